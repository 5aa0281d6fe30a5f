// CUDA kernels of the d-sparse pooling ops over 1, 2 or 3 spatial axes: grid-stride loops over the per-element
// bodies of elements.h, one thread per element, one kernel per axis pass (innermost first forward, outermost first
// backward, elements.h forward_passes/backward_passes). Separable as on the CPU: Σ k instead of Π k taps per
// output. The argmax taps and the scan rule are those of the CPU kernels, so the backward gathers are the same
// formulas. Reduced precision (bfloat16, half) is widened to float per tap and the scratch between passes is float.
#include <cuda_runtime.h>

#include "common.h"
#include "elements.h"
#include "kernels.h"
#include "launch.cuh"

namespace densecnn {
namespace {

template <typename A, typename S, typename D>
__global__ void max_pass(AxisPass p, const S* src, D* dst, uint8_t* tap, Activation activation) {
  DENSECNN_GRID_STRIDE_LOOP(e, pass_output_size(p)) { max_pass_at<A>(p, src, dst, tap, activation, e); }
}

template <typename A, typename S, typename D>
__global__ void sum_pass(AxisPass p, const S* src, D* dst, A scale, Activation activation) {
  DENSECNN_GRID_STRIDE_LOOP(e, pass_output_size(p)) { sum_pass_at<A>(p, src, dst, scale, activation, e); }
}

template <typename A, typename G, typename Y, typename D>
__global__ void max_pass_backward(AxisPass p, const G* grad, const Y* y, const uint8_t* tap, D* grad_in,
                                  Activation activation) {
  DENSECNN_GRID_STRIDE_LOOP(e, pass_input_size(p)) {
    max_pass_backward_at<A>(p, grad, y, tap, grad_in, activation, e);
  }
}

template <typename A, typename G, typename Y, typename D>
__global__ void sum_pass_backward(AxisPass p, const G* grad, const Y* y, D* grad_in, A scale, Activation activation) {
  DENSECNN_GRID_STRIDE_LOOP(e, pass_input_size(p)) {
    sum_pass_backward_at<A>(p, grad, y, grad_in, scale, activation, e);
  }
}

}  // namespace

template <typename T>
cudaError_t launch_max_pool_forward(const PoolGeometry& g, const T* x, T* y, uint8_t* const* taps,
                                    Activation activation, Acc<T>* scratch, cudaStream_t stream) {
  forward_passes(g, x, y, scratch, [&](int a, const AxisPass& p, const auto* src, auto* dst, bool last) {
    max_pass<Acc<T>><<<blocks_for(pass_output_size(p)), kThreadsPerBlock, 0, stream>>>(
        p, src, dst, taps == nullptr ? nullptr : taps[a], last ? activation : Activation::kNone);
  });
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_max_pool_backward(const PoolGeometry& g, const T* grad_y, const T* y, const uint8_t* const* taps,
                                     T* grad_x, Activation activation, Acc<T>* scratch, cudaStream_t stream) {
  const T* output = activation == Activation::kNone ? nullptr : y;
  backward_passes(g, grad_y, output, grad_x, scratch,
                  [&](int a, const AxisPass& p, const auto* grad, const T* out, auto* grad_in, bool first) {
                    max_pass_backward<Acc<T>><<<blocks_for(pass_input_size(p)), kThreadsPerBlock, 0, stream>>>(
                        p, grad, out, taps[a], grad_in, first ? activation : Activation::kNone);
                  });
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_avg_pool_forward(const PoolGeometry& g, const T* x, T* y, int64_t divisor, Activation activation,
                                    Acc<T>* scratch, cudaStream_t stream) {
  using A = Acc<T>;
  const A scale = A(1) / A(divisor);
  forward_passes(g, x, y, scratch, [&](int, const AxisPass& p, const auto* src, auto* dst, bool last) {
    sum_pass<A><<<blocks_for(pass_output_size(p)), kThreadsPerBlock, 0, stream>>>(
        p, src, dst, last ? scale : A(1), last ? activation : Activation::kNone);
  });
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_avg_pool_backward(const PoolGeometry& g, const T* grad_y, const T* y, T* grad_x, int64_t divisor,
                                     Activation activation, Acc<T>* scratch, cudaStream_t stream) {
  using A = Acc<T>;
  const A scale = A(1) / A(divisor);
  const T* output = activation == Activation::kNone ? nullptr : y;
  backward_passes(g, grad_y, output, grad_x, scratch,
                  [&](int, const AxisPass& p, const auto* grad, const T* out, auto* grad_in, bool first) {
                    sum_pass_backward<A><<<blocks_for(pass_input_size(p)), kThreadsPerBlock, 0, stream>>>(
                        p, grad, out, grad_in, first ? scale : A(1), first ? activation : Activation::kNone);
                  });
  return cudaGetLastError();
}

#define DENSECNN_INSTANTIATE_POOL(T)                                                                             \
  template cudaError_t launch_max_pool_forward<T>(const PoolGeometry&, const T*, T*, uint8_t* const*, Activation, \
                                                  Acc<T>*, cudaStream_t);                                        \
  template cudaError_t launch_max_pool_backward<T>(const PoolGeometry&, const T*, const T*, const uint8_t* const*, \
                                                   T*, Activation, Acc<T>*, cudaStream_t);                        \
  template cudaError_t launch_avg_pool_forward<T>(const PoolGeometry&, const T*, T*, int64_t, Activation, Acc<T>*, \
                                                  cudaStream_t);                                                 \
  template cudaError_t launch_avg_pool_backward<T>(const PoolGeometry&, const T*, const T*, T*, int64_t,          \
                                                   Activation, Acc<T>*, cudaStream_t);

DENSECNN_INSTANTIATE_POOL(float)
DENSECNN_INSTANTIATE_POOL(double)
DENSECNN_INSTANTIATE_POOL(__nv_bfloat16)
DENSECNN_INSTANTIATE_POOL(__half)

}  // namespace densecnn
