/* Prefill kernel, AVX-512 with AVX512-BF16: as prefill_avx512.c, but bf16 outputs are
 * stored with vcvtneps2bf16 (same bits); other dtypes run prefill_avx512.c's kernel. */
#include "prefill.h"
#include "silu.h"

#ifdef GDN_HAVE_X86_SIMD
#include <immintrin.h>

GDN_TARGET_BEGIN("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx,avx2,fma,f16c")
#define GDN_SIMD_BF16_NATIVE 1
#include "simd_avx512.h"
#include "prefill_simd.h"

void gdn_prefill_avx512bf16(const gdn_prefill_params *p, const float *w, int64_t ld, const float *b,
                            int64_t i, int64_t c0, int64_t c1, int64_t t0, int64_t t1) {
    if (p->conv.dtype == GDN_BF16) prefill_kernel(p, w, ld, b, i, c0, c1, t0, t1, 1);
    else gdn_prefill_avx512(p, w, ld, b, i, c0, c1, t0, t1);
}

GDN_TARGET_END
#endif
