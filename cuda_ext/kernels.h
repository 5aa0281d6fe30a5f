// Launchers of the CUDA kernels (pool_kernels.cu, conv_kernels.cu) over raw pointers and a stream. No torch here:
// the .cu files compile with nvcc against this header and common.h alone (see scripts/cuda_check.sh); the
// torch-facing *_cuda.cpp files allocate, guard the device and check the returned error.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "common.h"

namespace densecnn {

// y (and, when row_tap/col_tap are non-null, the argmax taps) of a max pooling; row_max has planes·rows·out_row_len
// elements of scratch for the row pass.
template <typename T>
cudaError_t launch_max_pool_forward(const PoolGeometry& g, const T* x, T* row_max, T* y, uint8_t* row_tap,
                                    uint8_t* col_tap, Activation activation, cudaStream_t stream);

template <typename T>
cudaError_t launch_max_pool_backward(const PoolGeometry& g, const T* grad_y, const T* y, const uint8_t* row_tap,
                                     const uint8_t* col_tap, T* grad_x, Activation activation, cudaStream_t stream);

// row_sum: planes·rows·out_row_len elements of scratch.
template <typename T>
cudaError_t launch_avg_pool_forward(const PoolGeometry& g, const T* x, T* row_sum, T* y, int64_t divisor,
                                    Activation activation, cudaStream_t stream);

template <typename T>
cudaError_t launch_avg_pool_backward(const PoolGeometry& g, const T* grad_y, const T* y, T* grad_x, int64_t divisor,
                                     Activation activation, cudaStream_t stream);

// col (C·kh·kw, rows·W') <- the band of output rows [band_start, band_start + rows) of the (C, H, W) image.
template <typename T>
cudaError_t launch_im2col(const ConvGeometry& g, const T* image, int64_t band_start, int64_t rows, T* col,
                          cudaStream_t stream);

// grad_image (C, H, W) += col2im(grad_col) for the band.
template <typename T>
cudaError_t launch_col2im_add(const ConvGeometry& g, const T* grad_col, int64_t band_start, int64_t rows,
                              T* grad_image, cudaStream_t stream);

}  // namespace densecnn
