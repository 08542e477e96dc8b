/* Shared by kernels/cpu/quant.c (the matmul kernels) and kernels/cpu/quant_pack.c (repacking at load,
 * the embedding lookup, activation quantization): the GGML type ids with kernels, the layout of their
 * repacked 16-row tiles, and the quantized activations. See quant.c for the scheme. */
#ifndef RINGSERVE_CPU_QUANT_H
#define RINGSERVE_CPU_QUANT_H

#include <string.h>

#include "kernels.h"

enum { T_F16 = 1, T_Q4_0 = 2, T_Q4_1 = 3, T_Q5_0 = 6, T_Q5_1 = 7, T_Q8_0 = 8, T_Q4_K = 12, T_Q5_K = 13,
       T_Q6_K = 14, T_BF16 = 30 };

#define AI inline __attribute__((always_inline))
#define TILE 16

/* A type's block in the file (values, bytes a row) and the repacked unit of 16 rows: its bytes and where
 * each field starts. Codes come first in 64-byte vectors (see quant.c); then, by type:
 * masks: Q5's fifth bits, 16 bytes a code vector (a 64-bit mask for the low nibbles' values, one for the
 * high); plane: Q6_K's top two bits, a 64-byte vector for every two code vectors; d, dmin/m: 16 fp16;
 * sc, mn: a byte per row and group. */
typedef struct {
    int values, bytes, unit, masks, plane, d, m, sc, mn, group;
} Layout;

/* the layout of `type` (values 0 for a type without a kernel); inlined with a constant type, it folds to
 * constants in the kernels */
static AI Layout layout_const(int type) {
    Layout l = {0, 0, 0, -1, -1, 0, -1, -1, -1, 32};
    l.values = 32;
    switch (type) {
    case T_Q4_0: l.bytes = 18, l.d = 256, l.unit = 288; break;
    case T_Q4_1: l.bytes = 20, l.d = 256, l.m = 288, l.unit = 320; break;
    case T_Q5_0: l.bytes = 22, l.masks = 256, l.d = 320, l.unit = 352; break;
    case T_Q5_1: l.bytes = 24, l.masks = 256, l.d = 320, l.m = 352, l.unit = 384; break;
    case T_Q8_0: l.bytes = 34, l.d = 512, l.unit = 544; break;
    case T_Q4_K:
        l.values = 256, l.bytes = 144, l.d = 2048, l.m = 2080, l.sc = 2112, l.mn = 2240, l.unit = 2368;
        break;
    case T_Q5_K:
        l.values = 256, l.bytes = 176, l.masks = 2048, l.d = 2560, l.m = 2592, l.sc = 2624, l.mn = 2752, l.unit = 2880;
        break;
    case T_Q6_K:
        l.values = 256, l.bytes = 210, l.plane = 2048, l.sc = 3072, l.d = 3328, l.unit = 3360, l.group = 16;
        break;
    default: l.values = 0; break;
    }
    return l;
}

static inline int layout_of(int type, Layout *l) {
    *l = layout_const(type);
    return l->values != 0;
}

typedef int32_t __attribute__((may_alias, aligned(1))) i32_any;   /* four activation bytes, any alignment */

static inline float f16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

typedef struct {
    int8_t *xq;                /* [M][K] */
    float *dx, *s32, *s16;     /* [M][K/32] scale, [M][K/32] and [M][K/16] dx * sums */
    int64_t M, K;
} Act;

/* x's M rows (row stride ldx) quantized; with `precise`, rows M..2M-1 hold their rounding error quantized
 * again (quant_pack.c). free(a.xq) releases it. */
INTERNAL Act quantize_act(const float *x, int64_t ldx, int64_t M, int64_t K, int precise, int num_threads);

#endif
