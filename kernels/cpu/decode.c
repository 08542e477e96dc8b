/* decode_forward16: a whole pure-decode step of a Llama-family model in one call (see kernels.h). */
#include "kernels.h"

/* One decoder layer's 16-bit tensors (NULL where the model has none), its matmul weights (16-bit or
 * GGUF-quantized) and its paged KV cache. */
typedef struct {
    const uint16_t *input_norm, *qkv_bias, *q_norm, *k_norm, *post_norm;
    Weight qkv, o_proj, gate_up, down;
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

/* A pure-decode step (one new token per request) through every layer, then the final norm.
 * x [T, hidden]: the tokens' embeddings in, the normed last hidden states out. Request r's token sits at
 * positions[r], goes to cache slot slots[r] (< 0: padding, not written, attends nothing) and attends the
 * seq_lens[r] cached tokens of block_tables[r] (its own included). Same arithmetic as the torch layers
 * in float32, with 16-bit weights (or gemm_q's for quantized ones) and a 16-bit cache. */
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
        matmul_weight(&L->qkv, normed, qkv, T, H, 0, num_threads);
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
        matmul_weight(&L->o_proj, attn, x, T, Hq * D, 0, num_threads);
        add_rows(residual, x, T * H);
        rms_norm_rows(residual, L->post_norm, normed, T, H, m->eps, is_bf16);
        matmul_weight(&L->gate_up, normed, gu, T, H, 0, num_threads);
        silu_mul_rows(gu, act, T, I);
        matmul_weight(&L->down, act, x, T, I, 0, num_threads);
    }
    add_rows(residual, x, T * H);
    rms_norm_rows(residual, m->final_norm, x, T, H, m->eps, is_bf16);
    free(residual), free(normed), free(qkv), free(attn), free(gu), free(act), free(q), free(lens);
}
