/* CPU kernels for 16-bit models on AVX2 (+FMA, F16C): what a decode step spends its time in.
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
 * float32 rows, one pass each, rows in parallel.
 *
 * Threads: OpenMP, in the same runtime as torch's (libgomp, resolved by soname).
 */
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>

/* Weight prefetches go to L2 (_MM_HINT_T1), far enough ahead to cover memory's latency at full bandwidth:
 * into L1 they streamed slower (likely capped by the core's few L1 miss buffers). On Zen 4 (bf16, medians
 * of three alternations) 30 layers of SmolLM2 at 1 / 2 / 4 / 16 rows took 9.5 / 11.6 / 12.0 / 14.4 ms with
 * L1 prefetches (1 KB ahead at one or two rows), 7.6 / 7.7 / 8.6 / 12.5 ms with these; the LM head
 * 1.7 / 2.2 / 2.8 / 3.3 -> 1.4 / 1.5 / 1.7 / 2.7 ms. */
#ifndef PAIR_AHEAD
#define PAIR_AHEAD 4
#endif
#ifndef PREFETCH
#define PREFETCH 8192
#endif

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

/* A leftover output row (N odd), against every activation row. */
static void single(const float *x, const uint16_t *w, float *y, int64_t M, int64_t n, int64_t N, int64_t K,
                   int is_bf16) {
    for (int64_t m = 0; m < M; m++) {
        float acc = 0.0f;
        for (int64_t k = 0; k < K; k++) acc += widen1(w[n * K + k], is_bf16) * x[m * K + k];
        y[m * N + n] = acc;
    }
}

/* Rows n0, n0 + 1 of w against MR (<= 6) activation rows from m0: each weight vector is widened once for
 * all MR rows (12 FMAs per two widenings keep the FMA units busy), the activations come from L1. */
static inline __attribute__((always_inline)) void pair(const float *x, const uint16_t *w, float *y, int64_t m0,
                                                       int64_t n0, int64_t N, int64_t K, int is_bf16, const int MR) {
    const uint16_t *w0 = w + n0 * K, *w1 = w0 + K;
    const float *xr = x + m0 * K;
    __m256 a[6], b[6];
    for (int j = 0; j < MR; j++) a[j] = b[j] = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 8 <= K; k += 8) {
        if ((k & 31) == 0 && m0 == 0) {     /* the rows PAIR_AHEAD further on, while these are in use */
            _mm_prefetch((const char *)(w0 + PAIR_AHEAD * K + k), _MM_HINT_T1);
            _mm_prefetch((const char *)(w1 + PAIR_AHEAD * K + k), _MM_HINT_T1);
        }
        __m256 v0 = load8(w0 + k, is_bf16), v1 = load8(w1 + k, is_bf16);
        for (int j = 0; j < MR; j++) {
            __m256 xv = _mm256_loadu_ps(xr + j * K + k);
            a[j] = _mm256_fmadd_ps(v0, xv, a[j]);
            b[j] = _mm256_fmadd_ps(v1, xv, b[j]);
        }
    }
    for (int j = 0; j < MR; j++) {
        float ya = hsum(a[j]), yb = hsum(b[j]);
        for (int64_t t = k; t < K; t++) {
            ya += widen1(w0[t], is_bf16) * xr[j * K + t];
            yb += widen1(w1[t], is_bf16) * xr[j * K + t];
        }
        y[(m0 + j) * N + n0] = ya;
        y[(m0 + j) * N + n0 + 1] = yb;
    }
}

static void pair_rows(const float *x, const uint16_t *w, float *y, int64_t M, int64_t n0, int64_t N, int64_t K,
                      int is_bf16) {
    int64_t m0 = 0;
    for (; m0 + 6 <= M; m0 += 6) pair(x, w, y, m0, n0, N, K, is_bf16, 6);
    switch (M - m0) {
    case 5: pair(x, w, y, m0, n0, N, K, is_bf16, 5); break;
    case 4: pair(x, w, y, m0, n0, N, K, is_bf16, 4); break;
    case 3: pair(x, w, y, m0, n0, N, K, is_bf16, 3); break;
    case 2: pair(x, w, y, m0, n0, N, K, is_bf16, 2); break;
    case 1: pair(x, w, y, m0, n0, N, K, is_bf16, 1); break;
    default: break;
    }
}

/* MR (1 or 2) activation rows against weight rows [n_begin, n_end), each weight row read front to back as
 * one stream (what the hardware prefetcher follows best: ~25% more bandwidth than four interleaved rows). */
static inline __attribute__((always_inline)) void gemv_rows(const float *x, const uint16_t *w, float *y,
                                                            int64_t n_begin, int64_t n_end, int64_t N, int64_t K,
                                                            int is_bf16, const int MR) {
    const float *x1 = MR == 2 ? x + K : x;
    for (int64_t n = n_begin; n < n_end; n++) {
        const uint16_t *wr = w + n * K;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
        int64_t k = 0;
        for (; k + 32 <= K; k += 32) {
            _mm_prefetch((const char *)(wr + k) + PREFETCH, _MM_HINT_T1);
            __m256 v0 = load8(wr + k, is_bf16), v1 = load8(wr + k + 8, is_bf16);
            __m256 v2 = load8(wr + k + 16, is_bf16), v3 = load8(wr + k + 24, is_bf16);
            a0 = _mm256_fmadd_ps(v0, _mm256_loadu_ps(x + k), a0);
            a1 = _mm256_fmadd_ps(v1, _mm256_loadu_ps(x + k + 8), a1);
            a2 = _mm256_fmadd_ps(v2, _mm256_loadu_ps(x + k + 16), a2);
            a3 = _mm256_fmadd_ps(v3, _mm256_loadu_ps(x + k + 24), a3);
            if (MR == 2) {
                b0 = _mm256_fmadd_ps(v0, _mm256_loadu_ps(x1 + k), b0);
                b1 = _mm256_fmadd_ps(v1, _mm256_loadu_ps(x1 + k + 8), b1);
                b2 = _mm256_fmadd_ps(v2, _mm256_loadu_ps(x1 + k + 16), b2);
                b3 = _mm256_fmadd_ps(v3, _mm256_loadu_ps(x1 + k + 24), b3);
            }
        }
        for (; k + 8 <= K; k += 8) {
            __m256 v = load8(wr + k, is_bf16);
            a0 = _mm256_fmadd_ps(v, _mm256_loadu_ps(x + k), a0);
            if (MR == 2) b0 = _mm256_fmadd_ps(v, _mm256_loadu_ps(x1 + k), b0);
        }
        float ya = hsum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
        float yb = hsum(_mm256_add_ps(_mm256_add_ps(b0, b1), _mm256_add_ps(b2, b3)));
        for (; k < K; k++) {
            ya += widen1(wr[k], is_bf16) * x[k];
            yb += widen1(wr[k], is_bf16) * x1[k];
        }
        y[n] = ya;
        if (MR == 2) y[N + n] = yb;
    }
}

/* ---------------------------------------------------------------- row ranges shared out by stealing
 * Thread t owns the t-th of equal contiguous ranges of n units (weight rows or tiles) and takes it from the
 * front, `step` units at a time; a thread out of work takes from the back of the others' ranges. Each
 * thread streams one long run of the weights (what the hardware prefetcher follows), the threads end
 * together (dynamic chunks left one idle for up to a chunk, 2-7 us a call; the 120 weight matrices of a
 * SmolLM2 decode step at one row on Zen 4: ~8.1 -> ~7.6 ms, the whole step ~11.6 -> ~11.1 ms), and a
 * thread the OS preempts (the frontend and scheduler share these cores) delays a call by `step` units, not
 * by its share. */
#define MAX_TEAM 64
#ifndef STEAL_ROWS
#define STEAL_ROWS 8
#endif
typedef struct {
    _Alignas(64) uint64_t range;        /* [lo, hi) as lo | hi << 32; one cache line each */
} Share;

static inline int take_units(uint64_t *share, int64_t step, int from_back, int64_t *lo_out, int64_t *hi_out) {
    uint64_t cur = __atomic_load_n(share, __ATOMIC_ACQUIRE);
    for (;;) {
        const int64_t lo = (uint32_t)cur, hi = (int64_t)(cur >> 32);
        if (lo >= hi) return 0;
        const int64_t a = from_back ? (hi - step > lo ? hi - step : lo) : lo;
        const int64_t b = from_back ? hi : (lo + step < hi ? lo + step : hi);
        const uint64_t next = from_back ? (uint64_t)a << 32 | (uint64_t)lo : (uint64_t)hi << 32 | (uint64_t)b;
        if (__atomic_compare_exchange_n(share, &cur, next, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
            *lo_out = a, *hi_out = b;
            return 1;
        }
    }
}

typedef struct {
    const void *x;
    const uint16_t *w;
    float *y;
    int64_t M, N, K, Kp;
    int is_bf16;
} MatmulArgs;

/* fn(args, lo, hi) over [0, n) in ranges of at most `step` units, on num_threads threads */
static void share_units(int64_t n, int64_t step, int num_threads, void (*fn)(const MatmulArgs *, int64_t, int64_t),
                        const MatmulArgs *args) {
    const int team = num_threads < MAX_TEAM ? num_threads : MAX_TEAM;
    Share shares[MAX_TEAM];
    for (int t = 0; t < team; t++) shares[t].range = (uint64_t)((t + 1) * n / team) << 32 | (uint64_t)(t * n / team);
#pragma omp parallel num_threads(team)
    {
        const int me = omp_get_thread_num();
        int64_t lo, hi;
        /* its own range, then the others' (also those of threads the runtime did not start) */
        for (int v = 0; v < team; v++)
            while (take_units(&shares[(me + v) % team].range, step, v != 0, &lo, &hi)) fn(args, lo, hi);
    }
}

static void gemv_range(const MatmulArgs *a, int64_t lo, int64_t hi) {
    if (a->M == 2) gemv_rows(a->x, a->w, a->y, lo, hi, a->N, a->K, a->is_bf16, 2);
    else gemv_rows(a->x, a->w, a->y, lo, hi, a->N, a->K, a->is_bf16, 1);
}

/* ---------------------------------------------------------------- AVX-512 BF16 (e.g. AMD Zen 4)
 * On CPUs with VDPBF16PS, bf16 weights times activations rounded to bf16, accumulated in float32 (what
 * oneDNN's and a GPU's bf16 GEMMs do), run at twice the float32 FMA rate: one instruction takes 32 products
 * of a row pair. Used by gemm16 from three rows on for bf16 weights when set_bf16_dot(1) was called (the
 * caller checks the CPU); these functions carry their own target, the rest of the file stays AVX2. */
#define BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
#define BF16_MR 6
#define BF16_NR 4
#ifndef DOT_AHEAD
#define DOT_AHEAD 4
#endif
#ifndef STEAL_TILES
#define STEAL_TILES 2
#endif

static int use_bf16_dot = 0;

int set_bf16_dot(int on) {
    const int was = use_bf16_dot;
    use_bf16_dot = on;
    return was;
}

/* the first `left` of 16 lanes (all 16 from 16 on) */
static inline __mmask16 tail16(int64_t left) { return left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1u); }

/* 16 bf16 values (the masked lanes zero) widened to float32 */
BF16_TARGET static inline __m512 load16_bf16(const uint16_t *p, __mmask16 m) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16));
}

/* x [M, K] float32 -> xb [M, Kp] bf16 (round to nearest even), zero past K up to Kp (a multiple of 32) */
BF16_TARGET static void rows_to_bf16(const float *x, uint16_t *xb, int64_t M, int64_t K, int64_t Kp) {
    for (int64_t m = 0; m < M; m++)
        for (int64_t k = 0; k < Kp; k += 32) {
            const int64_t lo = K - k < 0 ? 0 : (K - k > 16 ? 16 : K - k);
            const int64_t hi = K - k - 16 < 0 ? 0 : (K - k - 16 > 16 ? 16 : K - k - 16);
            __m512 a = _mm512_maskz_loadu_ps((__mmask16)((1u << lo) - 1u), x + m * K + k);
            __m512 b = _mm512_maskz_loadu_ps((__mmask16)((1u << hi) - 1u), x + m * K + k + 16);
            _mm512_storeu_si512((void *)(xb + m * Kp + k), (__m512i)_mm512_cvtne2ps_pbh(b, a));
        }
}

/* the sums of four accumulators, in order */
BF16_TARGET static inline __m128 reduce4(__m512 a0, __m512 a1, __m512 a2, __m512 a3) {
#define HALVES(v) _mm256_add_ps(_mm512_castps512_ps256(v), \
                                _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)))
    __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(HALVES(a0), HALVES(a1)), _mm256_hadd_ps(HALVES(a2), HALVES(a3)));
#undef HALVES
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

/* weight rows [n0, n0 + NR) (NR 4 or 1) against MR activation rows from m0. bf16 (F16 == 0): xa holds the
 * rows in bf16, Kp columns each (zero past K), and VDPBF16PS takes 32 products a step, the weights' tail past
 * K masked to zero. fp16 (F16 == 1): xa holds the float32 rows (K columns), each fp16 weight vector is
 * widened to float32 (VCVTPH2PS, exact) and multiplied by FMAs, 16 a step: float32 arithmetic throughout. */
BF16_TARGET static inline __attribute__((always_inline)) void dot_tile(
        const void *xa, const uint16_t *w, float *y, int64_t m0, int64_t n0, int64_t N, int64_t K, int64_t Kp,
        const int MR, const int NR, const int pass, const int passes, const int F16) {
    const uint16_t *xb = xa;
    const float *xf = xa;
    __m512 acc[BF16_MR][BF16_NR];
    for (int j = 0; j < MR; j++)
        for (int i = 0; i < NR; i++) acc[j][i] = _mm512_setzero_ps();
    for (int64_t k = 0; k < (F16 ? K : Kp); k += F16 ? 16 : 32) {
        if (NR == BF16_NR && (k & 31) == 0)  /* the tile DOT_AHEAD further on into L2, spread over passes */
            for (int i = pass; i < NR; i += passes)
                _mm_prefetch((const char *)(w + (n0 + DOT_AHEAD * BF16_NR + i) * K + k), _MM_HINT_T1);
        if (F16) {
            const __mmask16 mask = tail16(K - k);
            __m512 wv[BF16_NR];
            for (int i = 0; i < NR; i++) wv[i] = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, w + (n0 + i) * K + k));
            for (int j = 0; j < MR; j++) {
                const __m512 xv = _mm512_maskz_loadu_ps(mask, xf + (m0 + j) * K + k);
                for (int i = 0; i < NR; i++) acc[j][i] = _mm512_fmadd_ps(xv, wv[i], acc[j][i]);
            }
        } else {
            const __mmask32 mask = K - k >= 32 ? 0xffffffffu : (__mmask32)((1u << (K - k)) - 1u);
            __m512i wv[BF16_NR];
            for (int i = 0; i < NR; i++) wv[i] = _mm512_maskz_loadu_epi16(mask, w + (n0 + i) * K + k);
            for (int j = 0; j < MR; j++) {
                const __m512bh xv = (__m512bh)_mm512_loadu_si512((const void *)(xb + (m0 + j) * Kp + k));
                for (int i = 0; i < NR; i++) acc[j][i] = _mm512_dpbf16_ps(acc[j][i], xv, (__m512bh)wv[i]);
            }
        }
    }
    for (int j = 0; j < MR; j++) {
        if (NR == 4) _mm_storeu_ps(y + (m0 + j) * N + n0, reduce4(acc[j][0], acc[j][1], acc[j][2], acc[j][3]));
        else y[(m0 + j) * N + n0] = _mm512_reduce_add_ps(acc[j][0]);
    }
}

BF16_TARGET static inline __attribute__((always_inline)) void dot_rows(
        const void *xa, const uint16_t *w, float *y, int64_t M, int64_t n0, int64_t N, int64_t K, int64_t Kp,
        const int NR, const int F16) {
    /* the rows in ceil(M / 6) tiles of near-equal height (8 rows: 4 + 4, not 6 + 2: a two-row tile
     * loads as many weight vectors per product as it multiplies) */
    const int64_t tiles = (M + BF16_MR - 1) / BF16_MR;
    for (int64_t t = 0, m0 = 0; t < tiles; t++) {
        const int64_t rows = (M - m0) / (tiles - t) + ((M - m0) % (tiles - t) ? 1 : 0);
        switch (rows) {
        case 6: dot_tile(xa, w, y, m0, n0, N, K, Kp, 6, NR, (int)t, (int)tiles, F16); break;
        case 5: dot_tile(xa, w, y, m0, n0, N, K, Kp, 5, NR, (int)t, (int)tiles, F16); break;
        case 4: dot_tile(xa, w, y, m0, n0, N, K, Kp, 4, NR, (int)t, (int)tiles, F16); break;
        case 3: dot_tile(xa, w, y, m0, n0, N, K, Kp, 3, NR, (int)t, (int)tiles, F16); break;
        case 2: dot_tile(xa, w, y, m0, n0, N, K, Kp, 2, NR, (int)t, (int)tiles, F16); break;
        default: dot_tile(xa, w, y, m0, n0, N, K, Kp, 1, NR, (int)t, (int)tiles, F16); break;
        }
        m0 += rows;
    }
}

BF16_TARGET static void dot_rows_bf16(const void *xa, const uint16_t *w, float *y, int64_t M, int64_t n0, int64_t N,
                                      int64_t K, int64_t Kp, int NR) {
    if (NR == BF16_NR) dot_rows(xa, w, y, M, n0, N, K, Kp, BF16_NR, 0);
    else dot_rows(xa, w, y, M, n0, N, K, Kp, 1, 0);
}

BF16_TARGET static void dot_rows_f16(const void *xa, const uint16_t *w, float *y, int64_t M, int64_t n0, int64_t N,
                                     int64_t K, int64_t Kp, int NR) {
    if (NR == BF16_NR) dot_rows(xa, w, y, M, n0, N, K, Kp, BF16_NR, 1);
    else dot_rows(xa, w, y, M, n0, N, K, Kp, 1, 1);
}

/* tiles [lo, hi) of four weight rows against every activation row (share_units' callbacks) */
BF16_TARGET static void tiles_bf16(const MatmulArgs *a, int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; t++) dot_rows_bf16(a->x, a->w, a->y, a->M, t * BF16_NR, a->N, a->K, a->Kp, BF16_NR);
}

BF16_TARGET static void tiles_f16(const MatmulArgs *a, int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; t++) dot_rows_f16(a->x, a->w, a->y, a->M, t * BF16_NR, a->N, a->K, a->Kp, BF16_NR);
}

/* From three rows on, on AVX-512 BF16 CPUs (when set_bf16_dot(1) was called): bf16 weights by VDPBF16PS,
 * fp16 weights widened sixteen at a time (AVX-512F) into float32 FMAs; the same tiles, prefetch and sharing. */
BF16_TARGET static void gemm_avx512(const float *x, const uint16_t *w, float *y, int64_t M, int64_t N, int64_t K,
                                    int is_bf16, int num_threads) {
    const int64_t Kp = (K + 31) / 32 * 32;
    uint16_t *xb = NULL;
    if (is_bf16) {
        xb = aligned_alloc(64, (size_t)(M * Kp * 2 + 63) / 64 * 64);
        rows_to_bf16(x, xb, M, K, Kp);
    }
    const void *xa = is_bf16 ? (const void *)xb : (const void *)x;
    void (*rows_fn)(const void *, const uint16_t *, float *, int64_t, int64_t, int64_t, int64_t, int64_t, int) =
        is_bf16 ? dot_rows_bf16 : dot_rows_f16;
    const int64_t tiles = N / BF16_NR;
    /* tiles shared out by stealing, STEAL_TILES at a time (share_units): each thread streams one long run of
     * the weights, which the prefetch above follows once under way (dynamic chunks of up to 32 tiles before:
     * ~6% slower at 4, 8 and 16 rows, 30 layers of SmolLM2 on Zen 4) */
    const MatmulArgs args = {xa, w, y, M, N, K, Kp, is_bf16};
    share_units(tiles, STEAL_TILES, num_threads, is_bf16 ? tiles_bf16 : tiles_f16, &args);
    for (int64_t n = tiles * BF16_NR; n < N; n++) rows_fn(xa, w, y, M, n, N, K, Kp, 1);
    free(xb);
}

void gemm16(const float *x, const uint16_t *w, float *y, int64_t M, int64_t N, int64_t K, int is_bf16,
            int num_threads) {
    if (M <= 2) {             /* bound by reading the weights: rows shared out by stealing (above) */
        const MatmulArgs args = {x, w, y, M, N, K, K, is_bf16};
        share_units(N, STEAL_ROWS, num_threads, gemv_range, &args);
        return;
    }
    /* Dynamic chunks: a thread the OS preempts (the frontend and scheduler share these cores) delays the
     * call by one chunk, not by its whole static share. */
    if (use_bf16_dot) {
        gemm_avx512(x, w, y, M, N, K, is_bf16, num_threads);
        return;
    }
    int64_t pairs = N / 2;
#pragma omp parallel for schedule(dynamic, 16) num_threads(num_threads)
    for (int64_t b = 0; b < pairs; b++) pair_rows(x, w, y, M, b * 2, N, K, is_bf16);
    if (N % 2) single(x, w, y, M, N - 1, N, K, is_bf16);
}


/* ---------------------------------------------------------------- vector helpers */

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
 * to PREFETCH_KEYS further (not yet handed out) into ahead, for the caller to prefetch a few at a time
 * between its query heads' dot products (all at once they stall on the core's outstanding misses).
 * Returns how many rows went into ahead. */
static inline int64_t key_group(SlotWalk *walk, SlotWalk *prefetch, int64_t *prefetched, int64_t i0, int64_t n,
                                int64_t S, const uint16_t *key_cache, int64_t row_stride, const uint16_t **rows,
                                const uint16_t **ahead) {
    int64_t ahead_n = 0;
    for (; *prefetched < i0 + n + PREFETCH_KEYS && *prefetched < S; (*prefetched)++)
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

/* attend_range on AVX-512 BF16 CPUs for a bf16 cache (when set_bf16_dot(1) was called and D % 32 == 0):
 * the query rounded to bf16 (as a bf16 model's own attention has it) times the keys in place by VDPBF16PS,
 * 16 keys' dot products reduced together into one vector; the values widened sixteen at a time. The same
 * contract and the same prefetch as attend_range, about three times fewer instructions a key. */
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

/* o[g][d0 .. d0 + 16 NV) += sum_i p[g][i] v_(first + i)[d0 ..] for GN <= 4 query heads, NV <= 4 */
BF16_TARGET static inline __attribute__((always_inline)) void value_pass16(
    const uint16_t *value_cache, const int32_t *table, int64_t first, int64_t S, int64_t block_size,
    int64_t row_stride, int64_t d0, const float *const *p, float *const *o, const int GN, const int NV) {
    __m512 a[4][4];
    for (int g = 0; g < GN; g++)
        for (int c = 0; c < NV; c++) a[g][c] = _mm512_loadu_ps(o[g] + d0 + 16 * c);
    SlotWalk walk = slot_walk(table, block_size, first);
    for (int64_t i = 0; i < S; i++) {
        const uint16_t *v = value_cache + next_slot(&walk) * row_stride + d0;
        __m512 pg[4];
        for (int g = 0; g < GN; g++) pg[g] = _mm512_set1_ps(p[g][i]);
        for (int c = 0; c < NV; c++) {
            const __m512 vv = load16_bf16(v + 16 * c, 0xffff);
            for (int g = 0; g < GN; g++) a[g][c] = _mm512_fmadd_ps(pg[g], vv, a[g][c]);
        }
    }
    for (int g = 0; g < GN; g++)
        for (int c = 0; c < NV; c++) _mm512_storeu_ps(o[g] + d0 + 16 * c, a[g][c]);
}

BF16_TARGET static inline __attribute__((always_inline)) void value_heads16(
    const uint16_t *value_cache, const int32_t *table, int64_t first, int64_t S, int64_t block_size,
    int64_t row_stride, int64_t D, const float *const *p, float *const *o, const int GN) {
    int64_t d0 = 0;
    for (; d0 + 64 <= D; d0 += 64)
        value_pass16(value_cache, table, first, S, block_size, row_stride, d0, p, o, GN, 4);
    for (; d0 < D; d0 += 32)         /* D % 32 == 0 */
        value_pass16(value_cache, table, first, S, block_size, row_stride, d0, p, o, GN, 2);
}

BF16_TARGET static void value_heads_bf16(const uint16_t *vh, const int32_t *table, int64_t first, int64_t S,
                                         int64_t block_size, int64_t row_stride, int64_t D, const float *const *p,
                                         float *const *o, int is_bf16, int64_t heads) {
    (void)is_bf16;                   /* a bf16 cache */
    switch (heads) {
    case 4: value_heads16(vh, table, first, S, block_size, row_stride, D, p, o, 4); break;
    case 3: value_heads16(vh, table, first, S, block_size, row_stride, D, p, o, 3); break;
    case 2: value_heads16(vh, table, first, S, block_size, row_stride, D, p, o, 2); break;
    default: value_heads16(vh, table, first, S, block_size, row_stride, D, p, o, 1); break;
    }
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

BF16_TARGET static void attend_range_bf16(const float *q, const uint16_t *key_cache, const uint16_t *value_cache,
                                          const int32_t *table, int64_t first, int64_t S, int64_t Hq, int64_t Hk,
                                          int64_t D, int64_t block_size, float scale, float *scores, float *out,
                                          float *maxs, float *sums) {
    const int64_t row_stride = Hk * D, group = Hq / Hk, chunks = D / 32;
    uint16_t qb[Hq * D];                   /* at most MAX_HEAD_DIM x the heads: a few KB */
    rows_to_bf16(q, qb, Hq, D, D);
    const int64_t row_bytes = row_stride * 2;
    SlotWalk walk = slot_walk(table, block_size, first), prefetch = walk;
    int64_t prefetched = 0;
    for (int64_t i0 = 0; i0 < S; i0 += KEYS16) {
        const int64_t n = S - i0 < KEYS16 ? S - i0 : KEYS16;
        const uint16_t *rows[KEYS16], *ahead[KEYS16 + PREFETCH_KEYS];
        const int64_t ahead_n = key_group(&walk, &prefetch, &prefetched, i0, n, S, key_cache, row_stride, rows,
                                          ahead);
        int64_t issued = 0, head_done = 0;
        const __mmask16 valid = tail16(n);
        for (int64_t h = 0; h < Hk; h++)
            for (int64_t g = h * group; g < (h + 1) * group; g++) {
                prefetch_share(ahead, ahead_n, &issued, ++head_done, Hq, key_cache, value_cache, row_bytes);
                const uint16_t *qg = qb + g * D;
                __m512 acc[KEYS16];
                for (int j = 0; j < KEYS16; j++) acc[j] = _mm512_setzero_ps();
                for (int64_t c = 0; c < chunks; c++) {
                    const __m512bh qv = (__m512bh)_mm512_loadu_si512((const void *)(qg + 32 * c));
                    for (int j = 0; j < KEYS16; j++)
                        if (j < n)
                            acc[j] = _mm512_dpbf16_ps(acc[j], qv,
                                                      (__m512bh)_mm512_loadu_si512((const void *)(rows[j] + h * D + 32 * c)));
                }
                _mm512_mask_storeu_ps(scores + g * S + i0, valid, _mm512_mul_ps(sums16(acc), _mm512_set1_ps(scale)));
            }
    }
    softmax_rows(scores, Hq, S, maxs, sums);
    accumulate_values(scores, value_cache, table, first, S, Hq, Hk, D, block_size, 1, out, value_heads_bf16);
}

/* One request's query heads q [Hq, D] (float32) against its keys [first, first + S), every KV head in one
 * task so that each cache row (all KV heads of a token, contiguous) is read from memory once. Writes each
 * query head's unnormalised output (sum of exp(s - max) v) to out [Hq, D] and its max and sum of
 * exp(s - max) to maxs, sums [Hq]. scores is scratch of Hq * S floats. */
static void attend_range(const float *q, const uint16_t *key_cache, const uint16_t *value_cache,
                         const int32_t *table, int64_t first, int64_t S, int64_t Hq, int64_t Hk, int64_t D,
                         int64_t block_size, float scale, int is_bf16, float *scores, float *out, float *maxs,
                         float *sums) {
    if (is_bf16 && use_bf16_dot && D % 32 == 0) {
        attend_range_bf16(q, key_cache, value_cache, table, first, S, Hq, Hk, D, block_size, scale, scores, out,
                          maxs, sums);
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
        const int64_t ahead_n = key_group(&walk, &prefetch, &prefetched, i0, n, S, key_cache, row_stride, rows, ahead);
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
 * One task per request; with fewer requests than a few per thread (small batches), each request's keys are
 * split into ranges of at least MIN_SPLIT_KEYS, attended separately and merged (flash-decoding's split-K),
 * so every thread has work. */
#define MIN_SPLIT_KEYS 32
#define MAX_SPLITS 64
void paged_decode_attention16(const float *q, const uint16_t *key_cache, const uint16_t *value_cache,
                              const int32_t *seq_lens, const int32_t *block_tables, int64_t max_blocks,
                              float *out, int64_t R, int64_t Hq, int64_t Hk, int64_t D, int64_t block_size,
                              float scale, int is_bf16, int num_threads) {
    int64_t longest = 1;
    for (int64_t r = 0; r < R; r++) longest = seq_lens[r] > longest ? seq_lens[r] : longest;
    int64_t splits = 1;
    if (R < 4 * (int64_t)num_threads) {
        splits = (4 * num_threads + R - 1) / R;
        const int64_t most = (longest + MIN_SPLIT_KEYS - 1) / MIN_SPLIT_KEYS;
        splits = splits < most ? splits : most;
        splits = splits < MAX_SPLITS ? splits : MAX_SPLITS;
    }
    const int64_t span = (longest + splits - 1) / splits;       /* keys per range at most */
    const int64_t jobs = R * splits;
    /* Unsplit, each job's unnormalised output goes straight to out and is normalised there. */
    float *part = splits == 1 ? out : malloc(sizeof(float) * (size_t)(jobs * Hq) * (size_t)D);
    float *part_max = malloc(sizeof(float) * (size_t)(jobs * Hq) * 2), *part_sum = part_max + jobs * Hq;
#pragma omp parallel num_threads(num_threads)
    {
        float *scores = malloc(sizeof(float) * (size_t)span * (size_t)Hq);
#pragma omp for schedule(dynamic, 1)
        for (int64_t job = 0; job < jobs; job++) {
            const int64_t r = job / splits, split = job % splits;
            const int64_t S = seq_lens[r], per = (S + splits - 1) / splits;
            const int64_t lo = split * per < S ? split * per : S, hi = lo + per < S ? lo + per : S;
            float *acc = part + job * Hq * D, *mx = part_max + job * Hq, *sm = part_sum + job * Hq;
            if (hi > lo) {
                attend_range(q + r * Hq * D, key_cache, value_cache, block_tables + r * max_blocks, lo, hi - lo,
                             Hq, Hk, D, block_size, scale, is_bf16, scores, acc, mx, sm);
            } else {
                for (int64_t g = 0; g < Hq; g++) mx[g] = -INFINITY, sm[g] = 0.0f;
            }
        }
        free(scores);
        /* merge each query head's ranges: rescale each by exp(its max - the overall max) */
#pragma omp for schedule(static)
        for (int64_t head = 0; head < R * Hq; head++) {
            const int64_t r = head / Hq, g = head % Hq;
            float top = -INFINITY, total = 0.0f, weights[MAX_SPLITS];
            for (int64_t s = 0; s < splits; s++) {
                const float m = part_max[(r * splits + s) * Hq + g];
                top = m > top ? m : top;
            }
            for (int64_t s = 0; s < splits; s++) {
                const int64_t at = (r * splits + s) * Hq + g;
                weights[s] = part_sum[at] > 0.0f ? expf(part_max[at] - top) : 0.0f;
                total += weights[s] * part_sum[at];
            }
            const float inv = total > 0.0f ? 1.0f / total : 0.0f;
            float *o = out + head * D;
            for (int64_t d = 0; d < D; d++) {
                float v = 0.0f;
                for (int64_t s = 0; s < splits; s++)
                    if (weights[s] > 0.0f) v += weights[s] * part[((r * splits + s) * Hq + g) * D + d];
                o[d] = v * inv;
            }
        }
    }
    if (part != out) free(part);
    free(part_max);
}

/* ---------------------------------------------------------------- SiLU-and-mul of bf16 rows (AVX-512 BF16)
 * Where bf16 is native, the SwiGLU gate comes out of torch's matmul in bf16 (cpu_matmul.matmul_native16):
 * one pass over it instead of torch's three, rounding where torch's bf16 ops round. */
BF16_TARGET static inline void store16_bf16(uint16_t *p, __m512 v, __mmask16 m) {
    _mm256_mask_storeu_epi16(p, m, (__m256i)_mm512_cvtneps_pbh(v));
}

BF16_TARGET static inline __m512 round_bf16(__m512 v) {       /* float32 -> bf16 -> float32 */
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(v)), 16));
}

/* x [T, 2I] = [gate | up] bf16 -> out [T, I] = bf16(bf16(silu(gate)) * up) */
BF16_TARGET void silu_and_mul_bf16(const uint16_t *x, uint16_t *out, int64_t T, int64_t I, int num_threads) {
    const __m512 one = _mm512_set1_ps(1.0f);
#pragma omp parallel for schedule(static) num_threads(num_threads)
    for (int64_t r = 0; r < T; r++) {
        const uint16_t *g = x + r * 2 * I, *u = g + I;
        uint16_t *o = out + r * I;
        for (int64_t i = 0; i < I; i += 16) {
            const __mmask16 m = tail16(I - i);
            const __m512 gv = load16_bf16(g + i, m);
            const __m512 neg = _mm512_sub_ps(_mm512_setzero_ps(), gv);
            const __m256 hi = exp8(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(neg), 1)));
            const __m512 e = _mm512_castpd_ps(_mm512_insertf64x4(
                _mm512_castps_pd(_mm512_castps256_ps512(exp8(_mm512_castps512_ps256(neg)))), _mm256_castps_pd(hi), 1));
            const __m512 silu = round_bf16(_mm512_div_ps(gv, _mm512_add_ps(one, e)));
            store16_bf16(o + i, _mm512_mul_ps(silu, load16_bf16(u + i, m)), m);
        }
    }
}

/* ---------------------------------------------------------------- a whole decode step's layers */

/* One decoder layer's 16-bit tensors (NULL where the model has none) and its paged KV cache. */
typedef struct {
    const uint16_t *input_norm, *qkv, *qkv_bias, *q_norm, *k_norm, *o_proj, *post_norm, *gate_up, *down;
    uint16_t *key_cache, *value_cache;
} DecodeLayer;

typedef struct {
    int64_t num_layers, hidden, num_heads, num_kv_heads, head_dim, intermediate, block_size;
    float eps, scale;
    int is_bf16;
    const DecodeLayer *layers;
    const uint16_t *final_norm;
    const float *cos_sin;          /* [max_positions, head_dim]: cos in the first half, sin in the second */
} DecodeModel;

/* out[r] = w * x[r] / rms(x[r]) over rows of n floats (the residual stream), float32 throughout. */
static void rms_norm_rows(const float *x, const uint16_t *w, float *out, int64_t T, int64_t n, float eps,
                          int is_bf16) {
    for (int64_t r = 0; r < T; r++) {
        const float *xr = x + r * n;
        float *o = out + r * n;
        __m256 acc = _mm256_setzero_ps();
        int64_t i = 0;
        for (; i + 8 <= n; i += 8) {
            __m256 v = _mm256_loadu_ps(xr + i);
            acc = _mm256_fmadd_ps(v, v, acc);
        }
        float ss = hsum(acc);
        for (; i < n; i++) ss += xr[i] * xr[i];
        const float inv = 1.0f / sqrtf(ss / (float)n + eps);
        __m256 vinv = _mm256_set1_ps(inv);
        for (i = 0; i + 8 <= n; i += 8)
            _mm256_storeu_ps(o + i, _mm256_mul_ps(load8(w + i, is_bf16), _mm256_mul_ps(_mm256_loadu_ps(xr + i), vinv)));
        for (; i < n; i++) o[i] = widen1(w[i], is_bf16) * (xr[i] * inv);
    }
}

static void add_rows(float *acc, const float *x, int64_t count) {
    int64_t i = 0;
    for (; i + 8 <= count; i += 8)
        _mm256_storeu_ps(acc + i, _mm256_add_ps(_mm256_loadu_ps(acc + i), _mm256_loadu_ps(x + i)));
    for (; i < count; i++) acc[i] += x[i];
}

/* neox rotary embedding of `heads` heads of D at x, by the table row of one position */
static void rope_heads(float *x, int64_t heads, int64_t D, const float *cos_sin) {
    const int64_t half = D / 2;
    for (int64_t h = 0; h < heads; h++) {
        float *xh = x + h * D;
        for (int64_t i = 0; i < half; i++) {
            const float c = cos_sin[i], s = cos_sin[half + i], x1 = xh[i], x2 = xh[half + i];
            xh[i] = x1 * c - x2 * s;
            xh[half + i] = x2 * c + x1 * s;
        }
    }
}

/* silu(gate) * up for rows [gate | up] of 2I floats -> rows of I floats */
static void silu_mul_rows(const float *gu, float *out, int64_t T, int64_t I) {
    const __m256 one = _mm256_set1_ps(1.0f);
    for (int64_t r = 0; r < T; r++) {
        const float *g = gu + r * 2 * I, *u = g + I;
        float *o = out + r * I;
        int64_t i = 0;
        for (; i + 8 <= I; i += 8) {
            __m256 gv = _mm256_loadu_ps(g + i);
            __m256 sig = _mm256_div_ps(one, _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), gv))));
            _mm256_storeu_ps(o + i, _mm256_mul_ps(_mm256_mul_ps(gv, sig), _mm256_loadu_ps(u + i)));
        }
        for (; i < I; i++) o[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
    }
}

/* The eager path's elementwise ops for float32 activations (16-bit models on the CPU), rows in parallel:
 * RMSNorm with the residual add fused (residual == NULL: none; else sum_out = x + residual is normalised)
 * and SiLU-and-mul; the arithmetic of the torch references in float32, one pass a row. */
void rms_norm_f32(const float *x, const float *residual, const uint16_t *w, float *out, float *sum_out, int64_t T,
                  int64_t n, float eps, int is_bf16, int num_threads) {
#pragma omp parallel for schedule(static) num_threads(num_threads)
    for (int64_t r = 0; r < T; r++) {
        const float *src = x + r * n;
        if (residual) {
            float *s = sum_out + r * n;
            const float *res = residual + r * n;
            int64_t i = 0;
            for (; i + 8 <= n; i += 8)
                _mm256_storeu_ps(s + i, _mm256_add_ps(_mm256_loadu_ps(src + i), _mm256_loadu_ps(res + i)));
            for (; i < n; i++) s[i] = src[i] + res[i];
            src = s;
        }
        rms_norm_rows(src, w, out + r * n, 1, n, eps, is_bf16);
    }
}

void silu_and_mul_f32(const float *x, float *out, int64_t T, int64_t I, int num_threads) {
#pragma omp parallel for schedule(static) num_threads(num_threads)
    for (int64_t r = 0; r < T; r++) silu_mul_rows(x + r * 2 * I, out + r * I, 1, I);
}

/* RoPE of x [T, H, D] (rows row_stride floats apart, heads contiguous) by kernels.rotary.rope_rows' factors
 * [2, T, D] ((cos, cos) and (-sin, sin)) into out [T, H, D]: x * c + swapped halves * s, each product
 * rounded before the sum as torch's two products and a sum are. D % 16 == 0. */
void rope_f32(const float *x, int64_t row_stride, const float *factors, float *out, int64_t T, int64_t H, int64_t D,
              int num_threads) {
    const int64_t half = D / 2;
#pragma omp parallel for schedule(static) num_threads(num_threads)
    for (int64_t t = 0; t < T; t++) {
        const float *c = factors + t * D, *s = factors + (T + t) * D;
        for (int64_t h = 0; h < H; h++) {
            const float *xh = x + t * row_stride + h * D;
            float *o = out + (t * H + h) * D;
            for (int64_t i = 0; i < half; i += 8) {
                const __m256 x1 = _mm256_loadu_ps(xh + i), x2 = _mm256_loadu_ps(xh + half + i);
                _mm256_storeu_ps(o + i, _mm256_add_ps(_mm256_mul_ps(x1, _mm256_loadu_ps(c + i)),
                                                      _mm256_mul_ps(x2, _mm256_loadu_ps(s + i))));
                _mm256_storeu_ps(o + half + i, _mm256_add_ps(_mm256_mul_ps(x2, _mm256_loadu_ps(c + half + i)),
                                                             _mm256_mul_ps(x1, _mm256_loadu_ps(s + half + i))));
            }
        }
    }
}

/* A pure-decode step (one new token per request) through every layer, then the final norm.
 * x [T, hidden]: the tokens' embeddings in, the normed last hidden states out. Request r's token sits at
 * positions[r], goes to cache slot slots[r] (< 0: padding, not written, attends nothing) and attends the
 * seq_lens[r] cached tokens of block_tables[r] (its own included). Same arithmetic as the torch layers
 * in float32, with 16-bit weights and cache. */
void decode_forward16(const DecodeModel *m, float *x, const int64_t *positions, const int64_t *slots,
                      const int32_t *seq_lens, const int32_t *block_tables, int64_t max_blocks, int64_t T,
                      int num_threads) {
    const int64_t H = m->hidden, Hq = m->num_heads, Hk = m->num_kv_heads, D = m->head_dim, I = m->intermediate;
    const int64_t qkv_n = (Hq + 2 * Hk) * D, bs = m->block_size;
    const int is_bf16 = m->is_bf16;
    float *residual = malloc(sizeof(float) * T * H), *normed = malloc(sizeof(float) * T * H);
    float *qkv = malloc(sizeof(float) * T * qkv_n), *attn = malloc(sizeof(float) * T * Hq * D);
    float *gu = malloc(sizeof(float) * T * 2 * I), *act = malloc(sizeof(float) * T * I);
    float *q = malloc(sizeof(float) * T * Hq * D);
    int32_t *lens = malloc(sizeof(int32_t) * T);
    for (int64_t r = 0; r < T; r++) lens[r] = slots[r] < 0 ? 0 : seq_lens[r];
    for (int64_t i = 0; i < T * H; i++) residual[i] = 0.0f;

    for (int64_t l = 0; l < m->num_layers; l++) {
        const DecodeLayer *L = m->layers + l;
        add_rows(residual, x, T * H);                       /* x: the embeddings, then each layer's output */
        rms_norm_rows(residual, L->input_norm, normed, T, H, m->eps, is_bf16);
        gemm16(normed, L->qkv, qkv, T, qkv_n, H, is_bf16, num_threads);
        for (int64_t r = 0; r < T; r++) {
            float *row = qkv + r * qkv_n;
            if (L->qkv_bias)
                for (int64_t i = 0; i < qkv_n; i++) row[i] += widen1(L->qkv_bias[i], is_bf16);
            if (L->q_norm) {
                for (int64_t h = 0; h < Hq; h++) rms_norm_rows(row + h * D, L->q_norm, row + h * D, 1, D, m->eps, is_bf16);
                for (int64_t h = 0; h < Hk; h++)
                    rms_norm_rows(row + (Hq + h) * D, L->k_norm, row + (Hq + h) * D, 1, D, m->eps, is_bf16);
            }
            const float *cs = m->cos_sin + positions[r] * D;
            rope_heads(row, Hq + Hk, D, cs);
            for (int64_t i = 0; i < Hq * D; i++) q[r * Hq * D + i] = row[i];
            if (slots[r] >= 0) {
                const float *k = row + Hq * D, *v = k + Hk * D;
                uint16_t *kc = L->key_cache + slots[r] * Hk * D, *vc = L->value_cache + slots[r] * Hk * D;
                for (int64_t i = 0; i < Hk * D; i++) {
                    kc[i] = narrow1(k[i], is_bf16);
                    vc[i] = narrow1(v[i], is_bf16);
                }
            }
        }
        paged_decode_attention16(q, L->key_cache, L->value_cache, lens, block_tables, max_blocks, attn, T, Hq, Hk, D,
                                 bs, m->scale, is_bf16, num_threads);
        gemm16(attn, L->o_proj, x, T, H, Hq * D, is_bf16, num_threads);
        add_rows(residual, x, T * H);
        rms_norm_rows(residual, L->post_norm, normed, T, H, m->eps, is_bf16);
        gemm16(normed, L->gate_up, gu, T, 2 * I, H, is_bf16, num_threads);
        silu_mul_rows(gu, act, T, I);
        gemm16(act, L->down, x, T, H, I, is_bf16, num_threads);
    }
    add_rows(residual, x, T * H);
    rms_norm_rows(residual, m->final_norm, x, T, H, m->eps, is_bf16);
    free(residual), free(normed), free(qkv), free(attn), free(gu), free(act), free(q), free(lens);
}

/* ---------------------------------------------------------------- sampling by inverse CDF over exp weights
 * engine/sample/sampler.py's full-vocabulary rows without top-p: one token per row with probability
 * proportional to w_i = exp(l_i * inv_t - shift), where a token with w_i < 1 (below the row's floor: shift
 * puts the most likely token at e^-floor) weighs 0. One pass over the row gives each block's sum (float64);
 * the row's uniform u picks the block on their running sum (the first whose cumulative sum exceeds
 * u * total), and the block's weights, recomputed by the same arithmetic, pick the token the same way;
 * a pick that rounding carries past the last weighted block or token steps back to it, and a row without
 * weight gives its last token (as vocab_ops.sample_rows). The torch path takes about a dozen passes and
 * small ops for this: ~0.5 -> ~0.1 ms at one row of 49,152 tokens. */
#define SAMPLE_BLOCK 128

/* the weights of tokens [i0, i1) of l, into w (n <= SAMPLE_BLOCK); returns their float32 sum */
static float exp_weights_block(const float *l, int64_t i0, int64_t i1, float inv_t, float shift, float *w) {
    const __m256 t = _mm256_set1_ps(inv_t), s = _mm256_set1_ps(shift), one = _mm256_set1_ps(1.0f);
    __m256 acc = _mm256_setzero_ps();
    int64_t i = i0;
    for (; i + 8 <= i1; i += 8) {
        __m256 v = exp8(_mm256_fmsub_ps(_mm256_loadu_ps(l + i), t, s));
        v = _mm256_and_ps(v, _mm256_cmp_ps(v, one, _CMP_GE_OQ));
        acc = _mm256_add_ps(acc, v);
        _mm256_storeu_ps(w + (i - i0), v);
    }
    float sum = hsum(acc);
    if (i < i1) {                      /* the tail through the same vector code, padded with -inf */
        float pad[8];
        for (int j = 0; j < 8; j++) pad[j] = i + j < i1 ? l[i + j] : -INFINITY;
        __m256 v = exp8(_mm256_fmsub_ps(_mm256_loadu_ps(pad), t, s));
        v = _mm256_and_ps(v, _mm256_cmp_ps(v, one, _CMP_GE_OQ));
        float lanes[8];
        _mm256_storeu_ps(lanes, v);
        for (int64_t j = 0; i + j < i1; j++) w[i - i0 + j] = lanes[j], sum += lanes[j];
    }
    return sum;
}

/* logits [*, V] float32; row r of the draw is logits row rows[r] (rows NULL: row r); out [R] int64 */
void sample_exp_rows(const float *logits, int64_t V, const int64_t *rows, int64_t R, const float *inv_t,
                     const float *shift, const double *u, int64_t *out, int num_threads) {
    const int64_t blocks = (V + SAMPLE_BLOCK - 1) / SAMPLE_BLOCK;
#pragma omp parallel num_threads(num_threads)
    {
        double *cum = malloc(sizeof(double) * (size_t)blocks);
        float w[SAMPLE_BLOCK];
#pragma omp for schedule(dynamic, 1)
        for (int64_t r = 0; r < R; r++) {
            const float *l = logits + (rows ? rows[r] : r) * V;
            double total = 0.0;
            int64_t last = blocks - 1;                      /* the last block with weight */
            int any = 0;
            for (int64_t b = 0; b < blocks; b++) {
                const int64_t i1 = (b + 1) * SAMPLE_BLOCK < V ? (b + 1) * SAMPLE_BLOCK : V;
                const float sum = exp_weights_block(l, b * SAMPLE_BLOCK, i1, inv_t[r], shift[r], w);
                total += sum;
                cum[b] = total;
                if (sum > 0.0f) last = b, any = 1;
            }
            if (!any) {
                out[r] = V - 1;
                continue;
            }
            const double target = u[r] * total;
            int64_t b = 0;
            while (b < last && cum[b] <= target) b++;
            const double before = b ? cum[b - 1] : 0.0;
            const int64_t i0 = b * SAMPLE_BLOCK, i1 = i0 + SAMPLE_BLOCK < V ? i0 + SAMPLE_BLOCK : V;
            exp_weights_block(l, i0, i1, inv_t[r], shift[r], w);
            int64_t col = i1 - i0 - 1;
            while (col > 0 && w[col] <= 0.0f) col--;        /* the last token with weight */
            double run = 0.0;
            for (int64_t j = 0; j < col; j++) {
                run += w[j];
                if (run > target - before) {
                    col = j;
                    break;
                }
            }
            out[r] = i0 + col;
        }
        free(cum);
    }
}
