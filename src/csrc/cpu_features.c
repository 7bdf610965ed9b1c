/* CPU features: the name table and the detected set, filled once by the detector of
 * this architecture. */
#include "cpu_features.h"

static const char *const names[GDN_FEATURE_COUNT] = {
    [GDN_FEATURE_SSE2] = "sse2", [GDN_FEATURE_AVX] = "avx", [GDN_FEATURE_AVX2] = "avx2",
    [GDN_FEATURE_FMA] = "fma", [GDN_FEATURE_F16C] = "f16c",
    [GDN_FEATURE_AVX512F] = "avx512f", [GDN_FEATURE_AVX512BW] = "avx512bw",
    [GDN_FEATURE_AVX512VL] = "avx512vl", [GDN_FEATURE_AVX512DQ] = "avx512dq",
    [GDN_FEATURE_AVX512_BF16] = "avx512_bf16", [GDN_FEATURE_AVX512_FP16] = "avx512_fp16",
    [GDN_FEATURE_AMX_TILE] = "amx_tile", [GDN_FEATURE_AMX_BF16] = "amx_bf16",
    [GDN_FEATURE_AMX_INT8] = "amx_int8",
    [GDN_FEATURE_OS_AVX] = "os_avx", [GDN_FEATURE_OS_AVX512] = "os_avx512", [GDN_FEATURE_OS_AMX] = "os_amx",
    [GDN_FEATURE_ASIMD] = "asimd", [GDN_FEATURE_SVE] = "sve", [GDN_FEATURE_BF16] = "bf16",
};

static unsigned char has[GDN_FEATURE_COUNT];
static int detected;

const char *gdn_feature_name(int f) { return f >= 0 && f < GDN_FEATURE_COUNT ? names[f] : NULL; }

int gdn_cpu_has(int f) {
    if (!detected) {  /* the first call comes from module import, under the GIL */
        gdn_detect_x86(has);
        gdn_detect_aarch64(has);
        detected = 1;
    }
    return f >= 0 && f < GDN_FEATURE_COUNT && has[f];
}
