/* The dispatcher: ISA table, validation of index arrays, and the one parallel loop. */
#include <stdlib.h>
#include <string.h>

#include "conv_common.h"

#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__unix__) || defined(__APPLE__)
#include <pthread.h>
#include <unistd.h>
#define GDN_HAVE_FORK 1
#endif

typedef struct {
    const char *name;
    int (*supported)(const gdn_cpu_features *f);
    gdn_kernel_fn kernel;
    gdn_fill_fn fill;   /* weight conversion for gdn_run's per-call copy; NULL: none */
} gdn_isa_entry;

#ifdef GDN_HAVE_AVX512
static int avx512_ok(const gdn_cpu_features *f) {
    return f->os_avx512 && f->avx512f && f->avx512bw && f->avx512vl && f->avx512dq && f->fma && f->f16c;
}
static int avx512bf16_ok(const gdn_cpu_features *f) { return avx512_ok(f) && f->avx512_bf16; }
#endif
#ifdef GDN_HAVE_AVX2
static int avx2_ok(const gdn_cpu_features *f) { return f->os_avx && f->avx2 && f->fma && f->f16c; }
#endif
static int scalar_ok(const gdn_cpu_features *f) { (void)f; return 1; }

/* Best first; the first supported entry is the default. */
static const gdn_isa_entry isa_table[] = {
#ifdef GDN_HAVE_AVX512
    {"avx512bf16", avx512bf16_ok, gdn_kernel_avx512bf16, gdn_fill_avx512},
    {"avx512", avx512_ok, gdn_kernel_avx512, gdn_fill_avx512},
#endif
#ifdef GDN_HAVE_AVX2
    {"avx2", avx2_ok, gdn_kernel_avx2, gdn_fill_avx2},
#endif
    {"scalar", scalar_ok, gdn_kernel_scalar, NULL},
};
#define ISA_COUNT ((int)(sizeof(isa_table) / sizeof(isa_table[0])))

static int active_isa = ISA_COUNT - 1;

int gdn_isa_count(void) { return ISA_COUNT; }
const char *gdn_isa_name(int i) { return i >= 0 && i < ISA_COUNT ? isa_table[i].name : NULL; }
int gdn_isa_supported(int i) {
    return i >= 0 && i < ISA_COUNT && isa_table[i].supported(gdn_get_cpu_features());
}
const char *gdn_active_isa(void) { return isa_table[active_isa].name; }

int gdn_select_isa(const char *name) {
    for (int i = 0; i < ISA_COUNT; i++) {
        if (name ? strcmp(name, isa_table[i].name) != 0 : !gdn_isa_supported(i)) continue;
        if (!gdn_isa_supported(i)) return -2;
        active_isa = i;
        return 0;
    }
    return -1;
}

int gdn_validate(const gdn_params *p, int64_t num_tokens, int64_t *bad_index, int64_t *bad_value) {
    const int32_t *qsl = p->query_start_loc, *idx = p->conv_state_indices, *nat = p->num_accepted_tokens;
    const int64_t B = p->batch, S = p->num_slots, W = p->width, L = p->state_len;
#define FAIL(code, i, v) do { *bad_index = (i); *bad_value = (v); rc = (code); goto done; } while (0)
    int rc = GDN_OK;
    uint64_t stack_bits[1024], *bits = stack_bits;
    const int64_t words = (S + 63) / 64;
    if (idx && words > 1024) {
        bits = (uint64_t *)calloc((size_t)words, sizeof(uint64_t));
        if (!bits) return GDN_ERR_NO_MEMORY;
    } else if (idx) {
        memset(bits, 0, (size_t)words * sizeof(uint64_t));
    }
    if (qsl) {
        if (qsl[0] != 0) FAIL(GDN_ERR_QSL_START, 0, qsl[0]);
        for (int64_t j = 1; j <= B; j++)
            if (qsl[j] < qsl[j - 1]) FAIL(GDN_ERR_QSL_ORDER, j, qsl[j]);
        if (qsl[B] != num_tokens) FAIL(GDN_ERR_QSL_END, B, qsl[B]);
    }
    for (int64_t i = 0; i < B; i++) {
        if (gdn_is_pad(p, i)) continue;
        if (idx) {
            const int64_t s = idx[i];
            if (s < 0 || s >= S) FAIL(GDN_ERR_SLOT_RANGE, i, s);
            if ((bits[s >> 6] >> (s & 63)) & 1u) FAIL(GDN_ERR_SLOT_DUPLICATE, i, s);
            bits[s >> 6] |= 1ull << (s & 63);
        }
        if (nat) {
            const int64_t T = qsl ? qsl[i + 1] - qsl[i] : p->seqlen;
            if (nat[i] < 1 || nat[i] - 1 + W - 1 > L) FAIL(GDN_ERR_ACCEPTED_RANGE, i, nat[i]);
            if (W - 2 + T > L) FAIL(GDN_ERR_SPEC_TOKENS, i, T);
        }
    }
done:
    if (bits != stack_bits) free(bits);
    return rc;
#undef FAIL
}

int64_t gdn_bytes_moved(const gdn_params *p) {
    const int64_t W = p->width;
    int64_t rows = 0;
    for (int64_t i = 0; i < p->batch; i++) {
        const gdn_request r = gdn_get_request(p, i);
        if (!r.skip) rows += r.T + r.T + (W - 1) + (W - 2 + r.T);
    }
    return rows * p->dim * gdn_elsize(p->dtype) + p->dim * W * gdn_elsize(p->weight_dtype);
}

/* Below this many bytes a call runs on the calling thread: a second thread gained
 * 0.96x at 84 kB, 1.14x at 168 kB and 1.29x at 336 kB (B=1, T=4, bf16, D = 2048,
 * 4096, 8192),
 * against its cost when another process holds the other core (measured with
 * scripts/bench_threshold.py on a 2-core Zen 5). */
static int64_t parallel_min_bytes = 256 * 1024;

int64_t gdn_set_parallel_min_bytes(int64_t bytes) {
    const int64_t previous = parallel_min_bytes;
    parallel_min_bytes = bytes;
    return previous;
}

static void run_unit(const gdn_params *p, gdn_kernel_fn kernel, int64_t u, int64_t blocks, int64_t per_unit) {
    /* request-major: a thread's consecutive units continue the same rows */
    const int64_t c0 = (u % blocks) * GDN_BLOCK_CHANNELS, r0 = (u / blocks) * per_unit;
    const int64_t c1 = c0 + GDN_BLOCK_CHANNELS < p->dim ? c0 + GDN_BLOCK_CHANNELS : p->dim;
    const int64_t r1 = r0 + per_unit < p->batch ? r0 + per_unit : p->batch;
    kernel(p, r0, r1, c0, c1);
    if (!p->zero_skipped) return;
    const int e = gdn_elsize(p->dtype);
    for (int64_t i = r0; i < r1; i++) {
        if (!gdn_is_pad(p, i)) continue;
        const gdn_request r = gdn_get_request(p, i);
        for (int64_t t = 0; t < r.T; t++) {
            char *row = r.out + (int64_t)e * t * p->out_stride_t;
            for (int64_t c = c0; c < c1; c++) gdn_store_raw(row, c * p->out_stride_d, 0, p->dtype);
        }
    }
}

/* A forked child runs every call on its calling thread. GNU OpenMP cannot run a
 * parallel region in a child of a process that had started its pool (the child
 * waits forever for the parent's threads), and the pool is shared with every other
 * user of the same libgomp (torch's), so whether it was started is not knowable
 * here. pthread_atfork sees every fork() through libc (os.fork, multiprocessing,
 * C code); the pid check, made only before a parallel region, sees a raw clone(). */
static int in_forked_child;
#ifdef GDN_HAVE_FORK
static pid_t guard_pid;
static void mark_forked_child(void) { in_forked_child = 1; }
#endif

void gdn_fork_guard_init(void) {
#ifdef GDN_HAVE_FORK
    guard_pid = getpid();
    pthread_atfork(NULL, NULL, mark_forked_child);
#endif
}

static int forked(void) {
#ifdef GDN_HAVE_FORK
    if (!in_forked_child && getpid() != guard_pid) in_forked_child = 1;
#endif
    return in_forked_child;
}

int gdn_num_procs(void) {
#ifdef _OPENMP
    return omp_get_num_procs();
#else
    return 0;
#endif
}

/* Units [u0, u1) on one thread. With a scratch (the thread's own (W + 1) * D
 * floats, see gdn_run) the weights and bias are converted into it, one block at the
 * unit that first needs it (the range is contiguous, so its first units visit every
 * block of it once), and every unit reads them there in place. */
static void run_units(const gdn_params *p, gdn_kernel_fn kernel, gdn_fill_fn fill, float *scratch,
                      int64_t u0, int64_t u1, int64_t blocks, int64_t per_unit) {
    gdn_params q;
    if (scratch) {
        q = *p;
        q.weight = scratch;
        q.weight_stride_d = 1;
        q.weight_stride_w = p->dim;
        q.weight_dtype = GDN_F32;
        q.bias = p->bias ? scratch + p->width * p->dim : NULL;
        q.bias_stride = 1;
    }
    for (int64_t u = u0; u < u1; u++) {
        if (scratch && u - u0 < blocks) {
            const int64_t c0 = (u % blocks) * GDN_BLOCK_CHANNELS;
            const int64_t c1 = c0 + GDN_BLOCK_CHANNELS < p->dim ? c0 + GDN_BLOCK_CHANNELS : p->dim;
            fill(p, c0, c1, scratch + c0, p->dim, scratch + p->width * p->dim + c0);
        }
        run_unit(scratch ? &q : p, kernel, u, blocks, per_unit);
    }
}

/* The kernel a call runs: the active ISA's, or the portable one for channel strides
 * other than 1. */
static const gdn_isa_entry *call_isa(const gdn_params *p, gdn_kernel_fn *kernel) {
    const int unit_stride = p->x_stride_d == 1 && p->out_stride_d == 1 && p->state_stride_d == 1;
    const gdn_isa_entry *isa = &isa_table[active_isa];
    *kernel = unit_stride ? isa->kernel : gdn_kernel_scalar;
    return isa;
}

/* A SIMD unit holds one request and converts the weights of its block itself. With
 * more requests than threads, and weights other than fp32 with unit channel stride,
 * each thread instead converts them once into its part of the caller's scratch
 * (fp32, taps outermost: pack_weight's layout) and reads them there (B=16, bf16, one
 * thread: 220 -> 200 us, two: 116 -> 108 us), while a part fits 1 MiB (L2; D = 8192
 * with W = 4 takes 160 kB). */
#define GDN_SCRATCH_MAX_FLOATS 262144
static int converts_weights(const gdn_params *p, const gdn_isa_entry *isa, gdn_kernel_fn kernel) {
    return kernel != gdn_kernel_scalar && isa->fill && p->batch > 1 &&
           (p->width + 1) * p->dim <= GDN_SCRATCH_MAX_FLOATS &&
           !(p->weight_dtype == GDN_F32 && p->weight_stride_d == 1);
}

int64_t gdn_weight_scratch_floats(const gdn_params *p, int num_threads) {
    gdn_kernel_fn kernel;
    const gdn_isa_entry *isa = call_isa(p, &kernel);
    if (!converts_weights(p, isa, kernel)) return 0;
    /* gdn_run converts only with fewer threads than requests: at most B - 1 parts */
    const int64_t parts = num_threads < p->batch - 1 ? num_threads : p->batch - 1;
    return (parts > 1 ? parts : 1) * (p->width + 1) * p->dim;
}

void gdn_run(const gdn_params *p, int num_threads) {
    gdn_kernel_fn kernel;
    const gdn_isa_entry *isa = call_isa(p, &kernel);
    /* Requests per unit: the SIMD kernels are memory-bound at large batches and take
     * one, so a thread streams through one request's ~2T+L rows at a time, which the
     * hardware prefetchers follow (B=64, bf16: 862 against 1149 us with 8 requests
     * per unit, interleaved); the portable kernel is compute-bound and converts its
     * weights once for the GDN_BLOCK_REQUESTS requests of a unit (7% faster at B=16). */
    const int64_t per_unit = kernel == gdn_kernel_scalar ? GDN_BLOCK_REQUESTS : 1;
    const int64_t groups = (p->batch + per_unit - 1) / per_unit;
    const int64_t blocks = (p->dim + GDN_BLOCK_CHANNELS - 1) / GDN_BLOCK_CHANNELS, units = groups * blocks;
    if (num_threads > units) num_threads = (int)units;
    if (num_threads > 1 && (gdn_bytes_moved(p) < parallel_min_bytes || forked())) num_threads = 1;
    const int convert = p->weight_scratch && p->batch > num_threads && converts_weights(p, isa, kernel);
    const int64_t per_thread = (p->width + 1) * p->dim;
#ifdef _OPENMP
    if (num_threads > 1) {
        /* contiguous ranges of units per thread: with one request, units are
         * neighbouring channel blocks, and interleaving them across threads measured
         * slower (B=8: 1.08x vs 1.58x from a second thread) */
#pragma omp parallel num_threads(num_threads)
        {
            const int64_t t = omp_get_thread_num(), n = omp_get_num_threads();
            run_units(p, kernel, isa->fill, convert ? p->weight_scratch + t * per_thread : NULL,
                      units * t / n, units * (t + 1) / n, blocks, per_unit);
        }
        return;
    }
#endif
    run_units(p, kernel, isa->fill, convert ? p->weight_scratch : NULL, 0, units, blocks, per_unit);
}
