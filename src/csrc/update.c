/* The conv update op: validation of the index arrays, the byte model, and the run
 * over (requests, channel block) units on the ISA's kernel. */
#include <stdlib.h>

#include "isa.h"
#include "threads.h"

/* The checks of both ops (update.h); the update's call reads every live request's slot. */
int gdn_update_validate(const gdn_update_params *p, int64_t num_tokens, int64_t *bad_index,
                        int64_t *bad_value) {
    return gdn_slots_validate(p, num_tokens, 0, NULL, NULL, 0, bad_index, bad_value);
}

int gdn_slots_validate(const gdn_update_params *p, int64_t num_tokens, int prefill, const uint8_t *init,
                       const int32_t *snap, int64_t K, int64_t *bad_index, int64_t *bad_value) {
    const int32_t *qsl = p->query_start_loc, *idx = p->conv_state_indices, *nat = p->num_accepted_tokens;
    const int32_t *isi = p->initial_state_indices;
    const int64_t B = p->batch, S = p->num_slots, W = p->width, L = p->state_len;
#define FAIL(code, i, v) do { *bad_index = (i); *bad_value = (v); rc = (code); goto done; } while (0)
#define T_OF(i) (qsl ? qsl[(i) + 1] - qsl[i] : p->seqlen)
    int rc = GDN_OK;
    uint64_t stack_bits[1024], *bits = stack_bits;
    int32_t *owner = NULL;       /* [S]: the request writing each slot, -1: none (with isi) */
    const int64_t words = (S + 63) / 64;
    const int track = idx || K > 0;
    if (track && words > 1024) {
        bits = (uint64_t *)calloc((size_t)words, sizeof(uint64_t));
        if (!bits) return GDN_ERR_NO_MEMORY;
    } else if (track) {
        memset(bits, 0, (size_t)words * sizeof(uint64_t));
    }
    if (isi && S > 0) {
        owner = (int32_t *)malloc((size_t)S * sizeof(int32_t));
        if (!owner) {
            if (bits != stack_bits) free(bits);
            return GDN_ERR_NO_MEMORY;
        }
        memset(owner, 0xff, (size_t)S * sizeof(int32_t));
    }
    if (qsl) {
        if (qsl[0] != 0) FAIL(GDN_ERR_QSL_START, 0, qsl[0]);
        for (int64_t j = 1; j <= B; j++)
            if (qsl[j] < qsl[j - 1]) FAIL(GDN_ERR_QSL_ORDER, j, qsl[j]);
        if (qsl[B] != num_tokens) FAIL(GDN_ERR_QSL_END, B, qsl[B]);
    }
    for (int64_t i = 0; i < B; i++) {
        if (gdn_is_pad(p, i)) continue;
        const int64_t s = idx ? idx[i] : i;
        if (idx) {
            if (s < 0 || s >= S) FAIL(GDN_ERR_SLOT_RANGE, i, s);
            if ((bits[s >> 6] >> (s & 63)) & 1u) FAIL(GDN_ERR_SLOT_DUPLICATE, i, s);
            bits[s >> 6] |= 1ull << (s & 63);
        } else if (K > 0 && s < S) {
            bits[s >> 6] |= 1ull << (s & 63);
        }
        if (owner && s < S && T_OF(i) > 0) owner[s] = (int32_t)i;
        if (nat) {
            const int64_t T = T_OF(i);
            if (nat[i] < 1 || nat[i] - 1 + W - 1 > L) FAIL(GDN_ERR_ACCEPTED_RANGE, i, nat[i]);
            if (W - 2 + T > L) FAIL(GDN_ERR_SPEC_TOKENS, i, T);
        }
    }
    /* snapshots: in request order, of live requests, 1 <= p <= T_i, slots written once */
    for (int64_t k = 0; k < K; k++) {
        const int64_t i = snap[3 * k], tok = snap[3 * k + 1], s = snap[3 * k + 2];
        if (i < 0 || i >= B || (k > 0 && i < snap[3 * (k - 1)]) || gdn_is_pad(p, i) || T_OF(i) <= 0)
            FAIL(GDN_ERR_SNAPSHOT_REQUEST, k, i);
        if (tok < 1 || tok > T_OF(i)) FAIL(GDN_ERR_SNAPSHOT_TOKENS, k, tok);
        if (s < 0 || s >= S) FAIL(GDN_ERR_SNAPSHOT_SLOT_RANGE, k, s);
        if ((bits[s >> 6] >> (s & 63)) & 1u) FAIL(GDN_ERR_SNAPSHOT_DUPLICATE, k, s);
        bits[s >> 6] |= 1ull << (s & 63);
        if (owner) owner[s] = (int32_t)i;
    }
    /* read slots: in range, and none written by another request of the call */
    for (int64_t i = 0; isi && i < B; i++) {
        if (gdn_is_pad(p, i) || T_OF(i) <= 0 || (prefill && !(init && init[i]))) continue;
        const int64_t r = isi[i], s = idx ? idx[i] : i;
        if (r < 0 || r >= S) FAIL(GDN_ERR_READ_SLOT_RANGE, i, r);
        if (owner[r] >= 0 && owner[r] != i) FAIL(GDN_ERR_READ_WRITTEN, i, r);
        if (nat && r != s && nat[i] > T_OF(i)) FAIL(GDN_ERR_SPEC_READ, i, nat[i]);
    }
done:
    if (bits != stack_bits) free(bits);
    free(owner);
    return rc;
#undef T_OF
#undef FAIL
}

int64_t gdn_update_bytes(const gdn_update_params *p) {
    const int64_t W = p->width;
    int64_t rows = 0;
    for (int64_t i = 0; i < p->batch; i++) {
        const gdn_request r = gdn_get_request(p, i);
        if (!r.skip) rows += r.T + r.T + (W - 1) + (W - 2 + r.T);
        if (!r.skip && p->initial_state_indices &&
            p->initial_state_indices[i] != (p->conv_state_indices ? p->conv_state_indices[i] : i))
            rows += W - 1;
    }
    return rows * p->dim * gdn_elsize(p->dtype) + p->dim * W * gdn_elsize(p->weight_dtype);
}

/* One call's run: the kernel, its units, and whether threads convert the weights. */
typedef struct {
    const gdn_update_params *p;
    const gdn_isa *isa;
    gdn_update_kernel_fn kernel; /* isa->update */
    int64_t blocks, per_unit;    /* channel blocks; requests per unit */
    int convert;                 /* each thread converts the weights once into its scratch */
} update_run;

/* The units' order: p->channel_groups (G) contiguous ranges of channel blocks, and within
 * each, request-major, so a thread's consecutive units continue the same rows. G = 1:
 * unit u is request u / blocks, block u % blocks. G > 1 (one range per thread, few
 * requests: see gdn_update_run): each thread reads its range's weights once from memory
 * and again from its L2 for the next requests, where with G = 1 every thread reads all
 * of them. Returns the unit's first request and its channel block. */
static void unit_of(const update_run *run, int64_t u, int64_t *r0, int64_t *block) {
    const int64_t G = run->p->channel_groups, nr = (run->p->batch + run->per_unit - 1) / run->per_unit;
    const int64_t per = (run->blocks + G - 1) / G;            /* blocks per range, the last has the rest */
    const int64_t g = u / (nr * per), nb = run->blocks - g * per < per ? run->blocks - g * per : per;
    const int64_t v = u - g * nr * per;
    *r0 = v / nb * run->per_unit;
    *block = g * per + v % nb;
}

/* Unit u: requests [r0, r1) x a channel block. Rows of pad requests are zeroed or take
 * x's values when asked. */
static void run_unit(const update_run *run, const gdn_update_params *p, int64_t u) {
    int64_t r0, block;
    unit_of(run, u, &r0, &block);
    const int64_t c0 = block * p->block_channels;
    const int64_t c1 = c0 + p->block_channels < p->dim ? c0 + p->block_channels : p->dim;
    const int64_t r1 = r0 + run->per_unit < p->batch ? r0 + run->per_unit : p->batch;
    /* a state read from another slot: the window's rows copied to the write slot first,
     * this unit's channels only, so the kernel rolls it in place (validation keeps every
     * written slot apart from other requests' read slots) */
    for (int64_t i = r0; p->initial_state_indices && i < r1; i++) {
        const gdn_request r = gdn_get_request(p, i);
        const int64_t dst = p->conv_state_indices ? p->conv_state_indices[i] : i;
        if (!r.skip && p->initial_state_indices[i] != dst)
            gdn_copy_rows(p, p->initial_state_indices[i], dst, r.off, p->width - 1, c0, c1);
    }
    run->kernel(p, r0, r1, c0, c1);
    if (p->skipped_rows == GDN_SKIPPED_KEEP) return;
    const int e = gdn_elsize(p->dtype), from_x = p->skipped_rows == GDN_SKIPPED_X;
    for (int64_t i = r0; i < r1; i++) {
        if (!gdn_is_pad(p, i)) continue;
        const gdn_request r = gdn_get_request(p, i);
        for (int64_t t = 0; t < r.T; t++) {
            char *row = r.out + (int64_t)e * t * p->out_stride_t;
            const char *xrow = r.x + (int64_t)e * t * p->x_stride_t;
            for (int64_t c = c0; c < c1; c++)
                gdn_store_raw(row, c * p->out_stride_d, from_x ? gdn_load_raw(xrow, c * p->x_stride_d, p->dtype) : 0,
                              p->dtype);
        }
    }
}

/* Units [u0, u1) on one thread. When converting, the weights and bias go into the
 * thread's scratch ((W + 1) * D floats, fp32, taps outermost: pack_weight's layout),
 * one block at the unit that first needs it (the range is contiguous, so its first
 * units visit every block of it once), and every unit reads them there in place. */
static void run_range(void *ctx, int64_t u0, int64_t u1) {
    const update_run *run = (const update_run *)ctx;
    const gdn_update_params *p = run->p;
    float *scratch = run->convert ? gdn_thread_scratch((p->width + 1) * p->dim) : NULL;
    gdn_update_params q;
    if (scratch) {
        q = *p;
        q.weight = scratch;
        q.weight_stride_d = 1;
        q.weight_stride_w = p->dim;
        q.weight_dtype = GDN_F32;
        q.is_weight_packed = 0;
        q.bias = p->bias ? scratch + p->width * p->dim : NULL;
        q.bias_stride = 1;
    }
    for (int64_t u = u0; u < u1; u++) {
        if (scratch && u - u0 < run->blocks) {   /* (converting: channel_groups is 1) */
            const int64_t c0 = (u % run->blocks) * p->block_channels;
            const int64_t c1 = c0 + p->block_channels < p->dim ? c0 + p->block_channels : p->dim;
            run->isa->update_fill(p, c0, c1, scratch + c0, p->dim, scratch + p->width * p->dim + c0);
        }
        run_unit(run, scratch ? &q : p, u);
    }
}

/* A SIMD unit holds one request and converts the weights of its block itself. With
 * more requests than threads, and weights other than fp32 with unit channel stride,
 * each thread instead converts them once into its scratch and reads them there
 * (B=16, bf16, one thread: 220 -> 200 us, two: 116 -> 108 us), while that fits
 * 1 MiB (L2; D = 8192 with W = 4 takes 160 kB). */
#define GDN_SCRATCH_MAX_FLOATS 262144

/* The path of the calling thread's last call (gdn_update_last_path). */
static GDN_THREAD_LOCAL const char *last_isa, *last_entry;

int gdn_update_last_path(const char **isa, const char **entry) {
    *isa = last_isa;
    *entry = last_entry;
    return last_isa ? 0 : -1;
}

/* The kernel entry for the call's strides: x and out must have unit channel stride
 * (the Python layer copies a strided x); then a channel-contiguous conv_state takes the
 * ISA's update, a time-contiguous one (time stride 1, or one row; channel stride >= L,
 * so channels are whole and ascending) too where the ISA's update_tc says so; anything
 * else the portable kernel. */
static void pick_kernel(const gdn_update_params *p, update_run *run) {
    const gdn_isa *active = gdn_isa_active();
    const int xo_unit = p->x_stride_d == 1 && p->out_stride_d == 1;
    const int64_t sd = p->state_stride_d;
    if (xo_unit && sd == 1) {
        run->isa = active;
        run->kernel = active->update;
        last_entry = "state-channel-contiguous";
    } else if (xo_unit && active->update_tc && (p->state_stride_l == 1 || p->state_len == 1) &&
               sd >= p->state_len && sd > 1) {
        run->isa = active;
        run->kernel = active->update;
        last_entry = "state-time-contiguous";
    } else {
        run->isa = gdn_isa_portable();
        run->kernel = run->isa->update;
        last_entry = "any-strides";
    }
    last_isa = run->isa->name;
}

/* Channels per unit: twice GDN_BLOCK_CHANNELS for plain decode of one token a request,
 * whose units of 256 channels are only 8 AVX-512 line steps, so that what a unit costs
 * besides its steps (the calls down to the kernel, its set-up, the next unit's rows, the
 * time-contiguous plan) is paid half as often. benchmarks/README.md (stop 58, with the
 * plain requests' own prefetch dropped): bf16 W=4, 2 threads, 32 layers, D=8192 B=16
 * 44.7 -> 41.8 us, D=2048 B=64 43.9 -> 40.1; warm, one thread, D=8192 B=16 67.3 -> 57.2;
 * the time-contiguous state D=8192 B=16 51.5 -> 44.5. Speculative calls keep 256
 * (512 units: D=2048 B=4 9.6 -> 10.2 us, time-contiguous D=8192 B=16 163 -> 169). */
static int64_t unit_channels(const gdn_update_params *p) {
    return !p->num_accepted_tokens && !p->query_start_loc && p->seqlen == 1 ? GDN_BLOCK_CHANNELS_MAX
                                                                           : GDN_BLOCK_CHANNELS;
}

void gdn_update_run(const gdn_update_params *p, int num_threads) {
    update_run run;
    gdn_update_params q = *p;
    q.block_channels = unit_channels(p);
    run.p = &q;
    pick_kernel(&q, &run);
    /* Requests per unit: the SIMD kernels are memory-bound at large batches and take
     * one, so a thread streams through one request's ~2T+L rows at a time, which the
     * hardware prefetchers follow (B=64, bf16: 862 against 1149 us with 8 requests
     * per unit, interleaved); the portable kernel is compute-bound and converts its
     * weights once for the GDN_BLOCK_REQUESTS requests of a unit (7% faster at B=16). */
    run.per_unit = run.isa->update_requests_per_unit;
    run.blocks = (p->dim + q.block_channels - 1) / q.block_channels;
    const int64_t units = (p->batch + run.per_unit - 1) / run.per_unit * run.blocks;
    const gdn_team team = gdn_threads_for(num_threads, units, gdn_update_bytes(p));
    run.convert = run.isa->update_fill && p->batch > team.n && p->batch > 1 &&
                  (p->width + 1) * p->dim <= GDN_SCRATCH_MAX_FLOATS &&
                  !gdn_weight_f32_rows(p) && !gdn_weight_bf16_packed(p);
    /* A range of channels per thread (unit_of) with up to 4 requests per thread, where
     * a range's rows are at least a page (4 KiB). benchmarks/README.md (stop 41): bf16
     * D=8192, 2 threads, 32 layers B=2 9.6 -> 8.6 us, B=4 14.6 -> 14.3, from DRAM B=4
     * 23.6 -> 20.5; ranges of 2 KiB (D=2048) put the two threads on neighbouring lines
     * and slowed B=16 1.3x. */
    q.channel_groups = team.n > 1 && run.per_unit == 1 && !run.convert && p->batch <= 4 * team.n &&
                               run.blocks >= team.n && p->dim * gdn_elsize(p->dtype) >= 4096 * team.n
                           ? team.n : 1;
    gdn_parallel_for(team, units, run_range, &run);
}
