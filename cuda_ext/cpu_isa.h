// CPU loops compiled once per instruction set.
//
// A function marked DENSECNN_MULTIVERSION is compiled for the x86-64 micro-architecture levels v4 (AVX-512 F, BW,
// CD, DQ and VL, with FMA) and v3 (AVX2 with FMA) and for the x86-64 baseline, and the best one the CPU supports is
// picked when the library loads (GCC function multiversioning, `target_clones`). The build therefore needs no -march
// flag and the same wheel runs on any x86-64 CPU. The levels, not single extensions ("avx512f", "avx2"), because
// neither of those brings FMA to 256-bit and scalar code: an "avx2" clone computes every a·b + c as a multiply and an
// add, twice the work and an extra rounding. Everything such a function calls must be inlined into it
// (DENSECNN_ALWAYS_INLINE), or it runs the baseline code.
//
// Included by the CPU translation units only (never by CUDA code).
#pragma once

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define DENSECNN_MULTIVERSION __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define DENSECNN_MULTIVERSION
#endif
#define DENSECNN_ALWAYS_INLINE inline __attribute__((always_inline))

namespace densecnn {

// One 512-bit vector of T (GCC vector extensions: one AVX-512 register, two AVX2 ones or four SSE ones in the
// clones), and its number of lanes.
template <typename T>
using Vec [[gnu::vector_size(64)]] = T;
template <typename T>
constexpr int lanes() {
  return 64 / sizeof(T);
}

// The clone of DENSECNN_MULTIVERSION functions this CPU runs: the resolver's own test, first match in the list.
inline const char* dispatched_isa() {
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("x86-64-v4")) return "x86-64-v4";
  if (__builtin_cpu_supports("x86-64-v3")) return "x86-64-v3";
  return "x86-64";
#else
  return "generic";
#endif
}

}  // namespace densecnn
