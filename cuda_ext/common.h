// Per-element math shared by the CPU launchers (*_cpu.cpp) and the CUDA kernels (*_kernels.cu).
//
// Everything here is HOST_DEVICE_INLINE (mmcv style): `__host__ __device__` under nvcc, plain `inline`
// otherwise, so the CPU tests run exactly the code the GPU kernels call. No torch includes: the CUDA kernels
// compile against this header alone.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define HOST_DEVICE_INLINE __host__ __device__ __forceinline__
#else
#define HOST_DEVICE_INLINE inline
#endif

namespace densecnn {

// A pointwise activation that may follow a pooling layer; fused ops apply it to the pooled value.
// The derivative is always expressed through the activation's OUTPUT, so backward needs only the saved output.
enum class Activation : int32_t { kNone = 0, kRelu = 1, kTanh = 2 };

// Torch's max-pooling scan rule (aten/src/ATen/native/cpu/MaxPoolKernel.cpp): a candidate replaces the current
// maximum when it is strictly larger or NaN. Ties therefore keep the FIRST maximum in scan order, and a window
// with NaNs yields NaN with its LAST NaN as argmax — the element F.max_pool2d's backward sends the gradient to.
template <typename T>
HOST_DEVICE_INLINE bool max_takes(T current, T candidate) {
  return candidate > current || candidate != candidate;
}

// Folds one (value, tap) candidate into the running (best, best_tap) with torch's rule.
template <typename T, typename Tap>
HOST_DEVICE_INLINE void max_update(T& best, Tap& best_tap, T candidate, Tap candidate_tap) {
  const bool take = max_takes(best, candidate);
  best = take ? candidate : best;
  best_tap = take ? candidate_tap : best_tap;
}

// Scans k taps src[0], src[step], ... in order: best value and its tap number (torch's rule).
template <typename T, typename Tap>
HOST_DEVICE_INLINE void max_scan(const T* src, int64_t step, int32_t k, T& best, Tap& best_tap) {
  best = src[0];
  best_tap = 0;
  for (int32_t t = 1; t < k; ++t) max_update(best, best_tap, src[t * step], static_cast<Tap>(t));
}

// Sum of k taps src[0], src[step], ... in tap order.
template <typename T>
HOST_DEVICE_INLINE T sum_scan(const T* src, int64_t step, int32_t k) {
  T sum = src[0];
  for (int32_t t = 1; t < k; ++t) sum += src[t * step];
  return sum;
}

// tanh for float as a clamped rational polynomial (Eigen's generic_fast_tanh_float, max error a few ulp):
// branch-free, so the CPU loops auto-vectorise instead of calling libm per element.
HOST_DEVICE_INLINE float fast_tanh(float x) {
  const float clamp = 7.90531110763549805f;
  x = x > clamp ? clamp : (x < -clamp ? -clamp : x);
  const float x2 = x * x;
  float p = -2.76076847742355e-16f;
  p = p * x2 + 2.00018790482477e-13f;
  p = p * x2 + -8.60467152213735e-11f;
  p = p * x2 + 5.12229709037114e-08f;
  p = p * x2 + 1.48572235717979e-05f;
  p = p * x2 + 6.37261928875436e-04f;
  p = p * x2 + 4.89352455891786e-03f;
  p = p * x;
  float q = 1.19825839466702e-06f;
  q = q * x2 + 1.18534705686654e-04f;
  q = q * x2 + 2.26843463243900e-03f;
  q = q * x2 + 4.89352518554385e-03f;
  return p / q;
}

HOST_DEVICE_INLINE float tanh_of(float x) {
#if defined(__CUDA_ARCH__)
  return tanhf(x);
#else
  return fast_tanh(x);
#endif
}

HOST_DEVICE_INLINE double tanh_of(double x) { return tanh(x); }

template <typename T>
HOST_DEVICE_INLINE T activation_forward(T x, Activation activation) {
  switch (activation) {
    case Activation::kRelu:
      return x < T(0) ? T(0) : x;  // keeps NaN, like torch.relu
    case Activation::kTanh:
      return tanh_of(x);
    default:
      return x;
  }
}

// d activation / d input, from the activation's output y.
template <typename T>
HOST_DEVICE_INLINE T activation_grad(T y, Activation activation) {
  switch (activation) {
    case Activation::kRelu:
      return y > T(0) ? T(1) : T(0);
    case Activation::kTanh:
      return T(1) - y * y;
    default:
      return T(1);
  }
}

// Geometry of one pooling problem, in the units the kernels use: a "plane" is a 2-D array of `rows` rows of
// `row_len` contiguous elements. NCHW: one plane per (n, c), row_len = W, taps `dw` elements apart.
// NHWC (channels_last): one plane per n, row_len = W·C, taps `dw·C` elements apart — the same loops then run
// over the channels too, so both layouts vectorise over their contiguous dimension.
struct PoolGeometry {
  int64_t planes;
  int64_t rows, row_len;          // input: H, W (or W·C)
  int64_t out_rows, out_row_len;  // output: H' = H - (kh-1)·dh, W' (or W'·C)
  int64_t tap_rows;               // dh: rows between vertical taps
  int64_t tap_step;               // dw (or dw·C): elements between horizontal taps
  int32_t kh, kw;
};

// Gradient of input element (r, c) of one plane of a max pooling: the sum of grad_y · activation'(y) over the
// outputs whose argmax it is. Output (i, j) took row-pass element (i + a·dh, j) when col_tap[i][j] == a, which took
// input (i + a·dh, j + b·step) when row_tap[i + a·dh][j] == b. Race-free: one thread per input element.
template <typename T>
HOST_DEVICE_INLINE T max_grad_gather(const PoolGeometry& g, const T* grad_y, const T* y, const uint8_t* row_tap,
                                     const uint8_t* col_tap, int64_t r, int64_t c, Activation activation) {
  T sum = T(0);
  for (int32_t b = 0; b < g.kw; ++b) {
    const int64_t j = c - b * g.tap_step;
    if (j < 0 || j >= g.out_row_len || row_tap[r * g.out_row_len + j] != b) continue;
    for (int32_t a = 0; a < g.kh; ++a) {
      const int64_t i = r - a * g.tap_rows;
      if (i < 0 || i >= g.out_rows) continue;
      const int64_t o = i * g.out_row_len + j;
      if (col_tap[o] == a) sum += grad_y[o] * activation_grad(y[o], activation);
    }
  }
  return sum;
}

// Gradient of input element (r, c) of one plane of an average pooling.
template <typename T>
HOST_DEVICE_INLINE T avg_grad_gather(const PoolGeometry& g, const T* grad_y, const T* y, int64_t r, int64_t c,
                                     T scale, Activation activation) {
  T sum = T(0);
  for (int32_t a = 0; a < g.kh; ++a) {
    const int64_t i = r - a * g.tap_rows;
    if (i < 0 || i >= g.out_rows) continue;
    for (int32_t b = 0; b < g.kw; ++b) {
      const int64_t j = c - b * g.tap_step;
      if (j < 0 || j >= g.out_row_len) continue;
      const int64_t o = i * g.out_row_len + j;
      sum += grad_y[o] * activation_grad(y[o], activation);
    }
  }
  return sum * scale;
}

}  // namespace densecnn

namespace densecnn {

// One image of a stride-1 dilated convolution, NCHW, processed in bands of output rows: the unrolled (im2col)
// matrix of a band has one row per (channel, kernel row a, kernel column b) and one column per output pixel.
struct ConvGeometry {
  int64_t channels, rows, cols;  // input C, H, W
  int64_t out_rows, out_cols;    // H', W'
  int32_t kh, kw;
  int64_t dh, dw;
};

// Offset in the (C, H, W) image of the input pixel that fills unrolled entry (row, pixel) of the band starting at
// output row `band_start`: row = (c·kh + a)·kw + b, pixel = i·W' + j  ->  x[c, band_start + i + a·dh, j + b·dw].
HOST_DEVICE_INLINE int64_t im2col_source(const ConvGeometry& g, int64_t band_start, int64_t row, int64_t pixel) {
  const int64_t b = row % g.kw, a = row / g.kw % g.kh, c = row / (static_cast<int64_t>(g.kw) * g.kh);
  const int64_t i = pixel / g.out_cols, j = pixel % g.out_cols;
  return (c * g.rows + band_start + i + a * g.dh) * g.cols + j + b * g.dw;
}

// col2im as a gather: the gradient of input pixel (c, r, q) summed over the band's unrolled entries it filled.
// `grad_col` is (C·kh·kw, band_rows·W'). Race-free, so one thread per input pixel needs no atomics.
template <typename T>
HOST_DEVICE_INLINE T col2im_gather(const ConvGeometry& g, const T* grad_col, int64_t band_start, int64_t band_rows,
                                   int64_t c, int64_t r, int64_t q) {
  const int64_t band_pixels = band_rows * g.out_cols;
  T sum = T(0);
  for (int32_t a = 0; a < g.kh; ++a) {
    const int64_t i = r - band_start - a * g.dh;
    if (i < 0 || i >= band_rows) continue;
    for (int32_t b = 0; b < g.kw; ++b) {
      const int64_t j = q - b * g.dw;
      if (j < 0 || j >= g.out_cols) continue;
      sum += grad_col[((c * g.kh + a) * g.kw + b) * band_pixels + i * g.out_cols + j];
    }
  }
  return sum;
}

}  // namespace densecnn
