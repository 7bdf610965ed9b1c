/* Prefill kernel, AVX-512 (F/BW/VL/DQ + FMA + F16C): 16 channels per zmm, fp32
 * arithmetic, bf16 rounded in integer arithmetic. */
#include "prefill.h"
#include "silu.h"

#ifdef GDN_HAVE_X86_SIMD
#include <immintrin.h>

GDN_TARGET_BEGIN("avx512f,avx512bw,avx512vl,avx512dq,avx,avx2,fma,f16c")

#include "simd_avx512.h"
#include "prefill_simd.h"

void gdn_prefill_avx512(const gdn_prefill_params *p, const float *w, int64_t ld, const float *b, int64_t i,
                        int64_t c0, int64_t c1, int64_t t0, int64_t t1) {
    prefill_kernel(p, w, ld, b, i, c0, c1, t0, t1, 0);
}

GDN_TARGET_END
#endif
