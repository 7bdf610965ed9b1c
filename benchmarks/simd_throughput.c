/* Reciprocal throughput of the instructions the AVX-512 kernels spend their time in,
 * alone and paired with an FMA or an add (which shows which pipes they share).
 * Eight independent chains per loop, so latency does not limit; cycles assume the
 * clock given on the command line (GHz, default 3.65: measure it with a dependent
 * add loop or read it from /proc/cpuinfo). Needs AVX-512 F/BW/DQ/VL, AVX512-BF16 and
 * AVX512-VBMI.
 *
 *   gcc -O2 -mfma -mavx512f -mavx512bw -mavx512dq -mavx512vl -mavx512bf16 -mavx512vbmi \
 *       benchmarks/simd_throughput.c -o /tmp/simd_throughput && /tmp/simd_throughput 3.65
 *
 * On the 2-core EPYC development VM a zmm FMA, mul or add took 1.0 cycle and a ymm
 * one 0.5 (512-bit operations run as two halves), vreduceps and vscalefps 2.0,
 * vcvtneps2bf16 1.7; an FMA and an add overlap, an FMA and rcp14 do not, and
 * vreduceps and vscalefps take the add pipes. The bf16 SiLU (mul, reduce, two FMAs,
 * scalef, add, rcp14, mul) thus needs ~5 cycles of each pipe pair per 16 outputs.
 * On the 2-core Sapphire Rapids-class VM (3 runs at the default clock) the two-source
 * word permute vpermt2w took 2.7-2.8 cycles, twice vpermt2d's 1.3-1.4 (and vpermw's
 * 1.4-2.1; a zmm add 0.7-1.1): the time-contiguous transposition's cost (docs/design.md).
 * On a 2-core Xeon model 167 (stop 49, default clock): vpermw, vpermb (AVX512-VBMI, merge-
 * masked or not) and vpermt2d 1.03 each, vpermt2w and vpermt2b 2.05; paired with an FMA,
 * vpermb + fma 0.54 (apart: one uop, port 5) against vpermw + fma 0.82 (a second uop shares
 * the FMA's port). The same Xeon (stop 50): ymm vpermps and vblendvps ~1 cycle each, vblendps
 * with an immediate ~1/3, vshufps ~1/2: AVX2's fp32 time-contiguous transposition merges by
 * immediates (simd_avx2.h). */
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define N 50000000L

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static double ghz = 3.65;

/* OPA on chains 0, 2, 4, 6 and OPB on 1, 3, 5, 7; prints cycles per instruction */
#define BENCH(T, SET1, name, OPA, OPB)                                                          \
    {                                                                                          \
        T a0 = SET1(1.1f), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;      \
        const T k = SET1(0.999f);                                                              \
        const double t0 = now();                                                               \
        for (long i = 0; i < N; i++) {                                                         \
            a0 = OPA(a0); a1 = OPB(a1); a2 = OPA(a2); a3 = OPB(a3);                            \
            a4 = OPA(a4); a5 = OPB(a5); a6 = OPA(a6); a7 = OPB(a7);                            \
            __asm__("" : "+v"(a0), "+v"(a1), "+v"(a2), "+v"(a3), "+v"(a4), "+v"(a5), "+v"(a6), \
                    "+v"(a7));                                                                 \
        }                                                                                      \
        const double s = now() - t0;                                                           \
        volatile T sink = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7;                               \
        (void)sink;                                                                            \
        (void)k;                                                                               \
        printf("%-26s %.2f cycles per instruction\n", name, s * ghz * 1e9 / (N * 8.0));        \
    }

#define Z_FMA(x) _mm512_fmadd_ps(x, k, k)
#define Z_ADD(x) _mm512_add_ps(x, k)
#define Z_RED(x) _mm512_reduce_ps(x, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC)
#define Z_SCF(x) _mm512_scalef_ps(x, k)
#define Z_RCP(x) _mm512_rcp14_ps(x)
#define Z_CBF(x) _mm512_castsi512_ps(_mm512_castsi256_si512((__m256i)_mm512_cvtneps_pbh(x)))
#define Z_C2BF(x) _mm512_castsi512_ps((__m512i)_mm512_cvtne2ps_pbh(x, k))
#define Z_PW(x) _mm512_castsi512_ps(_mm512_permutexvar_epi16(_mm512_castps_si512(k), _mm512_castps_si512(x)))
#define Z_P2W(x) _mm512_castsi512_ps(_mm512_permutex2var_epi16(_mm512_castps_si512(x), _mm512_castps_si512(k), _mm512_castps_si512(k)))
#define Z_P2D(x) _mm512_castsi512_ps(_mm512_permutex2var_epi32(_mm512_castps_si512(x), _mm512_castps_si512(k), _mm512_castps_si512(k)))
#define Z_PB(x) _mm512_castsi512_ps(_mm512_permutexvar_epi8(_mm512_castps_si512(k), _mm512_castps_si512(x)))
#define Z_PBM(x) _mm512_castsi512_ps(_mm512_mask_permutexvar_epi8(_mm512_castps_si512(x), 0x5555555555555555ull, _mm512_castps_si512(k), _mm512_castps_si512(k)))
#define Z_P2B(x) _mm512_castsi512_ps(_mm512_permutex2var_epi8(_mm512_castps_si512(x), _mm512_castps_si512(k), _mm512_castps_si512(k)))
#define Z_DP(x) _mm512_dpbf16_ps(x, (__m512bh)_mm512_castps_si512(k), (__m512bh)_mm512_castps_si512(k))
#define Y_FMA(x) _mm256_fmadd_ps(x, k, k)
#define Y_ADD(x) _mm256_add_ps(x, k)
#define Y_PERM(x) _mm256_permutevar8x32_ps(x, _mm256_castps_si256(k))
#define Y_BLENDV(x) _mm256_blendv_ps(k, x, x)   /* (the mask from the chain: not a constant) */
#define Y_BLENDI(x) _mm256_blend_ps(x, k, 0x5a)
#define Y_SHUF(x) _mm256_shuffle_ps(x, k, 0x4e)

int main(int argc, char **argv) {
    if (argc > 1) ghz = atof(argv[1]);
    BENCH(__m256, _mm256_set1_ps, "ymm fma", Y_FMA, Y_FMA)
    BENCH(__m256, _mm256_set1_ps, "ymm add", Y_ADD, Y_ADD)
    BENCH(__m256, _mm256_set1_ps, "ymm vpermps", Y_PERM, Y_PERM)
    BENCH(__m256, _mm256_set1_ps, "ymm vblendvps", Y_BLENDV, Y_BLENDV)
    BENCH(__m256, _mm256_set1_ps, "ymm vblendps immediate", Y_BLENDI, Y_BLENDI)
    BENCH(__m256, _mm256_set1_ps, "ymm vshufps", Y_SHUF, Y_SHUF)
    BENCH(__m512, _mm512_set1_ps, "zmm fma", Z_FMA, Z_FMA)
    BENCH(__m512, _mm512_set1_ps, "zmm add", Z_ADD, Z_ADD)
    BENCH(__m512, _mm512_set1_ps, "zmm fma + add", Z_FMA, Z_ADD)
    BENCH(__m512, _mm512_set1_ps, "zmm reduceps", Z_RED, Z_RED)
    BENCH(__m512, _mm512_set1_ps, "zmm scalefps", Z_SCF, Z_SCF)
    BENCH(__m512, _mm512_set1_ps, "zmm rcp14ps", Z_RCP, Z_RCP)
    BENCH(__m512, _mm512_set1_ps, "zmm fma + rcp14ps", Z_FMA, Z_RCP)
    BENCH(__m512, _mm512_set1_ps, "zmm add + reduceps", Z_ADD, Z_RED)
    BENCH(__m512, _mm512_set1_ps, "zmm add + scalefps", Z_ADD, Z_SCF)
    BENCH(__m512, _mm512_set1_ps, "zmm cvtneps2bf16", Z_CBF, Z_CBF)
    BENCH(__m512, _mm512_set1_ps, "zmm cvtne2ps2bf16", Z_C2BF, Z_C2BF)
    BENCH(__m512, _mm512_set1_ps, "zmm vpermw", Z_PW, Z_PW)
    BENCH(__m512, _mm512_set1_ps, "zmm vpermt2w", Z_P2W, Z_P2W)
    BENCH(__m512, _mm512_set1_ps, "zmm vpermt2d", Z_P2D, Z_P2D)
    BENCH(__m512, _mm512_set1_ps, "zmm vpermb", Z_PB, Z_PB)
    BENCH(__m512, _mm512_set1_ps, "zmm vpermb merge-masked", Z_PBM, Z_PBM)
    BENCH(__m512, _mm512_set1_ps, "zmm vpermt2b", Z_P2B, Z_P2B)
    BENCH(__m512, _mm512_set1_ps, "zmm vpermb + fma", Z_PB, Z_FMA)
    BENCH(__m512, _mm512_set1_ps, "zmm vpermw + fma", Z_PW, Z_FMA)
    BENCH(__m512, _mm512_set1_ps, "zmm dpbf16ps", Z_DP, Z_DP)
    return 0;
}
