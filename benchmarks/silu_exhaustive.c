/* fp32 SiLU over all 2^32 input bit patterns, through gdn_update_run on each ISA this
 * CPU runs, against silu in double as gdnconv.reference defines it (y / (1 + exp(-y)),
 * libm exp) rounded to float. The same measure as tests/test_silu.py: steps between
 * representable floats (subnormals included, +0 and -0 the same), NaN exactly where
 * the reference is NaN. Too slow for the test suite (minutes); run by hand:
 *
 *   gcc -O3 -fno-math-errno -fno-trapping-math -fopenmp -Iinclude -Isrc/csrc \
 *       benchmarks/silu_exhaustive.c src/csrc/*.c -lm -o /tmp/silu_exhaustive
 *   /tmp/silu_exhaustive [-s STEP] [isa ...]
 *       (default: scalar avx2 avx512 avx512bf16 neon neonbf16, those this CPU runs; -s: every
 *       STEP-th input pattern only, e.g. -s 251 under qemu, where all 2^32 take hours)
 *
 * Each call: B=1, T=1, W=2, weights [0, 1] per channel, no bias, a zeroed state, so
 * the pre-activation is x itself (0 * 0 + 1 * x) and the output is the kernel's SiLU.
 * Prints per ISA the outputs 0, 1 and over 1 step from the rounded reference, NaN
 * mismatches, and the first few inputs over 1 step. Exit status 1 if any. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gdnconv/gdnconv.h"

#define CHUNK (1 << 24)

static int64_t line(float v) {   /* signed magnitude onto one integer line */
    uint32_t u;
    memcpy(&u, &v, 4);
    const int64_t mag = u & 0x7fffffffu;
    return u >> 31 ? -mag : mag;
}

int main(int argc, char **argv) {
    static const char *all[] = {"scalar", "avx2", "avx512", "avx512bf16", "neon", "neonbf16"};
    int64_t stride = 1;
    if (argc > 2 && strcmp(argv[1], "-s") == 0) stride = atoll(argv[2]), argc -= 2, argv += 2;
    if (stride < 1) return 2;
    const char **isas = argc > 1 ? (const char **)argv + 1 : all;
    const int nisa = argc > 1 ? argc - 1 : 6;
    float *x = malloc(CHUNK * 4), *out = malloc(CHUNK * 4), *st = malloc(CHUNK * 4), *ref = malloc(CHUNK * 4);
    float *w = malloc(CHUNK * 2 * 4);
    if (!x || !out || !st || !ref || !w) return 2;
    for (int64_t c = 0; c < CHUNK; c++) w[2 * c] = 0.0f, w[2 * c + 1] = 1.0f;
    int32_t slot = 0;
    gdn_update_params p;
    memset(&p, 0, sizeof p);
    p.batch = 1, p.dim = CHUNK, p.width = 2, p.state_len = 1, p.num_slots = 1, p.seqlen = 1;
    p.pad_slot_id = -1, p.dtype = GDN_F32, p.silu = 1;
    p.x = x, p.x_stride_b = CHUNK, p.x_stride_t = CHUNK, p.x_stride_d = 1;
    p.out = out, p.out_stride_b = CHUNK, p.out_stride_t = CHUNK, p.out_stride_d = 1;
    p.conv_state = st, p.state_stride_s = CHUNK, p.state_stride_l = CHUNK, p.state_stride_d = 1;
    p.conv_state_indices = &slot;
    p.weight = w, p.weight_dtype = GDN_F32, p.weight_stride_d = 2, p.weight_stride_w = 1;
    int64_t bad_i, bad_v;
    if (gdn_update_validate(&p, 1, &bad_i, &bad_v) != GDN_OK) return 2;

    int64_t n[6][3] = {{0}}, nan_bad[6] = {0};
    int ok[6], shown[6] = {0};
    if (nisa > 6) return 2;
    for (int k = 0; k < nisa; k++) ok[k] = gdn_select_isa(isas[k]) == 0;
    for (int64_t base = 0; base < (1ll << 32); base += CHUNK * stride) {
        for (int64_t c = 0; c < CHUNK; c++) {
            const uint32_t u = (uint32_t)(base + c * stride);
            memcpy(&x[c], &u, 4);
            const double y = x[c];
            ref[c] = (float)(y / (1.0 + exp(-y)));
        }
        for (int k = 0; k < nisa; k++) {
            if (!ok[k]) continue;
            gdn_select_isa(isas[k]);
            memset(st, 0, CHUNK * 4);
            gdn_update_run(&p, 1);
            for (int64_t c = 0; c < CHUNK; c++) {
                if (isnan(ref[c]) || isnan(out[c])) {
                    if (isnan(ref[c]) != isnan(out[c])) nan_bad[k]++;
                    continue;
                }
                const int64_t d = llabs(line(out[c]) - line(ref[c]));
                n[k][d > 1 ? 2 : d]++;
                if (d > 1 && shown[k]++ < 5)
                    printf("  %s: x = %.9g (0x%08x): got %.9g, reference %.9g (%lld steps)\n", isas[k], x[c],
                           (unsigned)(base + c * stride), out[c], ref[c], (long long)d);
            }
        }
    }
    int fail = 0;
    for (int k = 0; k < nisa; k++) {
        if (!ok[k]) {
            printf("%-11s not supported here\n", isas[k]);
            continue;
        }
        printf("%-11s 0 steps %lld, 1 step %lld, over 1 step %lld, NaN mismatches %lld\n", isas[k],
               (long long)n[k][0], (long long)n[k][1], (long long)n[k][2], (long long)nan_bad[k]);
        fail |= n[k][2] > 0 || nan_bad[k] > 0;
    }
    gdn_select_isa(NULL);
    return fail;
}
