/* aarch64 feature detection: the kernel's hardware capabilities (Linux getauxval). */
#include "cpu_features.h"

#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>

#ifndef AT_HWCAP2
#define AT_HWCAP2 26
#endif
#define HWCAP_ASIMD_BIT (1ul << 1)    /* asm/hwcap.h: HWCAP_ASIMD */
#define HWCAP_SVE_BIT (1ul << 22)     /* asm/hwcap.h: HWCAP_SVE */
#define HWCAP2_BF16_BIT (1ul << 14)   /* asm/hwcap.h: HWCAP2_BF16 (BFCVT, BFDOT, BFMMLA) */

void gdn_detect_aarch64(unsigned char has[GDN_FEATURE_COUNT]) {
    const unsigned long hw = getauxval(AT_HWCAP), hw2 = getauxval(AT_HWCAP2);
    has[GDN_FEATURE_ASIMD] = (hw & HWCAP_ASIMD_BIT) != 0;
    has[GDN_FEATURE_SVE] = (hw & HWCAP_SVE_BIT) != 0;
    has[GDN_FEATURE_BF16] = (hw2 & HWCAP2_BF16_BIT) != 0;
}
#elif defined(__aarch64__)
void gdn_detect_aarch64(unsigned char has[GDN_FEATURE_COUNT]) {
    has[GDN_FEATURE_ASIMD] = 1;   /* Advanced SIMD is mandatory in ARMv8-A; BF16 is not detected here */
}
#else
void gdn_detect_aarch64(unsigned char has[GDN_FEATURE_COUNT]) { (void)has; }
#endif
