// CUDA kernels of the frequency-domain convolution's tile transforms (fft_driver.h): grid-stride loops over the
// per-element bodies of fft_elements.h, one thread per element of each pass, two passes per transform.
#include <cuda_runtime.h>

#include "fft_elements.h"
#include "kernels.h"
#include "launch.cuh"

namespace densecnn {
namespace {

template <typename T>
__global__ void fft_forward_rows_kernel(FftGeometry g, const T* x, int64_t first, int64_t count, Twiddles<T> w,
                                        T* rows) {
  DENSECNN_GRID_STRIDE_LOOP(index, fft_forward_rows_size(g, count)) {
    fft_forward_rows_at(g, x, first, w, rows, index);
  }
}

template <typename T>
__global__ void fft_forward_cols_kernel(FftGeometry g, const T* rows, int64_t count, Twiddles<T> w, T* spectrum) {
  DENSECNN_GRID_STRIDE_LOOP(index, fft_spectrum_size(g, count, g.channels)) {
    fft_forward_cols_at(g, rows, count, w, spectrum, index);
  }
}

template <typename T>
__global__ void fft_inverse_cols_kernel(FftGeometry g, const T* product, int64_t count, Twiddles<T> w, T* cols) {
  DENSECNN_GRID_STRIDE_LOOP(index, fft_inverse_cols_size(g, count)) {
    fft_inverse_cols_at(g, product, count, w, cols, index);
  }
}

template <typename T>
__global__ void fft_inverse_rows_kernel(FftGeometry g, const T* cols, const T* bias, int64_t first, int64_t count,
                                        Twiddles<T> w, T* y) {
  DENSECNN_GRID_STRIDE_LOOP(index, fft_inverse_rows_size(g, count)) {
    fft_inverse_rows_at(g, cols, bias, first, w, y, index);
  }
}

template <typename T>
__global__ void fft_overlap_add_kernel(FftGeometry g, const T* tiles, int64_t first, int64_t count, T* y) {
  DENSECNN_GRID_STRIDE_LOOP(index, fft_overlap_add_size(g)) { fft_overlap_add_at(g, tiles, first, count, y, index); }
}

}  // namespace

template <typename T>
cudaError_t launch_fft_forward(const FftGeometry& g, const T* x, int64_t first, int64_t count, const T* twiddles,
                               T* rows, T* spectrum, cudaStream_t stream) {
  const Twiddles<T> w = twiddles_of(g, twiddles);
  fft_forward_rows_kernel<T><<<blocks_for(fft_forward_rows_size(g, count)), kThreadsPerBlock, 0, stream>>>(
      g, x, first, count, w, rows);
  fft_forward_cols_kernel<T><<<blocks_for(fft_spectrum_size(g, count, g.channels)), kThreadsPerBlock, 0, stream>>>(
      g, rows, count, w, spectrum);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_fft_inverse(const FftGeometry& g, const T* product, const T* bias, int64_t first, int64_t count,
                               const T* twiddles, T* cols, T* y, cudaStream_t stream) {
  const Twiddles<T> w = twiddles_of(g, twiddles);
  fft_inverse_cols_kernel<T><<<blocks_for(fft_inverse_cols_size(g, count)), kThreadsPerBlock, 0, stream>>>(
      g, product, count, w, cols);
  fft_inverse_rows_kernel<T><<<blocks_for(fft_inverse_rows_size(g, count)), kThreadsPerBlock, 0, stream>>>(
      g, cols, bias, first, count, w, y);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_fft_adjoint(const FftGeometry& g, const T* product, int64_t first, int64_t count,
                               const T* twiddles, T* cols, T* tiles, T* y, cudaStream_t stream) {
  const cudaError_t status = launch_fft_inverse<T>(g, product, nullptr, first, count, twiddles, cols, tiles, stream);
  if (status != cudaSuccess) return status;
  fft_overlap_add_kernel<T><<<blocks_for(fft_overlap_add_size(g)), kThreadsPerBlock, 0, stream>>>(g, tiles, first,
                                                                                                  count, y);
  return cudaGetLastError();
}

#define DENSECNN_INSTANTIATE_FFT(T)                                                                               \
  template cudaError_t launch_fft_forward<T>(const FftGeometry&, const T*, int64_t, int64_t, const T*, T*, T*,    \
                                             cudaStream_t);                                                       \
  template cudaError_t launch_fft_inverse<T>(const FftGeometry&, const T*, const T*, int64_t, int64_t, const T*,  \
                                             T*, T*, cudaStream_t);                                               \
  template cudaError_t launch_fft_adjoint<T>(const FftGeometry&, const T*, int64_t, int64_t, const T*, T*, T*, T*, \
                                             cudaStream_t);

DENSECNN_INSTANTIATE_FFT(float)
DENSECNN_INSTANTIATE_FFT(double)

}  // namespace densecnn
