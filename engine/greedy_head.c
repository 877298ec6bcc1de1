/* The LM head and a greedy pick, for float32 on CPU: see greedy_head.py.
 *
 * A pass over an 8-bit copy of the LM head screens the vocabulary; the few ids it cannot rule out
 * are computed exactly from the LM head itself. The copy: each vocabulary row scaled to [-127, 127]
 * and rounded, with bounds per row (`bounds`) on how far its logit may lie from the exact one: the
 * smaller of its rounding error's norm times the hidden row's (Cauchy-Schwarz) and its largest
 * rounding error times the hidden row's sum of magnitudes (which is tighter where a few hidden
 * values dominate, as in SmolLM2's: the candidates left at p90 were 19 against 40, at most 85
 * against 309), plus both sums' float32 rounding. A row whose screened logit, raised by its bound,
 * falls short of another's lowered by its own cannot be the largest, whatever the exact values:
 * the rest are the candidates.
 * An exact logit is the float32 dot product in hidden order, one fused multiply-add a step (what
 * the panels of float32 and bfloat16 before this kernel summed, bit for bit).
 *
 * With AVX512-VNNI or AVX2 (GROUP 4) the hidden row is rounded to 8 bits too, but for its few
 * values far past the rest (outliers, multiplied as floats), in steps of its largest other
 * magnitude / 127, and its rounding error bounded likewise against the rounded LM head's rows
 * (their norms and sums of magnitudes); the screened sums are then whole numbers, plus the
 * outliers' products: a few float32 roundings, fewer than the bounds allow for.
 *
 * The screen is laid out in panels of 2 x LANES vocabulary rows by GROUP hidden indices, so that
 * one load brings GROUP hidden indices of a panel's rows, widened into two vectors (or multiplied
 * four at a time with VNNI), its low and its high half; a hidden row's screened logits for a panel
 * are 2 x LANES accumulators summed in hidden order, no horizontal sum. For up to CHUNK rows at a
 * time the threads take runs of TASK_PANELS panels from a shared counter, each keeping each row's
 * highest lowered logit (its floor) and the ids that reach it. A row for which a thread met more
 * than CANDIDATES before its floor rose is screened again from the row's final floor; one with
 * more even then, or whose hidden values are not all finite, is computed exactly over the whole
 * vocabulary; so is every row of an LM head that holds a value that is not finite (`screened` 0).
 * Ties and NaN go as torch.argmax has them: the first maximal index wins, and a NaN is maximal.
 * Built without -ffast-math, which would drop the NaN tests and let the exact sums reassociate. */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

/* one vector of floats: 64 bytes where AVX-512 has them, else 32 (AVX2; two registers on NEON) */
#ifdef __AVX512F__
#define LANES 16
#else
#define LANES 8
#endif
/* rows whose accumulators (two vectors each) stay in registers while a panel's two vectors are
 * loaded: 18 of AVX-512's 32 registers (with 12 rows, 26, the bfloat16 panels before took
 * 0.79-1.02x the time of one-vector panels at 1-40 rows, against 0.77-0.96x with 8); AVX2's 16
 * fit 6, but 8 rows then take a pass of 6 and one of 2, and 4 were faster from 8 rows up (the
 * demo's LM head built for AVX2, on an Intel Xeon: 8 rows 4.9 against 5.7 ms, 40 rows 14.7
 * against 18.6) */
#ifdef __AVX512F__
#define ROWS 8
#else
#define ROWS 4
#endif
/* rows that share one pass over the panels */
#define CHUNK 64
/* panels a thread takes at a time. A static half each made a step wait for whichever thread the
 * OS had put aside: on 2 cores with one busy elsewhere (the app's event loop, the embedder), 40
 * rows of the demo's LM head took 33.7 ms on 2 threads against 28.8 on one; taken in runs, 22.7.
 * With AVX2 its vocabulary is 148 runs, 0.2 ms each at 40 rows on one core. */
#define TASK_PANELS 64
/* candidates a thread keeps for a row. The demo's and SmolLM2's rows leave 1-5 and 1-85 after
 * the whole pass (median 1); a thread keeps more on the way, the ids that reached its floor
 * before it rose */
#define CANDIDATES 1024
/* hidden indices a lane of a panel holds side by side. With AVX512-VNNI the screen multiplies four
 * 8-bit values at once into a 32-bit sum (vpdpbusd), the hidden row rounded to 8 bits as the LM
 * head is: the demo's LM head at 8 / 40 rows took 0.44x / 0.33x the time of widening each value
 * to a float for an FMA (2 threads, Intel Xeon). With AVX2 alone four 8-bit values a lane take
 * three instructions (vpsignb, vpmaddubsw, vpmaddwd), still fewer than an FMA a value: at 8 / 40
 * rows 0.68x / 0.67x the time on the demo, 0.80x / 0.73x on SmolLM2 (AMD EPYC, 2 threads;
 * bench/greedy_head_bench.py). AVX-512 without VNNI (and GREEDY_HEAD_WIDENED, which the tests and
 * that bench build) widens one value a lane. */
#if !defined(GREEDY_HEAD_WIDENED) && (defined(__AVX512F__) ? defined(__AVX512VNNI__) : defined(__AVX2__))
#define GROUP 4
#define QUANT_MAX 127.f /* as the LM head's rounding (greedy_head.py) */
/* what the rounded hidden rows are stored with: vpdpbusd takes them unsigned, offset by 128, which
 * each vocabulary row's sum of 8-bit values times 128 takes off again; vpmaddubsw, signed */
#ifdef __AVX512F__
#define ROUNDED_OFFSET 128
#else
#define ROUNDED_OFFSET 0
#endif
/* A hidden row rounded to 8 bits may loosen its bound past use: SmolLM2's final hidden states have
 * a few values 14x their RMS at the median (the demo's 2.7x), so their steps are coarse, and on
 * its LM head, those values rounded too, the rounding's bound came to 3.0x the LM head's own at
 * the median row (the demo's 0.96x, at most 1.28x), leaving too many candidates (SmolLM2's greedy
 * steps in engine_bench took 1.6-9.4x the time of the widened pass at 1-32 sequences). A chunk's
 * rows are rounded only where each row's rounding bound is at most this times the LM head's
 * rounding bound for it, both at the LM head's median rows. */
#define MAX_ROUNDING_RATIO 2.f
/* What coarsens the rounding is those few values: a hidden row's values above OUTLIER_RMS times its
 * RMS, at most MAX_OUTLIERS of them, are kept out of it and multiplied as floats (each against its
 * LM head values widened, per panel). On SmolLM2's final hidden states in greedy replies to chat
 * questions (the bench's 128) that kept 5 a row out at the median, 7 at most, and brought the
 * rounding's bound to 0.74x the LM head's at the median (0.90x at most); the demo's keep none. */
#define OUTLIER_RMS 4.f
#define MAX_OUTLIERS 8
#else
#define GROUP 1
#endif

typedef float floats __attribute__((vector_size(LANES * sizeof(float))));
typedef int8_t bytes __attribute__((vector_size(LANES)));
/* one vector of 32-bit lanes, four bytes each in a panel of GROUP 4 */
typedef int32_t words __attribute__((vector_size(LANES * sizeof(int32_t))));

int64_t greedy_head_lanes(void) { return LANES; }

int64_t greedy_head_group(void) { return GROUP; }

/* whether (value, id) comes before (best, best_id) in torch.argmax's order */
static int beats(float value, int64_t id, float best, int64_t best_id)
{
    if (best_id < 0) return 1;
    if (isnan(best)) return isnan(value) && id < best_id;
    return isnan(value) || value > best || (value == best && id < best_id);
}

/* the exact logit of vocabulary row `id` */
static float exact_logit(const float *hidden, const float *weight, int64_t id, int64_t hidden_size)
{
    const float *row = weight + id * hidden_size;
    float sum = 0.f;
    for (int64_t k = 0; k < hidden_size; k++) sum = fmaf(hidden[k], row[k], sum);
    return sum;
}

/* the largest exact logit's id over the whole vocabulary */
static int64_t exact_pick(const float *hidden, const float *weight, int64_t vocab_size, int64_t hidden_size)
{
    float best = 0.f;
    int64_t best_id = -1;
    for (int64_t id = 0; id < vocab_size; id++) {
        const float value = exact_logit(hidden, weight, id, hidden_size);
        if (beats(value, id, best, best_id)) {
            best = value;
            best_id = id;
        }
    }
    return best_id;
}

/* LANES int8 values as floats. GCC 12 widens a vector of int8 one lane at a time (its
 * __builtin_convertvector), which took the pass 2-3x the time: on x86 the instructions are named. */
static inline __attribute__((always_inline)) floats widen(const int8_t *values)
{
#if defined(__AVX512F__)
    return (floats)_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)values)));
#elif defined(__AVX2__)
    return (floats)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)values)));
#else
    bytes narrow;
    memcpy(&narrow, values, sizeof narrow);
    return __builtin_convertvector(narrow, floats);
#endif
}

static inline float max_lane(floats v)
{
    float m = v[0];
    for (int j = 1; j < LANES; j++) m = v[j] > m ? v[j] : m;
    return m;
}

/* the lanes' smaller values, and whether any lane reaches `bound`, in an instruction or two where
 * they are named: a screen runs for every row and panel, and with GCC's generic vectors, a lane at
 * a time, the pass over the demo's LM head at 32 rows took 0.98x the time of the bfloat16 panels
 * before it, 0.91x now */
static inline floats min_lanes(floats a, floats b)
{
#if defined(__AVX512F__)
    return (floats)_mm512_min_ps((__m512)a, (__m512)b);
#elif defined(__AVX2__)
    return (floats)_mm256_min_ps((__m256)a, (__m256)b);
#else
    floats out;
    for (int j = 0; j < LANES; j++) out[j] = a[j] < b[j] ? a[j] : b[j];
    return out;
#endif
}

static inline int any_reaches(floats a, float bound)
{
#if defined(__AVX512F__)
    return _mm512_cmp_ps_mask((__m512)a, _mm512_set1_ps(bound), _CMP_GE_OQ) != 0;
#elif defined(__AVX2__)
    return _mm256_movemask_ps(_mm256_cmp_ps((__m256)a, _mm256_set1_ps(bound), _CMP_GE_OQ)) != 0;
#else
    int any = 0;
    for (int j = 0; j < LANES; j++) any |= a[j] >= bound;
    return any;
#endif
}

/* what a thread keeps of a row: its floor, and the ids whose raised logit reached the floor then */
struct candidates {
    float floor;
    int32_t count; /* past CANDIDATES: too many, the row is computed exactly */
    int32_t ids[CANDIDATES];
    float ceilings[CANDIDATES];
};

/* keeps the candidates that still reach the floor; false if that leaves no room */
static int make_room(struct candidates *row)
{
    int32_t kept = 0;
    for (int32_t c = 0; c < row->count; c++)
        if (row->ceilings[c] >= row->floor) {
            row->ids[kept] = row->ids[c];
            row->ceilings[kept++] = row->ceilings[c];
        }
    row->count = kept;
    return kept < CANDIDATES;
}

/* a panel's scales and bounds, its low and high half (greedy_head.py's `bounds`, in that order);
 * `offsets`: ROUNDED_OFFSET times each row's sum of 8-bit values, what the hidden row's offset adds */
struct panel_bounds {
    floats scale[2], error_norm[2], error_max[2], rounding[2], weight_norm[2], weight_sum[2];
#if GROUP == 4
    words offsets[2];
#endif
};

/* a hidden row's norm and sum of magnitudes, rounded up: the bounds scale with them; where the
 * screen reads the row rounded to 8 bits, the step of that rounding and its error's norm and
 * largest magnitude (rounded up), else 1 and 0 */
struct magnitudes {
    float norm, sum, step, error_norm, error_max;
};

#if GROUP == 4
/* the hidden values a rounded row leaves out (zeros in it): their indices, and their values in steps
 * of the rounding */
struct outliers {
    int32_t count;
    int32_t index[MAX_OUTLIERS];
    float value[MAX_OUTLIERS];
};
#endif

/* a panel's screened logits for one row (ids `first_id` on), raised and lowered by their bounds */
static inline __attribute__((always_inline)) void screen(const floats sums[2], const struct panel_bounds *bounds,
                                                         struct magnitudes x, int64_t first_id, int64_t vocab_size,
                                                         struct candidates *row)
{
    floats ceiling[2], floor[2];
    for (int h = 0; h < 2; h++) {
        const floats logit = sums[h] * (bounds->scale[h] * x.step);
        /* the LM head's rounding against the hidden row, the hidden row's against the rounded LM
         * head, and the float32 roundings of both passes */
        const floats margin = min_lanes(bounds->error_norm[h] * x.norm, bounds->error_max[h] * x.sum) +
                              min_lanes(bounds->weight_norm[h] * x.error_norm, bounds->weight_sum[h] * x.error_max) +
                              bounds->rounding[h] * (x.norm + x.error_norm);
        ceiling[h] = logit + margin;
        floor[h] = logit - margin;
    }
    /* ids past the vocabulary: zeros in the panels, a bound of 0, and -inf here */
    if (first_id + 2 * LANES > vocab_size)
        for (int h = 0; h < 2; h++)
            for (int j = 0; j < LANES; j++)
                if (first_id + h * LANES + j >= vocab_size) ceiling[h][j] = floor[h][j] = -INFINITY;
    /* past the first panels the floor seldom rises, and few lanes reach it */
    if (any_reaches(floor[0], row->floor) || any_reaches(floor[1], row->floor)) {
        const float low = max_lane(floor[0]), high = max_lane(floor[1]), top = low > high ? low : high;
        row->floor = top > row->floor ? top : row->floor;
    }
    if (!(any_reaches(ceiling[0], row->floor) || any_reaches(ceiling[1], row->floor)) || row->count > CANDIDATES)
        return;
    for (int h = 0; h < 2; h++)
        for (int j = 0; j < LANES; j++) {
            if (!(ceiling[h][j] >= row->floor)) continue;
            if (row->count == CANDIDATES && !make_room(row)) {
                row->count = CANDIDATES + 1;
                return;
            }
            row->ids[row->count] = (int32_t)(first_id + h * LANES + j);
            row->ceilings[row->count++] = ceiling[h][j];
        }
}

#if GROUP == 4
/* the 32-bit lanes' byte `j` of `v`, sign-extended, as floats */
static inline __attribute__((always_inline)) floats widen_byte(words v, const int j)
{
    return __builtin_convertvector((v << (24 - 8 * j)) >> 24, floats);
}

/* `sum` plus, in each 32-bit lane, its four bytes of `x` (a hidden row's, as round_row stores them)
 * times those of `w` (the LM head's) */
static inline __attribute__((always_inline)) words dot_bytes(words sum, words x, words w)
{
#ifdef __AVX512F__
    return (words)_mm512_dpbusd_epi32((__m512i)sum, (__m512i)x, (__m512i)w);
#else
    /* vpmaddubsw multiplies unsigned bytes by signed ones and saturates each pair's sum at 16
     * bits: w's magnitudes by x with w's sign, a pair at most 2 x 127 x 127 = 32,258 */
    const __m256i pairs = _mm256_maddubs_epi16(_mm256_abs_epi8((__m256i)w), _mm256_sign_epi8((__m256i)x, (__m256i)w));
    return sum + (words)_mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
#endif
}

/* `num_rows` rows of `x`, the hidden rows rounded to 8 bits (round_row), against one panel: four
 * hidden indices a lane multiplied at once, summed in 32 bits. As panel_rows_widened, always
 * called with a constant `num_rows`. */
static inline __attribute__((always_inline)) void panel_rows_rounded(const uint8_t *restrict x,
                                                                     const struct outliers *outliers,
                                                                     const int8_t *panel, int64_t num_groups,
                                                                     const int num_rows,
                                                                     const struct panel_bounds *bounds,
                                                                     const struct magnitudes *xs, int64_t first_id,
                                                                     int64_t vocab_size, struct candidates *rows)
{
    words acc[ROWS][2];
#pragma GCC unroll 8
    for (int i = 0; i < num_rows; i++) acc[i][0] = acc[i][1] = (words){0};
    for (int64_t g = 0; g < num_groups; g++) {
        words low, high;
        memcpy(&low, panel + 2 * g * LANES * GROUP, sizeof low);
        memcpy(&high, panel + (2 * g + 1) * LANES * GROUP, sizeof high);
#pragma GCC unroll 8
        for (int i = 0; i < num_rows; i++) {
            int32_t values;
            memcpy(&values, x + (i * num_groups + g) * GROUP, sizeof values);
            const words value = (words){0} + values;
            acc[i][0] = dot_bytes(acc[i][0], value, low);
            acc[i][1] = dot_bytes(acc[i][1], value, high);
        }
    }
    for (int i = 0; i < num_rows; i++) {
        /* whole numbers, exact in float32 below 2^24 (a hidden size up to 1,040), else rounded once */
        floats sums[2] = {__builtin_convertvector(acc[i][0] - bounds->offsets[0], floats),
                          __builtin_convertvector(acc[i][1] - bounds->offsets[1], floats)};
        for (int32_t o = 0; o < outliers[i].count; o++) {
            const int32_t k = outliers[i].index[o];
            words low, high;
            memcpy(&low, panel + 2 * (k / GROUP) * LANES * GROUP, sizeof low);
            memcpy(&high, panel + (2 * (k / GROUP) + 1) * LANES * GROUP, sizeof high);
            sums[0] += outliers[i].value[o] * widen_byte(low, k % GROUP);
            sums[1] += outliers[i].value[o] * widen_byte(high, k % GROUP);
        }
        screen(sums, bounds, xs[i], first_id, vocab_size, &rows[i]);
    }
}
#endif

/* `num_rows` rows of `x`, the hidden rows (padded to whole groups), against one panel, each 8-bit
 * value widened to a float. Always called with a constant `num_rows` (the switch in scan): the
 * accumulators then stay in registers, where a count known only at run time kept them on the
 * stack, loaded and stored at every hidden index. */
static inline __attribute__((always_inline)) void panel_rows_widened(const float *restrict x, const int8_t *panel,
                                                                     int64_t num_groups, const int num_rows,
                                                                     const struct panel_bounds *bounds,
                                                                     const struct magnitudes *xs, int64_t first_id,
                                                                     int64_t vocab_size, struct candidates *rows)
{
    floats acc[ROWS][2];
#pragma GCC unroll 8
    for (int i = 0; i < num_rows; i++) acc[i][0] = acc[i][1] = (floats){0};
    for (int64_t g = 0; g < num_groups; g++) {
#if GROUP == 4
        words low_bytes, high_bytes;
        memcpy(&low_bytes, panel + 2 * g * LANES * GROUP, sizeof low_bytes);
        memcpy(&high_bytes, panel + (2 * g + 1) * LANES * GROUP, sizeof high_bytes);
#endif
#pragma GCC unroll 4
        for (int j = 0; j < GROUP; j++) {
#if GROUP == 4
            const floats low = widen_byte(low_bytes, j), high = widen_byte(high_bytes, j);
#else
            const floats low = widen(panel + 2 * g * LANES), high = widen(panel + (2 * g + 1) * LANES);
#endif
#pragma GCC unroll 8
            for (int i = 0; i < num_rows; i++) {
                const float value = x[(i * num_groups + g) * GROUP + j];
                acc[i][0] += value * low;
                acc[i][1] += value * high;
            }
        }
    }
    for (int i = 0; i < num_rows; i++) screen(acc[i], bounds, xs[i], first_id, vocab_size, &rows[i]);
}

/* this thread's share of the panels, ROWS rows at a time. Widening a panel once for all rows,
 * into a buffer of floats, took 1.3-1.4x the time at 32-40 rows: the buffer's vectors did not
 * stay in registers; widened again for each ROWS, 32-40 rows take what the bfloat16 panels took. */
/* the rows `x` as they are (padded to whole groups), or rounded to 8 bits where `rounded` is not NULL */
struct screened_rows {
    const float *x;
    const uint8_t *rounded;
#if GROUP == 4
    const struct outliers *outliers;
#endif
};

static void scan(struct screened_rows x, const int8_t *panels, const float *bounds, const struct magnitudes *xs,
                 int64_t num_rows, int64_t vocab_size, int64_t num_groups, struct candidates *rows)
{
    const int64_t num_panels = (vocab_size + 2 * LANES - 1) / (2 * LANES), padded = 2 * LANES * num_panels;
#pragma omp for schedule(dynamic, TASK_PANELS) nowait
    for (int64_t p = 0; p < num_panels; p++) {
        const int64_t first_id = 2 * p * LANES;
        const int8_t *panel = panels + p * 2 * LANES * GROUP * num_groups;
        struct panel_bounds panel_bounds;
        memcpy(panel_bounds.scale, bounds + first_id, sizeof panel_bounds.scale);
        memcpy(panel_bounds.error_norm, bounds + padded + first_id, sizeof panel_bounds.error_norm);
        memcpy(panel_bounds.error_max, bounds + 2 * padded + first_id, sizeof panel_bounds.error_max);
        memcpy(panel_bounds.rounding, bounds + 3 * padded + first_id, sizeof panel_bounds.rounding);
        memcpy(panel_bounds.weight_norm, bounds + 4 * padded + first_id, sizeof panel_bounds.weight_norm);
        memcpy(panel_bounds.weight_sum, bounds + 5 * padded + first_id, sizeof panel_bounds.weight_sum);
#if GROUP == 4
        for (int h = 0; h < 2; h++) {
            floats sums;
            memcpy(&sums, bounds + 6 * padded + first_id + h * LANES, sizeof sums);
            panel_bounds.offsets[h] = __builtin_convertvector(sums, words) * ROUNDED_OFFSET;
        }
#endif
        for (int64_t first = 0; first < num_rows; first += ROWS) {
#if GROUP == 4
#define ROUNDED_ROWS(n)                                                                                            \
    if (x.rounded != NULL) {                                                                                       \
        panel_rows_rounded(x.rounded + first * num_groups * GROUP, x.outliers + first, panel, num_groups, n,       \
                           &panel_bounds, xs + first, first_id, vocab_size, rows + first);                        \
        break;                                                                                                     \
    }
#else
#define ROUNDED_ROWS(n)
#endif
#define PANEL_ROWS(n)                                                                                              \
    case n:                                                                                                        \
        ROUNDED_ROWS(n)                                                                                            \
        panel_rows_widened(x.x + first * num_groups * GROUP, panel, num_groups, n, &panel_bounds, xs + first,      \
                           first_id, vocab_size, rows + first);                                                   \
        break;
            switch (num_rows - first < ROWS ? (int)(num_rows - first) : ROWS) {
                PANEL_ROWS(1)
                PANEL_ROWS(2)
                PANEL_ROWS(3)
                PANEL_ROWS(4)
#if ROWS == 8
                PANEL_ROWS(5)
                PANEL_ROWS(6)
                PANEL_ROWS(7)
                PANEL_ROWS(8)
#endif
            }
#undef ROUNDED_ROWS
#undef PANEL_ROWS
        }
    }
}

/* the highest floor of the threads' for a row, and whether one of them kept too many candidates */
static float floor_of(const struct candidates *kept, int64_t stride, int num_threads, int *overflowed)
{
    float floor = -INFINITY;
    *overflowed = 0;
    for (int t = 0; t < num_threads; t++) {
        *overflowed |= kept[t * stride].count > CANDIDATES;
        floor = kept[t * stride].floor > floor ? kept[t * stride].floor : floor;
    }
    return floor;
}

/* the id that the threads' candidates under `floor` leave for the row, computed exactly */
static int64_t pick(const float *hidden, const float *weight, int64_t hidden_size, const struct candidates *kept,
                    int64_t stride, int num_threads, float floor)
{
    float best = 0.f;
    int64_t best_id = -1;
    for (int t = 0; t < num_threads; t++) {
        const struct candidates *row = &kept[t * stride];
        for (int32_t c = 0; c < row->count; c++) {
            if (!(row->ceilings[c] >= floor)) continue;
            const float value = exact_logit(hidden, weight, row->ids[c], hidden_size);
            if (beats(value, row->ids[c], best, best_id)) {
                best = value;
                best_id = row->ids[c];
            }
        }
    }
    return best_id;
}

/* one pass of the screen over `rows` rows on up to `team` threads, each thread's candidates
 * starting from `floors` */
static int screen_rows(struct screened_rows x, const int8_t *panels, const float *bounds, const struct magnitudes *xs,
                       const float *floors, int64_t rows, int64_t vocab_size, int64_t num_groups,
                       struct candidates *kept, int64_t stride, int team)
{
    int num_threads = 1;
#pragma omp parallel num_threads(team)
    {
        const int t = omp_get_thread_num();
        if (t == 0) num_threads = omp_get_num_threads();
        struct candidates *mine = kept + t * stride;
        for (int64_t i = 0; i < rows; i++) {
            mine[i].floor = floors[i];
            mine[i].count = 0;
        }
        scan(x, panels, bounds, xs, rows, vocab_size, num_groups, mine);
    }
    return num_threads;
}

/* a hidden row's norm and sum of magnitudes, rounded up; the screen reads the row itself */
static struct magnitudes magnitudes(const float *row, int64_t hidden_size)
{
    double squares = 0., sum = 0.;
    for (int64_t k = 0; k < hidden_size; k++) {
        const double value = row[k];
        squares += value * value;
        sum += fabs(value);
    }
    return (struct magnitudes){nextafterf((float)sqrt(squares), INFINITY), nextafterf((float)sum, INFINITY), 1.f, 0.f,
                               0.f};
}

#if GROUP == 4
/* the largest values of `row` past OUTLIER_RMS times its RMS (from its norm `norm`), at most
 * MAX_OUTLIERS, into `outliers` (indices in order of magnitude, values not yet set) */
static void find_outliers(const float *row, int64_t hidden_size, float norm, struct outliers *outliers)
{
    const float threshold = OUTLIER_RMS * norm / sqrtf((float)hidden_size);
    float magnitude[MAX_OUTLIERS];
    outliers->count = 0;
    for (int64_t k = 0; k < hidden_size; k++) {
        const float m = fabsf(row[k]);
        if (!(m > threshold) || (outliers->count == MAX_OUTLIERS && m <= magnitude[MAX_OUTLIERS - 1])) continue;
        int32_t at = outliers->count < MAX_OUTLIERS ? outliers->count++ : MAX_OUTLIERS - 1;
        for (; at > 0 && magnitude[at - 1] < m; at--) {
            magnitude[at] = magnitude[at - 1];
            outliers->index[at] = outliers->index[at - 1];
        }
        magnitude[at] = m;
        outliers->index[at] = (int32_t)k;
    }
}

static int is_outlier(const struct outliers *outliers, int64_t k)
{
    for (int32_t o = 0; o < outliers->count; o++)
        if (outliers->index[o] == k) return 1;
    return 0;
}

/* `row` but its outliers rounded to steps of its largest other magnitude / 127, offset by
 * ROUNDED_OFFSET into `out` (`padded` bytes, zero values past `hidden_size` and at the outliers),
 * its outliers into `outliers`, and its step and error's norm and largest magnitude into `x`. A
 * row that is not finite is computed exactly whatever its screen says: it screens as zeros. */
static void round_row(const float *row, int64_t hidden_size, int64_t padded, uint8_t *out, struct magnitudes *x,
                      struct outliers *outliers)
{
    const int finite = isfinite(x->sum);
    outliers->count = 0;
    if (finite) find_outliers(row, hidden_size, x->norm, outliers);
    float largest = 0.f;
    for (int64_t k = 0; k < hidden_size; k++)
        if (!is_outlier(outliers, k)) largest = fmaxf(largest, fabsf(row[k]));
    x->step = finite && largest > 0.f ? largest / QUANT_MAX : 1.f;
    for (int32_t o = 0; o < outliers->count; o++) outliers->value[o] = row[outliers->index[o]] / x->step;
    double squares = 0., error_max = 0.;
    for (int64_t k = 0; k < padded; k++) {
        float value = 0.f;
        if (k < hidden_size && finite && !is_outlier(outliers, k)) {
            value = nearbyintf(row[k] / x->step);
            value = fminf(fmaxf(value, -QUANT_MAX), QUANT_MAX);
            /* the product is exact in double: a float times a whole number below 2^8 */
            const double error = fabs((double)row[k] - (double)x->step * value);
            squares += error * error;
            error_max = error > error_max ? error : error_max;
        }
        out[k] = (uint8_t)((int)value + ROUNDED_OFFSET); /* two's complement where the offset is 0 */
    }
    x->error_norm = nextafterf((float)sqrt(squares), INFINITY);
    x->error_max = nextafterf((float)error_max, INFINITY);
}
#endif

#if GROUP == 4
/* whether rounding the row adds to its bound at most MAX_ROUNDING_RATIO times what the LM head's
 * own rounding adds, at the LM head's median rows (`typical`: their error norm, largest error,
 * and the norm and sum of magnitudes of their rounding) */
static int worth_rounding(struct magnitudes x, const float *typical)
{
    const float head = fminf(x.norm * typical[0], x.sum * typical[1]);
    const float row = fminf(x.error_norm * typical[2], x.error_max * typical[3]);
    return row <= MAX_ROUNDING_RATIO * head;
}
#endif

/* the bytes of the candidates `greedy_head` keeps for `num_rows` rows on each thread */
int64_t greedy_head_workspace(int64_t num_rows)
{
    return (int64_t)sizeof(struct candidates) * (num_rows < CHUNK ? num_rows : CHUNK);
}

/* token_ids[r] = argmax over the vocabulary of hidden[r] . weight[v], for r < num_rows; `weight`
 * [vocab_size, hidden_size] is the LM head, and `panels` and `bounds` its screen (greedy_head.py),
 * zeros past the vocabulary, used where `screened`; `workspace`: greedy_head_workspace's bytes
 * for each of `team` threads, the most the screen runs on. The caller names the team it sized the
 * workspace for, rather than this reading OpenMP's thread count again, which another thread's
 * torch.set_num_threads may have changed in between. */
void greedy_head(const float *hidden, const float *weight, const int8_t *panels, const float *bounds,
                 const float *typical, void *workspace, int64_t team, int64_t *token_ids, int64_t screened,
                 int64_t num_rows, int64_t vocab_size, int64_t hidden_size)
{
    if (!screened) {
        for (int64_t r = 0; r < num_rows; r++)
            token_ids[r] = exact_pick(hidden + r * hidden_size, weight, vocab_size, hidden_size);
        return;
    }
    /* a thread's rows of a chunk side by side */
    const int64_t stride = num_rows < CHUNK ? num_rows : CHUNK;
    const int64_t num_groups = (hidden_size + GROUP - 1) / GROUP, width = num_groups * GROUP;
    struct candidates *kept = workspace;
    struct magnitudes xs[CHUNK];
    /* the rows padded with zeros to whole groups, where the hidden size is none: else read in place */
    float *padded_rows = width == hidden_size ? NULL : calloc(CHUNK * width, sizeof(float));
    if (width != hidden_size && padded_rows == NULL) abort();
#if GROUP == 4
    uint8_t *rounded_rows = malloc(CHUNK * width);
    if (rounded_rows == NULL) abort();
#endif
    for (int64_t first = 0; first < num_rows; first += CHUNK) {
        const int64_t rows = num_rows - first < CHUNK ? num_rows - first : CHUNK;
        const float *chunk = hidden + first * hidden_size;
        for (int64_t i = 0; i < rows; i++) xs[i] = magnitudes(chunk + i * hidden_size, hidden_size);
        struct screened_rows x = {.x = chunk};
        const struct magnitudes *screened = xs;
        if (padded_rows != NULL) {
            for (int64_t i = 0; i < rows; i++)
                memcpy(padded_rows + i * width, chunk + i * hidden_size, sizeof(float) * hidden_size);
            x.x = padded_rows;
        }
#if GROUP == 4
        struct magnitudes rounded_xs[CHUNK];
        struct outliers outliers[CHUNK];
        int rounding = 1;
        for (int64_t i = 0; i < rows; i++) {
            rounded_xs[i] = xs[i];
            round_row(chunk + i * hidden_size, hidden_size, width, rounded_rows + i * width, &rounded_xs[i],
                      &outliers[i]);
            rounding &= worth_rounding(rounded_xs[i], typical);
        }
        if (rounding) {
            x.rounded = rounded_rows;
            x.outliers = outliers;
            screened = rounded_xs;
        }
#else
        (void)typical;
#endif
        float floors[CHUNK];
        for (int64_t i = 0; i < rows; i++) floors[i] = -INFINITY;
        const int num_threads =
            screen_rows(x, panels, bounds, screened, floors, rows, vocab_size, num_groups, kept, stride, team);
        int overflowed[CHUNK];
        for (int64_t i = 0; i < rows; i++) {
            floors[i] = floor_of(kept + i, stride, num_threads, &overflowed[i]);
            token_ids[first + i] = -1;
            if (isfinite(xs[i].sum) && !overflowed[i])
                token_ids[first + i] = pick(chunk + i * hidden_size, weight, hidden_size, kept + i, stride, num_threads,
                                            floors[i]);
        }
        /* a thread met too many candidates before its floor rose: the row again, its floor known
         * from the start, so that only the ids that reach it are kept (the workspace is free now),
         * and not rounded, whose bound is the tighter */
        for (int64_t i = 0; i < rows; i++) {
            const float *row = chunk + i * hidden_size;
            if (isfinite(xs[i].sum) && overflowed[i]) {
                const struct screened_rows alone = {.x = x.x + i * width};
                const int again =
                    screen_rows(alone, panels, bounds, xs + i, &floors[i], 1, vocab_size, num_groups, kept, 1, team);
                int still;
                floor_of(kept, 1, again, &still);
                if (!still) token_ids[first + i] = pick(row, weight, hidden_size, kept, 1, again, floors[i]);
            }
            if (token_ids[first + i] < 0) token_ids[first + i] = exact_pick(row, weight, vocab_size, hidden_size);
        }
    }
    free(padded_rows);
#if GROUP == 4
    free(rounded_rows);
#endif
}
