/* The token loop of the aarch64 SIMD rows for llvm-mca (benchmarks/README.md, "aarch64:
 * static estimate"): simd_unit's inner loop, one token of one 16-channel line step per
 * iteration (simd_tokens with n = 1, NV = 4), W = 4, SiLU, bf16 in and out, weights
 * and window in registers; the region between the LLVM-MCA markers is one iteration.
 * Built by benchmarks/mca/run.sh once as the neon row and once with BF16 stores
 * (-DGDN_MCA_BF16: the neonbf16 row's GDN_BF16_NATIVE). */
#include <arm_neon.h>

#include "silu.h"
#include "update.h"

#ifdef GDN_MCA_BF16
GDN_TARGET_BEGIN(GDN_NEON_BF16_TARGET)
#define GDN_SIMD_BF16_NATIVE 1
#define DT GDN_BF16_NATIVE
#else
#define DT GDN_BF16
#endif
#include "simd_neon.h"
#include "simd_tokens.h"

void mca_tokens(const char *xs, int64_t xt, char *os, int64_t ot, const float *wr, int64_t nt) {
    V w[GDN_MAX_WIDTH][4], hf[GDN_MAX_WIDTH - 1][4], b[4];
    for (int v = 0; v < 4; v++) {
        b[v] = vload(wr + 64 + 4 * v);
        for (int k = 0; k < 4; k++) w[k][v] = vload(wr + 16 * k + 4 * v);
        for (int k = 0; k < 3; k++) hf[k][v] = vload(wr + 80 + 16 * k + 4 * v);
    }
    for (int64_t j = 0; j < nt; j++) {
        __asm__ volatile("# LLVM-MCA-BEGIN tokens" ::: "memory");
        simd_tokens(xs + j * xt, xt, os + j * ot, ot, w, b, hf, 1, 4, DT, 4, 1);
        __asm__ volatile("# LLVM-MCA-END tokens" ::: "memory");
    }
}

#ifdef GDN_MCA_BF16
GDN_TARGET_END
#endif
