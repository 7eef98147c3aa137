// 16-lane vectors (GCC vector extensions) for the extension's own loops, and the clones
// those loops are compiled to: on x86-64 one each for AVX-512, AVX2 and the baseline, the
// loader picking one per CPU, so every call on a machine runs the same code. Built with
// -ffp-contract=off, every clone rounds each lane as the baseline does.
#pragma once

#include <cstdint>
#include <cstring>

typedef float v16f __attribute__((vector_size(64)));
typedef float v8f __attribute__((vector_size(32)));
typedef float v4f __attribute__((vector_size(16)));
typedef int32_t v16i __attribute__((vector_size(64)));
typedef int32_t v8i __attribute__((vector_size(32)));
typedef int8_t v16c __attribute__((vector_size(16)));

constexpr int64_t kLanes = 16;  // of the v16 types

#if defined(__x86_64__)
#define CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define CLONES
#endif

// Helpers are inlined into each clone that calls them: called across clones, a 64-byte
// vector would pass in AVX-512 registers on one side and in memory on the other.
#define INLINE [[gnu::always_inline]] inline

// A loop over a few vectors, unrolled so that they stay in registers (GCC keeps an array
// indexed in a loop it does not unroll in memory).
#define UNROLLED _Pragma("GCC unroll 16")

template <typename V, typename T>
INLINE V load(const T* p) {
  V v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

template <typename V, typename T>
INLINE void store(T* p, V v) {
  std::memcpy(p, &v, sizeof v);
}
