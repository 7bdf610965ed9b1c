/* Update kernel, AVX-512 (F/BW/VL/DQ + FMA + F16C): 16 channels per zmm, fp32
 * arithmetic, bf16 rounded in integer arithmetic. */
#include "silu.h"
#include "update.h"

#ifdef GDN_HAVE_X86_SIMD
#include <immintrin.h>

GDN_TARGET_BEGIN("avx512f,avx512bw,avx512vl,avx512dq,avx,avx2,fma,f16c,prfchw")

#include "simd_avx512.h"
#include "update_simd.h"

void gdn_update_avx512(const gdn_update_params *p, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
    simd_kernel(p, r0, r1, c0, c1, 0);
}

/* the weight conversion of avx512 and avx512bf16 (it uses no AVX512-BF16 instruction) */
void gdn_fill_avx512(const gdn_update_params *p, int64_t c0, int64_t c1, float *w, int64_t ld, float *b) {
    simd_fill(p, c0, c1, w, ld, b);
}

GDN_TARGET_END
#endif
