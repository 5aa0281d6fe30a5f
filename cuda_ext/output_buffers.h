// Output buffers of the CPU kernels: reused across calls, pre-faulted on the intra-op threads when fresh, and
// optionally on transparent huge pages.
//
// torch allocates every tensor anew, and the kernel maps a fresh buffer's pages on first touch, one 4 KiB page fault
// at a time: ~0.25-0.5 ms per MB on the machines this was measured on, so for a layer's output of tens of MB as much
// as the arithmetic that fills it. Dense nets run the same shapes call after call (every forward of a served model,
// every training step), so:
//
// - **Reuse.** The kernels' large outputs and workspaces (at least kMinCachedBytes) live on blocks of this cache:
//   when torch frees such a tensor's storage (nothing refers to it any more), its deleter returns the block here
//   instead of to the system, and the next output of the same size or down to half of it takes it. The smallest
//   such block is taken, so a net's layers, whose maps shrink slowly, mostly alternate between two blocks, also
//   within the first call. Outputs a caller keeps (a returned score map, a view of it, a tensor autograd saved) are
//   never reused while kept. The free blocks take at most a limit set from Python (densecnn.ops.config's
//   output_cache_mb, DENSECNN_OUTPUT_CACHE_MB: default 1024 MB; 0 turns reuse off), the least recently used
//   released first; blocks in use do not count, since the program needs that memory
//   anyway (counting them made a process whose live outputs passed the limit release every block it got back, and
//   map it afresh on the next call). `torch.ops.densecnn.release_output_buffers()`
//   (`densecnn.ops.ext.release_output_buffers`) releases all free ones at once.
// - **Pre-faulting.** A fresh large buffer (the first call's, or any with reuse off) has its pages mapped before the
//   kernel writes it, by MADV_POPULATE_WRITE (Linux 5.14 and later) over page-aligned chunks on torch's intra-op
//   threads: one call per chunk instead of a trap per page, 0.18 against 0.26 ms per MB with two threads here.
// - **Huge pages**, opt-in (the config's huge_pages, DENSECNN_HUGE_PAGES=1): a fresh buffer is advised to be backed
//   by 2 MiB pages where
//   the system allows it (transparent_hugepage "madvise" or "always"), making its first-touch faults 512× fewer.
//   Off by default: in a virtual machine a process's fresh huge pages are often not yet backed by the host, and
//   their first touch then cost 3-4 ms per MB here, which made a first forward ~2× slower than the next.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>
#include <c10/util/accumulate.h>
#include <c10/util/strides.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <list>
#include <mutex>

#if defined(__linux__)
#include <sys/mman.h>
#include <unistd.h>
#endif

namespace densecnn {

constexpr int64_t kMinCachedBytes = int64_t(1) << 20;  // smaller buffers come from malloc's heap, already mapped

// Whether fresh buffers are advised onto huge pages: set from Python with the output cache's limit
// (set_output_buffers in ops.cpp, called by densecnn.ops.config when the library loads and the config changes).
inline std::atomic<bool>& huge_pages_enabled() {
  static std::atomic<bool> enabled{false};
  return enabled;
}

// Call right after allocating `bytes` at `data`, before anything writes to it. A no-op unless enabled, for small
// buffers, elsewhere than Linux, and when the advice is refused.
inline void advise_huge_pages(void* data, int64_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  if (!huge_pages_enabled().load(std::memory_order_relaxed)) return;
  constexpr uintptr_t kHuge = uintptr_t(1) << 21;
  const uintptr_t begin = reinterpret_cast<uintptr_t>(data);
  const uintptr_t end = begin + static_cast<uintptr_t>(bytes);
  const uintptr_t first = (begin + kHuge - 1) & ~(kHuge - 1), last = end & ~(kHuge - 1);
  if (last >= first + 2 * kHuge) madvise(reinterpret_cast<void*>(first), last - first, MADV_HUGEPAGE);
#else
  (void)data;
  (void)bytes;
#endif
}

// Maps the pages of a fresh buffer of `bytes` at `data` before anything writes to it (see the header). A no-op for
// small buffers, elsewhere than Linux, and once the kernel has refused the advice (older than 5.14).
inline void prefault(void* data, int64_t bytes) {
#if defined(__linux__)
  constexpr int kPopulateWrite = 23;  // MADV_POPULATE_WRITE, which older headers lack
  constexpr int64_t kGrainPages = 1024;  // 4 MiB per intra-op task at least
  static std::atomic<bool> supported{true};
  if (bytes < kMinCachedBytes || !supported.load(std::memory_order_relaxed)) return;
  static const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(data) + page - 1) & ~(page - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(data) + static_cast<uintptr_t>(bytes)) & ~(page - 1);
  if (end <= begin) return;
  at::parallel_for(0, static_cast<int64_t>((end - begin) / page), kGrainPages, [&](int64_t first, int64_t last) {
    void* chunk = reinterpret_cast<void*>(begin + static_cast<uintptr_t>(first) * page);
    if (madvise(chunk, static_cast<size_t>(last - first) * page, kPopulateWrite) != 0 && errno == EINVAL) {
      supported.store(false, std::memory_order_relaxed);  // pages not mapped here are faulted on first write
    }
  });
#else
  (void)data;
  (void)bytes;
#endif
}

// Prepares a fresh large buffer before anything writes to it: huge-page advice, then its pages mapped.
inline void prepare_fresh(void* data, int64_t bytes) {
  advise_huge_pages(data, bytes);
  prefault(data, bytes);
}

class OutputCache {
 public:
  // A contiguous tensor of `sizes`: on a free cached block of the same byte size or up to twice it if there is one,
  // else on a fresh block, which returns to the cache when the tensor's storage is freed.
  at::Tensor empty(at::IntArrayRef sizes, const at::TensorOptions& options) {
    const int64_t bytes = c10::multiply_integers(sizes) * int64_t(options.dtype().itemsize());
    if (!options.device().is_cpu()) return at::empty(sizes, options);
    if (bytes < kMinCachedBytes || limit_ == 0) {
      at::Tensor out = at::empty(sizes, options);
      prepare_fresh(out.data_ptr(), bytes);
      return out;
    }
    Block block = take(bytes);
    at::DataPtr data(block.ptr, new Returning{block}, &Returning::give_back, at::Device(at::kCPU));
    // Resizable through the CPU allocator, as torch's own storages are (the old block then comes back here).
    at::Storage storage(at::Storage::use_byte_size_t(), static_cast<size_t>(block.bytes), std::move(data),
                        c10::GetCPUAllocator(), /*resizable=*/true);
    return at::empty({0}, options).set_(std::move(storage), 0, sizes, c10::contiguous_strides(sizes));
  }

  // Frees every free block; returns their bytes.
  int64_t release() {
    std::lock_guard<std::mutex> lock(mutex_);
    const int64_t released = free_bytes_;
    for (const Block& block : free_) c10::free_cpu(block.ptr);
    free_.clear();
    free_bytes_ = 0;
    return released;
  }

  // At most `bytes` of free blocks from now on (0: no reuse); the least recently used beyond it are freed now.
  void set_limit(int64_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    limit_ = bytes;
    trim();
  }

  // Never destroyed: storages still alive at exit return their blocks to it.
  static OutputCache& instance() {
    static OutputCache* cache = new OutputCache();
    return *cache;
  }

 private:
  struct Block {
    void* ptr;
    int64_t bytes;
  };
  struct Returning {  // the deleter's context: which block a storage holds
    Block block;
    static void give_back(void* context) {
      auto* returning = static_cast<Returning*>(context);
      instance().put(returning->block);
      delete returning;
    }
  };

  OutputCache() = default;

  // The smallest free block of `bytes` up to twice that, else a fresh one.
  Block take(int64_t bytes) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto best = free_.end();
      for (auto it = free_.begin(); it != free_.end(); ++it) {
        if (it->bytes >= bytes && it->bytes <= 2 * bytes && (best == free_.end() || it->bytes < best->bytes)) best = it;
      }
      if (best != free_.end()) {
        const Block block = *best;
        free_.erase(best);
        free_bytes_ -= block.bytes;
        return block;
      }
    }
    void* ptr = c10::alloc_cpu(static_cast<size_t>(bytes));
    prepare_fresh(ptr, bytes);
    return {ptr, bytes};
  }

  // Keeps a block its storage no longer needs, then releases the least recently used free blocks (possibly this
  // one) while the free blocks take more than the limit.
  void put(const Block& block) {
    std::lock_guard<std::mutex> lock(mutex_);
    free_.push_back(block);  // most recently used last
    free_bytes_ += block.bytes;
    trim();
  }

  // Releases the least recently used free blocks while they take more than the limit; called under mutex_.
  void trim() {
    while (free_bytes_ > limit_) {
      c10::free_cpu(free_.front().ptr);
      free_bytes_ -= free_.front().bytes;
      free_.pop_front();
    }
  }

  std::mutex mutex_;
  std::list<Block> free_;  // free blocks, least recently used first
  int64_t free_bytes_ = 0;
  int64_t limit_ = 0;  // of free_bytes_; set from Python when the library loads (set_output_buffers)
};

// An uninitialised output tensor of `sizes`, contiguous (see OutputCache).
inline at::Tensor empty_output(at::IntArrayRef sizes, const at::TensorOptions& options) {
  return OutputCache::instance().empty(sizes, options);
}

}  // namespace densecnn
