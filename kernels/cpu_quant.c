/* GGUF-quantized weights times float32 activations (see cpu_kernels.h): repack_q, gemm_q, matmul_weight,
 * dequantize_packed_rows.
 *
 * Every supported block type is, per group of values, weight = scale * code + offset with an unsigned
 * code (kernels/gguf_blocks.py has the table): legacy types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) one fp16 scale a
 * block of 32; k-quants (Q4_K, Q5_K, Q6_K) a 256-value super-block's fp16 scale times 6- or 8-bit scales of
 * its groups of 32 (16 for Q6_K).
 *
 * Layout: at load, repack_q regroups a matrix's blocks into tiles of 16 output rows (llama.cpp's CPU
 * backend repacks Q4_0 the same way): the same codes and scales, bit for bit, in an order where one 64-byte
 * vector holds four consecutive values of each of the 16 rows (4-bit codes: two such sets in its nibbles).
 * VPDPBUSD of that vector with four activation bytes broadcast to every lane then leaves each row's dot
 * product in its own lane, so nothing is reduced across lanes and the float work (scales, offsets) is one
 * vector operation per group for 16 rows at a time. Memory: the file's bytes (Q4_K, Q5_K: +4 bytes a
 * super-block, their 6-bit scales unpacked to bytes), plus rows up to a multiple of 16.
 *
 * Activations are quantized to int8 per block of 32 (an fp32 scale each, round to nearest, as llama.cpp's
 * Q8_0 activations), with their sums per 16 and 32 values, so that
 *   y = sum_groups (scale dx) * <code, xq> + offset * (dx * sum xq)
 * is integer dot products plus two FMAs a group. AVX-512 VNNI takes 16 rows an instruction; the AVX2 path
 * (VPMADDUBSW + VPMADDWD, 8 rows a 32-byte half) keeps Q8_0's codes signed, multiplying |w| by x with w's
 * sign (VPMADDUBSW would saturate at 255 * 127 * 2 with the codes offset to unsigned).
 *
 * Work: tiles are shared out by stealing (share_units, cpu_gemm.c), each thread streaming a contiguous run;
 * every tile meets all activation rows, QMR at a time (a 16-row decode step unpacks each tile once per QMR
 * rows, not once per row); prefill-sized inputs go in chunks of MC rows so that a chunk stays in L2.
 */
#include <string.h>

#include "cpu_kernels.h"

enum { T_F16 = 1, T_Q4_0 = 2, T_Q4_1 = 3, T_Q5_0 = 6, T_Q5_1 = 7, T_Q8_0 = 8, T_Q4_K = 12, T_Q5_K = 13,
       T_Q6_K = 14, T_BF16 = 30 };

#define VNNI_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))
#define AI inline __attribute__((always_inline))
#define TILE 16
#ifndef QMR
#define QMR 4
#endif
#ifndef MC
#define MC 256
#endif
#ifndef QSTEAL
#define QSTEAL 2
#endif
/* weights ahead of the unit in use, fetched into L2 as each unit starts (a thread streams its tiles front
 * to back, so this covers memory's latency at full bandwidth without a burst of misses per tile) */
#ifndef QPREFETCH
#define QPREFETCH 4096
#endif

static inline void prefetch_unit(const uint8_t *unit, int bytes) {
    for (int off = 0; off < bytes; off += 64) _mm_prefetch((const char *)(unit + QPREFETCH + off), _MM_HINT_T1);
}

/* A type's block in the file (values, bytes a row) and the repacked unit of 16 rows: its bytes and where
 * each field starts. Codes come first in 64-byte vectors (see the file comment); then, by type:
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

static int layout_of(int type, Layout *l) {
    *l = layout_const(type);
    return l->values != 0;
}

static int use_vnni = 0;

/* 1: the AVX-512 VNNI kernels (needs avx512bw/vl/vnni: the caller checks); 0: AVX2. Returns the old value. */
int set_quant_vnni(int on) {
    const int was = use_vnni;
    use_vnni = on;
    return was;
}

/* bytes of the repacked N x K matrix of `type`; 0 for a type without a kernel here */
int64_t packed_bytes(int type, int64_t N, int64_t K) {
    Layout l;
    if (!layout_of(type, &l)) return 0;
    return (N + TILE - 1) / TILE * (K / l.values) * l.unit;
}

typedef int32_t __attribute__((may_alias, aligned(1))) i32_any;   /* four activation bytes, any alignment */

static inline float f16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* ---------------------------------------------------------------- repacking (once, at load) */

/* One unit of one row from the file: its codes (Q8_0's as signed bytes), fp16 scale fields as stored,
 * and the group scales/mins of k-quants. */
typedef struct {
    uint8_t codes[256];
    uint8_t d[2], m[2];
    uint8_t sc[16], mn[8];
} RowUnit;

static void read_unit(int type, const uint8_t *src, RowUnit *u) {
    memcpy(u->d, src, 2);
    switch (type) {
    case T_Q4_0: case T_Q4_1: case T_Q5_0: case T_Q5_1: {
        const int has_m = type == T_Q4_1 || type == T_Q5_1, five = type == T_Q5_0 || type == T_Q5_1;
        const uint8_t *qs = src + 2 + 2 * has_m + 4 * five;
        uint32_t qh = 0;
        if (has_m) memcpy(u->m, src + 2, 2);
        if (five) memcpy(&qh, src + 2 + 2 * has_m, 4);
        for (int i = 0; i < 16; i++) {
            u->codes[i] = (uint8_t)((qs[i] & 15) | (((qh >> i) & 1) << 4));
            u->codes[i + 16] = (uint8_t)((qs[i] >> 4) | (((qh >> (i + 16)) & 1) << 4));
        }
        break;
    }
    case T_Q8_0: memcpy(u->codes, src + 2, 32); break;
    case T_Q4_K: case T_Q5_K: {
        memcpy(u->m, src + 2, 2);
        const uint8_t *s = src + 4, *qh = src + 16, *qs = src + (type == T_Q5_K ? 48 : 16);
        for (int j = 0; j < 8; j++) {
            if (j < 4) {
                u->sc[j] = s[j] & 63, u->mn[j] = s[j + 4] & 63;
            } else {
                u->sc[j] = (uint8_t)((s[j + 4] & 15) | ((s[j - 4] >> 6) << 4));
                u->mn[j] = (uint8_t)((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
            }
        }
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++) {
                const int hi = type == T_Q5_K;
                u->codes[64 * c + l] = (uint8_t)((qs[32 * c + l] & 15) | (hi ? ((qh[l] >> (2 * c)) & 1) << 4 : 0));
                u->codes[64 * c + 32 + l] =
                    (uint8_t)((qs[32 * c + l] >> 4) | (hi ? ((qh[l] >> (2 * c + 1)) & 1) << 4 : 0));
            }
        break;
    }
    case T_Q6_K: {
        const uint8_t *ql = src, *qh = src + 128;
        memcpy(u->d, src + 208, 2);
        memcpy(u->sc, src + 192, 16);
        for (int h = 0; h < 2; h++)
            for (int l = 0; l < 32; l++) {
                const uint8_t *a = ql + 64 * h, *b = qh + 32 * h;
                uint8_t *c = u->codes + 128 * h;
                c[l] = (uint8_t)((a[l] & 15) | ((b[l] & 3) << 4));
                c[l + 32] = (uint8_t)((a[l + 32] & 15) | (((b[l] >> 2) & 3) << 4));
                c[l + 64] = (uint8_t)((a[l] >> 4) | (((b[l] >> 4) & 3) << 4));
                c[l + 96] = (uint8_t)((a[l + 32] >> 4) | (((b[l] >> 6) & 3) << 4));
            }
        break;
    }
    default: break;
    }
}

/* Row i (0..15) of a unit into the tile's unit at dst. Code vector p holds, in lane i's four bytes, the
 * codes of values 8p..8p+3 in the low nibbles and 8p+4..8p+7 in the high ones (4-bit and 5-bit types),
 * values 4p..4p+3 as bytes (Q8_0), or, for Q6_K, like the 4-bit types with plane vector q holding the top
 * two bits of values 16q + 4s + b at bits 2s, 2s + 1 of lane i's byte b. */
static void write_unit(int type, const Layout *l, const RowUnit *u, int i, uint8_t *dst) {
    const int n = l->values;
    if (type == T_Q8_0) {
        for (int k = 0; k < 32; k++) dst[64 * (k / 4) + 4 * i + k % 4] = u->codes[k];
    } else {
        for (int p = 0; p < n / 8; p++)
            for (int b = 0; b < 4; b++)
                dst[64 * p + 4 * i + b] = (uint8_t)((u->codes[8 * p + b] & 15) | (u->codes[8 * p + 4 + b] & 15) << 4);
    }
    if (l->masks >= 0)
        for (int p = 0; p < n / 8; p++) {
            uint8_t *mask = dst + l->masks + 16 * p;
            for (int b = 0; b < 4; b++) {
                const int bit = 4 * i + b;
                mask[bit / 8] = (uint8_t)((mask[bit / 8] & ~(1 << bit % 8)) | ((u->codes[8 * p + b] >> 4) & 1) << bit % 8);
                mask[8 + bit / 8] =
                    (uint8_t)((mask[8 + bit / 8] & ~(1 << bit % 8)) | ((u->codes[8 * p + 4 + b] >> 4) & 1) << bit % 8);
            }
        }
    if (l->plane >= 0)
        for (int q = 0; q < n / 16; q++)
            for (int b = 0; b < 4; b++) {
                uint8_t v = 0;
                for (int s = 0; s < 4; s++) v |= (uint8_t)(((u->codes[16 * q + 4 * s + b] >> 4) & 3) << (2 * s));
                dst[l->plane + 64 * q + 4 * i + b] = v;
            }
    memcpy(dst + l->d + 2 * i, u->d, 2);
    if (l->m >= 0) memcpy(dst + l->m + 2 * i, u->m, 2);
    if (l->sc >= 0)
        for (int g = 0; g < n / l->group; g++) dst[l->sc + 16 * g + i] = u->sc[g];
    if (l->mn >= 0)
        for (int g = 0; g < 8; g++) dst[l->mn + 16 * g + i] = u->mn[g];
}

/* src: N rows of K values in `type` blocks as the file holds them -> dst (packed_bytes(type, N, K)); rows
 * past N are zero (scale 0: they multiply to 0). */
void repack_q(int type, const uint8_t *src, int64_t N, int64_t K, uint8_t *dst, int num_threads) {
    Layout l;
    if (!layout_of(type, &l)) return;
    const int64_t units = K / l.values, tiles = (N + TILE - 1) / TILE, row_bytes = units * l.bytes;
#pragma omp parallel for schedule(dynamic, 4) num_threads(num_threads)
    for (int64_t t = 0; t < tiles; t++) {
        RowUnit u;
        uint8_t *tile = dst + t * units * l.unit;
        memset(tile, 0, (size_t)(units * l.unit));
        for (int i = 0; i < TILE && t * TILE + i < N; i++)
            for (int64_t v = 0; v < units; v++) {
                read_unit(type, src + (t * TILE + i) * row_bytes + v * l.bytes, &u);
                write_unit(type, &l, &u, i, tile + v * l.unit);
            }
    }
}

/* rows[j] of a repacked N x K matrix dequantized into out[j] (float32): a quantized token embedding's
 * lookup. Scalar: a step looks up one row per token. */
void dequantize_packed_rows(const uint8_t *w, int type, const int64_t *rows, int64_t count, int64_t K, float *out) {
    Layout l;
    if (!layout_of(type, &l)) return;
    const int64_t units = K / l.values;
    for (int64_t j = 0; j < count; j++) {
        const int64_t t = rows[j] / TILE;
        const int i = (int)(rows[j] % TILE);
        for (int64_t v = 0; v < units; v++) {
            const uint8_t *unit = w + (t * units + v) * l.unit;
            const float d = f16(unit + l.d + 2 * i);
            for (int k = 0; k < l.values; k++) {
                int code;
                if (type == T_Q8_0) {
                    code = (int8_t)unit[64 * (k / 4) + 4 * i + k % 4];
                } else {
                    const uint8_t byte = unit[64 * (k / 8) + 4 * i + k % 4];
                    code = (k % 8 < 4 ? byte & 15 : byte >> 4);
                    if (l.masks >= 0) {
                        const uint8_t *mask = unit + l.masks + 16 * (k / 8) + (k % 8 < 4 ? 0 : 8);
                        const int bit = 4 * i + k % 4;
                        code |= ((mask[bit / 8] >> (bit % 8)) & 1) << 4;
                    }
                    if (l.plane >= 0)
                        code |= ((unit[l.plane + 64 * (k / 16) + 4 * i + k % 4] >> (2 * ((k % 16) / 4))) & 3) << 4;
                }
                float value;
                switch (type) {
                case T_Q4_0: value = d * (float)(code - 8); break;
                case T_Q5_0: value = d * (float)(code - 16); break;
                case T_Q4_1: case T_Q5_1: value = d * (float)code + f16(unit + l.m + 2 * i); break;
                case T_Q6_K: value = d * (float)(int8_t)unit[l.sc + 16 * (k / 16) + i] * (float)(code - 32); break;
                case T_Q8_0: value = d * (float)code; break;
                default:     /* Q4_K, Q5_K */
                    value = d * (float)unit[l.sc + 16 * (k / 32) + i] * (float)code -
                            f16(unit + l.m + 2 * i) * (float)unit[l.mn + 16 * (k / 32) + i];
                    break;
                }
                out[j * K + v * l.values + k] = value;
            }
        }
    }
}

/* ---------------------------------------------------------------- activations */
typedef struct {
    int8_t *xq;                /* [M][K] */
    float *dx, *s32, *s16;     /* [M][K/32] scale, [M][K/32] and [M][K/16] dx * sums */
    int64_t M, K;
} Act;

static AI int32_t hsum_i32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

static void quantize_row(const float *x, Act *a, int64_t r) {
    const int64_t K = a->K, nb = K / 32;
    int8_t *xq = a->xq + r * K;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t b = 0; b < nb; b++) {
        const float *xb = x + 32 * b;
        __m256 v[4], m = _mm256_setzero_ps();
        for (int j = 0; j < 4; j++) {
            v[j] = _mm256_loadu_ps(xb + 8 * j);
            m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[j]));
        }
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_movehdup_ps(h));
        const float amax = _mm_cvtss_f32(h), d = amax / 127.0f;
        const __m256 inv = _mm256_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
        __m256i q[4];
        for (int j = 0; j < 4; j++) q[j] = _mm256_cvtps_epi32(_mm256_mul_ps(v[j], inv));
        const int32_t lo = hsum_i32(_mm256_add_epi32(q[0], q[1])), hi = hsum_i32(_mm256_add_epi32(q[2], q[3]));
        __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
        p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *)(xq + 32 * b), p);
        a->dx[r * nb + b] = d;
        a->s32[r * nb + b] = d * (float)(lo + hi);
        a->s16[r * 2 * nb + 2 * b] = d * (float)lo;
        a->s16[r * 2 * nb + 2 * b + 1] = d * (float)hi;
    }
}

/* x's rows quantized (threads for prefill-sized inputs); free(a.xq) releases it. With `precise`, rows M..2M-1
 * hold each row's rounding error quantized in turn (x - dx * xq, to 8 bits again): the two planes together
 * carry ~15 bits, and the sum of their products is the product of x to that precision. */
static Act quantize_act(const float *x, int64_t ldx, int64_t M, int64_t K, int precise, int num_threads) {
    const int64_t rows = precise ? 2 * M : M, nb = K / 32;
    Act a = {NULL, NULL, NULL, NULL, rows, K};
    const size_t xbytes = (size_t)(rows * K + 63) / 64 * 64;
    a.xq = aligned_alloc(64, xbytes + sizeof(float) * (size_t)(4 * rows * nb) + 64);
    if (!a.xq) abort();
    a.dx = (float *)((uint8_t *)a.xq + xbytes);
    a.s32 = a.dx + rows * nb;
    a.s16 = a.s32 + rows * nb;
    float *error = precise ? malloc(sizeof(float) * (size_t)(K * (num_threads > 0 ? num_threads : 1))) : NULL;
    if (precise && !error) abort();
#pragma omp parallel for schedule(static) num_threads(M * K >= 65536 && num_threads > 1 ? num_threads : 1)
    for (int64_t r = 0; r < M; r++) {
        quantize_row(x + r * ldx, &a, r);
        if (precise) {
            float *e = error + (int64_t)omp_get_thread_num() * K;
            for (int64_t k = 0; k < K; k++) e[k] = x[r * ldx + k] - a.dx[r * nb + k / 32] * (float)a.xq[r * K + k];
            quantize_row(e, &a, M + r);
        }
    }
    free(error);
    return a;
}

/* ---------------------------------------------------------------- per-group scales of a tile (16 rows) */
/* scale and offset of group g (within the unit) for the 16 rows, as float vectors (AVX-512: one zmm;
 * AVX2: two ymm, rows 0-7 and 8-15). Q8_0's offset depends on the path (-128 d for VNNI's unsigned codes). */
#define GROUP_SCALES(VEC, CVTPH, CVTSC, CVTMN, SET1, MUL, FNMUL)                                                  \
    do {                                                                                                          \
        const VEC d = CVTPH(unit + l->d);                                                                         \
        switch (type) {                                                                                           \
        case T_Q4_0: scale = d, offset = MUL(d, SET1(-8.0f)); break;                                             \
        case T_Q5_0: scale = d, offset = MUL(d, SET1(-16.0f)); break;                                            \
        case T_Q4_1: case T_Q5_1: scale = d, offset = CVTPH(unit + l->m); break;                                 \
        case T_Q8_0: scale = d, offset = MUL(d, SET1(q8_offset)); break;                                         \
        case T_Q6_K: scale = MUL(d, CVTSC(unit + l->sc + 16 * g)), offset = MUL(scale, SET1(-32.0f)); break;    \
        default: scale = MUL(d, CVTMN(unit + l->sc + 16 * g)), offset = FNMUL(CVTPH(unit + l->m), CVTMN(unit + l->mn + 16 * g)); \
        }                                                                                                         \
    } while (0)

/* ---------------------------------------------------------------- AVX-512 VNNI: 16 rows a vector */
VNNI_TARGET static AI __m512 cvtph16(const uint8_t *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }
VNNI_TARGET static AI __m512 cvti8_16(const uint8_t *p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
}
VNNI_TARGET static AI __m512 cvtu8_16(const uint8_t *p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p)));
}
VNNI_TARGET static AI __m512 fnmul512(__m512 a, __m512 b) { return _mm512_sub_ps(_mm512_setzero_ps(), _mm512_mul_ps(a, b)); }

/* 16 rows of one tile (units from `tile`) against NRW activation rows from r: y[r + j][n0 + lane].
 * Everything the type decides is a constant here (one instance per type and NRW), so the step loop unrolls. */
VNNI_TARGET static AI void tile_vnni(const int type, const uint8_t *tile, int64_t units, const Act *a,
                                     int64_t r, float *y, int64_t ldy, int64_t n0, int valid, const int NRW) {
    const Layout layout = layout_const(type), *l = &layout;
    const int masks = type == T_Q5_0 || type == T_Q5_1 || type == T_Q5_K, plane = type == T_Q6_K;
    const int groups = l->values / l->group, steps = l->group / 4;      /* steps of four values a group */
    const int64_t K = a->K, nb = K / 32;
    const __m512i low = _mm512_set1_epi8(0x0f), flip = _mm512_set1_epi8((char)0x80), five = _mm512_set1_epi8(0x10);
    const __m512i three = _mm512_set1_epi8(3);
    const float q8_offset = -128.0f;
    const int8_t *xq[QMR];
    const float *dx[QMR], *sx[QMR];            /* a row's scale per 32 values, its offset sums per group */
    __m512 acc[QMR];
    for (int j = 0; j < NRW; j++) {
        xq[j] = a->xq + (r + j) * K;
        dx[j] = a->dx + (r + j) * nb;
        sx[j] = l->group == 16 ? a->s16 + (r + j) * 2 * nb : a->s32 + (r + j) * nb;
        acc[j] = _mm512_setzero_ps();
    }
    for (int64_t v = 0; v < units; v++) {
        const uint8_t *unit = tile + v * l->unit;
        prefetch_unit(unit, l->unit);
        for (int g = 0; g < groups; g++) {
            __m512i dot[QMR];
            for (int j = 0; j < NRW; j++) dot[j] = _mm512_setzero_si512();
            const int64_t k0 = v * l->values + g * l->group;            /* the group's first value */
#pragma GCC unroll 8
            for (int s = 0; s < steps; s += (type == T_Q8_0 ? 1 : 2)) {
                const int step = g * steps + s;                          /* step within the unit */
                __m512i c0, c1 = _mm512_setzero_si512();
                if (type == T_Q8_0) {
                    c0 = _mm512_xor_si512(_mm512_loadu_si512(unit + 64 * step), flip);
                } else {
                    const __m512i packed = _mm512_loadu_si512(unit + 64 * (step / 2));
                    c0 = _mm512_and_si512(packed, low);
                    c1 = _mm512_and_si512(_mm512_srli_epi16(packed, 4), low);
                    if (masks) {
                        const uint8_t *mask = unit + l->masks + 16 * (step / 2);
                        __mmask64 m0, m1;
                        memcpy(&m0, mask, 8), memcpy(&m1, mask + 8, 8);
                        c0 = _mm512_mask_add_epi8(c0, m0, c0, five);
                        c1 = _mm512_mask_add_epi8(c1, m1, c1, five);
                    }
                    if (plane) {
                        const __m512i h = _mm512_loadu_si512(unit + l->plane + 64 * (step / 4));
                        const int shift = 2 * (step % 4);
                        c0 = _mm512_or_si512(c0, _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(h, shift), three), 4));
                        c1 = _mm512_or_si512(c1, _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(h, shift + 2), three), 4));
                    }
                }
                const int64_t k = k0 + 4 * s;
                for (int j = 0; j < NRW; j++) {
                    dot[j] = _mm512_dpbusd_epi32(dot[j], c0, _mm512_set1_epi32(*(const i32_any *)(xq[j] + k)));
                    if (type != T_Q8_0)
                        dot[j] = _mm512_dpbusd_epi32(dot[j], c1, _mm512_set1_epi32(*(const i32_any *)(xq[j] + k + 4)));
                }
            }
            __m512 scale, offset;
            GROUP_SCALES(__m512, cvtph16, cvti8_16, cvtu8_16, _mm512_set1_ps, _mm512_mul_ps, fnmul512);
            for (int j = 0; j < NRW; j++) {
                acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[j]),
                                         _mm512_mul_ps(scale, _mm512_set1_ps(dx[j][k0 / 32])), acc[j]);
                acc[j] = _mm512_fmadd_ps(offset, _mm512_set1_ps(sx[j][k0 / l->group]), acc[j]);
            }
        }
    }
    const __mmask16 keep = valid >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << valid) - 1u);
    for (int j = 0; j < NRW; j++) _mm512_mask_storeu_ps(y + (r + j) * ldy + n0, keep, acc[j]);
}

/* ---------------------------------------------------------------- AVX2: a tile as two halves of 8 rows */
static AI __m256 cvtph8(const uint8_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }
static AI __m256 cvti8_8(const uint8_t *p) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p))); }
static AI __m256 cvtu8_8(const uint8_t *p) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p))); }
static AI __m256 fnmul256(__m256 a, __m256 b) { return _mm256_sub_ps(_mm256_setzero_ps(), _mm256_mul_ps(a, b)); }

/* 32 bytes, 0x10 where the bit of `bits` for that byte is set */
static AI __m256i mask_bytes(uint32_t bits) {
    const __m256i shuffle = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                             2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i select = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), shuffle);
    v = _mm256_cmpeq_epi8(_mm256_and_si256(v, select), select);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x10));
}

/* half h (rows 8h..8h+7) of a tile against NRW activation rows. VPMADDUBSW's 16-bit sums are added up for
 * as many steps as cannot overflow (4-bit codes: a whole group of 32; 5-bit: half; 6- and 8-bit: one step)
 * before VPMADDWD widens them. */
static AI void half_avx2(const int type, const uint8_t *tile, int64_t units, const Act *a, int64_t r,
                         float *y, int64_t ldy, int64_t n0, int valid, int h, const int NRW) {
    const Layout layout = layout_const(type), *l = &layout;
    const int masks = type == T_Q5_0 || type == T_Q5_1 || type == T_Q5_K, plane = type == T_Q6_K;
    const int widen_every = type == T_Q8_0 || plane ? 1 : (masks ? 4 : 8);     /* steps between VPMADDWDs */
    const int groups = l->values / l->group, steps = l->group / 4;
    const int64_t K = a->K, nb = K / 32;
    const __m256i low = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1), three = _mm256_set1_epi8(3);
    const float q8_offset = 0.0f;
    const int8_t *xq[QMR];
    const float *dx[QMR], *sx[QMR];
    __m256 acc[QMR];
    for (int j = 0; j < NRW; j++) {
        xq[j] = a->xq + (r + j) * K;
        dx[j] = a->dx + (r + j) * nb;
        sx[j] = l->group == 16 ? a->s16 + (r + j) * 2 * nb : a->s32 + (r + j) * nb;
        acc[j] = _mm256_setzero_ps();
    }
    for (int64_t v = 0; v < units; v++) {
        const uint8_t *unit = tile + v * l->unit;
        if (h == 0) prefetch_unit(unit, l->unit);
        for (int g = 0; g < groups; g++) {
            __m256i dot[QMR], sum16[QMR];
            for (int j = 0; j < NRW; j++) dot[j] = sum16[j] = _mm256_setzero_si256();
            const int64_t k0 = v * l->values + g * l->group;
#pragma GCC unroll 8
            for (int s = 0; s < steps; s += (type == T_Q8_0 ? 1 : 2)) {
                const int step = g * steps + s;
                __m256i c0, c1 = _mm256_setzero_si256();
                if (type == T_Q8_0) {
                    c0 = _mm256_loadu_si256((const __m256i *)(unit + 64 * step + 32 * h));
                } else {
                    const __m256i packed = _mm256_loadu_si256((const __m256i *)(unit + 64 * (step / 2) + 32 * h));
                    c0 = _mm256_and_si256(packed, low);
                    c1 = _mm256_and_si256(_mm256_srli_epi16(packed, 4), low);
                    if (masks) {
                        const uint8_t *mask = unit + l->masks + 16 * (step / 2) + 4 * h;
                        uint32_t m0, m1;
                        memcpy(&m0, mask, 4), memcpy(&m1, mask + 8, 4);
                        c0 = _mm256_or_si256(c0, mask_bytes(m0));
                        c1 = _mm256_or_si256(c1, mask_bytes(m1));
                    }
                    if (plane) {
                        const __m256i hb = _mm256_loadu_si256((const __m256i *)(unit + l->plane + 64 * (step / 4) + 32 * h));
                        const int shift = 2 * (step % 4);
                        c0 = _mm256_or_si256(c0, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, shift), three), 4));
                        c1 = _mm256_or_si256(c1, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, shift + 2), three), 4));
                    }
                }
                const int64_t k = k0 + 4 * s;
                for (int j = 0; j < NRW; j++) {
                    const __m256i x0 = _mm256_set1_epi32(*(const i32_any *)(xq[j] + k));
                    if (type == T_Q8_0) {
                        sum16[j] = _mm256_maddubs_epi16(_mm256_abs_epi8(c0), _mm256_sign_epi8(x0, c0));
                    } else {
                        const __m256i x1 = _mm256_set1_epi32(*(const i32_any *)(xq[j] + k + 4));
                        sum16[j] = _mm256_add_epi16(sum16[j], _mm256_add_epi16(_mm256_maddubs_epi16(c0, x0),
                                                                               _mm256_maddubs_epi16(c1, x1)));
                    }
                    if ((s + (type == T_Q8_0 ? 1 : 2)) % widen_every == 0) {
                        dot[j] = _mm256_add_epi32(dot[j], _mm256_madd_epi16(sum16[j], ones));
                        sum16[j] = _mm256_setzero_si256();
                    }
                }
            }
            __m256 scale, offset;
#define CVTPH_H(p) cvtph8((p) + 16 * h)
#define CVTI8_H(p) cvti8_8((p) + 8 * h)
#define CVTU8_H(p) cvtu8_8((p) + 8 * h)
            GROUP_SCALES(__m256, CVTPH_H, CVTI8_H, CVTU8_H, _mm256_set1_ps, _mm256_mul_ps, fnmul256);
#undef CVTPH_H
#undef CVTI8_H
#undef CVTU8_H
            for (int j = 0; j < NRW; j++) {
                acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot[j]), _mm256_mul_ps(scale, _mm256_set1_ps(dx[j][k0 / 32])),
                                         acc[j]);
                acc[j] = _mm256_fmadd_ps(offset, _mm256_set1_ps(sx[j][k0 / l->group]), acc[j]);
            }
        }
    }
    for (int j = 0; j < NRW; j++) {
        if (valid >= 8 * h + 8) {
            _mm256_storeu_ps(y + (r + j) * ldy + n0 + 8 * h, acc[j]);
        } else {
            float tmp[8];
            _mm256_storeu_ps(tmp, acc[j]);
            for (int i = 0; i < valid - 8 * h; i++) y[(r + j) * ldy + n0 + 8 * h + i] = tmp[i];
        }
    }
}

/* ---------------------------------------------------------------- the matmul */
typedef struct {
    const uint8_t *w;
    int type, vnni;
    const Layout *l;
    int64_t N, units, m0, mc, ldy;
    const Act *a;
    float *y;
} QArgs;

/* one instance per type and row count: the type's branches fold away (four rows a call, or one) */
#define TYPE_CASES(CALL, NRW)                                                                                      \
    switch (q->type) {                                                                                             \
    case T_Q4_0: CALL(T_Q4_0, NRW); break; case T_Q4_1: CALL(T_Q4_1, NRW); break;                                 \
    case T_Q5_0: CALL(T_Q5_0, NRW); break; case T_Q5_1: CALL(T_Q5_1, NRW); break;                                 \
    case T_Q8_0: CALL(T_Q8_0, NRW); break; case T_Q4_K: CALL(T_Q4_K, NRW); break;                                 \
    case T_Q5_K: CALL(T_Q5_K, NRW); break; default: CALL(T_Q6_K, NRW); break;                                     \
    }

VNNI_TARGET static void rows_vnni(const QArgs *q, const uint8_t *tile, int64_t r, int nrw, int64_t n0, int valid) {
#define CALL(TYPE, NRW) tile_vnni(TYPE, tile, q->units, q->a, r + i, q->y, q->ldy, n0, valid, NRW)
    if (nrw == QMR) {
        const int i = 0;
        TYPE_CASES(CALL, QMR)
    } else {
        for (int i = 0; i < nrw; i++) TYPE_CASES(CALL, 1)
    }
#undef CALL
}

static void rows_avx2(const QArgs *q, const uint8_t *tile, int64_t r, int nrw, int64_t n0, int valid) {
    for (int h = 0; h < 2 && 8 * h < valid; h++) {
#define CALL(TYPE, NRW) half_avx2(TYPE, tile, q->units, q->a, r + i, q->y, q->ldy, n0, valid, h, NRW)
        if (nrw == QMR) {
            const int i = 0;
            TYPE_CASES(CALL, QMR)
        } else {
            for (int i = 0; i < nrw; i++) TYPE_CASES(CALL, 1)
        }
#undef CALL
    }
}

/* tiles [lo, hi) against activation rows [m0, m0 + mc) */
static void q_tiles(const void *args, int64_t lo, int64_t hi) {
    const QArgs *q = args;
    const int64_t tile_bytes = q->units * q->l->unit;
    for (int64_t t = lo; t < hi; t++) {
        const uint8_t *tile = q->w + t * tile_bytes;
        const int64_t n0 = t * TILE;
        const int valid = (int)(q->N - n0 < TILE ? q->N - n0 : TILE);
        for (int64_t r = q->m0; r < q->m0 + q->mc; r += QMR) {
            const int nrw = (int)(q->m0 + q->mc - r < QMR ? q->m0 + q->mc - r : QMR);
            if (q->vnni) rows_vnni(q, tile, r, nrw, n0, valid);
            else rows_avx2(q, tile, r, nrw, n0, valid);
        }
    }
}

static void gemm_q_act(const Act *a, const uint8_t *w, int type, float *y, int64_t ldy, int64_t N, int num_threads) {
    Layout l;
    if (!layout_of(type, &l)) abort();
    QArgs q = {w, type, use_vnni, &l, N, a->K / l.values, 0, 0, ldy, a, y};
    const int64_t tiles = (N + TILE - 1) / TILE;
    for (int64_t m0 = 0; m0 < a->M; m0 += MC) {
        q.m0 = m0;
        q.mc = a->M - m0 < MC ? a->M - m0 : MC;
        share_units(tiles, QSTEAL, num_threads, q_tiles, &q);
    }
}

/* y[M, N] (row stride ldy) = x[M, K] (row stride ldx) @ w^T, w repacked by repack_q from `type` blocks. */
void gemm_q(const float *x, int64_t ldx, const void *w, int type, float *y, int64_t ldy, int64_t M, int64_t N,
            int64_t K, int num_threads) {
    if (M <= 0 || N <= 0) return;
    Act a = quantize_act(x, ldx, M, K, 0, num_threads);
    gemm_q_act(&a, w, type, y, ldy, N, num_threads);
    free(a.xq);
}

/* y = x @ W^T for a Weight (see cpu_kernels.h): a 16-bit matrix through gemm16, or repacked quantized
 * parts, each into its own columns of y, the activations quantized once for all of them. `precise`: with
 * two 8-bit planes (quantize_act), twice the integer work for ~15-bit activations (the LM head, whose
 * rounding decides tokens). */
void matmul_weight(const Weight *w, const float *x, float *y, int64_t M, int64_t K, int precise, int num_threads) {
    if (w->type[0] == T_F16 || w->type[0] == T_BF16) {
        gemm16(x, w->data[0], y, M, w->rows[0], K, w->type[0] == T_BF16, num_threads);
        return;
    }
    if (M <= 0) return;
    int64_t N = 0;
    for (int i = 0; i < w->num_parts; i++) N += w->rows[i];
    Act a = quantize_act(x, K, M, K, precise, num_threads);
    float *out = precise ? malloc(sizeof(float) * (size_t)(2 * M * N)) : y;
    if (!out) abort();
    for (int i = 0, col = 0; i < w->num_parts; col += (int)w->rows[i], i++)
        gemm_q_act(&a, w->data[i], w->type[i], out + col, N, w->rows[i], num_threads);
    if (precise) {
        for (int64_t i = 0; i < M * N; i++) y[i] = out[i] + out[M * N + i];
        free(out);
    }
    free(a.xq);
}
