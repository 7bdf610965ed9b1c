/* The conv prefill op: validation, the byte model, and the run over (time chunk,
 * channel block) units on the ISA's kernel. */
#include "isa.h"
#include "threads.h"

int gdn_prefill_validate(const gdn_prefill_params *p, int64_t num_tokens, int64_t *bad_index,
                         int64_t *bad_value) {
    /* query_start_loc, slot range, duplicate live slots: the update's checks (none of
     * its speculative ones run: num_accepted_tokens is NULL), read slots, snapshots */
    return gdn_slots_validate(&p->conv, num_tokens, 1, p->has_initial_state, p->snapshots, p->num_snapshots,
                              bad_index, bad_value);
}

int64_t gdn_prefill_bytes(const gdn_prefill_params *p) {
    const int64_t W = p->conv.width;
    int64_t rows = 0;
    for (int64_t i = 0; i < p->conv.batch; i++) {
        const gdn_prefill_request r = gdn_prefill_get_request(p, i);
        if (!r.skip) rows += 2 * r.T + (r.init ? W - 1 : 0) + (r.state ? W - 1 : 0);
        if (!r.skip && r.init && p->conv.initial_state_indices &&
            p->conv.initial_state_indices[i] != (p->conv.conv_state_indices ? p->conv.conv_state_indices[i] : i))
            rows += W - 1;
    }
    rows += p->num_snapshots * (W - 1);
    return rows * p->conv.dim * gdn_elsize(p->conv.dtype) + p->conv.dim * W * gdn_elsize(p->conv.weight_dtype);
}

/* One call's run. Its token rows, requests laid end to end (request i holds rows
 * start_i .. start_i + T_i - 1), are cut into chunks of GDN_PREFILL_CHUNK rows, and
 * the channels into nblocks blocks; unit u is chunk u / nblocks, block u % nblocks,
 * so a thread's contiguous range of units streams contiguous rows. */
typedef struct {
    const gdn_prefill_params *p;
    gdn_prefill_kernel_fn kernel;
    const float *w, *b;       /* fp32 weights (w[k * ld + c]) and bias [D] */
    int64_t ld, rows, nblocks, block;
} prefill_run;

static int64_t request_start(const gdn_update_params *p, int64_t i) {
    return p->query_start_loc ? p->query_start_loc[i] : i * p->seqlen;
}

/* A chunk boundary at token b of a request of T tokens with W-1 = H history rows.
 * One inside the first H tokens moves to 0, so a unit that starts a piece of a
 * request at t0 > 0 reads its window from x alone, and the history is read only by
 * the unit holding token 0, which also writes the state (after reading the history).
 * Writing the state from the unit holding the sequence end instead raced with a unit
 * still reading the history from the same slot. */
static int64_t boundary(int64_t b, int64_t T, int64_t H) {
    b = b < 0 ? 0 : b > T ? T : b;
    return b < H && b < T ? 0 : b;
}

/* Out rows [t0, t1), channels [c0, c1) of a pad request, to zero. */
static void zero_rows(const gdn_update_params *p, const gdn_prefill_request *r, int64_t c0, int64_t c1,
                      int64_t t0, int64_t t1) {
    const int e = gdn_elsize(p->dtype);
    for (int64_t t = t0; t < t1; t++) {
        char *row = r->out + (int64_t)e * t * p->out_stride_t;
        if (p->out_stride_d == 1) memset(row + (int64_t)e * c0, 0, (size_t)(e * (c1 - c0)));
        else
            for (int64_t c = c0; c < c1; c++) gdn_store_raw(row, c * p->out_stride_d, 0, p->dtype);
    }
}

/* Before the unit holding token 0 of request i (which reads the history and writes the
 * state), channels [c0, c1): a history read from another slot is copied into the write
 * slot, then request i's snapshots are written from it and x (validation keeps every
 * slot written here apart from what other units read). */
static void prepare(const gdn_prefill_params *pp, int64_t i, const gdn_prefill_request *r, int64_t c0,
                    int64_t c1) {
    const gdn_update_params *p = &pp->conv;
    const int32_t *snap = pp->snapshots;
    const int64_t slot = p->conv_state_indices ? p->conv_state_indices[i] : i, e = gdn_elsize(p->dtype);
    if (r->init && p->initial_state_indices && p->initial_state_indices[i] != slot)
        gdn_copy_rows(p, p->initial_state_indices[i], slot, 0, p->width - 1, c0, c1);
    int64_t k = 0, hi = pp->num_snapshots;   /* the first snapshot of request i */
    while (k < hi) {
        const int64_t mid = k + (hi - k) / 2;
        if (snap[3 * mid] < i) k = mid + 1;
        else hi = mid;
    }
    for (; k < pp->num_snapshots && snap[3 * k] == i; k++) {
        gdn_prefill_request s = *r;
        s.T = snap[3 * k + 1];
        gdn_prefill_write_rows(pp, &s, (char *)p->conv_state + e * snap[3 * k + 2] * p->state_stride_s, c0, c1);
    }
}

static void run_unit(const prefill_run *run, int64_t u) {
    const gdn_prefill_params *pp = run->p;
    const gdn_update_params *p = &pp->conv;
    const int64_t H = p->width - 1;
    const int64_t g0 = u / run->nblocks * GDN_PREFILL_CHUNK;
    const int64_t g1 = g0 + GDN_PREFILL_CHUNK < run->rows ? g0 + GDN_PREFILL_CHUNK : run->rows;
    const int64_t c0 = u % run->nblocks * run->block;
    const int64_t c1 = c0 + run->block < p->dim ? c0 + run->block : p->dim;
    /* the first request with rows at or after g0 */
    int64_t i = 0;
    if (p->query_start_loc) {
        int64_t hi = p->batch - 1;
        while (i < hi) {
            const int64_t mid = i + (hi - i) / 2;
            if (p->query_start_loc[mid + 1] > g0) hi = mid;
            else i = mid + 1;
        }
    } else {
        i = g0 / p->seqlen;
    }
    for (; i < p->batch && request_start(p, i) < g1; i++) {
        const gdn_prefill_request r = gdn_prefill_get_request(pp, i);
        const int64_t s = request_start(p, i);
        if (r.T <= 0) continue;
        if (r.skip) {   /* a pad request */
            if (p->skipped_rows == GDN_SKIPPED_ZERO) {
                const int64_t t0 = g0 > s ? g0 - s : 0, t1 = g1 - s < r.T ? g1 - s : r.T;
                zero_rows(p, &r, c0, c1, t0, t1);
            }
            continue;
        }
        const int64_t t0 = boundary(g0 - s, r.T, H), t1 = boundary(g1 - s, r.T, H);
        if (t0 < t1 && t0 == 0 && r.state) prepare(pp, i, &r, c0, c1);
        if (t0 < t1) run->kernel(pp, run->w, run->ld, run->b, i, c0, c1, t0, t1);
    }
}

static void run_range(void *ctx, int64_t u0, int64_t u1) {
    for (int64_t u = u0; u < u1; u++) run_unit((const prefill_run *)ctx, u);
}

/* Fewer chunks than this many per thread (of two or more): channel blocks too, the
 * fewest (of a multiple of GDN_BLOCK_CHANNELS) that make as many units, so short
 * prompts still use every thread and each unit's rows stay as long as they can
 * (blocks of 256 channels made a one-thread 1x512 prefill at D=8192 take 5x its warm
 * time cold: 512-byte row pieces 16 KiB apart). */
#define GDN_PREFILL_CHUNKS_PER_THREAD 4

int gdn_prefill_run(const gdn_prefill_params *pp, int num_threads) {
    const gdn_update_params *p = &pp->conv;
    const int64_t D = p->dim, W = p->width;
    prefill_run run;
    run.p = pp;
    run.rows = p->query_start_loc ? p->query_start_loc[p->batch] : p->batch * p->seqlen;
    if (run.rows <= 0 || D <= 0) return GDN_OK;
    /* the SIMD kernels need channel stride 1 in x and out (the state may have any) */
    const int simd = p->x_stride_d == 1 && p->out_stride_d == 1;
    const gdn_isa *isa = simd ? gdn_isa_active() : gdn_isa_portable();
    run.kernel = isa->prefill;
    /* fp32 weights with unit channel stride (pack_weight's layout) are read in place,
     * with a fp32 bias of unit stride; anything else is converted once per call on
     * the calling thread, into its scratch, which every thread then reads */
    if (gdn_weight_f32_rows(p)) {
        run.w = (const float *)p->weight;
        run.ld = p->weight_stride_w;
        if (p->bias && p->bias_stride == 1) {
            run.b = (const float *)p->bias;
        } else {
            float *scratch = gdn_thread_scratch(D);
            if (!scratch) return GDN_ERR_NO_MEMORY;
            gdn_fill_bias(p, 0, D, scratch);
            run.b = scratch;
        }
    } else {
        float *scratch = gdn_thread_scratch((W + 1) * D);
        if (!scratch) return GDN_ERR_NO_MEMORY;
        if (isa->update_fill) isa->update_fill(p, 0, D, scratch, D, scratch + W * D);
        else gdn_fill_weights_any(p, 0, D, scratch, D, scratch + W * D);
        run.w = scratch;
        run.ld = D;
        run.b = scratch + W * D;
    }
    const int64_t chunks = (run.rows + GDN_PREFILL_CHUNK - 1) / GDN_PREFILL_CHUNK;
    const int64_t most = num_threads < 0 ? -(int64_t)num_threads : num_threads;   /* < 0: a default call */
    const int64_t want = most > 1 ? GDN_PREFILL_CHUNKS_PER_THREAD * most : 1;
    const int64_t split = chunks >= want ? 1 : (want + chunks - 1) / chunks;
    const int64_t per = (D + split - 1) / split;
    run.block = split == 1 ? D : (per + GDN_BLOCK_CHANNELS - 1) / GDN_BLOCK_CHANNELS * GDN_BLOCK_CHANNELS;
    run.nblocks = (D + run.block - 1) / run.block;
    const int64_t units = chunks * run.nblocks;
    gdn_parallel_for(gdn_threads_for(num_threads, units, gdn_prefill_bytes(pp)), units, run_range, &run);
    return GDN_OK;
}
