/* Update kernel, AVX-512 with AVX512-BF16: as update_avx512.c, but bf16 outputs are
 * stored with vcvtneps2bf16 (one instruction instead of eight, same bits); other
 * dtypes run update_avx512.c's kernel. */
#include "silu.h"
#include "update.h"

#ifdef GDN_HAVE_X86_SIMD
#include <immintrin.h>

GDN_TARGET_BEGIN("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx,avx2,fma,f16c,prfchw")
#define GDN_SIMD_BF16_NATIVE 1
#include "simd_avx512.h"
#include "update_simd.h"

void gdn_update_avx512bf16(const gdn_update_params *p, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
    if (p->dtype == GDN_BF16) simd_kernel(p, r0, r1, c0, c1, 1);
    else gdn_update_avx512(p, r0, r1, c0, c1);
}

GDN_TARGET_END
#endif
