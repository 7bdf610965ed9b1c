/* Shared internals of every file: the public header, inlining, alignment and
 * thread-local macros, and whether this compiler can build the x86 SIMD kernels from
 * a baseline build. */
#ifndef GDNCONV_COMMON_H
#define GDNCONV_COMMON_H

#include <stdint.h>
#include <string.h>

#include "gdnconv/gdnconv.h"

#if defined(_MSC_VER) && !defined(__clang__)
#define GDN_INLINE static __forceinline
#define GDN_NOINLINE __declspec(noinline)
#define GDN_ALIGN64 __declspec(align(64))
#define GDN_THREAD_LOCAL __declspec(thread)
#else
#define GDN_INLINE static inline __attribute__((always_inline))
#define GDN_NOINLINE __attribute__((noinline))
#define GDN_ALIGN64 __attribute__((aligned(64)))
#define GDN_THREAD_LOCAL _Thread_local
#endif

/* The x86 SIMD kernels are compiled where the compiler can target them from a
 * baseline build (GCC >= 10 or clang >= 9 on x86-64, with target pragmas); elsewhere
 * only the portable kernel. */
#if (defined(__x86_64__) || defined(_M_X64)) && \
    ((defined(__clang__) && __clang_major__ >= 9) || \
     (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 10))
#define GDN_HAVE_X86_SIMD 1
#endif

/* The aarch64 SIMD kernels (NEON, and NEON + BF16 in a target region) where the
 * compiler has the BF16 intrinsics: GCC >= 10, clang >= 11. */
#if defined(__aarch64__) && defined(__ARM_NEON) && \
    ((defined(__clang__) && __clang_major__ >= 11) || \
     (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 10))
#define GDN_HAVE_NEON_SIMD 1
/* FEAT_BF16 is an Armv8.2+ option, so every CPU with it has Armv8.2-A (GCC's arm_neon.h
 * declares its BF16 intrinsics for "arch=armv8.2-a+bf16", which a caller must include;
 * clang takes the same string, untested here) */
#define GDN_NEON_BF16_TARGET "arch=armv8.2-a+bf16"
#endif

/* GDN_TARGET_BEGIN("avx2,fma") ... GDN_TARGET_END: every function between them is
 * compiled for those instruction sets (intrinsic headers go before the region). */
#define GDN_PRAGMA(x) _Pragma(#x)
#if defined(__clang__)
#define GDN_TARGET_BEGIN(t) GDN_PRAGMA(clang attribute push(__attribute__((target(t))), apply_to = function))
#define GDN_TARGET_END GDN_PRAGMA(clang attribute pop)
#else
#define GDN_TARGET_BEGIN(t) GDN_PRAGMA(GCC push_options) GDN_PRAGMA(GCC target(t))
#define GDN_TARGET_END GDN_PRAGMA(GCC pop_options)
#endif

#endif
