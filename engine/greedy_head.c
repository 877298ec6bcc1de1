/* The LM head and a greedy pick in one pass, for float32 on CPU: see greedy_head.py.
 *
 * The LM head is cut into panels of LANES vocabulary rows laid out by hidden index, so that one
 * vector holds one hidden index of LANES vocabulary rows; a hidden row's logits for a panel are
 * LANES accumulators summed in hidden order, no horizontal sum. For up to CHUNK rows at a time
 * the threads take runs of TASK_PANELS panels from a shared counter, each keeping each row's best
 * logit per lane, and the lanes and threads are reduced at the end. Ties and NaN go as
 * torch.argmax has them: the first maximal index wins, and a NaN is maximal. Built without
 * -ffast-math, which would drop the NaN tests. */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

/* one vector of floats: 64 bytes where AVX-512 has them, else 32 (AVX2; two registers on NEON) */
#ifdef __AVX512F__
#define LANES 16
#else
#define LANES 8
#endif
/* rows whose accumulators stay in registers while one panel vector is loaded */
#define ROWS 8
/* rows that share one pass over the panels: their running maxima stay in L1 (8 KB at 16 lanes) */
#define CHUNK 64
/* panels a thread takes at a time. A static half each made a step wait for whichever thread the
 * OS had put aside: on 2 cores with one busy elsewhere (the app's event loop, the embedder), 40
 * rows of the demo's LM head took 33.7 ms on 2 threads against 28.8 on one; taken in runs, 22.7.
 * With AVX2 its vocabulary is 148 runs, 0.2 ms each at 40 rows on one core. */
#define TASK_PANELS 128

typedef float floats __attribute__((vector_size(LANES * sizeof(float))));
typedef int32_t ints __attribute__((vector_size(LANES * sizeof(int32_t))));
typedef uint32_t uints __attribute__((vector_size(LANES * sizeof(uint32_t))));
typedef uint16_t halves __attribute__((vector_size(LANES * sizeof(uint16_t))));

int64_t greedy_head_lanes(void) { return LANES; }

/* bfloat16 is float32's upper half: widening is a shift, exact */
static inline __attribute__((always_inline)) floats load(const void *panel, int64_t at, int is_bf16)
{
    floats out;
    if (is_bf16) {
        halves narrow;
        memcpy(&narrow, (const uint16_t *)panel + at, sizeof narrow);
        const uints bits = __builtin_convertvector(narrow, uints) << 16;
        memcpy(&out, &bits, sizeof out);
    } else {
        memcpy(&out, (const float *)panel + at, sizeof out);
    }
    return out;
}

static inline ints select_ints(ints mask, ints a, ints b) { return (a & mask) | (b & ~mask); }

static inline floats select_floats(ints mask, floats a, floats b)
{
    ints a_bits, b_bits;
    memcpy(&a_bits, &a, sizeof a_bits);
    memcpy(&b_bits, &b, sizeof b_bits);
    const ints bits = select_ints(mask, a_bits, b_bits);
    floats out;
    memcpy(&out, &bits, sizeof out);
    return out;
}

/* whether (value, id) comes before (best, best_id) in torch.argmax's order */
static int beats(float value, int64_t id, float best, int64_t best_id)
{
    if (best_id < 0) return 1;
    if (isnan(best)) return isnan(value) && id < best_id;
    return isnan(value) || value > best || (value == best && id < best_id);
}

static inline __attribute__((always_inline)) void dot_panel(const float *restrict hidden, const void *panel,
                                                            int64_t hidden_size, int num_rows, int is_bf16,
                                                            floats acc[ROWS])
{
    for (int i = 0; i < ROWS; i++) acc[i] = (floats){0};
    if (num_rows == ROWS) {
        for (int64_t k = 0; k < hidden_size; k++) {
            const floats weights = load(panel, k * LANES, is_bf16);
#pragma GCC unroll 8
            for (int i = 0; i < ROWS; i++) acc[i] += hidden[i * hidden_size + k] * weights;
        }
        return;
    }
    for (int64_t k = 0; k < hidden_size; k++) {
        const floats weights = load(panel, k * LANES, is_bf16);
        for (int i = 0; i < num_rows; i++) acc[i] += hidden[i * hidden_size + k] * weights;
    }
}

static inline __attribute__((always_inline)) void scan(const float *restrict hidden, const void *panels,
                                                       int64_t num_rows, int64_t vocab_size, int64_t hidden_size,
                                                       int is_bf16, int64_t num_panels, float best[CHUNK],
                                                       int64_t best_ids[CHUNK])
{
    floats lane_best[CHUNK];
    ints lane_ids[CHUNK], lane;
    for (int j = 0; j < LANES; j++) lane[j] = j;
    for (int64_t i = 0; i < num_rows; i++) {
        lane_best[i] = (floats){0};
        lane_ids[i] = (ints){0} - 1;
    }
    /* monotonic: a thread's runs come in rising order, so ids still rise along each lane */
#pragma omp for schedule(monotonic : dynamic, TASK_PANELS) nowait
    for (int64_t p = 0; p < num_panels; p++) {
        const ints ids = lane + (int32_t)(p * LANES);
        const ints in_vocab = ids < (int32_t)vocab_size;
        const void *panel = is_bf16 ? (const void *)((const uint16_t *)panels + p * hidden_size * LANES)
                                    : (const void *)((const float *)panels + p * hidden_size * LANES);
        for (int64_t first = 0; first < num_rows; first += ROWS) {
            const int rows = num_rows - first < ROWS ? (int)(num_rows - first) : ROWS;
            floats acc[ROWS];
            dot_panel(hidden + first * hidden_size, panel, hidden_size, rows, is_bf16, acc);
            for (int i = 0; i < rows; i++) {
                floats *b = &lane_best[first + i];
                /* ids rise along a lane, so a later logit takes the lane only if strictly greater,
                 * or NaN over a number */
                const ints takes = in_vocab & ((lane_ids[first + i] < 0) | (acc[i] > *b) | ((acc[i] != acc[i]) & (*b == *b)));
                *b = select_floats(takes, acc[i], *b);
                lane_ids[first + i] = select_ints(takes, ids, lane_ids[first + i]);
            }
        }
    }
    for (int64_t i = 0; i < num_rows; i++) {
        best[i] = 0.f;
        best_ids[i] = -1;
        for (int j = 0; j < LANES; j++)
            if (lane_ids[i][j] >= 0 && beats(lane_best[i][j], lane_ids[i][j], best[i], best_ids[i])) {
                best[i] = lane_best[i][j];
                best_ids[i] = lane_ids[i][j];
            }
    }
}

/* token_ids[r] = argmax over the vocabulary of hidden[r] . lm_head[v], for r < num_rows. `panels`:
 * the LM head as [vocab_size / LANES, hidden_size, LANES], bfloat16 or float32, zeros past the
 * vocabulary. */
void greedy_head(const float *hidden, const void *panels, int64_t *token_ids, int64_t is_bf16, int64_t num_rows,
                 int64_t vocab_size, int64_t hidden_size)
{
    const int64_t num_panels = (vocab_size + LANES - 1) / LANES;
    const int max_threads = omp_get_max_threads();
    float (*best)[CHUNK] = __builtin_alloca(sizeof(float[CHUNK]) * max_threads);
    int64_t (*best_ids)[CHUNK] = __builtin_alloca(sizeof(int64_t[CHUNK]) * max_threads);
    for (int64_t first = 0; first < num_rows; first += CHUNK) {
        const int64_t rows = num_rows - first < CHUNK ? num_rows - first : CHUNK;
        int num_threads = 1;
#pragma omp parallel num_threads(max_threads)
        {
            const int t = omp_get_thread_num();
            if (t == 0) num_threads = omp_get_num_threads();
            if (is_bf16)
                scan(hidden + first * hidden_size, panels, rows, vocab_size, hidden_size, 1, num_panels, best[t],
                     best_ids[t]);
            else
                scan(hidden + first * hidden_size, panels, rows, vocab_size, hidden_size, 0, num_panels, best[t],
                     best_ids[t]);
        }
        /* a thread's best may come from any of its runs: ties go to the lower id (beats) */
        for (int64_t i = 0; i < rows; i++) {
            float value = 0.f;
            int64_t id = -1;
            for (int t = 0; t < num_threads; t++)
                if (best_ids[t][i] >= 0 && beats(best[t][i], best_ids[t][i], value, id)) {
                    value = best[t][i];
                    id = best_ids[t][i];
                }
            token_ids[first + i] = id;
        }
    }
}
