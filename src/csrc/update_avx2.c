/* Update kernel, AVX2 (AVX2 + FMA + F16C): 8 channels per ymm, fp32 arithmetic. */
#include "silu.h"
#include "update.h"

#ifdef GDN_HAVE_X86_SIMD
#include <immintrin.h>

GDN_TARGET_BEGIN("avx,avx2,fma,f16c")

#include "simd_avx2.h"
#include "update_simd.h"

void gdn_update_avx2(const gdn_update_params *p, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
    simd_kernel(p, r0, r1, c0, c1, 0);
}

void gdn_fill_avx2(const gdn_update_params *p, int64_t c0, int64_t c1, float *w, int64_t ld, float *b) {
    simd_fill(p, c0, c1, w, ld, b);
}

GDN_TARGET_END
#endif
