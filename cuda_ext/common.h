// Per-element math shared by the CPU launchers (*_cpu.cpp) and the CUDA kernels (*_kernels.cu).
//
// Everything here is HOST_DEVICE_INLINE (mmcv style): `__host__ __device__` under nvcc, plain `inline`
// otherwise, so the CPU tests run exactly the code the GPU kernels call. No torch includes: the CUDA kernels
// compile against this header alone.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

#if defined(__CUDACC__)
#define HOST_DEVICE_INLINE __host__ __device__ __forceinline__
#else
#define HOST_DEVICE_INLINE inline
#endif

namespace densecnn {

// Accumulation type: reduced-precision storage (bfloat16, half) is widened to float for every sum and comparison;
// float and double accumulate in themselves.
template <typename T>
struct AccumulateIn {
  using type = float;
};
template <>
struct AccumulateIn<double> {
  using type = double;
};
template <typename T>
using Acc = typename AccumulateIn<T>::type;

// Conversions between storage and accumulation types. torch builds its CUDA code with the implicit conversions of
// __nv_bfloat16/__half disabled, so those use the intrinsics; everything else (float, double, c10::BFloat16,
// c10::Half) converts with a cast.
template <typename A, typename S>
HOST_DEVICE_INLINE A widen(S value) {
  return static_cast<A>(value);
}
template <typename D, typename A>
HOST_DEVICE_INLINE D narrow(A value) {
  return static_cast<D>(value);
}
#if defined(__CUDACC__)
template <>
HOST_DEVICE_INLINE float widen<float, __nv_bfloat16>(__nv_bfloat16 value) {
  return __bfloat162float(value);
}
template <>
HOST_DEVICE_INLINE float widen<float, __half>(__half value) {
  return __half2float(value);
}
template <>
HOST_DEVICE_INLINE __nv_bfloat16 narrow<__nv_bfloat16, float>(float value) {
  return __float2bfloat16_rn(value);
}
template <>
HOST_DEVICE_INLINE __half narrow<__half, float>(float value) {
  return __float2half_rn(value);
}
#endif

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

// Scans k taps src[0], src[step], ... in order, widened to A: best value and its tap number (torch's rule).
template <typename A, typename S, typename Tap>
HOST_DEVICE_INLINE void max_scan(const S* src, int64_t step, int32_t k, A& best, Tap& best_tap) {
  best = widen<A>(src[0]);
  best_tap = 0;
  for (int32_t t = 1; t < k; ++t) max_update(best, best_tap, widen<A>(src[t * step]), static_cast<Tap>(t));
}

// Sum of k taps src[0], src[step], ... in tap order, accumulated in A.
template <typename A, typename S>
HOST_DEVICE_INLINE A sum_scan(const S* src, int64_t step, int32_t k) {
  A sum = widen<A>(src[0]);
  for (int32_t t = 1; t < k; ++t) sum += widen<A>(src[t * step]);
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

// Geometry of one d-sparse pooling problem over n = `axes` spatial axes (1: signals, 2: images, 3: volumes), in the
// units the kernels use. Each of `planes` planes is a compact n-d array; its innermost axis counts ELEMENTS.
// Contiguous (N, C, ...): one plane per (n, c), innermost extent W, taps `d` apart.
// Channels-last (N, ..., C): one plane per n, innermost extent W·C, taps `d·C` apart — the channels ride along in
// the innermost axis, so both layouts vectorise over their contiguous dimension with the same loops.
constexpr int kMaxAxes = 3;

struct PoolGeometry {
  int32_t axes;
  int64_t planes;
  int64_t size[kMaxAxes];  // input extent per axis (innermost: W, or W·C)
  int64_t out[kMaxAxes];   // output extent: size - (k - 1)·step
  int64_t step[kMaxAxes];  // distance between two taps along the axis, in its own units: d (innermost: d or d·C)
  int32_t kernel[kMaxAxes];
};

// Max and average pooling are separable: one pass per axis, innermost first, each a 1-d window along its axis.
// A pass sees its array as (outer, len, inner): `outer` slabs of `len` slices of `inner` contiguous elements, the
// taps of a window `dilation·inner` elements apart. The same pass serves every axis of every n: only the three
// extents change. Innermost first, with torch's scan rule in each pass, selects the first maximum in row-major
// window order — F.max_pool*d's argmax.
struct AxisPass {
  int64_t outer, in_len, out_len, inner;
  int64_t dilation;  // in units of the axis: element distance between taps = dilation·inner
  int32_t kernel;
};

// The pass along `axis`: axes after it are already pooled (extent out), the others still whole (extent size).
HOST_DEVICE_INLINE AxisPass axis_pass(const PoolGeometry& g, int axis) {
  AxisPass p;
  p.outer = g.planes;
  p.inner = 1;
  for (int b = 0; b < axis; ++b) p.outer *= g.size[b];
  for (int b = axis + 1; b < g.axes; ++b) p.inner *= g.out[b];
  p.in_len = g.size[axis];
  p.out_len = g.out[axis];
  p.dilation = g.step[axis];
  p.kernel = g.kernel[axis];
  return p;
}

HOST_DEVICE_INLINE int64_t pass_input_size(const AxisPass& p) { return p.outer * p.in_len * p.inner; }
HOST_DEVICE_INLINE int64_t pass_output_size(const AxisPass& p) { return p.outer * p.out_len * p.inner; }

// Elements of the largest array between two passes: the innermost pass's output (forward) or the gradient that
// reaches it (backward). Two such slots alternate between passes.
HOST_DEVICE_INLINE int64_t intermediate_size(const PoolGeometry& g) {
  return g.axes == 1 ? 0 : pass_output_size(axis_pass(g, g.axes - 1));
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
