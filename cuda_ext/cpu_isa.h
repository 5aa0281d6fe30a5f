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

// Code written with explicit vectors (Vec) is defined per level instead, by DENSECNN_PER_LEVEL((signature), body):
// the same three versions and the same choice at load time, the body compiled in each with kVecBytes, the width of
// that level's vector registers (64, 32 and 16 bytes). A vector wider than the registers is not split into them
// but lowered through memory: AVX2 clones of 64-byte vector code ran the Winograd products and the FFT transforms
// 4-5x slower than the AVX-512 clones on the same core.
// DENSECNN_TOP_LEVEL (4 unless the build sets it: setup.py's DENSECNN_CPU_LEVEL=v3 or baseline) leaves the levels
// above it out, so that a CPU of a higher level runs, and the tests check, the lower levels' versions.
#define DENSECNN_ALWAYS_INLINE inline __attribute__((always_inline))
#define DENSECNN_UNPARENTHESISED(...) __VA_ARGS__
#ifndef DENSECNN_TOP_LEVEL
#define DENSECNN_TOP_LEVEL 4
#endif
#define DENSECNN_LEVEL_VERSION(TARGET, BYTES, SIGNATURE, ...)               \
  __attribute__((target(TARGET))) DENSECNN_UNPARENTHESISED SIGNATURE {      \
    [[maybe_unused]] constexpr int kVecBytes = BYTES;                       \
    __VA_ARGS__                                                             \
  }
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && DENSECNN_TOP_LEVEL >= 4
#define DENSECNN_MULTIVERSION __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#define DENSECNN_PER_LEVEL(SIGNATURE, ...)                                   \
  DENSECNN_LEVEL_VERSION("arch=x86-64-v4", 64, SIGNATURE, __VA_ARGS__)       \
  DENSECNN_LEVEL_VERSION("arch=x86-64-v3", 32, SIGNATURE, __VA_ARGS__)       \
  DENSECNN_LEVEL_VERSION("default", 16, SIGNATURE, __VA_ARGS__)
#elif defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && DENSECNN_TOP_LEVEL == 3
#define DENSECNN_MULTIVERSION __attribute__((target_clones("arch=x86-64-v3", "default")))
#define DENSECNN_PER_LEVEL(SIGNATURE, ...)                                   \
  DENSECNN_LEVEL_VERSION("arch=x86-64-v3", 32, SIGNATURE, __VA_ARGS__)       \
  DENSECNN_LEVEL_VERSION("default", 16, SIGNATURE, __VA_ARGS__)
#else
#define DENSECNN_MULTIVERSION
#define DENSECNN_PER_LEVEL(SIGNATURE, ...)          \
  DENSECNN_UNPARENTHESISED SIGNATURE {              \
    [[maybe_unused]] constexpr int kVecBytes = 16;  \
    __VA_ARGS__                                     \
  }
#endif

namespace densecnn {

// One vector of T, Bytes wide (GCC vector extensions), aligned like its elements (loads and stores through it are
// the unaligned kind), and its number of lanes. The default, 64 bytes, is one AVX-512 register: the widest level's,
// which blocks of channels and padding are counted in.
template <typename T, int Bytes = 64>
using Vec [[gnu::vector_size(Bytes), gnu::aligned(alignof(T))]] = T;
template <typename T, int Bytes = 64>
constexpr int lanes() {
  return Bytes / sizeof(T);
}

// The x86-64 level whose versions of DENSECNN_MULTIVERSION and DENSECNN_PER_LEVEL functions this CPU runs: the
// resolver's own test, first match in the list (4, 3 or 1; 0 where the build has no levels).
inline int dispatched_level() {
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
  __builtin_cpu_init();
  if (DENSECNN_TOP_LEVEL >= 4 && __builtin_cpu_supports("x86-64-v4")) return 4;
  if (DENSECNN_TOP_LEVEL >= 3 && __builtin_cpu_supports("x86-64-v3")) return 3;
  return 1;
#else
  return 0;
#endif
}

// That level's name, as cpu_isa() reports it.
inline const char* dispatched_isa() {
  switch (dispatched_level()) {
    case 4: return "x86-64-v4";
    case 3: return "x86-64-v3";
    case 1: return "x86-64";
    default: return "generic";
  }
}

// kVecBytes of the DENSECNN_PER_LEVEL versions this CPU runs, for host code that lays data out for them.
inline int dispatched_vector_bytes() {
  switch (dispatched_level()) {
    case 4: return 64;
    case 3: return 32;
    default: return 16;
  }
}

}  // namespace densecnn
