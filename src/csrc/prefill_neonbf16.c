/* Prefill kernel, NEON with BF16: as prefill_neon.c, but bf16 outputs are stored with
 * BFCVTN (same bits); other dtypes run prefill_neon.c's kernel. */
#include "prefill.h"
#include "silu.h"

#ifdef GDN_HAVE_NEON_SIMD
#include <arm_neon.h>

GDN_TARGET_BEGIN(GDN_NEON_BF16_TARGET)
#define GDN_SIMD_BF16_NATIVE 1
#include "simd_neon.h"
#include "prefill_simd.h"

void gdn_prefill_neonbf16(const gdn_prefill_params *p, const float *w, int64_t ld, const float *b,
                          int64_t i, int64_t c0, int64_t c1, int64_t t0, int64_t t1) {
    if (p->conv.dtype == GDN_BF16) prefill_kernel(p, w, ld, b, i, c0, c1, t0, t1, 1);
    else gdn_prefill_neon(p, w, ld, b, i, c0, c1, t0, t1);
}

GDN_TARGET_END
#endif
