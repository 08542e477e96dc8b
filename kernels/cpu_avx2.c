/* CPU kernels for 16-bit models on AVX2 (+FMA, F16C): the two operations that dominate a decode step.
 *
 * gemm16: y[M, N] = x[M, K] @ w[N, K]^T for 16-bit weights (bf16 or fp16) and float32 activations.
 * torch's own bf16/fp16 matmul on CPUs without AVX-512 BF16 or AMX is compute-bound on the conversion
 * (~8 GB/s of weights, slower than its fp32 path); decoding at small batch is bound by reading the
 * weights, so this kernel streams each weight row once, widens it to float32 in registers (a shift for
 * bf16, F16C for fp16) and multiplies it into up to two activation rows at a time. Accumulation is in
 * float32, like a GPU's or oneDNN's half-precision GEMM. Blocks of four weight rows stay in L1 while the
 * activation rows pass over them, so the weights come from memory once per call whatever M is.
 *
 * paged_decode_attention16: one query token per request against its keys and values in the paged 16-bit
 * KV cache, read in place through the block table (torch's reference gathers K and V into new tensors and
 * runs SDPA with a mask: ~4 ms per layer at 16 requests of 300 tokens here, ~10x this kernel's time).
 * Each (request, KV head) task scores its group of query heads against every key, takes a float32 softmax
 * and accumulates the values; grouped-query heads share one pass over K and V.
 *
 * Threads: OpenMP, in the same runtime as torch's (libgomp, resolved by soname).
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#define ROWS 4

static inline __m256 load8(const uint16_t *p, int is_bf16) {
    __m128i h = _mm_loadu_si128((const __m128i *)p);
    if (is_bf16)
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    return _mm256_cvtph_ps(h);
}

static inline float widen1(uint16_t v, int is_bf16) {
    if (is_bf16) {
        union { uint32_t u; float f; } c = {.u = (uint32_t)v << 16};
        return c.f;
    }
    return _cvtsh_ss(v);
}

static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Rows n0..n0+ROWS-1 of w against activation rows m and m+1 (two_rows) of x. */
static inline void block(const float *x, const uint16_t *w, float *y, int64_t m, int two_rows, int64_t n0,
                         int64_t N, int64_t K, int is_bf16) {
    const uint16_t *w0 = w + n0 * K, *w1 = w0 + K, *w2 = w1 + K, *w3 = w2 + K;
    const float *xa = x + m * K, *xb = two_rows ? xa + K : xa;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
    int64_t k = 0;
    for (; k + 8 <= K; k += 8) {
        __m256 v0 = load8(w0 + k, is_bf16), v1 = load8(w1 + k, is_bf16);
        __m256 v2 = load8(w2 + k, is_bf16), v3 = load8(w3 + k, is_bf16);
        __m256 xv = _mm256_loadu_ps(xa + k);
        a0 = _mm256_fmadd_ps(v0, xv, a0);
        a1 = _mm256_fmadd_ps(v1, xv, a1);
        a2 = _mm256_fmadd_ps(v2, xv, a2);
        a3 = _mm256_fmadd_ps(v3, xv, a3);
        if (two_rows) {
            __m256 xw = _mm256_loadu_ps(xb + k);
            b0 = _mm256_fmadd_ps(v0, xw, b0);
            b1 = _mm256_fmadd_ps(v1, xw, b1);
            b2 = _mm256_fmadd_ps(v2, xw, b2);
            b3 = _mm256_fmadd_ps(v3, xw, b3);
        }
    }
    float ya[ROWS] = {hsum(a0), hsum(a1), hsum(a2), hsum(a3)};
    float yb[ROWS] = {hsum(b0), hsum(b1), hsum(b2), hsum(b3)};
    const uint16_t *ws[ROWS] = {w0, w1, w2, w3};
    for (; k < K; k++) {
        for (int r = 0; r < ROWS; r++) {
            float wv = widen1(ws[r][k], is_bf16);
            ya[r] += wv * xa[k];
            yb[r] += wv * xb[k];
        }
    }
    for (int r = 0; r < ROWS; r++) {
        y[m * N + n0 + r] = ya[r];
        if (two_rows) y[(m + 1) * N + n0 + r] = yb[r];
    }
}

/* Leftover output rows (N not a multiple of ROWS), one at a time. */
static void single(const float *x, const uint16_t *w, float *y, int64_t M, int64_t n, int64_t N, int64_t K,
                   int is_bf16) {
    for (int64_t m = 0; m < M; m++) {
        float acc = 0.0f;
        for (int64_t k = 0; k < K; k++) acc += widen1(w[n * K + k], is_bf16) * x[m * K + k];
        y[m * N + n] = acc;
    }
}

void gemm16(const float *x, const uint16_t *w, float *y, int64_t M, int64_t N, int64_t K, int is_bf16,
            int num_threads) {
    int64_t blocks = N / ROWS;
#pragma omp parallel for schedule(static) num_threads(num_threads)
    for (int64_t b = 0; b < blocks; b++) {
        for (int64_t m = 0; m < M; m += 2) block(x, w, y, m, m + 1 < M, b * ROWS, N, K, is_bf16);
    }
    for (int64_t n = blocks * ROWS; n < N; n++) single(x, w, y, M, n, N, K, is_bf16);
}

#define MAX_GROUP 16
#define MAX_HEAD_DIM 256

/* q [R, Hq, D] float32; caches [num_blocks, block_size, Hk, D] 16-bit; block_tables [R, max_blocks] int32;
 * out [R, Hq, D] float32. Needs Hq % Hk == 0, Hq / Hk <= MAX_GROUP, D % 8 == 0, D <= MAX_HEAD_DIM. */
void paged_decode_attention16(const float *q, const uint16_t *key_cache, const uint16_t *value_cache,
                              const int32_t *seq_lens, const int32_t *block_tables, int64_t max_blocks,
                              float *out, int64_t R, int64_t Hq, int64_t Hk, int64_t D, int64_t block_size,
                              float scale, int is_bf16, int num_threads) {
    const int64_t group = Hq / Hk;
#pragma omp parallel for schedule(dynamic, 1) num_threads(num_threads)
    for (int64_t task = 0; task < R * Hk; task++) {
        const int64_t r = task / Hk, h = task % Hk, S = seq_lens[r];
        const int32_t *table = block_tables + r * max_blocks;
        const float *qh = q + (r * Hq + h * group) * D;
        float *scores = malloc(sizeof(float) * (size_t)(S > 0 ? S : 1) * (size_t)group);
        float acc[MAX_GROUP * MAX_HEAD_DIM];
        float maxs[MAX_GROUP], sums[MAX_GROUP];
        for (int64_t g = 0; g < group; g++) maxs[g] = -INFINITY, sums[g] = 0.0f;
        for (int64_t t = 0; t < S; t++) {
            const uint16_t *k = key_cache + ((int64_t)table[t / block_size] * block_size + t % block_size) * Hk * D
                                + h * D;
            for (int64_t g = 0; g < group; g++) {
                __m256 a = _mm256_setzero_ps(), b = a;
                int64_t d = 0;
                for (; d + 16 <= D; d += 16) {
                    a = _mm256_fmadd_ps(load8(k + d, is_bf16), _mm256_loadu_ps(qh + g * D + d), a);
                    b = _mm256_fmadd_ps(load8(k + d + 8, is_bf16), _mm256_loadu_ps(qh + g * D + d + 8), b);
                }
                if (d < D) a = _mm256_fmadd_ps(load8(k + d, is_bf16), _mm256_loadu_ps(qh + g * D + d), a);
                float s = hsum(_mm256_add_ps(a, b)) * scale;
                scores[g * S + t] = s;
                if (s > maxs[g]) maxs[g] = s;
            }
        }
        for (int64_t g = 0; g < group; g++) {
            float *sg = scores + g * S, total = 0.0f;
            for (int64_t t = 0; t < S; t++) total += (sg[t] = expf(sg[t] - maxs[g]));
            sums[g] = total;
        }
        /* values: 64 output dims of one query head in 8 registers, over all keys (V stays in L2) */
        for (int64_t d0 = 0; d0 < D; d0 += 64) {
            const int64_t chunks = (D - d0 < 64 ? D - d0 : 64) / 8;
            for (int64_t g = 0; g < group; g++) {
                __m256 a[8];
                for (int c = 0; c < 8; c++) a[c] = _mm256_setzero_ps();
                const float *sg = scores + g * S;
                for (int64_t t = 0; t < S; t++) {
                    const uint16_t *v = value_cache + h * D + d0
                        + ((int64_t)table[t / block_size] * block_size + t % block_size) * Hk * D;
                    __m256 p = _mm256_set1_ps(sg[t]);
                    for (int c = 0; c < chunks; c++) a[c] = _mm256_fmadd_ps(p, load8(v + 8 * c, is_bf16), a[c]);
                }
                for (int c = 0; c < chunks; c++) _mm256_storeu_ps(acc + g * D + d0 + 8 * c, a[c]);
            }
        }
        for (int64_t g = 0; g < group; g++) {
            float *o = out + (r * Hq + h * group + g) * D, inv = sums[g] > 0.0f ? 1.0f / sums[g] : 0.0f;
            for (int64_t d = 0; d < D; d++) o[d] = acc[g * D + d] * inv;
        }
        free(scores);
    }
}
