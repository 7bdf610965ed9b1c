/* The portable kernel's per-token channel loops for llvm-mca (benchmarks/README.md):
 * update_scalar.c's gdn_scalar_conv (W = 4, plain mode), gdn_silu_row (bf16) and the
 * rounding store, with unit channel strides, bf16 in and out, fp32 weights, as
 * GCC vectorises them for aarch64 at the build's flags. benchmarks/mca/run.sh takes the
 * three vector loop bodies from the assembly. */
#include "update_scalar.c"

void mca_portable(const char *restrict xrow, char *restrict orow, float (*restrict w)[GDN_SCALAR_CHUNK],
                  const float *restrict b, const float *restrict h0, const float *restrict h1,
                  const float *restrict h2, float *restrict xf, uint16_t *restrict xr, float *restrict acc,
                  int64_t n) {
    /* (restrict: in gdn_scalar_core these are distinct local arrays) */
    const float *const h[3] = {h0, h1, h2};
    gdn_scalar_conv(xrow, 1, NULL, 1, w, b, h, xf, xr, acc, n, GDN_BF16, 4, 0);
    gdn_scalar_store(orow, 1, acc, n, GDN_BF16, GDN_F32, 1);
}
