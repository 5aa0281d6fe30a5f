// Geometry and per-element body of the direct convolution for few input channels (direct_conv_cpu.cpp,
// direct_conv_kernels.cu): a stride-1 dilated convolution, groups 1, of an (N, C, D, H, W) input (signals and
// images as D = H = 1 or D = 1) with a (K, C, kd, kh, kw) weight. No torch here (nvcc compiles it alone).
#pragma once

#include <cstdint>

#include "common.h"

namespace densecnn {

struct DirectConvGeometry {
  int64_t batch, channels, out_channels;
  int64_t depth, rows, cols;              // input spatial size
  int64_t out_depth, out_rows, out_cols;  // output spatial size
  int32_t kd, kh, kw;                     // kernel
  int32_t dd, dh, dw;                     // dilation
  bool channels_last;                     // output laid out (N, D', H', W', K) in memory, else (N, K, D', H', W')
};

// Memory offset of output element (n, k, d, h, w).
HOST_DEVICE_INLINE int64_t direct_conv_offset(const DirectConvGeometry& g, int64_t n, int64_t k, int64_t d, int64_t h,
                                              int64_t w) {
  if (g.channels_last) return (((n * g.out_depth + d) * g.out_rows + h) * g.out_cols + w) * g.out_channels + k;
  return (((n * g.out_channels + k) * g.out_depth + d) * g.out_rows + h) * g.out_cols + w;
}

// Memory offset of input element (n, c, d, h, w) of the contiguous (N, C, D, H, W) input.
HOST_DEVICE_INLINE int64_t direct_conv_input_offset(const DirectConvGeometry& g, int64_t n, int64_t c, int64_t d,
                                                    int64_t h, int64_t w) {
  return (((n * g.channels + c) * g.depth + d) * g.rows + h) * g.cols + w;
}

HOST_DEVICE_INLINE int64_t direct_conv_size(const DirectConvGeometry& g) {
  return g.batch * g.out_channels * g.out_depth * g.out_rows * g.out_cols;
}

// Output element e = (n, k, d, h, w) (row-major index) of the (N, K, D', H', W') output: bias[k] + the sum over
// channels and taps of weight (K, C, kd, kh, kw) times the input at (n, c, d + a·dd, h + b·dh, w + t·dw), written at
// direct_conv_offset. bias may be null.
template <typename T>
HOST_DEVICE_INLINE void direct_conv_at(const DirectConvGeometry& g, const T* x, const T* weight, const T* bias, T* y,
                                       int64_t e) {
  const int64_t w = e % g.out_cols, h = e / g.out_cols % g.out_rows, d = e / (g.out_cols * g.out_rows) % g.out_depth;
  const int64_t k = e / (g.out_cols * g.out_rows * g.out_depth) % g.out_channels;
  const int64_t n = e / (g.out_cols * g.out_rows * g.out_depth * g.out_channels);
  T sum = bias == nullptr ? T(0) : bias[k];
  const T* tap = weight + k * g.channels * g.kd * g.kh * g.kw;
  for (int64_t c = 0; c < g.channels; ++c) {
    for (int32_t a = 0; a < g.kd; ++a) {
      for (int32_t b = 0; b < g.kh; ++b) {
        const T* src = x + direct_conv_input_offset(g, n, c, d + a * g.dd, h + b * g.dh, w);
        for (int32_t t = 0; t < g.kw; ++t) sum += *tap++ * src[t * g.dw];
      }
    }
  }
  y[direct_conv_offset(g, n, k, d, h, w)] = sum;
}

}  // namespace densecnn
