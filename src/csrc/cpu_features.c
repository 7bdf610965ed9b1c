/* CPU feature detection: cpuid for what the CPU has, xgetbv for what the OS saves. */
#include "conv_common.h"

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
#define GDN_X86 1
#endif

enum { EAX = 0, EBX = 1, ECX = 2, EDX = 3 };
#define BIT(reg, n) (((reg) >> (n)) & 1u)

/* XCR0 state components */
#define XCR0_SSE_AVX 0x6ull        /* XMM | YMM */
#define XCR0_AVX512 0xe0ull        /* opmask | ZMM_Hi256 | Hi16_ZMM */
#define XCR0_AMX 0x60000ull        /* XTILECFG | XTILEDATA */

static gdn_cpu_features features;
static int detected;

static void detect(void) {
#ifdef GDN_X86
    unsigned l1[4], l7[4], l7s1[4];
    cpuid(1, 0, l1);
    cpuid(7, 0, l7);
    cpuid(7, 1, l7s1);
    features.sse2 = BIT(l1[EDX], 26);              /* leaf 1, EDX bit 26 */
    features.fma = BIT(l1[ECX], 12);               /* leaf 1, ECX bit 12 */
    features.avx = BIT(l1[ECX], 28);               /* leaf 1, ECX bit 28 */
    features.f16c = BIT(l1[ECX], 29);              /* leaf 1, ECX bit 29 */
    features.avx2 = BIT(l7[EBX], 5);               /* leaf 7, EBX bit 5 */
    features.avx512f = BIT(l7[EBX], 16);           /* leaf 7, EBX bit 16 */
    features.avx512dq = BIT(l7[EBX], 17);          /* leaf 7, EBX bit 17 */
    features.avx512bw = BIT(l7[EBX], 30);          /* leaf 7, EBX bit 30 */
    features.avx512vl = BIT(l7[EBX], 31);          /* leaf 7, EBX bit 31 */
    features.amx_bf16 = BIT(l7[EDX], 22);          /* leaf 7, EDX bit 22 */
    features.avx512_fp16 = BIT(l7[EDX], 23);       /* leaf 7, EDX bit 23 */
    features.amx_tile = BIT(l7[EDX], 24);          /* leaf 7, EDX bit 24 */
    features.amx_int8 = BIT(l7[EDX], 25);          /* leaf 7, EDX bit 25 */
    features.avx512_bf16 = BIT(l7s1[EAX], 5);      /* leaf 7 subleaf 1, EAX bit 5 */
    if (BIT(l1[ECX], 27)) {                        /* leaf 1, ECX bit 27: OSXSAVE */
        const uint64_t xcr0 = xgetbv0();
        features.os_avx = (xcr0 & XCR0_SSE_AVX) == XCR0_SSE_AVX;
        features.os_avx512 = features.os_avx && (xcr0 & XCR0_AVX512) == XCR0_AVX512;
        features.os_amx = (xcr0 & XCR0_AMX) == XCR0_AMX;
    }
#endif
    detected = 1;
}

const gdn_cpu_features *gdn_get_cpu_features(void) {
    if (!detected) detect();  /* first call comes from module import, under the GIL */
    return &features;
}
