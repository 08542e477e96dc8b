/* The CPU kernels for 16-bit models on AVX2 (+FMA, F16C): what a decode step spends its time in. Their
 * sources, compiled together into one library by kernels/cpu/build.py, share this header:
 *   gemm.c         gemm16 (and the work sharing by stealing, the AVX-512 BF16 tiles)
 *   attention.c    paged_decode_attention16 (decode, and prefill as decode rows)
 *   decode.c       decode_forward16
 *   elementwise.c  rms_norm_f32, rope_f32, silu_and_mul_f32/_bf16, sample_exp_rows, the row helpers
 *   quant.c        gemm_q (GGUF-quantized weights, 8-bit activations, integer dot products),
 *                      matmul_weight (a Weight of either kind)
 *   quant_pack.c   repack_q, dequantize_packed_rows, the activations' quantization (quant.h)
 *
 * gemm16: y[M, N] = x[M, K] @ w[N, K]^T for 16-bit weights (bf16 or fp16) and float32 activations.
 * torch's own bf16/fp16 matmul on CPUs without AVX-512 BF16 or AMX is compute-bound on the conversion
 * (~8 GB/s of weights, slower than its fp32 path). Each weight vector is widened to float32 in registers
 * (a shift for bf16, F16C for fp16) and accumulated in float32, like a GPU's or oneDNN's half-precision
 * GEMM. At one or two rows (decode at small batch, bound by reading the weights) every weight row streams
 * front to back once, prefetched ahead; from three rows on (bound by arithmetic) two weight rows are widened
 * once per six activation rows, so the FMA units rather than the conversions set the pace.
 *
 * paged_decode_attention16: one query token per request against its keys and values in the paged 16-bit
 * KV cache, read in place through the block table (torch's reference gathers K and V into new tensors and
 * runs SDPA with a mask). Each request's task scores its query heads against eight keys at a time (sixteen
 * by VDPBF16PS for a bf16 cache on AVX-512 BF16 CPUs), takes a float32 softmax and accumulates the values
 * up to four query heads at a time.
 *
 * decode_forward16: every layer of a Llama-family decoder for a pure-decode step, in one call.
 *
 * rms_norm_f32, rope_f32, silu_and_mul_f32 (and silu_and_mul_bf16): the eager path's elementwise ops on
 * float32 rows, one pass each, rows in parallel. sample_exp_rows: the sampler's draw of full-vocabulary rows.
 *
 * Threads: OpenMP, in the same runtime as torch's (libgomp, resolved by soname).
 */
#ifndef RINGSERVE_CPU_KERNELS_H
#define RINGSERVE_CPU_KERNELS_H

#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>

/* functions one source defines for the others, not exported from the library */
#define INTERNAL __attribute__((visibility("hidden")))

/* AVX-512 BF16 code carries its own target; everything else is built for AVX2 */
#define BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

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

/* exp(x) for 8 floats: Cody-Waite range reduction to 2^n * exp(r), |r| <= ln2/2, and a degree-6 polynomial
 * (relative error ~2e-7, below float32's rounding of most inputs); inputs under -87.3 give 0, over 88.7 +inf
 * is not needed here (softmax and SiLU only pass values <= 0 or saturate through the reciprocal). */
static inline __m256 exp8(__m256 x) {
    const __m256 lo = _mm256_set1_ps(-87.3f), hi = _mm256_set1_ps(88.3f);
    __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    x = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(under, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

/* The eight sums of a0..a7 in one vector (lane j = sum of aj). */
static inline __m256 hsum8(__m256 a0, __m256 a1, __m256 a2, __m256 a3, __m256 a4, __m256 a5, __m256 a6,
                           __m256 a7) {
    __m256 s0 = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    __m256 s1 = _mm256_hadd_ps(_mm256_hadd_ps(a4, a5), _mm256_hadd_ps(a6, a7));
    return _mm256_add_ps(_mm256_permute2f128_ps(s0, s1, 0x20), _mm256_permute2f128_ps(s0, s1, 0x31));
}

/* float32 -> 16 bits, rounding to nearest even as torch's .to() does (NaN stays NaN). */
static inline uint16_t narrow1(float v, int is_bf16) {
    if (!is_bf16) return _cvtss_sh(v, _MM_FROUND_TO_NEAREST_INT);
    union { float f; uint32_t u; } c = {.f = v};
    if ((c.u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((c.u >> 16) | 0x40);
    return (uint16_t)((c.u + 0x7fffu + ((c.u >> 16) & 1u)) >> 16);
}

/* the first `left` of 16 lanes (all 16 from 16 on) */
static inline __mmask16 tail16(int64_t left) { return left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1u); }

/* 16 bf16 values (the masked lanes zero) widened to float32 */
BF16_TARGET static inline __m512 load16_bf16(const uint16_t *p, __mmask16 m) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16));
}

/* A matmul's weight as decode_forward16 and matmul_weight take it: one 16-bit matrix (type 1 F16 or 30 BF16,
 * num_parts 1), or up to WEIGHT_PARTS GGUF-quantized matrices (GGML type ids, repacked by repack_q)
 * stacked by output rows, each multiplied into its own columns of y (a fused q/k/v or gate/up whose parts
 * differ in type). */
#define WEIGHT_PARTS 4
typedef struct {
    const void *data[WEIGHT_PARTS];
    int64_t rows[WEIGHT_PARTS];
    int32_t type[WEIGHT_PARTS];
    int32_t num_parts;
} Weight;

/* gemm.c: fn(args, lo, hi) over the units [0, n), `step` at a time, each thread first taking its own
 * contiguous range, then stealing from the back of the others' */
INTERNAL void share_units(int64_t n, int64_t step, int num_threads, void (*fn)(const void *, int64_t, int64_t),
                          const void *args);

/* gemm.c: whether the AVX-512 BF16 paths run (set_bf16_dot) */
extern int use_bf16_dot;

/* gemm.c: x [M, K] float32 -> xb [M, Kp] bf16 (round to nearest even), zero past K up to Kp (a multiple
 * of 32); also the bf16 query of attention.c */
BF16_TARGET INTERNAL void rows_to_bf16(const float *x, uint16_t *xb, int64_t M, int64_t K, int64_t Kp);

void gemm16(const float *x, const uint16_t *w, float *y, int64_t M, int64_t N, int64_t K, int is_bf16,
            int num_threads);
void paged_decode_attention16(const float *q, const uint16_t *key_cache, const uint16_t *value_cache,
                              const int32_t *seq_lens, const int32_t *block_tables, int64_t max_blocks,
                              float *out, int64_t R, int64_t Hq, int64_t Hk, int64_t D, int64_t block_size,
                              float scale, int is_bf16, int num_threads);

void gemm_q(const float *x, int64_t ldx, const void *w, int type, float *y, int64_t ldy, int64_t M, int64_t N,
            int64_t K, int num_threads);
void matmul_weight(const Weight *w, const float *x, float *y, int64_t M, int64_t K, int precise, int num_threads);

/* elementwise.c: one thread's row helpers, also used by decode_forward16 */
INTERNAL void rms_norm_rows(const float *x, const uint16_t *w, float *out, int64_t T, int64_t n, float eps,
                            int is_bf16);
INTERNAL void add_rows(float *acc, const float *x, int64_t count);
INTERNAL void rope_heads(float *x, int64_t heads, int64_t D, const float *cos_sin);
INTERNAL void silu_mul_rows(const float *gu, float *out, int64_t T, int64_t I);

#endif
