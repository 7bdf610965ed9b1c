/* Update kernel, NEON (Advanced SIMD, baseline on every Armv8-A CPU: no target
 * region): 4 channels per q register, fp32 arithmetic, bf16 rounded in integer
 * arithmetic. */
#include "silu.h"
#include "update.h"

#ifdef GDN_HAVE_NEON_SIMD
#include <arm_neon.h>

#include "simd_neon.h"
#include "update_simd.h"

void gdn_update_neon(const gdn_update_params *p, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
    simd_kernel(p, r0, r1, c0, c1, 0);
}

/* the weight conversion of neon and neonbf16 (it uses no BF16 instruction) */
void gdn_fill_neon(const gdn_update_params *p, int64_t c0, int64_t c1, float *w, int64_t ld, float *b) {
    simd_fill(p, c0, c1, w, ld, b);
}
#endif
