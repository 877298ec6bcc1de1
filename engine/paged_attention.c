/* Decode attention read in place from the paged KV pool, for float32 on CPU: see paged_kernel.py.
 *
 * Each query row attends to its sequence's keys up to its own position, block by block through the
 * sequence's block table, with an online softmax (a running maximum and sum rescale what came
 * before), so nothing is gathered or allocated. One task is one row: a token's keys or values of
 * every KV head lie together in the pool, and are read once for all the query heads. */
#include <float.h>
#include <math.h>
#include <stdint.h>

/* bounds for each thread's buffers: paged_decode_supports tells paged_kernel.py whether a model fits */
#define MAX_HEADS 128
#define MAX_HEAD_DIM 256
#define MAX_BLOCK_SIZE 256

int paged_decode_supports(int64_t num_heads, int64_t head_dim, int64_t block_size)
{
    return num_heads <= MAX_HEADS && head_dim <= MAX_HEAD_DIM && block_size <= MAX_BLOCK_SIZE;
}

static void attend(const float *restrict q, float *restrict out, const float *restrict k_cache,
                   const float *restrict v_cache, const int64_t *restrict block_table, int64_t context_len,
                   int64_t num_kv_heads, int64_t group, int64_t head_dim, int64_t block_size, float scale)
{
    /* 256 KB: kept off the stack of OpenMP's threads */
    static _Thread_local float acc[MAX_HEADS][MAX_HEAD_DIM], scores[MAX_HEADS][MAX_BLOCK_SIZE];
    float running_max[MAX_HEADS], running_sum[MAX_HEADS];
    const int64_t num_heads = num_kv_heads * group, token_stride = num_kv_heads * head_dim;
    for (int64_t h = 0; h < num_heads; h++) {
        running_max[h] = -FLT_MAX;
        running_sum[h] = 0.f;
        for (int64_t d = 0; d < head_dim; d++) acc[h][d] = 0.f;
    }
    for (int64_t first = 0; first < context_len; first += block_size) {
        const int64_t num_tokens = context_len - first < block_size ? context_len - first : block_size;
        const int64_t offset = block_table[first / block_size] * block_size * token_stride;
        /* the next block is anywhere in the pool, where the hardware prefetcher cannot guess it */
        const int64_t next =
            first + block_size < context_len ? block_table[first / block_size + 1] * block_size * token_stride : offset;
        for (int64_t t = 0; t < num_tokens; t++) {
            const float *keys = k_cache + offset + t * token_stride;
            for (int64_t i = 0; i < token_stride; i += 16) {
                __builtin_prefetch(k_cache + next + t * token_stride + i);
                __builtin_prefetch(v_cache + next + t * token_stride + i);
            }
            for (int64_t h = 0; h < num_heads; h++) {
                const float *query = q + h * head_dim, *key = keys + h / group * head_dim;
                float dot = 0.f;
#pragma omp simd reduction(+ : dot)
                for (int64_t d = 0; d < head_dim; d++) dot += query[d] * key[d];
                scores[h][t] = dot * scale;
            }
        }
        for (int64_t h = 0; h < num_heads; h++) {
            float block_max = running_max[h];
            for (int64_t t = 0; t < num_tokens; t++) block_max = fmaxf(block_max, scores[h][t]);
            const float rescale = expf(running_max[h] - block_max);
            float block_sum = 0.f;
#pragma omp simd reduction(+ : block_sum)
            for (int64_t t = 0; t < num_tokens; t++) {
                scores[h][t] = expf(scores[h][t] - block_max);
                block_sum += scores[h][t];
            }
            running_max[h] = block_max;
            running_sum[h] = running_sum[h] * rescale + block_sum;
#pragma omp simd
            for (int64_t d = 0; d < head_dim; d++) acc[h][d] *= rescale;
        }
        for (int64_t t = 0; t < num_tokens; t++) {
            const float *values = v_cache + offset + t * token_stride;
            for (int64_t h = 0; h < num_heads; h++) {
                const float weight = scores[h][t], *value = values + h / group * head_dim;
#pragma omp simd
                for (int64_t d = 0; d < head_dim; d++) acc[h][d] += weight * value[d];
            }
        }
    }
    for (int64_t h = 0; h < num_heads; h++)
        for (int64_t d = 0; d < head_dim; d++) out[h * head_dim + d] = acc[h][d] / running_sum[h];
}

/* q and out: [rows, num_kv_heads * group, head_dim]; k_cache and v_cache: one layer's pool,
 * [blocks, block_size, num_kv_heads, head_dim]. Row r's block table starts at
 * block_tables[table_starts[r]] and it sees context_lens[r] keys. */
void paged_decode_attention(const float *q, float *out, const float *k_cache, const float *v_cache,
                            const int64_t *block_tables, const int64_t *table_starts, const int64_t *context_lens,
                            int64_t num_rows, int64_t num_kv_heads, int64_t group, int64_t head_dim,
                            int64_t block_size, float scale)
{
    const int64_t row_stride = num_kv_heads * group * head_dim;
#pragma omp parallel for schedule(dynamic)
    for (int64_t row = 0; row < num_rows; row++)
        attend(q + row * row_stride, out + row * row_stride, k_cache, v_cache, block_tables + table_starts[row],
               context_lens[row], num_kv_heads, group, head_dim, block_size, scale);
}
