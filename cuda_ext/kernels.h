// Launchers of the CUDA kernels (pool_kernels.cu, conv_kernels.cu) over raw pointers and a stream. No torch here:
// the .cu files compile with nvcc against this header and common.h alone (see scripts/cuda_check.sh); the
// torch-facing *_cuda.cpp files allocate, guard the device and check the returned error.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "common.h"
#include "direct_conv.h"
#include "fft_elements.h"
#include "winograd.h"

namespace densecnn {

// The pooling launchers run one kernel per axis pass (common.h AxisPass), innermost axis first forward and outermost
// first backward. T is float, double, __nv_bfloat16 or __half; `scratch` holds 2·intermediate_size(g) values of
// Acc<T> for the arrays between passes.

// y (and, per axis a where taps[a] is non-null, the argmax taps of the pass along a) of a max pooling.
template <typename T>
cudaError_t launch_max_pool_forward(const PoolGeometry& g, const T* x, T* y, uint8_t* const* taps,
                                    Activation activation, Acc<T>* scratch, cudaStream_t stream);

template <typename T>
cudaError_t launch_max_pool_backward(const PoolGeometry& g, const T* grad_y, const T* y, const uint8_t* const* taps,
                                     T* grad_x, Activation activation, Acc<T>* scratch, cudaStream_t stream);

template <typename T>
cudaError_t launch_avg_pool_forward(const PoolGeometry& g, const T* x, T* y, int64_t divisor, Activation activation,
                                    Acc<T>* scratch, cudaStream_t stream);

template <typename T>
cudaError_t launch_avg_pool_backward(const PoolGeometry& g, const T* grad_y, const T* y, T* grad_x, int64_t divisor,
                                     Activation activation, Acc<T>* scratch, cudaStream_t stream);

// col (C·kh·kw, rows·W') <- the band of output rows [band_start, band_start + rows) of the (C, H, W) image.
template <typename T>
cudaError_t launch_im2col(const ConvGeometry& g, const T* image, int64_t band_start, int64_t rows, T* col,
                          cudaStream_t stream);

// grad_image (C, H, W) += col2im(grad_col) for the band.
template <typename T>
cudaError_t launch_col2im_add(const ConvGeometry& g, const T* grad_col, int64_t band_start, int64_t rows,
                              T* grad_image, cudaStream_t stream);

// y <- the direct convolution of x (direct_conv.h); bias may be null.
template <typename T>
cudaError_t launch_direct_conv(const DirectConvGeometry& g, const T* x, const T* weight, const T* bias, T* y,
                               cudaStream_t stream);

// The frequency-domain convolution's tile transforms (fft_elements.h), for tiles [first, first + count): forward
// from x into the spectrum (P, count, C) of (re, im) pairs through `rows` (2·fft_forward_rows_size values); inverse
// from the product spectrum (P, count, K) through `cols` (2·fft_inverse_cols_size values) into y, plus the bias.
// `twiddles` is the table of twiddles_of (fft_elements.h), on the device.
template <typename T>
cudaError_t launch_fft_forward(const FftGeometry& g, const T* x, int64_t first, int64_t count, const T* twiddles,
                               T* rows, T* spectrum, cudaStream_t stream);

template <typename T>
cudaError_t launch_fft_inverse(const FftGeometry& g, const T* product, const T* bias, int64_t first, int64_t count,
                               const T* twiddles, T* cols, T* y, cudaStream_t stream);

// The input gradient's inverse (g.adjoint): whole tiles of the product (P, count, C) through `cols` into `tiles`
// (fft_inverse_rows_size values), then each pixel of the input gradient y adds the tiles covering it.
template <typename T>
cudaError_t launch_fft_adjoint(const FftGeometry& g, const T* product, int64_t first, int64_t count,
                               const T* twiddles, T* cols, T* tiles, T* y, cudaStream_t stream);

// Winograd F(m, 3) transforms (winograd.h) of the chunk of tiles g.tile_begin.. : v (α^n, tiles, C) from the map x,
// and the outputs (+ bias, may be null) of the products (α^n, tiles, K) into the map y. T is float or double.
template <typename T>
cudaError_t launch_winograd_input(const WinogradGeometry& g, int m, const T* x, T* v, cudaStream_t stream);

template <typename T>
cudaError_t launch_winograd_output(const WinogradGeometry& g, int m, const T* products, const T* bias, T* y,
                                   cudaStream_t stream);

// The output-gradient transform (the weight gradient) of the chunk: z (α^n, tiles, K) from the output gradient.
template <typename T>
cudaError_t launch_winograd_output_gradient(const WinogradGeometry& g, int m, const T* grad, T* z,
                                            cudaStream_t stream);

}  // namespace densecnn
