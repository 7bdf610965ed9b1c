/* x86 feature detection: cpuid for what the CPU has, xgetbv for what the OS saves. */
#include "cpu_features.h"

#if defined(__x86_64__) || defined(__i386__) || defined(_M_X64) || defined(_M_IX86)
#if defined(_MSC_VER) && !defined(__clang__)
#include <intrin.h>
static void cpuid(unsigned leaf, unsigned sub, unsigned r[4]) {
    int v[4];
    __cpuidex(v, (int)leaf, (int)sub);
    for (int i = 0; i < 4; i++) r[i] = (unsigned)v[i];
}
static uint64_t xgetbv0(void) { return _xgetbv(0); }
#else
#include <cpuid.h>
static void cpuid(unsigned leaf, unsigned sub, unsigned r[4]) {
    r[0] = r[1] = r[2] = r[3] = 0;
    if (leaf <= __get_cpuid_max(leaf & 0x80000000u, NULL)) __cpuid_count(leaf, sub, r[0], r[1], r[2], r[3]);
}
static uint64_t xgetbv0(void) {
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}
#endif

enum { EAX = 0, EBX = 1, ECX = 2, EDX = 3 };
#define BIT(reg, n) (((reg) >> (n)) & 1u)

/* XCR0 state components */
#define XCR0_SSE_AVX 0x6ull        /* XMM | YMM */
#define XCR0_AVX512 0xe0ull        /* opmask | ZMM_Hi256 | Hi16_ZMM */
#define XCR0_AMX 0x60000ull        /* XTILECFG | XTILEDATA */

void gdn_detect_x86(unsigned char has[GDN_FEATURE_COUNT]) {
    unsigned l1[4], l7[4], l7s1[4];
    cpuid(1, 0, l1);
    cpuid(7, 0, l7);
    cpuid(7, 1, l7s1);
    has[GDN_FEATURE_SSE2] = BIT(l1[EDX], 26);              /* leaf 1, EDX bit 26 */
    has[GDN_FEATURE_FMA] = BIT(l1[ECX], 12);               /* leaf 1, ECX bit 12 */
    has[GDN_FEATURE_AVX] = BIT(l1[ECX], 28);               /* leaf 1, ECX bit 28 */
    has[GDN_FEATURE_F16C] = BIT(l1[ECX], 29);              /* leaf 1, ECX bit 29 */
    has[GDN_FEATURE_AVX2] = BIT(l7[EBX], 5);               /* leaf 7, EBX bit 5 */
    has[GDN_FEATURE_AVX512F] = BIT(l7[EBX], 16);           /* leaf 7, EBX bit 16 */
    has[GDN_FEATURE_AVX512DQ] = BIT(l7[EBX], 17);          /* leaf 7, EBX bit 17 */
    has[GDN_FEATURE_AVX512BW] = BIT(l7[EBX], 30);          /* leaf 7, EBX bit 30 */
    has[GDN_FEATURE_AVX512VL] = BIT(l7[EBX], 31);          /* leaf 7, EBX bit 31 */
    has[GDN_FEATURE_AMX_BF16] = BIT(l7[EDX], 22);          /* leaf 7, EDX bit 22 */
    has[GDN_FEATURE_AVX512_FP16] = BIT(l7[EDX], 23);       /* leaf 7, EDX bit 23 */
    has[GDN_FEATURE_AMX_TILE] = BIT(l7[EDX], 24);          /* leaf 7, EDX bit 24 */
    has[GDN_FEATURE_AMX_INT8] = BIT(l7[EDX], 25);          /* leaf 7, EDX bit 25 */
    has[GDN_FEATURE_AVX512_BF16] = BIT(l7s1[EAX], 5);      /* leaf 7 subleaf 1, EAX bit 5 */
    if (BIT(l1[ECX], 27)) {                                /* leaf 1, ECX bit 27: OSXSAVE */
        const uint64_t xcr0 = xgetbv0();
        has[GDN_FEATURE_OS_AVX] = (xcr0 & XCR0_SSE_AVX) == XCR0_SSE_AVX;
        has[GDN_FEATURE_OS_AVX512] = has[GDN_FEATURE_OS_AVX] && (xcr0 & XCR0_AVX512) == XCR0_AVX512;
        has[GDN_FEATURE_OS_AMX] = (xcr0 & XCR0_AMX) == XCR0_AMX;
    }
}
#else
void gdn_detect_x86(unsigned char has[GDN_FEATURE_COUNT]) { (void)has; }
#endif
