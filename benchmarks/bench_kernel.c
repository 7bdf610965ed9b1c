/* Times gdn_update_run itself, without Python: one bf16 configuration (D channels, W=4, T=4,
 * spec mode, L=6, num_accepted_tokens in 1..3), prints the best and the median of 7
 * repeats in microseconds per call. For A/B runs of kernel changes, where the
 * Python benchmarks' fixed cost and the VM's noise hide a few percent: build one
 * binary per tree and run them in alternation, e.g. 7-11 rounds, comparing medians.
 *
 *   gcc -O3 -fno-math-errno -fno-trapping-math -fopenmp -Iinclude -Isrc/csrc \
 *       benchmarks/bench_kernel.c src/csrc/*.c \
 *       -o /tmp/bench_kernel
 *   /tmp/bench_kernel B D [silu|none] [threads] [isa] [packed|raw] [identity|perm]
 *
 * packed: fp32 tap-major weights (gdnconv.pack_weight's layout); raw: bf16 (D, W)
 * weights, converted once per thread into the C side's per-thread scratch. identity: request
 * i uses slot i; perm: slots in a random permutation (as benchmarks/bench.py). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gdnconv/gdnconv.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s B D [silu|none] [threads] [isa] [packed|raw] [identity|perm]\n", argv[0]);
        return 2;
    }
    const int64_t B = atol(argv[1]), D = atol(argv[2]), T = 4, L = 6, W = 4;
    const int silu = argc <= 3 || strcmp(argv[3], "none") != 0;
    const int threads = argc > 4 ? atoi(argv[4]) : 1;
    if (gdn_select_isa(argc > 5 ? argv[5] : NULL) != 0) {
        fprintf(stderr, "isa %s: unknown or not supported here\n", argc > 5 ? argv[5] : "(best)");
        return 2;
    }
    const int raw = argc > 6 && strcmp(argv[6], "raw") == 0;
    const int perm = argc > 7 && strcmp(argv[7], "perm") == 0;
    if (B < 1 || D < 1 || threads < 1) {
        fprintf(stderr, "B, D and threads must be positive\n");
        return 2;
    }

    uint16_t *x = malloc(B * T * D * 2), *out = malloc(B * T * D * 2), *st = malloc(B * L * D * 2);
    uint16_t *wraw = malloc(D * W * 2);
    float *wpacked = malloc(W * D * 4);
    int32_t *nat = malloc(B * 4), *slots = malloc(B * 4);
    srand(1);
    for (int64_t i = 0; i < B * T * D; i++) x[i] = (uint16_t)(0x3f80 + i % 37);   /* bf16 around 1 */
    for (int64_t i = 0; i < B * L * D; i++) st[i] = (uint16_t)(0x3f00 + i % 41);
    for (int64_t i = 0; i < D * W; i++) wraw[i] = (uint16_t)(0x3e00 + i % 29);
    for (int64_t i = 0; i < W * D; i++) wpacked[i] = 0.1f * (float)(i % 7) - 0.3f;
    for (int64_t i = 0; i < B; i++) slots[i] = (int32_t)i, nat[i] = 1 + rand() % 3;
    if (perm)
        for (int64_t i = B - 1; i > 0; i--) {
            const int64_t j = rand() % (i + 1);
            const int32_t s = slots[i];
            slots[i] = slots[j];
            slots[j] = s;
        }

    gdn_update_params p;
    memset(&p, 0, sizeof p);
    p.batch = B, p.dim = D, p.width = W, p.state_len = L, p.num_slots = B, p.seqlen = T, p.pad_slot_id = -1;
    p.dtype = GDN_BF16, p.silu = silu;
    p.x = x, p.x_stride_b = T * D, p.x_stride_t = D, p.x_stride_d = 1;
    p.out = out, p.out_stride_b = T * D, p.out_stride_t = D, p.out_stride_d = 1;
    p.conv_state = st, p.state_stride_s = L * D, p.state_stride_l = D, p.state_stride_d = 1;
    p.num_accepted_tokens = nat, p.conv_state_indices = slots;
    if (raw) {
        p.weight = wraw, p.weight_dtype = GDN_BF16, p.weight_stride_d = W, p.weight_stride_w = 1;
        /* (the per-thread conversion scratch is the C side's own: threads.c) */
    } else {
        p.weight = wpacked, p.weight_dtype = GDN_F32, p.weight_stride_d = 1, p.weight_stride_w = D;
    }
    int64_t bad_i, bad_v;
    if (gdn_update_validate(&p, B * T, &bad_i, &bad_v) != GDN_OK) return 1;

    const long calls = (long)(2e8 / (double)(B * D * T)) + 10;   /* ~0.1 s per repeat */
    double us[7];
    for (int k = 0; k < 7; k++) {
        const double t0 = now();
        for (long c = 0; c < calls; c++) gdn_update_run(&p, threads);
        us[k] = (now() - t0) / calls * 1e6;
    }
    qsort(us, 7, sizeof us[0], cmp);
    printf("B=%ld D=%ld %s threads=%d isa=%s %s %s: best %.2f median %.2f us/call\n", (long)B, (long)D,
           silu ? "silu" : "none", threads, gdn_active_isa(), raw ? "raw" : "packed", perm ? "perm" : "identity",
           us[0], us[3]);
    return 0;
}
