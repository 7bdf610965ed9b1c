/* Times gdn_update_run itself, without Python: one configuration (D channels, W=4, T=4,
 * spec mode, L=6, num_accepted_tokens in 1..3; or plain mode, L=3), against a memcpy of the same byte count
 * (gdn_update_bytes), interleaved; prints the best and the median of 11 samples in
 * microseconds per call and the median ratio kernel / copy. For A/B runs of kernel
 * changes, where the Python benchmarks' fixed cost and the VM's noise hide a few
 * percent: build one binary per tree and run them in alternation, e.g. 7-11 rounds,
 * comparing medians.
 *
 *   gcc -O3 -fno-math-errno -fno-trapping-math -fopenmp -Iinclude -Isrc/csrc \
 *       benchmarks/bench_kernel.c src/csrc/*.c \
 *       -o /tmp/bench_kernel
 *   /tmp/bench_kernel B D [silu|none] [threads] [isa] [packed|raw|vllm] [identity|perm] [cold|warm] [bf16|fp16|fp32] \
 *       [sd|ds|hf] [spec|plain]
 *
 * The dtype of x, out and conv_state is bf16 unless the ninth argument says otherwise
 * (values near 1 in every dtype: the same bf16 patterns, widened for fp32).
 * packed: fp32 tap-major weights (gdnconv.pack_weight's layout); raw: bf16 (D, W)
 * weights, converted once per thread into the C side's per-thread scratch; vllm: bf16
 * weights in vLLM's packed layout (is_weight_packed, read in place; W = 4, D a multiple
 * of 32). identity: request
 * i uses slot i; perm: slots in a random permutation (as benchmarks/bench.py). cold (the
 * default, as benchmarks/harness.py): each call goes to the next of enough layers'
 * separate x, out, state and weights to hold 4x the last-level cache, and the copy
 * to the next of its own buffer pairs, so every call finds its data evicted; warm:
 * repeated calls on the same arrays; BK_LAYERS=N in the environment: cold over N layers
 * instead (32: bench_grid.py's engine-like rotation, from the last-level cache). State
 * layout (as benchmarks/bench_layouts.py): sd (the
 * default), (S, L, D) memory, channels contiguous; ds, (S, D, L) memory (vLLM's DS layout),
 * channel stride L, time stride 1; hf, (S, D, L + 1) memory of which the kernel gets the last
 * L columns (transformers' cache view [..., 1:]), channel stride L + 1; ds/sd or hf/sd: that
 * layout and sd in alternation, sample by sample in one process (each with its own layers),
 * printing both medians and the median (and quartiles) of the per-sample ratio: runs as
 * separate processes on a shared VM differed by up to 2x, the alternated ratio by a few %.
 * spec (the default) or plain: the mode (plain: L = W - 1, no num_accepted_tokens). T: tokens per
 * request (default 4; 1 is vLLM's plain decode, the grid's plain rows). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "gdnconv/gdnconv.h"

#define SAMPLES 11

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* the k-th smallest of v[0..n) (k = n / 2: the median) */
static double nth(const double *v, int n, int k) {
    double s[SAMPLES];
    memcpy(s, v, n * sizeof *v);
    qsort(s, n, sizeof s[0], cmp);
    return s[k];
}

static double median(const double *v, int n) { return nth(v, n, n / 2); }

/* the last-level cache in bytes (glibc's sysconf), 32 MiB where unknown */
static int64_t llc_bytes(void) {
    const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE), l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
    return l3 > 0 ? l3 : l2 > 0 ? l2 : 32 << 20;
}

static int64_t layers_for(int cold, int64_t bytes) {
    const char *fixed = getenv("BK_LAYERS");   /* a fixed count, e.g. 32 as bench_grid.py */
    const int64_t n = fixed && atol(fixed) > 0 ? atol(fixed) : (4 * llc_bytes() + bytes - 1) / bytes;
    return !cold ? 1 : n < 2 ? 2 : n;
}

/* element i of a dtype-dt array: the bf16 bit pattern b, widened for fp32, or for fp16
 * the pattern of the same value's neighbourhood (b - 0x3f80 + 0x3c00: 1 + small) */
static void put(char *a, int64_t i, int b, int dt) {
    if (dt == GDN_F32) {
        const uint32_t u = (uint32_t)b << 16;
        memcpy(a + 4 * i, &u, 4);
    } else {
        const uint16_t h = (uint16_t)(dt == GDN_F16 && b ? b - 0x3f80 + 0x3c00 : b);
        memcpy(a + 2 * i, &h, 2);
    }
}

static void *alloc(int64_t bytes) {
    void *q = aligned_alloc(4096, (size_t)((bytes + 4095) / 4096 * 4096));
    if (!q) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    return q;
}

/* nl layers' arrays and parameters of one configuration and state layout (sd, ds or hf) */
static gdn_update_params *make_layers(int64_t nl, const char *layout, int64_t B, int64_t D, int64_t T, int64_t W,
                                      int64_t L, int plain, int silu, int raw, int vllm, int dt, int32_t *nat, int32_t *slots) {
    const int64_t e = dt == GDN_F32 ? 4 : 2, lead = strcmp(layout, "hf") == 0, cols = L + lead;
    gdn_update_params *ps = calloc((size_t)nl, sizeof *ps);
    for (int64_t l = 0; l < nl; l++) {
        char *x = alloc(B * T * D * e), *out = alloc(B * T * D * e), *st = alloc(B * cols * D * e);
        for (int64_t i = 0; i < B * T * D; i++) put(x, i, 0x3f80 + i % 37, dt), put(out, i, 0, dt);   /* ~1 */
        for (int64_t i = 0; i < B * cols * D; i++) put(st, i, 0x3f00 + i % 41, dt);
        gdn_update_params *p = &ps[l];
        p->batch = B, p->dim = D, p->width = W, p->state_len = L, p->num_slots = B, p->seqlen = T;
        p->pad_slot_id = -1, p->dtype = dt, p->silu = silu;
        p->x = x, p->x_stride_b = T * D, p->x_stride_t = D, p->x_stride_d = 1;
        p->out = out, p->out_stride_b = T * D, p->out_stride_t = D, p->out_stride_d = 1;
        if (strcmp(layout, "sd") == 0)
            p->conv_state = st, p->state_stride_s = L * D, p->state_stride_l = D, p->state_stride_d = 1;
        else
            p->conv_state = st + lead * e, p->state_stride_s = cols * D, p->state_stride_l = 1, p->state_stride_d = cols;
        p->num_accepted_tokens = plain ? NULL : nat, p->conv_state_indices = slots;
        if (vllm) {   /* the same values as raw's, at their packed places */
            uint16_t *w = alloc(D * W * 2);
            for (int64_t c = 0; c < D; c++)
                for (int64_t k = 0; k < W; k++)
                    w[(c >> 5) * 128 + (k >> 1) * 64 + (c & 31) * 2 + (k & 1)] = (uint16_t)(0x3e00 + (c * W + k) % 29);
            p->weight = w, p->weight_dtype = GDN_BF16, p->is_weight_packed = 1;
        } else if (raw) {
            char *w = alloc(D * W * e);
            for (int64_t i = 0; i < D * W; i++) put(w, i, 0x3e00 + i % 29, dt);
            p->weight = w, p->weight_dtype = dt, p->weight_stride_d = W, p->weight_stride_w = 1;
            /* (the per-thread conversion scratch is the C side's own: threads.c) */
        } else {
            float *w = alloc(W * D * 4);
            for (int64_t i = 0; i < W * D; i++) w[i] = 0.1f * (float)(i % 7) - 0.3f;
            p->weight = w, p->weight_dtype = GDN_F32, p->weight_stride_d = 1, p->weight_stride_w = D;
        }
        int64_t bad_i, bad_v;
        if (gdn_update_validate(p, B * T, &bad_i, &bad_v) != GDN_OK) exit(1);
    }
    return ps;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s B D [silu|none] [threads] [isa] [packed|raw|vllm] [identity|perm] [cold|warm] "
                "[bf16|fp16|fp32] [sd|ds|hf|ds/sd|hf/sd] [spec|plain] [T]\n", argv[0]);
        return 2;
    }
    char layout[8];
    snprintf(layout, sizeof layout, "%s", argc > 10 ? argv[10] : "sd");
    const int pair = strlen(layout) == 5 && strcmp(layout + 2, "/sd") == 0 && strcmp(layout, "sd/sd") != 0;
    if (pair) layout[2] = 0;   /* ds/sd, hf/sd: that layout against sd */
    const int plain = argc > 11 && strcmp(argv[11], "plain") == 0;
    const int64_t T = argc > 12 ? atol(argv[12]) : 4;
    const int64_t B = atol(argv[1]), D = atol(argv[2]), W = 4, L = plain ? W - 1 : W - 2 + T;
    if (T < 1) {
        fprintf(stderr, "T = %s: tokens per request must be >= 1\n", argv[12]);
        return 2;
    }
    const int silu = argc <= 3 || strcmp(argv[3], "none") != 0;
    const int threads = argc > 4 ? atoi(argv[4]) : 1;
    if (gdn_select_isa(argc > 5 ? argv[5] : NULL) != 0) {
        fprintf(stderr, "isa %s: unknown or not supported here\n", argc > 5 ? argv[5] : "(best)");
        return 2;
    }
    const int raw = argc > 6 && strcmp(argv[6], "raw") == 0, vllm = argc > 6 && strcmp(argv[6], "vllm") == 0;
    const int perm = argc > 7 && strcmp(argv[7], "perm") == 0;
    const int cold = !(argc > 8 && strcmp(argv[8], "warm") == 0);
    const char *dname = argc > 9 ? argv[9] : "bf16";
    const int dt = strcmp(dname, "fp32") == 0 ? GDN_F32 : strcmp(dname, "fp16") == 0 ? GDN_F16 : GDN_BF16;
    if (dt == GDN_BF16 && strcmp(dname, "bf16") != 0) {
        fprintf(stderr, "dtype %s: use bf16, fp16 or fp32\n", dname);
        return 2;
    }
    const int64_t e = dt == GDN_F32 ? 4 : 2;
    if (strcmp(layout, "sd") != 0 && strcmp(layout, "ds") != 0 && strcmp(layout, "hf") != 0) {
        fprintf(stderr, "layout %s: one of sd, ds, hf, ds/sd, hf/sd\n", argv[10]);
        return 2;
    }
    const int64_t lead = strcmp(layout, "hf") == 0, cols = L + lead;   /* time columns per channel in memory */
    if (B < 1 || D < 1 || threads < 1) {
        fprintf(stderr, "B, D and threads must be positive\n");
        return 2;
    }

    int32_t *nat = malloc(B * 4), *slots = malloc(B * 4);
    srand(1);
    for (int64_t i = 0; i < B; i++) slots[i] = (int32_t)i, nat[i] = 1 + rand() % (T < 3 ? T : 3);
    if (perm)
        for (int64_t i = B - 1; i > 0; i--) {
            const int64_t j = rand() % (i + 1);
            const int32_t s = slots[i];
            slots[i] = slots[j];
            slots[j] = s;
        }

    const int64_t layer_bytes = (2 * B * T + B * cols) * D * e + (raw ? D * W * e : vllm ? D * W * 2 : W * D * 4);
    const int64_t nl = layers_for(cold, layer_bytes);
    gdn_update_params *ps = make_layers(nl, layout, B, D, T, W, L, plain, silu, raw, vllm, dt, nat, slots);
    gdn_update_params *ref = pair ? make_layers(nl, "sd", B, D, T, W, L, plain, silu, raw, vllm, dt, nat, slots) : NULL;
    /* the yardstick: a copy of the kernel's byte count, rotating through its own buffer pairs */
    const int64_t bytes = gdn_update_bytes(&ps[0]), nc = pair ? 0 : layers_for(cold, 2 * bytes);
    char **src = malloc(nc * sizeof *src), **dst = malloc(nc * sizeof *dst);
    for (int64_t l = 0; l < nc; l++) {
        src[l] = alloc(bytes), dst[l] = alloc(bytes);
        memset(src[l], 1, (size_t)bytes), memset(dst[l], 0, (size_t)bytes);
    }

    const long calls = (long)(1e8 / (double)(B * D * T)) + 10;   /* ~0.05 s per sample */
    double us[SAMPLES], cu[SAMPLES], ratio[SAMPLES];
    int64_t l = 0, m = 0;
    gdn_update_run(&ps[0], threads);   /* wakes the thread pool */
    for (int k = 0; k < SAMPLES; k++) {
        double t0 = now();
        for (long c = 0; c < calls; c++, l = l + 1 == nl ? 0 : l + 1) gdn_update_run(&ps[l], threads);
        us[k] = (now() - t0) / calls * 1e6;
        t0 = now();
        if (pair)   /* the sd layout's own layers in place of the copy */
            for (long c = 0; c < calls; c++, m = m + 1 == nl ? 0 : m + 1) gdn_update_run(&ref[m], threads);
        else
            for (long c = 0; c < calls; c++, m = m + 1 == nc ? 0 : m + 1) memcpy(dst[m], src[m], (size_t)bytes);
        cu[k] = (now() - t0) / calls * 1e6;
        ratio[k] = us[k] / cu[k];
    }
    if (pair) {
        printf("%s B=%ld T=%ld D=%ld %s threads=%d isa=%s %s %s %s %s (layers %ld): %s median %.2f us/call, sd %.2f; "
               "%s/sd median %.3f (quartiles %.3f %.3f)\n",
               dname, (long)B, (long)T, (long)D, silu ? "silu" : "none", threads, gdn_active_isa(), raw ? "raw" : vllm ? "vllm" : "packed",
               perm ? "perm" : "identity", cold ? "cold" : "warm", plain ? "plain" : "spec", (long)nl, layout,
               median(us, SAMPLES), median(cu, SAMPLES), layout, median(ratio, SAMPLES), nth(ratio, SAMPLES, SAMPLES / 4),
               nth(ratio, SAMPLES, SAMPLES - 1 - SAMPLES / 4));
        return 0;
    }
    double best = us[0];
    for (int k = 1; k < SAMPLES; k++) best = us[k] < best ? us[k] : best;
    printf("%s B=%ld T=%ld D=%ld %s threads=%d isa=%s %s %s %s %s %s (layers %ld): best %.2f median %.2f us/call; "
           "copy %.2f us; kernel/copy %.2f\n",
           dname, (long)B, (long)T, (long)D, silu ? "silu" : "none", threads, gdn_active_isa(), raw ? "raw" : vllm ? "vllm" : "packed",
           perm ? "perm" : "identity", cold ? "cold" : "warm", layout, plain ? "plain" : "spec", (long)nl, best,
           median(us, SAMPLES),
           median(cu, SAMPLES), median(ratio, SAMPLES));
    return 0;
}
