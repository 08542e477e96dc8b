/* Repacking a matrix's GGUF blocks into 16-row tiles (once, at load), reading rows back (a quantized token
 * embedding), and quantizing activations to int8: the parts of kernels/cpu/quant.c's scheme that are not
 * its matmul kernels (see that file). */
#include "quant.h"

/* bytes of the repacked N x K matrix of `type`; 0 for a type without a kernel here */
int64_t packed_bytes(int type, int64_t N, int64_t K) {
    Layout l;
    if (!layout_of(type, &l)) return 0;
    return (N + TILE - 1) / TILE * (K / l.values) * l.unit;
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
Act quantize_act(const float *x, int64_t ldx, int64_t M, int64_t K, int precise, int num_threads) {
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

