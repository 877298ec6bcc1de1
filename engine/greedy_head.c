/* The LM head and a greedy pick in one pass, for float32 on CPU: see greedy_head.py.
 *
 * The LM head is cut into panels of 2 x LANES vocabulary rows laid out by hidden index, so that
 * two vectors hold one hidden index of a panel's rows, its low and its high half; a hidden row's
 * logits for a panel are 2 x LANES accumulators summed in hidden order, no horizontal sum. In
 * bfloat16 one load brings both halves, interleaved: each 32-bit word holds a low row's value in
 * its lower half and the high row's in its upper half, so a shift widens the one and a mask the
 * other, one instruction a vector where panels of one vector took two (a widening load and a
 * shift) on the ports the multiply-adds need, and each row value loaded feeds two multiply-adds.
 * For up to CHUNK rows at a time the threads take runs of TASK_PANELS panels from a shared
 * counter, each keeping each row's best logit per lane, and the lanes and threads are reduced at
 * the end. Ties and NaN go as torch.argmax has them: the first maximal index wins, and a NaN is
 * maximal. Built without -ffast-math, which would drop the NaN tests. */
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
/* rows whose accumulators (two vectors each) stay in registers while a panel's two vectors are
 * loaded: 18 of AVX-512's 32 registers (with 12 rows, 26, the kernel took 0.79-1.02x the time of
 * one-vector panels at 1-40 rows, against 0.77-0.96x with 8); AVX2's 16 fit 6, but 8 rows then
 * take a pass of 6 and one of 2, and 4 were faster from 8 rows up (the demo's LM head built for
 * AVX2, on an Intel Xeon: 8 rows 4.9 against 5.7 ms, 40 rows 14.7 against 18.6) */
#ifdef __AVX512F__
#define ROWS 8
#else
#define ROWS 4
#endif
/* rows that share one pass over the panels: their running maxima stay in L1 (16 KB at 16 lanes) */
#define CHUNK 64
/* panels a thread takes at a time. A static half each made a step wait for whichever thread the
 * OS had put aside: on 2 cores with one busy elsewhere (the app's event loop, the embedder), 40
 * rows of the demo's LM head took 33.7 ms on 2 threads against 28.8 on one; taken in runs, 22.7.
 * With AVX2 its vocabulary is 148 runs, 0.2 ms each at 40 rows on one core. */
#define TASK_PANELS 64

typedef float floats __attribute__((vector_size(LANES * sizeof(float))));
typedef int32_t ints __attribute__((vector_size(LANES * sizeof(int32_t))));
typedef uint32_t uints __attribute__((vector_size(LANES * sizeof(uint32_t))));

int64_t greedy_head_lanes(void) { return LANES; }

/* the two vectors of hidden index k of a panel. bfloat16 is float32's upper half: widening is a
 * shift (a word's lower half) or a mask (its upper half), exact */
static inline __attribute__((always_inline)) void load(const void *panel, int64_t k, int is_bf16, floats *low,
                                                       floats *high)
{
    if (is_bf16) {
        uints words;
        memcpy(&words, (const uint32_t *)panel + k * LANES, sizeof words);
        const uints low_bits = words << 16, high_bits = words & 0xffff0000u;
        memcpy(low, &low_bits, sizeof *low);
        memcpy(high, &high_bits, sizeof *high);
    } else {
        memcpy(low, (const float *)panel + 2 * k * LANES, sizeof *low);
        memcpy(high, (const float *)panel + (2 * k + 1) * LANES, sizeof *high);
    }
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
                                                            floats acc[ROWS][2])
{
    for (int i = 0; i < ROWS; i++) acc[i][0] = acc[i][1] = (floats){0};
    if (num_rows == ROWS) {
        for (int64_t k = 0; k < hidden_size; k++) {
            floats low, high;
            load(panel, k, is_bf16, &low, &high);
#pragma GCC unroll 8
            for (int i = 0; i < ROWS; i++) {
                const float value = hidden[i * hidden_size + k];
                acc[i][0] += value * low;
                acc[i][1] += value * high;
            }
        }
        return;
    }
    for (int64_t k = 0; k < hidden_size; k++) {
        floats low, high;
        load(panel, k, is_bf16, &low, &high);
        for (int i = 0; i < num_rows; i++) {
            const float value = hidden[i * hidden_size + k];
            acc[i][0] += value * low;
            acc[i][1] += value * high;
        }
    }
}

static inline __attribute__((always_inline)) void scan(const float *restrict hidden, const void *panels,
                                                       int64_t num_rows, int64_t vocab_size, int64_t hidden_size,
                                                       int is_bf16, int64_t num_panels, float best[CHUNK],
                                                       int64_t best_ids[CHUNK])
{
    floats lane_best[CHUNK][2];
    ints lane_ids[CHUNK][2], lane;
    for (int j = 0; j < LANES; j++) lane[j] = j;
    for (int64_t i = 0; i < num_rows; i++)
        for (int h = 0; h < 2; h++) {
            lane_best[i][h] = (floats){0};
            lane_ids[i][h] = (ints){0} - 1;
        }
    const int64_t panel_size = 2 * LANES * hidden_size;
    /* monotonic: a thread's runs come in rising order, so ids still rise along each lane */
#pragma omp for schedule(monotonic : dynamic, TASK_PANELS) nowait
    for (int64_t p = 0; p < num_panels; p++) {
        const ints ids[2] = {lane + (int32_t)(2 * p * LANES), lane + (int32_t)((2 * p + 1) * LANES)};
        const ints in_vocab[2] = {ids[0] < (int32_t)vocab_size, ids[1] < (int32_t)vocab_size};
        const void *panel = is_bf16 ? (const void *)((const uint16_t *)panels + p * panel_size)
                                    : (const void *)((const float *)panels + p * panel_size);
        for (int64_t first = 0; first < num_rows; first += ROWS) {
            const int rows = num_rows - first < ROWS ? (int)(num_rows - first) : ROWS;
            floats acc[ROWS][2];
            dot_panel(hidden + first * hidden_size, panel, hidden_size, rows, is_bf16, acc);
            for (int i = 0; i < rows; i++)
                for (int h = 0; h < 2; h++) {
                    floats *b = &lane_best[first + i][h];
                    ints *b_ids = &lane_ids[first + i][h];
                    const floats a = acc[i][h];
                    /* ids rise along a lane, so a later logit takes the lane only if strictly
                     * greater, or NaN over a number */
                    const ints takes = in_vocab[h] & ((*b_ids < 0) | (a > *b) | ((a != a) & (*b == *b)));
                    *b = select_floats(takes, a, *b);
                    *b_ids = select_ints(takes, ids[h], *b_ids);
                }
        }
    }
    for (int64_t i = 0; i < num_rows; i++) {
        best[i] = 0.f;
        best_ids[i] = -1;
        for (int h = 0; h < 2; h++)
            for (int j = 0; j < LANES; j++)
                if (lane_ids[i][h][j] >= 0 && beats(lane_best[i][h][j], lane_ids[i][h][j], best[i], best_ids[i])) {
                    best[i] = lane_best[i][h][j];
                    best_ids[i] = lane_ids[i][h][j];
                }
    }
}

/* token_ids[r] = argmax over the vocabulary of hidden[r] . lm_head[v], for r < num_rows. `panels`:
 * the LM head as [vocab_size / (2 x LANES), hidden_size, 2 x LANES], bfloat16 with a panel's low
 * and high rows interleaved, or float32 with them one after the other; zeros past the vocabulary. */
void greedy_head(const float *hidden, const void *panels, int64_t *token_ids, int64_t is_bf16, int64_t num_rows,
                 int64_t vocab_size, int64_t hidden_size)
{
    const int64_t num_panels = (vocab_size + 2 * LANES - 1) / (2 * LANES);
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
