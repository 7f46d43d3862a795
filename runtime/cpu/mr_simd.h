/*
 * mr_simd.h - MR_HOT: compile a hot kernel three times, for AVX-512F,
 * AVX2 and the baseline, and pick at load time (GCC function
 * multi-versioning).
 *
 * The resolver picks by CPU feature (__builtin_cpu_supports), not model.
 * The build stays portable (no -march), yet the own kernels get 16- or
 * 8-wide vectors where the CPU has them (AVX-512 halves GELU's time on
 * Zen 4). All versions perform the same float operations in the same order
 * (no FMA contraction under -std=c11, no reassociation), so the results do
 * not depend on which version runs.
 *
 * Non-goals: hand-written intrinsics; clang (it gets the baseline).
 */
#ifndef MR_SIMD_H
#define MR_SIMD_H

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define MR_HOT __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define MR_HOT
#endif

#endif
