// Output buffers of the CPU kernels: reused across calls, and optionally on transparent huge pages.
//
// torch allocates every tensor anew, and the kernel maps a fresh buffer's pages on first touch, one 4 KiB page fault
// at a time: ~0.25 ms per MB on the machines this was measured on, so for a layer's output of tens of MB as much as
// the arithmetic that fills it. Dense nets run the same shapes call after call (every forward of a served model,
// every training step), so:
//
// - **Reuse.** The kernels keep each large output buffer they allocate (at least kMinCachedBytes) and hand it out
//   again, for an output of the same size or up to half as large, once nothing else refers to it: its storage's use
//   count is back to one, the cache's own reference. The smallest such buffer is taken, so a net's layers, whose
//   maps shrink slowly, mostly alternate between two buffers, also within the first call. Outputs a caller keeps (a returned score map, a tensor autograd saved) are
//   never reused while kept. At most DENSECNN_OUTPUT_CACHE_MB (default 1024; 0 turns reuse off) of buffers are
//   kept; beyond that the least recently used free ones are released.
// - **Huge pages**, opt-in with DENSECNN_HUGE_PAGES=1: a fresh buffer is advised to be backed by 2 MiB pages where
//   the system allows it (transparent_hugepage "madvise" or "always"), making its first-touch faults 512× fewer.
//   Off by default: with the usual defrag setting ("madvise") those faults compact memory synchronously, which made
//   a first forward ~2× slower than the next.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/accumulate.h>
#include <c10/util/strides.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <list>
#include <mutex>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace densecnn {

constexpr int64_t kMinCachedBytes = int64_t(1) << 20;  // smaller buffers come from malloc's heap, already mapped

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

class OutputCache {
 public:
  // A contiguous tensor of `sizes`: a free cached buffer of the same byte size if there is one, else a fresh one
  // (kept for later calls when large enough and the limit allows).
  at::Tensor empty(at::IntArrayRef sizes, const at::TensorOptions& options) {
    const int64_t bytes = c10::multiply_integers(sizes) * int64_t(options.dtype().itemsize());
    if (!options.device().is_cpu() || bytes < kMinCachedBytes || limit_ == 0) return fresh(sizes, options);
    std::lock_guard<std::mutex> lock(mutex_);
    auto best = buffers_.end();  // the smallest free buffer that fits, up to twice the size asked for
    for (auto it = buffers_.begin(); it != buffers_.end(); ++it) {
      const int64_t size = static_cast<int64_t>(it->nbytes());
      if (it->use_count() == 1 && size >= bytes && size <= 2 * bytes &&
          (best == buffers_.end() || size < static_cast<int64_t>(best->nbytes()))) {
        best = it;
      }
    }
    if (best != buffers_.end()) {
      buffers_.splice(buffers_.end(), buffers_, best);  // most recently used last
      return at::empty({0}, options).set_(buffers_.back(), 0, sizes, c10::contiguous_strides(sizes));
    }
    at::Tensor out = fresh(sizes, options);
    buffers_.push_back(out.storage());
    held_ += bytes;
    for (auto it = buffers_.begin(); held_ > limit_ && it != buffers_.end();) {  // oldest free ones first
      if (it->use_count() == 1) {
        held_ -= static_cast<int64_t>(it->nbytes());
        it = buffers_.erase(it);
      } else {
        ++it;
      }
    }
    return out;
  }

  static OutputCache& instance() {
    static OutputCache cache;
    return cache;
  }

 private:
  OutputCache() {
    const char* value = std::getenv("DENSECNN_OUTPUT_CACHE_MB");
    limit_ = (value != nullptr ? std::atoll(value) : 1024) << 20;
  }

  static at::Tensor fresh(at::IntArrayRef sizes, const at::TensorOptions& options) {
    at::Tensor out = at::empty(sizes, options);
    advise_huge_pages(out);
    return out;
  }

  std::mutex mutex_;
  std::list<c10::Storage> buffers_;  // least recently used first
  int64_t held_ = 0, limit_ = 0;
};

// An uninitialised output tensor of `sizes`, contiguous (see OutputCache).
inline at::Tensor empty_output(at::IntArrayRef sizes, const at::TensorOptions& options) {
  return OutputCache::instance().empty(sizes, options);
}

}  // namespace densecnn
