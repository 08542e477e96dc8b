/* GGUF-quantized weights times float32 activations (see kernels.h): gemm_q, matmul_weight; the
 * repacking at load, the embedding lookup and the activations' quantization are in quant_pack.c, the
 * layout both read in quant.h.
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
 * Q8_0 activations; `precise` adds a second plane, the rounding error quantized again), with their sums
 * per 16 and 32 values, so that
 *   y = sum_groups (scale dx) * <code, xq> + offset * (dx * sum xq)
 * is integer dot products plus two FMAs a group. AVX-512 VNNI takes 16 rows an instruction; the AVX2 path
 * (VPMADDUBSW + VPMADDWD, 8 rows a 32-byte half) keeps Q8_0's codes signed, multiplying |w| by x with w's
 * sign (VPMADDUBSW would saturate at 255 * 127 * 2 with the codes offset to unsigned).
 *
 * Work: tiles are shared out by stealing (share_units, gemm.c), each thread streaming a contiguous run;
 * every tile meets all activation rows, up to QMR_VNNI (AVX2: QMR) at a time, each count its own instance (a
 * 16-row decode step unpacks each tile twice, not 16 times; a 5-row verify step once); a row's sums are the
 * same whatever the count, so a row gets the same bits in any batch; prefill-sized inputs go in chunks of MC
 * rows so that a chunk stays in L2.
 */
#include "quant.h"

#define VNNI_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni")))
#ifndef QMR
#define QMR 4           /* AVX2: activation rows a pass over a tile (3 registers a row of 16) */
#endif
#ifndef QMR_VNNI
#define QMR_VNNI 8      /* AVX-512: 2 of its 32 registers a row; a batch-1 verify step (k + 1 rows) is one pass */
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

static int use_vnni = 0;

/* 1: the AVX-512 VNNI kernels (needs avx512bw/vl/vnni: the caller checks); 0: AVX2. Returns the old value. */
int set_quant_vnni(int on) {
    const int was = use_vnni;
    use_vnni = on;
    return was;
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
    const int8_t *xq[QMR_VNNI];
    const float *dx[QMR_VNNI], *sx[QMR_VNNI];            /* a row's scale per 32 values, its offset sums per group */
    __m512 acc[QMR_VNNI];
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
            __m512i dot[QMR_VNNI];
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

/* one instance per type and row count: the type's branches fold away */
#define TYPE_CASES(CALL, NRW)                                                                                      \
    switch (q->type) {                                                                                             \
    case T_Q4_0: CALL(T_Q4_0, NRW); break; case T_Q4_1: CALL(T_Q4_1, NRW); break;                                 \
    case T_Q5_0: CALL(T_Q5_0, NRW); break; case T_Q5_1: CALL(T_Q5_1, NRW); break;                                 \
    case T_Q8_0: CALL(T_Q8_0, NRW); break; case T_Q4_K: CALL(T_Q4_K, NRW); break;                                 \
    case T_Q5_K: CALL(T_Q5_K, NRW); break; default: CALL(T_Q6_K, NRW); break;                                     \
    }

/* one instance per row count: 1..QMR_VNNI (AVX2: 1..QMR) */
#define ROW_CASES_4(CALL) \
    case 1: TYPE_CASES(CALL, 1) break; case 2: TYPE_CASES(CALL, 2) break; \
    case 3: TYPE_CASES(CALL, 3) break; case 4: TYPE_CASES(CALL, 4) break;
#define ROW_CASES_8(CALL) ROW_CASES_4(CALL) \
    case 5: TYPE_CASES(CALL, 5) break; case 6: TYPE_CASES(CALL, 6) break; \
    case 7: TYPE_CASES(CALL, 7) break; default: TYPE_CASES(CALL, 8) break;

VNNI_TARGET static void rows_vnni(const QArgs *q, const uint8_t *tile, int64_t r, int nrw, int64_t n0, int valid) {
#define CALL(TYPE, NRW) tile_vnni(TYPE, tile, q->units, q->a, r, q->y, q->ldy, n0, valid, NRW)
    switch (nrw) { ROW_CASES_8(CALL) }
#undef CALL
}

static void rows_avx2(const QArgs *q, const uint8_t *tile, int64_t r, int nrw, int64_t n0, int valid) {
    for (int h = 0; h < 2 && 8 * h < valid; h++) {
#define CALL(TYPE, NRW) half_avx2(TYPE, tile, q->units, q->a, r, q->y, q->ldy, n0, valid, h, NRW)
        switch (nrw) { ROW_CASES_4(CALL) default: abort(); }
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
        const int most = q->vnni ? QMR_VNNI : QMR;
        for (int64_t r = q->m0; r < q->m0 + q->mc; r += most) {
            const int nrw = (int)(q->m0 + q->mc - r < most ? q->m0 + q->mc - r : most);
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

/* y = x @ W^T for a Weight (see kernels.h): a 16-bit matrix through gemm16, or repacked quantized
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
