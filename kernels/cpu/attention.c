/* Decode and prefill attention over the paged 16-bit KV cache (see kernels.h). */
#include "kernels.h"

/* ---------------------------------------------------------------- decode attention */

#define MAX_GROUP 16
#define MAX_HEAD_DIM 256
#define KEYS 8
#ifndef PREFETCH_KEYS
#define PREFETCH_KEYS 24      /* with the group in use: 32 keys' rows in flight */
#endif

/* A walk over a request's cache slots through its block table, one key at a time, without divisions. */
typedef struct {
    const int32_t *table;
    int64_t block_size, blk, off;
} SlotWalk;

static inline SlotWalk slot_walk(const int32_t *table, int64_t block_size, int64_t first) {
    return (SlotWalk){table, block_size, first / block_size, first % block_size};
}

static inline int64_t next_slot(SlotWalk *w) {
    const int64_t slot = (int64_t)w->table[w->blk] * w->block_size + w->off;
    if (++w->off == w->block_size) w->off = 0, w->blk++;
    return slot;
}

/* Values: o[g][d0 .. d0 + 8 NV) += sum_i p[g][i] v_(first + i)[d0 ..] for GN query heads of a group at
 * once (each value vector widened once for all of them), GN x NV accumulators in registers. */
static inline __attribute__((always_inline)) void value_pass(
    const uint16_t *value_cache, const int32_t *table, int64_t first, int64_t S, int64_t block_size,
    int64_t row_stride, int64_t d0, const float *const *p, float *const *o, int is_bf16, const int GN,
    const int NV) {
    __m256 a[4][4];
    for (int g = 0; g < GN; g++)
        for (int c = 0; c < NV; c++) a[g][c] = _mm256_loadu_ps(o[g] + d0 + 8 * c);
    SlotWalk walk = slot_walk(table, block_size, first);
    for (int64_t i = 0; i < S; i++) {
        const uint16_t *v = value_cache + next_slot(&walk) * row_stride + d0;
        for (int c = 0; c < NV; c++) {
            __m256 vv = load8(v + 8 * c, is_bf16);
            for (int g = 0; g < GN; g++) a[g][c] = _mm256_fmadd_ps(_mm256_broadcast_ss(p[g] + i), vv, a[g][c]);
        }
    }
    for (int g = 0; g < GN; g++)
        for (int c = 0; c < NV; c++) _mm256_storeu_ps(o[g] + d0 + 8 * c, a[g][c]);
}

/* value_pass over all of D for heads g0 .. g0 + GN - 1 (GN <= 4): 32 dims a pass, 16 for four heads. */
static inline __attribute__((always_inline)) void value_heads(
    const uint16_t *value_cache, const int32_t *table, int64_t first, int64_t S, int64_t block_size,
    int64_t row_stride, int64_t D, const float *const *p, float *const *o, int is_bf16, const int GN) {
    const int NV = GN == 4 ? 2 : 4;
    int64_t d0 = 0;
    for (; d0 + 8 * NV <= D; d0 += 8 * NV)
        value_pass(value_cache, table, first, S, block_size, row_stride, d0, p, o, is_bf16, GN, NV);
    for (; d0 < D; d0 += 8)
        value_pass(value_cache, table, first, S, block_size, row_stride, d0, p, o, is_bf16, GN, 1);
}

/* scores [Hq, S] -> exp(s - max) in place, per query head, with its max and sum */
static void softmax_rows(float *scores, int64_t Hq, int64_t S, float *maxs, float *sums) {
    for (int64_t g = 0; g < Hq; g++) {
        float *sg = scores + g * S;
        float mx = -INFINITY;
        for (int64_t i = 0; i < S; i++) mx = sg[i] > mx ? sg[i] : mx;
        __m256 vmax = _mm256_set1_ps(mx), total = _mm256_setzero_ps();
        int64_t i = 0;
        for (; i + 8 <= S; i += 8) {
            __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(sg + i), vmax));
            _mm256_storeu_ps(sg + i, e);
            total = _mm256_add_ps(total, e);
        }
        float sum = hsum(total);
        for (; i < S; i++) {
            float lane[8] = {sg[i] - mx};
            float e[8];
            _mm256_storeu_ps(e, exp8(_mm256_loadu_ps(lane)));
            sg[i] = e[0];
            sum += e[0];
        }
        maxs[g] = mx;
        sums[g] = sum;
    }
}

#define VALUE_CHUNK 128      /* keys whose value rows (every KV head) stay in L2 while each head passes */

/* The next group of keys [i0, i0 + n) of a request: their cache rows into rows, and the rows of the keys up
 * to PREFETCH_KEYS further (not yet handed out, below `end`) into ahead, for the caller to prefetch a few at a time
 * between its query heads' dot products (all at once they stall on the core's outstanding misses).
 * Returns how many rows went into ahead. */
static inline int64_t key_group(SlotWalk *walk, SlotWalk *prefetch, int64_t *prefetched, int64_t i0, int64_t n,
                                int64_t end, const uint16_t *key_cache, int64_t row_stride, const uint16_t **rows,
                                const uint16_t **ahead) {
    int64_t ahead_n = 0;
    for (; *prefetched < i0 + n + PREFETCH_KEYS && *prefetched < end; (*prefetched)++)
        ahead[ahead_n++] = key_cache + next_slot(prefetch) * row_stride;
    for (int64_t j = 0; j < n; j++) rows[j] = key_cache + next_slot(walk) * row_stride;
    return ahead_n;
}

typedef void (*ValueHeadsFn)(const uint16_t *value_cache, const int32_t *table, int64_t first, int64_t S,
                             int64_t block_size, int64_t row_stride, int64_t D, const float *const *p,
                             float *const *o, int is_bf16, int64_t heads);

static void value_heads_avx2(const uint16_t *vh, const int32_t *table, int64_t first, int64_t S, int64_t block_size,
                             int64_t row_stride, int64_t D, const float *const *p, float *const *o, int is_bf16,
                             int64_t heads) {
    switch (heads) {
    case 4: value_heads(vh, table, first, S, block_size, row_stride, D, p, o, is_bf16, 4); break;
    case 3: value_heads(vh, table, first, S, block_size, row_stride, D, p, o, is_bf16, 3); break;
    case 2: value_heads(vh, table, first, S, block_size, row_stride, D, p, o, is_bf16, 2); break;
    default: value_heads(vh, table, first, S, block_size, row_stride, D, p, o, is_bf16, 1); break;
    }
}

/* out [Hq, D] = sum over the keys [first, first + S) of p [Hq, S] times the values: chunks of keys whose
 * value rows (every KV head) stay in L2, each KV head's query heads up to four at a time (five as 3 + 2),
 * through `heads_fn` (the AVX2 or the AVX-512 value pass). Plain C: it calls, but holds, no AVX-512 code. */
static void accumulate_values(const float *scores, const uint16_t *value_cache, const int32_t *table, int64_t first,
                              int64_t S, int64_t Hq, int64_t Hk, int64_t D, int64_t block_size, int is_bf16,
                              float *out, ValueHeadsFn heads_fn) {
    const int64_t row_stride = Hk * D, group = Hq / Hk;
    for (int64_t i = 0; i < Hq * D; i++) out[i] = 0.0f;
    for (int64_t c0 = 0; c0 < S; c0 += VALUE_CHUNK) {
        const int64_t n = S - c0 < VALUE_CHUNK ? S - c0 : VALUE_CHUNK;
        for (int64_t h = 0; h < Hk; h++) {
            for (int64_t g0 = h * group, end = (h + 1) * group; g0 < end;) {
                const int64_t left = end - g0, gn = left == 5 ? 3 : (left < 4 ? left : 4);
                const float *p[4];
                float *o[4];
                for (int64_t g = 0; g < gn; g++) p[g] = scores + (g0 + g) * S + c0, o[g] = out + (g0 + g) * D;
                heads_fn(value_cache + h * D, table, first + c0, n, block_size, row_stride, D, p, o, is_bf16, gn);
                g0 += gn;
            }
        }
    }
}

/* ---------------------------------------------------------------- AVX-512 (attend_range16, below) */
BF16_TARGET static inline __m512 sums16(__m512 *a) {
    /* lane j of the result = the sum of a[j]'s sixteen lanes */
    __m512 b[8], c[4], d[2];
    for (int i = 0; i < 8; i++)
        b[i] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]), _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]));
    for (int i = 0; i < 4; i++)
        c[i] = _mm512_add_ps(_mm512_shuffle_ps(b[2 * i], b[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                             _mm512_shuffle_ps(b[2 * i], b[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    for (int i = 0; i < 2; i++)
        d[i] = _mm512_add_ps(_mm512_shuffle_f32x4(c[2 * i], c[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_f32x4(c[2 * i], c[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm512_add_ps(_mm512_shuffle_f32x4(d[0], d[1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(d[0], d[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

/* o[g][d0 .. d0 + 16 NV) += sum_i p[g][i] v_(first + i)[d0 ..] for GN <= 4 query heads, NV <= 4; the cache
 * bf16, or f16 (F16: widened by VCVTPH2PS) */
BF16_TARGET static inline __attribute__((always_inline)) void value_pass16(
    const uint16_t *value_cache, const int32_t *table, int64_t first, int64_t S, int64_t block_size,
    int64_t row_stride, int64_t d0, const float *const *p, float *const *o, const int GN, const int NV,
    const int F16) {
    __m512 a[4][4];
    for (int g = 0; g < GN; g++)
        for (int c = 0; c < NV; c++) a[g][c] = _mm512_loadu_ps(o[g] + d0 + 16 * c);
    SlotWalk walk = slot_walk(table, block_size, first);
    for (int64_t i = 0; i < S; i++) {
        const uint16_t *v = value_cache + next_slot(&walk) * row_stride + d0;
        __m512 pg[4];
        for (int g = 0; g < GN; g++) pg[g] = _mm512_set1_ps(p[g][i]);
        for (int c = 0; c < NV; c++) {
            const __m512 vv = F16 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(v + 16 * c)))
                                  : load16_bf16(v + 16 * c, 0xffff);
            for (int g = 0; g < GN; g++) a[g][c] = _mm512_fmadd_ps(pg[g], vv, a[g][c]);
        }
    }
    for (int g = 0; g < GN; g++)
        for (int c = 0; c < NV; c++) _mm512_storeu_ps(o[g] + d0 + 16 * c, a[g][c]);
}

BF16_TARGET static inline __attribute__((always_inline)) void value_heads16(
    const uint16_t *value_cache, const int32_t *table, int64_t first, int64_t S, int64_t block_size,
    int64_t row_stride, int64_t D, const float *const *p, float *const *o, const int GN, const int F16) {
    int64_t d0 = 0;
    for (; d0 + 64 <= D; d0 += 64)
        value_pass16(value_cache, table, first, S, block_size, row_stride, d0, p, o, GN, 4, F16);
    for (; d0 < D; d0 += 32)         /* D % 32 == 0 */
        value_pass16(value_cache, table, first, S, block_size, row_stride, d0, p, o, GN, 2, F16);
}

/* the AVX-512 value pass, for a bf16 or an f16 cache */
BF16_TARGET static void value_heads_avx512(const uint16_t *vh, const int32_t *table, int64_t first, int64_t S,
                                           int64_t block_size, int64_t row_stride, int64_t D, const float *const *p,
                                           float *const *o, int is_bf16, int64_t heads) {
#define HEADS(F16)                                                                                   \
    switch (heads) {                                                                                 \
    case 4: value_heads16(vh, table, first, S, block_size, row_stride, D, p, o, 4, F16); break;      \
    case 3: value_heads16(vh, table, first, S, block_size, row_stride, D, p, o, 3, F16); break;      \
    case 2: value_heads16(vh, table, first, S, block_size, row_stride, D, p, o, 2, F16); break;      \
    default: value_heads16(vh, table, first, S, block_size, row_stride, D, p, o, 1, F16); break;     \
    }
    if (is_bf16) HEADS(0) else HEADS(1)
#undef HEADS
}

#define KEYS16 16

/* Before query head `heads_done` of `heads` (1-based), the rows of key_group's `ahead` not yet requested up
 * to that head's share: each key row and its value row (every KV head of one token) into L2. */
static inline void prefetch_share(const uint16_t *const *ahead, int64_t ahead_n, int64_t *issued, int64_t heads_done,
                                  int64_t heads, const uint16_t *key_cache, const uint16_t *value_cache,
                                  int64_t row_bytes) {
    for (const int64_t upto = (heads_done * ahead_n + heads - 1) / heads; *issued < upto; (*issued)++) {
        const char *k = (const char *)ahead[*issued], *v = (const char *)(value_cache + (ahead[*issued] - key_cache));
        for (int64_t b = 0; b < row_bytes; b += 64) _mm_prefetch(k + b, _MM_HINT_T1), _mm_prefetch(v + b, _MM_HINT_T1);
    }
}

/* attend_range on AVX-512 BF16 CPUs (D % 32 == 0) for a 16-bit cache, 16 keys' dot products reduced together
 * into one vector, the values widened sixteen at a time. A bf16 cache (F16 = 0): the query rounded to bf16 (as
 * a bf16 model's own attention has it) times the keys in place by VDPBF16PS, about three times fewer
 * instructions a key than attend_range. An f16 cache (F16 = 1): each group of 16 keys widened once per KV head
 * (VCVTPH2PS) and multiplied in float32, attend_range's arithmetic in another order, half its instructions a
 * key. The same contract and the same prefetch as attend_range. */
BF16_TARGET static inline __attribute__((always_inline)) void attend_range16(
    const float *q, const uint16_t *key_cache, const uint16_t *value_cache, const int32_t *table, int64_t first,
    int64_t S, int64_t ahead_to, int64_t Hq, int64_t Hk, int64_t D, int64_t block_size, float scale,
    float *scores, float *out, float *maxs, float *sums, const int F16) {
    const int64_t row_stride = Hk * D, group = Hq / Hk;
    uint16_t qb[F16 ? 1 : Hq * D];         /* the query in bf16: at most MAX_HEAD_DIM x the heads, a few KB */
    float keys[F16 ? KEYS16 : 1][MAX_HEAD_DIM];     /* f16: a KV head's 16 keys, widened */
    if (!F16) rows_to_bf16(q, qb, Hq, D, D);
    const int64_t row_bytes = row_stride * 2;
    SlotWalk walk = slot_walk(table, block_size, first), prefetch = walk;
    int64_t prefetched = 0;
    for (int64_t i0 = 0; i0 < S; i0 += KEYS16) {
        const int64_t n = S - i0 < KEYS16 ? S - i0 : KEYS16;
        const uint16_t *rows[KEYS16], *ahead[KEYS16 + PREFETCH_KEYS];
        const int64_t ahead_n = key_group(&walk, &prefetch, &prefetched, i0, n, ahead_to, key_cache, row_stride,
                                          rows, ahead);
        int64_t issued = 0, head_done = 0;
        const __mmask16 valid = tail16(n);
        for (int64_t h = 0; h < Hk; h++) {
            if (F16)
                for (int64_t j = 0; j < KEYS16; j++)
                    for (int64_t c = 0; c < D / 16; c++)
                        _mm512_storeu_ps(keys[j] + 16 * c, j < n ? _mm512_cvtph_ps(_mm256_loadu_si256(
                                                                       (const __m256i *)(rows[j] + h * D + 16 * c)))
                                                                 : _mm512_setzero_ps());
            for (int64_t g = h * group; g < (h + 1) * group; g++) {
                prefetch_share(ahead, ahead_n, &issued, ++head_done, Hq, key_cache, value_cache, row_bytes);
                __m512 acc[KEYS16];
                for (int j = 0; j < KEYS16; j++) acc[j] = _mm512_setzero_ps();
                if (F16) {
                    for (int64_t c = 0; c < D / 16; c++) {
                        const __m512 qv = _mm512_loadu_ps(q + g * D + 16 * c);
                        for (int j = 0; j < KEYS16; j++)
                            acc[j] = _mm512_fmadd_ps(_mm512_loadu_ps(keys[j] + 16 * c), qv, acc[j]);
                    }
                } else {
                    for (int64_t c = 0; c < D / 32; c++) {
                        const __m512bh qv = (__m512bh)_mm512_loadu_si512((const void *)(qb + g * D + 32 * c));
                        for (int j = 0; j < KEYS16; j++)
                            if (j < n)
                                acc[j] = _mm512_dpbf16_ps(acc[j], qv, (__m512bh)_mm512_loadu_si512(
                                                                          (const void *)(rows[j] + h * D + 32 * c)));
                    }
                }
                _mm512_mask_storeu_ps(scores + g * S + i0, valid, _mm512_mul_ps(sums16(acc), _mm512_set1_ps(scale)));
            }
        }
    }
    softmax_rows(scores, Hq, S, maxs, sums);
    accumulate_values(scores, value_cache, table, first, S, Hq, Hk, D, block_size, !F16, out, value_heads_avx512);
}

BF16_TARGET static void attend_range_avx512(const float *q, const uint16_t *key_cache, const uint16_t *value_cache,
                                            const int32_t *table, int64_t first, int64_t S, int64_t ahead_to,
                                            int64_t Hq, int64_t Hk, int64_t D, int64_t block_size, float scale,
                                            int is_bf16, float *scores, float *out, float *maxs, float *sums) {
    if (is_bf16)
        attend_range16(q, key_cache, value_cache, table, first, S, ahead_to, Hq, Hk, D, block_size, scale, scores,
                       out, maxs, sums, 0);
    else
        attend_range16(q, key_cache, value_cache, table, first, S, ahead_to, Hq, Hk, D, block_size, scale, scores,
                       out, maxs, sums, 1);
}

/* One request's query heads q [Hq, D] (float32) against its keys [first, first + S), every KV head in one
 * task so that each cache row (all KV heads of a token, contiguous) is read from memory once. Writes each
 * query head's unnormalised output (sum of exp(s - max) v) to out [Hq, D] and its max and sum of
 * exp(s - max) to maxs, sums [Hq]. scores is scratch of Hq * S floats. The prefetch runs up to key
 * first + ahead_to (>= S): into the next range, when the same task attends it next. */
static void attend_range(const float *q, const uint16_t *key_cache, const uint16_t *value_cache,
                         const int32_t *table, int64_t first, int64_t S, int64_t ahead_to, int64_t Hq, int64_t Hk,
                         int64_t D, int64_t block_size, float scale, int is_bf16, float *scores, float *out,
                         float *maxs, float *sums) {
    if (use_bf16_dot && D % 32 == 0) {            /* the library's AVX-512 switch */
        attend_range_avx512(q, key_cache, value_cache, table, first, S, ahead_to, Hq, Hk, D, block_size, scale,
                            is_bf16, scores, out, maxs, sums);
        return;
    }
    const int64_t row_stride = Hk * D, group = Hq / Hk;
    float keys[KEYS][MAX_HEAD_DIM];
    /* scores: for eight keys at a time, each KV head's slice widened into L1, then each of its query
     * heads' eight dots reduced together */
    /* The cache offsets of the keys come from a walk of the block table (no divisions); a second walk runs
     * PREFETCH_KEYS keys ahead and prefetches their key and value rows into L2, a few rows between each
     * query head's dot products (nearer, into L1, fewer keys ahead, or all at once leaves the loads waiting
     * on memory: 15 -> 9 ms for a 16-request step of SmolLM2 on Zen 4). */
    const int64_t row_bytes = row_stride * 2;
    SlotWalk walk = slot_walk(table, block_size, first), prefetch = walk;
    int64_t prefetched = 0;
    for (int64_t i0 = 0; i0 < S; i0 += KEYS) {
        const int64_t n = S - i0 < KEYS ? S - i0 : KEYS;
        const uint16_t *rows[KEYS], *ahead[KEYS + PREFETCH_KEYS];
        const int64_t ahead_n = key_group(&walk, &prefetch, &prefetched, i0, n, ahead_to, key_cache, row_stride, rows,
                                          ahead);
        int64_t issued = 0, head_done = 0;
        for (int64_t h = 0; h < Hk; h++) {
            for (int64_t j = 0; j < KEYS; j++) {
                if (j < n)
                    for (int64_t d = 0; d < D; d += 8) _mm256_storeu_ps(keys[j] + d, load8(rows[j] + h * D + d, is_bf16));
                else
                    for (int64_t d = 0; d < D; d += 8) _mm256_storeu_ps(keys[j] + d, _mm256_setzero_ps());
            }
            for (int64_t g = h * group; g < (h + 1) * group; g++) {
                prefetch_share(ahead, ahead_n, &issued, ++head_done, Hq, key_cache, value_cache, row_bytes);
                const float *qg = q + g * D;
                __m256 a[KEYS];
                for (int j = 0; j < KEYS; j++) a[j] = _mm256_setzero_ps();
                for (int64_t d = 0; d < D; d += 8) {
                    __m256 qv = _mm256_loadu_ps(qg + d);
                    for (int j = 0; j < KEYS; j++) a[j] = _mm256_fmadd_ps(_mm256_loadu_ps(keys[j] + d), qv, a[j]);
                }
                __m256 sc = _mm256_mul_ps(hsum8(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]), _mm256_set1_ps(scale));
                float lanes[KEYS];
                _mm256_storeu_ps(lanes, sc);
                for (int64_t j = 0; j < n; j++) scores[g * S + i0 + j] = lanes[j];
            }
        }
    }
    softmax_rows(scores, Hq, S, maxs, sums);
    accumulate_values(scores, value_cache, table, first, S, Hq, Hk, D, block_size, is_bf16, out, value_heads_avx2);
}

/* q [R, Hq, D] float32; caches [num_blocks, block_size, Hk, D] 16-bit; block_tables [R, max_blocks] int32;
 * out [R, Hq, D] float32. Needs Hq % Hk == 0, Hq / Hk <= MAX_GROUP, D % 8 == 0, D <= MAX_HEAD_DIM.
 * A request's keys may be split into ranges, attended separately and merged (flash-decoding's split-K):
 * - by_length (decode steps): ranges of about SPLIT_KEYS, by the request's own length alone, so that a row
 *   gets the same bits whichever rows share its step (speculative decoding's verify rows equal the decode
 *   steps they stand for; a request's output does not depend on what else runs). With fewer rows than
 *   four a thread each range is a task, so every thread has work; with more, a task attends all of a
 *   row's ranges in turn, its prefetch running on from one into the next, so the ranges cost no more
 *   than a merge of Hq x D floats each.
 * - otherwise (prefill chunks as decode rows: thousands of rows): ranges only while there are fewer rows
 *   than four a thread, as many as give each thread four tasks. */
#define SPLIT_KEYS 64
#define MIN_SPLIT_KEYS 32
#define MAX_SPLITS 64
void paged_decode_attention16(const float *q, const uint16_t *key_cache, const uint16_t *value_cache,
                              const int32_t *seq_lens, const int32_t *block_tables, int64_t max_blocks,
                              float *out, int64_t R, int64_t Hq, int64_t Hk, int64_t D, int64_t block_size,
                              float scale, int is_bf16, int by_length, int num_threads) {
    const int few_rows = R < 4 * (int64_t)num_threads;
    int64_t batch_splits = 1;
    if (!by_length && few_rows) {
        int64_t longest = 1;
        for (int64_t r = 0; r < R; r++) longest = seq_lens[r] > longest ? seq_lens[r] : longest;
        const int64_t most = (longest + MIN_SPLIT_KEYS - 1) / MIN_SPLIT_KEYS;
        batch_splits = (4 * num_threads + R - 1) / R;
        batch_splits = batch_splits < most ? batch_splits : most;
    }
    /* range k of request r is first_range[r] + k; span: the most keys a range holds */
    int64_t *first_range = malloc(sizeof(int64_t) * (size_t)(R + 1)), span = 1;
    first_range[0] = 0;
    for (int64_t r = 0; r < R; r++) {
        const int64_t S = seq_lens[r] > 0 ? seq_lens[r] : 0;
        int64_t splits = by_length ? (S + SPLIT_KEYS - 1) / SPLIT_KEYS : batch_splits;
        splits = splits < 1 ? 1 : splits < MAX_SPLITS ? splits : MAX_SPLITS;
        const int64_t per = (S + splits - 1) / splits;
        first_range[r + 1] = first_range[r] + splits;
        span = per > span ? per : span;
    }
    const int64_t ranges = first_range[R], tasks = few_rows ? ranges : R;
    int64_t *range_row = malloc(sizeof(int64_t) * (size_t)ranges);
    for (int64_t r = 0; r < R; r++)
        for (int64_t k = first_range[r]; k < first_range[r + 1]; k++) range_row[k] = r;
    /* Unsplit, each range's unnormalised output goes straight to out and is normalised there. */
    float *part = ranges == R ? out : malloc(sizeof(float) * (size_t)(ranges * Hq) * (size_t)D);
    float *part_max = malloc(sizeof(float) * (size_t)(ranges * Hq) * 2), *part_sum = part_max + ranges * Hq;
#pragma omp parallel num_threads(num_threads)
    {
        float *scores = malloc(sizeof(float) * (size_t)span * (size_t)Hq);
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < tasks; task++) {
            const int64_t r = few_rows ? range_row[task] : task;
            const int64_t k0 = few_rows ? task : first_range[r], k1 = few_rows ? task + 1 : first_range[r + 1];
            const int64_t S = seq_lens[r] > 0 ? seq_lens[r] : 0, splits = first_range[r + 1] - first_range[r];
            const int64_t per = (S + splits - 1) / splits, last = (k1 - first_range[r]) * per;
            for (int64_t k = k0; k < k1; k++) {
                const int64_t split = k - first_range[r];
                const int64_t lo = split * per < S ? split * per : S, hi = lo + per < S ? lo + per : S;
                float *acc = part + k * Hq * D, *mx = part_max + k * Hq, *sm = part_sum + k * Hq;
                if (hi > lo) {
                    const int64_t ahead_to = (last < S ? last : S) - lo;     /* this task's keys from lo on */
                    attend_range(q + r * Hq * D, key_cache, value_cache, block_tables + r * max_blocks, lo, hi - lo,
                                 ahead_to, Hq, Hk, D, block_size, scale, is_bf16, scores, acc, mx, sm);
                } else {
                    for (int64_t g = 0; g < Hq; g++) mx[g] = -INFINITY, sm[g] = 0.0f;
                }
            }
        }
        free(scores);
        /* merge each query head's ranges: rescale each by exp(its max - the overall max) */
#pragma omp for schedule(static)
        for (int64_t head = 0; head < R * Hq; head++) {
            const int64_t r = head / Hq, g = head % Hq, first = first_range[r], splits = first_range[r + 1] - first;
            float top = -INFINITY, total = 0.0f, weights[MAX_SPLITS];
            for (int64_t s = 0; s < splits; s++) {
                const float m = part_max[(first + s) * Hq + g];
                top = m > top ? m : top;
            }
            for (int64_t s = 0; s < splits; s++) {
                const int64_t at = (first + s) * Hq + g;
                weights[s] = part_sum[at] > 0.0f ? expf(part_max[at] - top) : 0.0f;
                total += weights[s] * part_sum[at];
            }
            const float inv = total > 0.0f ? 1.0f / total : 0.0f;
            float *o = out + head * D;
            for (int64_t d = 0; d < D; d++) {
                float v = 0.0f;
                for (int64_t s = 0; s < splits; s++)
                    if (weights[s] > 0.0f) v += weights[s] * part[((first + s) * Hq + g) * D + d];
                o[d] = v * inv;
            }
        }
    }
    if (part != out) free(part);
    free(part_max), free(first_range), free(range_row);
}
