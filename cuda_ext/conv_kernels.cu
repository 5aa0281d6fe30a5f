// CUDA im2col / col2im for the banded im2col + GEMM convolution (conv_driver.h; the GEMMs run on cuBLAS through
// at::mm). One thread per unrolled entry (im2col) or per input pixel of the band (col2im, a race-free gather).
#include <cuda_runtime.h>

#include "common.h"
#include "elements.h"
#include "kernels.h"
#include "launch.cuh"

namespace densecnn {
namespace {

template <typename T>
__global__ void im2col_kernel(ConvGeometry g, const T* image, int64_t band_start, int64_t rows, T* col) {
  DENSECNN_GRID_STRIDE_LOOP(index, im2col_size(g, rows)) { im2col_at(g, image, band_start, rows, col, index); }
}

template <typename T>
__global__ void col2im_kernel(ConvGeometry g, const T* grad_col, int64_t band_start, int64_t rows, T* grad_image) {
  DENSECNN_GRID_STRIDE_LOOP(index, g.channels * col2im_rows(g, rows) * g.cols) {
    col2im_add_at(g, grad_col, band_start, rows, grad_image, index);
  }
}

}  // namespace

template <typename T>
cudaError_t launch_im2col(const ConvGeometry& g, const T* image, int64_t band_start, int64_t rows, T* col,
                          cudaStream_t stream) {
  im2col_kernel<T><<<blocks_for(im2col_size(g, rows)), kThreadsPerBlock, 0, stream>>>(g, image, band_start, rows, col);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_col2im_add(const ConvGeometry& g, const T* grad_col, int64_t band_start, int64_t rows,
                              T* grad_image, cudaStream_t stream) {
  col2im_kernel<T><<<blocks_for(g.channels * col2im_rows(g, rows) * g.cols), kThreadsPerBlock, 0, stream>>>(
      g, grad_col, band_start, rows, grad_image);
  return cudaGetLastError();
}

#define DENSECNN_INSTANTIATE_CONV(T)                                                                         \
  template cudaError_t launch_im2col<T>(const ConvGeometry&, const T*, int64_t, int64_t, T*, cudaStream_t); \
  template cudaError_t launch_col2im_add<T>(const ConvGeometry&, const T*, int64_t, int64_t, T*, cudaStream_t);

DENSECNN_INSTANTIATE_CONV(float)
DENSECNN_INSTANTIATE_CONV(double)

}  // namespace densecnn
