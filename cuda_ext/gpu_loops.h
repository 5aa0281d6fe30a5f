// A test switch: when on, the CPU ops run the CUDA kernels' per-element bodies (elements.h), one call per element
// like the grid-stride loops, instead of the vectorised CPU loops — so the tests check the GPU's logic on a machine
// without a GPU. Toggled by the op densecnn::_use_gpu_loops_on_cpu (defined in ops.cpp); off by default.
#pragma once

#include <ATen/Parallel.h>

#include <atomic>
#include <cstdint>

namespace densecnn {

std::atomic<bool>& gpu_loops_on_cpu();

// Calls body(index) for every index in [0, n), like DENSECNN_GRID_STRIDE_LOOP does on the GPU.
template <typename Body>
void for_each_element(int64_t n, const Body& body) {
  at::parallel_for(0, n, 4096, [&](int64_t begin, int64_t end) {
    for (int64_t index = begin; index < end; ++index) body(index);
  });
}

}  // namespace densecnn
