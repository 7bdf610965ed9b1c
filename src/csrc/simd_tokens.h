/* The token loop of the SIMD kernels, shared by update_simd.h and prefill_simd.h (each
 * includes it after its ISA's simd_<isa>.h), so a prefill equals the update bit for bit
 * on the same ISA.
 *
 * n tokens of one line step (NV vectors per row): rows 0..n-1 of xs (row stride xt
 * bytes) in, rows 0..n-1 of os (row stride ot) out. The convolutions run first (bias,
 * then fused multiply-adds over taps 0..W-1 in order), then SiLU stage by stage across
 * the n*NV vectors (independent chains side by side keep the FP pipes busy: the
 * exp-reciprocal chain is ~45 cycles long), then the stores, one rounding each. The
 * window hf (the W-1 inputs before row 0, fp32) slides by n. */
#ifndef GDNCONV_SIMD_TOKENS_H
#define GDNCONV_SIMD_TOKENS_H
#ifndef LANES
#error "simd_tokens.h: include an ISA's simd_<isa>.h first"
#endif

GDN_INLINE void simd_tokens(const char *xs, int64_t xt, char *os, int64_t ot, V w[][4], const V *b, V hf[][4],
                            const int n, const int NV, const int dt, const int W, const int silu) {
    const int H = W - 1;
    const int64_t ve = LANES * gdn_elsize(dt);
    V E[GDN_MAX_WIDTH - 1 + 4][4], acc[4];   /* window then the n new tokens, fp32 */
#pragma GCC unroll 8
    for (int k = 0; k < H; k++)
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) E[k][v] = hf[k][v];
#pragma GCC unroll 8
    for (int j = 0; j < n; j++)
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) {
            E[H + j][v] = to_f32(ld_raw(xs + j * xt + v * ve, dt), dt);
            acc[j * NV + v] = b[v];
#pragma GCC unroll 8
            for (int k = 0; k < W; k++) acc[j * NV + v] = vfma(w[k][v], E[j + k][v], acc[j * NV + v]);
        }
    if (silu) vsilu_n(acc, n * NV, dt);
#pragma GCC unroll 8
    for (int j = 0; j < n; j++) {
#ifdef SIMD_ST2_NATIVE
        if (dt == GDN_BF16_NATIVE && NV % 2 == 0) {
#pragma GCC unroll 4
            for (int v = 0; v < NV; v += 2) st2_native(os + j * ot + v * ve, acc[j * NV + v], acc[j * NV + v + 1]);
            continue;
        }
#endif
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) st_raw(os + j * ot + v * ve, from_f32(acc[j * NV + v], dt), dt);
    }
#pragma GCC unroll 8
    for (int k = 0; k < H; k++)
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) hf[k][v] = E[n + k][v];
}

#endif
