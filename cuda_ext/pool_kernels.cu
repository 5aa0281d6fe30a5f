// CUDA kernels of the d-sparse pooling ops: grid-stride loops over the per-element bodies of elements.h, one
// thread per element. Max and average pooling are separable, as on the CPU: a row pass (kw taps along each input row) into
// scratch, then a column pass (kh taps down the row pass) — 2k instead of k² taps per output. The argmax taps and
// the scan rule are those of the CPU kernels, so the backward gathers are the same formulas.
#include <cuda_runtime.h>

#include "common.h"
#include "elements.h"
#include "kernels.h"
#include "launch.cuh"

namespace densecnn {
namespace {

template <typename T>
__global__ void max_row_pass(PoolGeometry g, const T* x, T* row_max, uint8_t* row_tap) {
  DENSECNN_GRID_STRIDE_LOOP(index, row_pass_size(g)) { max_row_pass_at(g, x, row_max, row_tap, index); }
}

template <typename T>
__global__ void max_col_pass(PoolGeometry g, const T* row_max, T* y, uint8_t* col_tap, Activation activation) {
  DENSECNN_GRID_STRIDE_LOOP(index, output_size(g)) { max_col_pass_at(g, row_max, y, col_tap, activation, index); }
}

template <typename T>
__global__ void max_backward(PoolGeometry g, const T* grad_y, const T* y, const uint8_t* row_tap,
                             const uint8_t* col_tap, T* grad_x, Activation activation) {
  DENSECNN_GRID_STRIDE_LOOP(index, input_size(g)) {
    max_backward_at(g, grad_y, y, row_tap, col_tap, grad_x, activation, index);
  }
}

template <typename T>
__global__ void sum_row_pass(PoolGeometry g, const T* x, T* row_sum) {
  DENSECNN_GRID_STRIDE_LOOP(index, row_pass_size(g)) { sum_row_pass_at(g, x, row_sum, index); }
}

template <typename T>
__global__ void avg_col_pass(PoolGeometry g, const T* row_sum, T* y, T scale, Activation activation) {
  DENSECNN_GRID_STRIDE_LOOP(index, output_size(g)) { avg_col_pass_at(g, row_sum, y, scale, activation, index); }
}

template <typename T>
__global__ void avg_backward(PoolGeometry g, const T* grad_y, const T* y, T* grad_x, T scale,
                             Activation activation) {
  DENSECNN_GRID_STRIDE_LOOP(index, input_size(g)) { avg_backward_at(g, grad_y, y, grad_x, scale, activation, index); }
}

}  // namespace

template <typename T>
cudaError_t launch_max_pool_forward(const PoolGeometry& g, const T* x, T* row_max, T* y, uint8_t* row_tap,
                                    uint8_t* col_tap, Activation activation, cudaStream_t stream) {
  max_row_pass<T><<<blocks_for(row_pass_size(g)), kThreadsPerBlock, 0, stream>>>(g, x, row_max,
                                                                                                   row_tap);
  max_col_pass<T><<<blocks_for(output_size(g)), kThreadsPerBlock, 0, stream>>>(
      g, row_max, y, col_tap, activation);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_max_pool_backward(const PoolGeometry& g, const T* grad_y, const T* y, const uint8_t* row_tap,
                                     const uint8_t* col_tap, T* grad_x, Activation activation, cudaStream_t stream) {
  max_backward<T><<<blocks_for(input_size(g)), kThreadsPerBlock, 0, stream>>>(
      g, grad_y, y, row_tap, col_tap, grad_x, activation);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_avg_pool_forward(const PoolGeometry& g, const T* x, T* row_sum, T* y, int64_t divisor,
                                    Activation activation, cudaStream_t stream) {
  sum_row_pass<T><<<blocks_for(row_pass_size(g)), kThreadsPerBlock, 0, stream>>>(g, x, row_sum);
  avg_col_pass<T><<<blocks_for(output_size(g)), kThreadsPerBlock, 0, stream>>>(
      g, row_sum, y, T(1) / T(divisor), activation);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_avg_pool_backward(const PoolGeometry& g, const T* grad_y, const T* y, T* grad_x, int64_t divisor,
                                     Activation activation, cudaStream_t stream) {
  avg_backward<T><<<blocks_for(input_size(g)), kThreadsPerBlock, 0, stream>>>(
      g, grad_y, y, grad_x, T(1) / T(divisor), activation);
  return cudaGetLastError();
}

#define DENSECNN_INSTANTIATE_POOL(T)                                                                            \
  template cudaError_t launch_max_pool_forward<T>(const PoolGeometry&, const T*, T*, T*, uint8_t*, uint8_t*,   \
                                                  Activation, cudaStream_t);                                   \
  template cudaError_t launch_max_pool_backward<T>(const PoolGeometry&, const T*, const T*, const uint8_t*,    \
                                                   const uint8_t*, T*, Activation, cudaStream_t);              \
  template cudaError_t launch_avg_pool_forward<T>(const PoolGeometry&, const T*, T*, T*, int64_t, Activation,  \
                                                  cudaStream_t);                                               \
  template cudaError_t launch_avg_pool_backward<T>(const PoolGeometry&, const T*, const T*, T*, int64_t,       \
                                                   Activation, cudaStream_t);

DENSECNN_INSTANTIATE_POOL(float)
DENSECNN_INSTANTIATE_POOL(double)

}  // namespace densecnn
