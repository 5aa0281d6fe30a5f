// CUDA direct convolution for few input channels: one thread per output element (direct_conv.h).
#include <cuda_runtime.h>

#include "common.h"
#include "direct_conv.h"
#include "kernels.h"
#include "launch.cuh"

namespace densecnn {
namespace {

template <typename T>
__global__ void direct_conv_kernel(DirectConvGeometry g, const T* x, const T* weight, const T* bias, T* y) {
  DENSECNN_GRID_STRIDE_LOOP(index, direct_conv_size(g)) { direct_conv_at(g, x, weight, bias, y, index); }
}

}  // namespace

template <typename T>
cudaError_t launch_direct_conv(const DirectConvGeometry& g, const T* x, const T* weight, const T* bias, T* y,
                               cudaStream_t stream) {
  direct_conv_kernel<T><<<blocks_for(direct_conv_size(g)), kThreadsPerBlock, 0, stream>>>(g, x, weight, bias, y);
  return cudaGetLastError();
}

template cudaError_t launch_direct_conv<float>(const DirectConvGeometry&, const float*, const float*, const float*,
                                               float*, cudaStream_t);
template cudaError_t launch_direct_conv<double>(const DirectConvGeometry&, const double*, const double*,
                                                const double*, double*, cudaStream_t);

}  // namespace densecnn
