/* Update kernel, NEON with Armv8.6 BF16 (FEAT_BF16: Graviton3/4, Neoverse V1/V2/N2,
 * Apple M2 and later): as update_neon.c, but bf16 outputs are stored with BFCVTN (one
 * instruction instead of nine, same bits); other dtypes run update_neon.c's kernel.
 * The convolution stays widening + FMLA: a depthwise 4-tap filter has no reduction
 * axis that BFDOT's pairs could take without first interleaving two token rows, and
 * BFDOT (FPCR.EBF = 0) rounds to odd and flushes subnormals, which would break the
 * bit-equality with the other rows (benchmarks/README.md counts both). */
#include "silu.h"
#include "update.h"

#ifdef GDN_HAVE_NEON_SIMD
#include <arm_neon.h>

GDN_TARGET_BEGIN(GDN_NEON_BF16_TARGET)
#define GDN_SIMD_BF16_NATIVE 1
#include "simd_neon.h"
#include "update_simd.h"

void gdn_update_neonbf16(const gdn_update_params *p, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
    if (p->dtype == GDN_BF16) simd_kernel(p, r0, r1, c0, c1, 1);
    else gdn_update_neon(p, r0, r1, c0, c1);
}

GDN_TARGET_END
#endif
