/* The row-wise ops: RMSNorm, RoPE, SiLU-and-mul (the eager path's, and the row helpers of decode_forward16)
 * and the sampler's draw (see kernels.h). */
#include "kernels.h"

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

/* ---------------------------------------------------------------- float32 rows */
/* out[r] = w * x[r] / rms(x[r]) over rows of n floats (the residual stream), float32 throughout. */
void rms_norm_rows(const float *x, const uint16_t *w, float *out, int64_t T, int64_t n, float eps, int is_bf16) {
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

void add_rows(float *acc, const float *x, int64_t count) {
    int64_t i = 0;
    for (; i + 8 <= count; i += 8)
        _mm256_storeu_ps(acc + i, _mm256_add_ps(_mm256_loadu_ps(acc + i), _mm256_loadu_ps(x + i)));
    for (; i < count; i++) acc[i] += x[i];
}

/* neox rotary embedding of `heads` heads of D at x, by the table row of one position */
void rope_heads(float *x, int64_t heads, int64_t D, const float *cos_sin) {
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
void silu_mul_rows(const float *gu, float *out, int64_t T, int64_t I) {
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

/* ---------------------------------------------------------------- sampling by inverse CDF over exp weights
 * engine/sample/sampler.py's full-vocabulary rows without top-p: one token per row with probability
 * proportional to w_i = exp(l_i * inv_t - shift), where a token with w_i < 1 (below the row's floor: shift
 * puts the most likely token at e^-floor) weighs 0. One pass over the row gives each block's float32 sum,
 * accumulated in float64; the row's uniform u picks the block on that running sum (the first whose
 * cumulative sum exceeds u * total), and the block's weights, recomputed by the same arithmetic, pick the
 * token the same way;
 * a pick that rounding carries past the last weighted block or token steps back to it, and a row without
 * weight gives its last token (as vocab_ops.sample_rows). The torch path takes about a dozen passes and
 * small ops for this: ~0.5 -> ~0.2 ms a sampler call at one row of 49,152 tokens. */
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
