/* Prefill kernel, NEON (baseline on every Armv8-A CPU): 4 channels per q register,
 * fp32 arithmetic. */
#include "prefill.h"
#include "silu.h"

#ifdef GDN_HAVE_NEON_SIMD
#include <arm_neon.h>

#include "simd_neon.h"
#include "prefill_simd.h"

void gdn_prefill_neon(const gdn_prefill_params *p, const float *w, int64_t ld, const float *b, int64_t i,
                      int64_t c0, int64_t c1, int64_t t0, int64_t t1) {
    prefill_kernel(p, w, ld, b, i, c0, c1, t0, t1, 0);
}
#endif
