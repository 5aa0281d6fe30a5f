// CUDA im2col / col2im for the banded im2col + GEMM convolution (conv_driver.h; the GEMMs run on cuBLAS through
// at::mm). One thread per unrolled entry (im2col) or per input pixel of the band (col2im, a race-free gather).
#include <cuda_runtime.h>

#include "common.h"
#include "kernels.h"
#include "launch.cuh"

namespace densecnn {
namespace {

template <typename T>
__global__ void im2col_kernel(ConvGeometry g, const T* image, int64_t band_start, int64_t rows, T* col) {
  const int64_t pixels = rows * g.out_cols;
  DENSECNN_GRID_STRIDE_LOOP(index, g.channels * g.kh * g.kw * pixels) {
    col[index] = image[im2col_source(g, band_start, index / pixels, index % pixels)];
  }
}

// Input rows [band_start, band_start + rows + (kh-1)·dh) are the ones the band's taps touched.
template <typename T>
__global__ void col2im_kernel(ConvGeometry g, const T* grad_col, int64_t band_start, int64_t rows,
                              int64_t touched_rows, T* grad_image) {
  DENSECNN_GRID_STRIDE_LOOP(index, g.channels * touched_rows * g.cols) {
    const int64_t q = index % g.cols, r = band_start + index / g.cols % touched_rows;
    const int64_t c = index / (g.cols * touched_rows);
    grad_image[(c * g.rows + r) * g.cols + q] += col2im_gather(g, grad_col, band_start, rows, c, r, q);
  }
}

}  // namespace

template <typename T>
cudaError_t launch_im2col(const ConvGeometry& g, const T* image, int64_t band_start, int64_t rows, T* col,
                          cudaStream_t stream) {
  const int64_t n = g.channels * g.kh * g.kw * rows * g.out_cols;
  im2col_kernel<T><<<blocks_for(n), kThreadsPerBlock, 0, stream>>>(g, image, band_start, rows, col);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_col2im_add(const ConvGeometry& g, const T* grad_col, int64_t band_start, int64_t rows,
                              T* grad_image, cudaStream_t stream) {
  const int64_t touched_rows = rows + (g.kh - 1) * g.dh;
  col2im_kernel<T><<<blocks_for(g.channels * touched_rows * g.cols), kThreadsPerBlock, 0, stream>>>(
      g, grad_col, band_start, rows, touched_rows, grad_image);
  return cudaGetLastError();
}

#define DENSECNN_INSTANTIATE_CONV(T)                                                                         \
  template cudaError_t launch_im2col<T>(const ConvGeometry&, const T*, int64_t, int64_t, T*, cudaStream_t); \
  template cudaError_t launch_col2im_add<T>(const ConvGeometry&, const T*, int64_t, int64_t, T*, cudaStream_t);

DENSECNN_INSTANTIATE_CONV(float)
DENSECNN_INSTANTIATE_CONV(double)

}  // namespace densecnn
