// Transparent huge pages for large fresh outputs of the CPU kernels, opt-in with DENSECNN_HUGE_PAGES=1. torch
// allocates every tensor anew and the kernel maps its pages on first touch, one 4 KiB page fault at a time: for a
// layer's output of tens of MB that costs as much as the arithmetic that fills it. Advising the kernel to back the
// (not yet touched) buffer with 2 MiB pages, where the system allows it (transparent_hugepage "madvise" or
// "always"), makes those faults 512× fewer, and warm calls 10–20% faster. It is off by default because the first
// calls of a process pay for it: with the usual defrag setting ("madvise") those faults compact memory
// synchronously, which made a first forward ~2× slower than the next; long-running processes that warm up first
// (a service with warm-up sizes, a large batch job) gain from turning it on.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace densecnn {

// Whether DENSECNN_HUGE_PAGES=1 was set when the library first needed to know.
inline bool huge_pages_enabled() {
  static const bool enabled = [] {
    const char* value = std::getenv("DENSECNN_HUGE_PAGES");
    return value != nullptr && std::strcmp(value, "1") == 0;
  }();
  return enabled;
}

// Call right after allocating `fresh`, before anything writes to it. A no-op unless enabled, for small tensors,
// elsewhere than Linux, and when the advice is refused.
inline void advise_huge_pages(const at::Tensor& fresh) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  if (!huge_pages_enabled()) return;
  constexpr uintptr_t kHuge = uintptr_t(1) << 21;
  const uintptr_t begin = reinterpret_cast<uintptr_t>(fresh.data_ptr());
  const uintptr_t end = begin + fresh.nbytes();
  const uintptr_t first = (begin + kHuge - 1) & ~(kHuge - 1), last = end & ~(kHuge - 1);
  if (fresh.is_cpu() && last >= first + 2 * kHuge) madvise(reinterpret_cast<void*>(first), last - first, MADV_HUGEPAGE);
#else
  (void)fresh;
#endif
}

}  // namespace densecnn
