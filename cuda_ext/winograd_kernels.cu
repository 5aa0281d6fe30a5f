// CUDA kernels of the Winograd transforms (winograd.h): grid-stride loops over (tile, channel) pairs, one thread
// per pair running the per-element bodies the CPU tests run too (winograd_input_at / winograd_output_at /
// winograd_output_gradient_at).
#include <cuda_runtime.h>

#include "common.h"
#include "kernels.h"
#include "launch.cuh"
#include "winograd.h"

namespace densecnn {
namespace {

template <int M, int AXES, typename T>
__global__ void winograd_input_kernel(WinogradGeometry g, const T* x, T* v) {
  DENSECNN_GRID_STRIDE_LOOP(index, g.tile_count * g.channels) { winograd_input_at<M, AXES>(g, x, v, index); }
}

template <int M, int AXES, typename T>
__global__ void winograd_output_kernel(WinogradGeometry g, const T* m, const T* bias, T* y) {
  DENSECNN_GRID_STRIDE_LOOP(index, g.tile_count * g.channels) { winograd_output_at<M, AXES>(g, m, bias, y, index); }
}

template <int M, int AXES, typename T>
__global__ void winograd_output_gradient_kernel(WinogradGeometry g, const T* grad, T* z) {
  DENSECNN_GRID_STRIDE_LOOP(index, g.tile_count * g.channels) { winograd_output_gradient_at<M, AXES>(g, grad, z, index); }
}

template <int M, int AXES, typename T>
void launch_output_gradient(const WinogradGeometry& g, const T* grad, T* z, cudaStream_t stream) {
  winograd_output_gradient_kernel<M, AXES, T>
      <<<blocks_for(g.tile_count * g.channels), kThreadsPerBlock, 0, stream>>>(g, grad, z);
}

template <int M, int AXES, typename T>
void launch_input(const WinogradGeometry& g, const T* x, T* v, cudaStream_t stream) {
  winograd_input_kernel<M, AXES, T><<<blocks_for(g.tile_count * g.channels), kThreadsPerBlock, 0, stream>>>(g, x, v);
}

template <int M, int AXES, typename T>
void launch_output(const WinogradGeometry& g, const T* m, const T* bias, T* y, cudaStream_t stream) {
  winograd_output_kernel<M, AXES, T>
      <<<blocks_for(g.tile_count * g.channels), kThreadsPerBlock, 0, stream>>>(g, m, bias, y);
}

}  // namespace

template <typename T>
cudaError_t launch_winograd_input(const WinogradGeometry& g, int m, const T* x, T* v, cudaStream_t stream) {
  dispatch_winograd(m, g.axes, [&](auto m_tag, auto axes_tag) {
    launch_input<decltype(m_tag)::value, decltype(axes_tag)::value>(g, x, v, stream);
  });
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_winograd_output(const WinogradGeometry& g, int m, const T* products, const T* bias, T* y,
                                   cudaStream_t stream) {
  dispatch_winograd(m, g.axes, [&](auto m_tag, auto axes_tag) {
    launch_output<decltype(m_tag)::value, decltype(axes_tag)::value>(g, products, bias, y, stream);
  });
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_winograd_output_gradient(const WinogradGeometry& g, int m, const T* grad, T* z,
                                            cudaStream_t stream) {
  dispatch_winograd(m, g.axes, [&](auto m_tag, auto axes_tag) {
    launch_output_gradient<decltype(m_tag)::value, decltype(axes_tag)::value>(g, grad, z, stream);
  });
  return cudaGetLastError();
}

#define DENSECNN_INSTANTIATE_WINOGRAD(T)                                                                       \
  template cudaError_t launch_winograd_input<T>(const WinogradGeometry&, int, const T*, T*, cudaStream_t);    \
  template cudaError_t launch_winograd_output<T>(const WinogradGeometry&, int, const T*, const T*, T*,        \
                                                 cudaStream_t);                                                \
  template cudaError_t launch_winograd_output_gradient<T>(const WinogradGeometry&, int, const T*, T*,         \
                                                          cudaStream_t);

DENSECNN_INSTANTIATE_WINOGRAD(float)
DENSECNN_INSTANTIATE_WINOGRAD(double)

}  // namespace densecnn
