/* gemm16: 16-bit weights times float32 activations (see kernels.h). */
#include "kernels.h"

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

/* fn(args, lo, hi) over [0, n) in ranges of at most `step` units, on num_threads threads (also gemm_q's) */
INTERNAL void share_units(int64_t n, int64_t step, int num_threads, void (*fn)(const void *, int64_t, int64_t),
                          const void *args) {
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

static void gemv_range(const void *args, int64_t lo, int64_t hi) {
    const MatmulArgs *a = args;
    if (a->M == 2) gemv_rows(a->x, a->w, a->y, lo, hi, a->N, a->K, a->is_bf16, 2);
    else gemv_rows(a->x, a->w, a->y, lo, hi, a->N, a->K, a->is_bf16, 1);
}

/* ---------------------------------------------------------------- AVX-512 BF16 (e.g. AMD Zen 4)
 * On CPUs with VDPBF16PS, bf16 weights times activations rounded to bf16, accumulated in float32 (what
 * oneDNN's and a GPU's bf16 GEMMs do), run at twice the float32 FMA rate: one instruction takes 32 products
 * of a row pair. Used by gemm16 from three rows on for bf16 weights when set_bf16_dot(1) was called (the
 * caller checks the CPU); these functions carry their own target, the rest of the file stays AVX2. */
#define BF16_MR 6
#define BF16_NR 4
#ifndef DOT_AHEAD
#define DOT_AHEAD 4
#endif
#ifndef STEAL_TILES
#define STEAL_TILES 2
#endif

int use_bf16_dot = 0;

int set_bf16_dot(int on) {
    const int was = use_bf16_dot;
    use_bf16_dot = on;
    return was;
}

/* x [M, K] float32 -> xb [M, Kp] bf16 (round to nearest even), zero past K up to Kp (a multiple of 32) */
BF16_TARGET void rows_to_bf16(const float *x, uint16_t *xb, int64_t M, int64_t K, int64_t Kp) {
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

/* tiles [lo, hi) of four weight rows against every activation row (share_units' callbacks: one per dtype,
 * so that each inlines its dot_rows: one callback choosing per tile was slower at 4 rows, 7 of 7 A/B runs) */
BF16_TARGET static void tiles_bf16(const void *args, int64_t lo, int64_t hi) {
    const MatmulArgs *a = args;
    for (int64_t t = lo; t < hi; t++) dot_rows_bf16(a->x, a->w, a->y, a->M, t * BF16_NR, a->N, a->K, a->Kp, BF16_NR);
}

BF16_TARGET static void tiles_f16(const void *args, int64_t lo, int64_t hi) {
    const MatmulArgs *a = args;
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
    if (use_bf16_dot) {
        gemm_avx512(x, w, y, M, N, K, is_bf16, num_threads);
        return;
    }
    /* Dynamic chunks: a thread the OS preempts (the frontend and scheduler share these cores) delays the
     * call by one chunk, not by its whole static share. */
    int64_t pairs = N / 2;
#pragma omp parallel for schedule(dynamic, 16) num_threads(num_threads)
    for (int64_t b = 0; b < pairs; b++) pair_rows(x, w, y, M, b * 2, N, K, is_bf16);
    if (N % 2) single(x, w, y, M, N - 1, N, K, is_bf16);
}
