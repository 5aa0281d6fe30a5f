// Grid-stride launch helpers shared by the .cu files.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

namespace densecnn {

constexpr int kThreadsPerBlock = 256;

// Enough blocks to cover n elements, capped: the grid-stride loops cover the rest.
inline unsigned int blocks_for(int64_t n) {
  const int64_t blocks = (n + kThreadsPerBlock - 1) / kThreadsPerBlock;
  return static_cast<unsigned int>(std::max<int64_t>(1, std::min<int64_t>(blocks, 65535LL * 32)));
}

}  // namespace densecnn

#define DENSECNN_GRID_STRIDE_LOOP(index, n)                                                    \
  for (int64_t index = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; index < (n); \
       index += static_cast<int64_t>(blockDim.x) * gridDim.x)
