// CPU op applying a small complex matrix along each of the two leading axes of a complex (A, B, N) array:
// out[a', b', n] = Σ_a Σ_b first[a', a] · second[b', b] · x[a, b, n]. The FFT conv's kernel spectrum is this on the
// kernel's taps (the DFT matrices of the tile, (Th, kh) and (F, kw)), and the weight gradient's taps are its adjoint
// on the gradient's spectrum. Both are tall and thin — a few terms per output over tens of MB — where MKL's complex
// GEMM with an inner dimension of 5 runs far below the cores' speed. Each work item here takes a chunk of n: the
// cheaper axis first into an intermediate that stays in L2, then the other axis, blocks of up to 8 output rows
// summed in registers (mix_block) and written once.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "cpu_isa.h"

namespace densecnn {
namespace {

constexpr int64_t kChunk = 512;  // complex values of n per work item

// Rows [r0, r0 + R) of dst = m · src over the first `reals` reals (a whole number of vectors) of each row: the R
// sums of a vector held in registers while the terms stream through, each source vector read once for the R rows.
// A complex product m·x is mr·x + mi·(-x.im, x.re) on interleaved pairs: two FMAs a vector, one swap a term.
template <typename T, int B, int R>
DENSECNN_ALWAYS_INLINE void mix_block(const T* m, int64_t r0, int64_t terms, const T* src, int64_t src_stride,
                                      T* dst, int64_t dst_stride, int64_t reals) {
  using V = Vec<T, B>;
  constexpr int kLanes = lanes<T, B>();
  V sign;                                                             // -1, 1, -1, 1, ...
  Vec<std::conditional_t<sizeof(T) == 4, int32_t, int64_t>, B> partner;  // 1, 0, 3, 2, ...: each pair swapped
  for (int i = 0; i < kLanes; ++i) {
    sign[i] = i % 2 == 0 ? T(-1) : T(1);
    partner[i] = i ^ 1;
  }
  for (int64_t j = 0; j < reals; j += kLanes) {
    V acc[R] = {};
    for (int64_t t = 0; t < terms; ++t) {
      V x;
      std::memcpy(&x, src + t * src_stride + j, sizeof(V));
      const V turned = __builtin_shuffle(x, partner) * sign;  // (-im, re) pairs: x times i
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const T* c = m + 2 * ((r0 + r) * terms + t);
        acc[r] += c[0] * x + c[1] * turned;
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) std::memcpy(dst + (r0 + r) * dst_stride + j, &acc[r], sizeof(V));
  }
}

// The last values of each row (fewer than a vector's), one complex product at a time.
template <typename T>
DENSECNN_ALWAYS_INLINE void mix_tail(const T* m, int64_t rows, int64_t terms, const T* src, int64_t src_stride,
                                     T* dst, int64_t dst_stride, int64_t from, int64_t reals) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = from; j < reals; j += 2) {
      T re = 0, im = 0;
      for (int64_t t = 0; t < terms; ++t) {
        const T mr = m[2 * (r * terms + t)], mi = m[2 * (r * terms + t) + 1];
        const T xr = src[t * src_stride + j], xi = src[t * src_stride + j + 1];
        re += mr * xr - mi * xi;
        im += mr * xi + mi * xr;
      }
      dst[r * dst_stride + j] = re;
      dst[r * dst_stride + j + 1] = im;
    }
  }
}

// dst row r = Σ_t m[r, t] · src row t, for the `rows` rows of a (rows × terms) complex matrix m; rows of n complex
// values, src row t at src + t·src_stride, dst row r at dst + r·dst_stride (strides in reals): blocks of 8 rows,
// then 4, 2 and 1, each summed in registers.
template <typename T, int B>
DENSECNN_ALWAYS_INLINE void mix_rows_impl(const T* m, int64_t rows, int64_t terms, const T* src, int64_t src_stride,
                                          T* dst, int64_t dst_stride, int64_t n) {
  const int64_t reals = 2 * n, whole = reals / lanes<T, B>() * lanes<T, B>();
  int64_t r = 0;
  for (; r + 8 <= rows; r += 8) mix_block<T, B, 8>(m, r, terms, src, src_stride, dst, dst_stride, whole);
  if (r + 4 <= rows) mix_block<T, B, 4>(m, r, terms, src, src_stride, dst, dst_stride, whole), r += 4;
  if (r + 2 <= rows) mix_block<T, B, 2>(m, r, terms, src, src_stride, dst, dst_stride, whole), r += 2;
  if (r < rows) mix_block<T, B, 1>(m, r, terms, src, src_stride, dst, dst_stride, whole);
  mix_tail(m, rows, terms, src, src_stride, dst, dst_stride, whole, reals);
}

#define DENSECNN_MIX_ROWS(T)                                                                                   \
  DENSECNN_PER_LEVEL((void mix_rows(const T* m, int64_t rows, int64_t terms, const T* src, int64_t src_stride, \
                                    T* dst, int64_t dst_stride, int64_t n)),                                  \
                     mix_rows_impl<T, kVecBytes>(m, rows, terms, src, src_stride, dst, dst_stride, n);)
DENSECNN_MIX_ROWS(float)
DENSECNN_MIX_ROWS(double)

template <typename T>
void axes_transform_impl(const T* x, const T* first, const T* second, T* out, int64_t a_in, int64_t b_in,
                         int64_t a_out, int64_t b_out, int64_t n) {
  // multiply-adds per value of n: along A first (then B), or along B first (then A)
  const bool a_first = a_out * a_in * b_in + a_out * b_out * b_in <= a_in * b_out * b_in + a_out * b_out * a_in;
  const int64_t row = 2 * n;  // reals between consecutive (a, b) rows of x and out
  at::parallel_for(0, (n + kChunk - 1) / kChunk, 1, [&](int64_t begin, int64_t end) {
    // the intermediate (A', B, chunk) or (A, B', chunk), rows of kChunk complex values
    std::vector<T> mid((a_first ? a_out * b_in : a_in * b_out) * 2 * kChunk);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t j0 = item * kChunk, count = std::min(kChunk, n - j0);
      const T* xs = x + 2 * j0;
      T* outs = out + 2 * j0;
      if (a_first) {
        for (int64_t b = 0; b < b_in; ++b) {  // mid[a', b] = Σ_a first[a', a] x[a, b]
          mix_rows(first, a_out, a_in, xs + b * row, b_in * row, mid.data() + b * 2 * kChunk, b_in * 2 * kChunk,
                   count);
        }
        for (int64_t a = 0; a < a_out; ++a) {  // out[a', b'] = Σ_b second[b', b] mid[a', b]
          mix_rows(second, b_out, b_in, mid.data() + a * b_in * 2 * kChunk, 2 * kChunk, outs + a * b_out * row, row,
                   count);
        }
      } else {
        for (int64_t a = 0; a < a_in; ++a) {  // mid[a, b'] = Σ_b second[b', b] x[a, b]
          mix_rows(second, b_out, b_in, xs + a * b_in * row, row, mid.data() + a * b_out * 2 * kChunk, 2 * kChunk,
                   count);
        }
        for (int64_t b = 0; b < b_out; ++b) {  // out[a', b'] = Σ_a first[a', a] mid[a, b']
          mix_rows(first, a_out, a_in, mid.data() + b * 2 * kChunk, b_out * 2 * kChunk, outs + b * row, b_out * row,
                   count);
        }
      }
    }
  });
}

void axes_transform_cpu(const at::Tensor& x, const at::Tensor& first, const at::Tensor& second, at::Tensor out) {
  TORCH_CHECK(x.dim() == 3 && first.dim() == 2 && second.dim() == 2 && out.dim() == 3,
              "densecnn.axes_transform: expected x (A, B, N), first (A', A), second (B', B) and out (A', B', N), "
              "got ", x.sizes(), ", ", first.sizes(), ", ", second.sizes(), " and ", out.sizes());
  const int64_t a_in = x.size(0), b_in = x.size(1), n = x.size(2), a_out = first.size(0), b_out = second.size(0);
  TORCH_CHECK(first.size(1) == a_in && second.size(1) == b_in && out.size(0) == a_out && out.size(1) == b_out &&
                  out.size(2) == n,
              "densecnn.axes_transform: shapes do not chain: x ", x.sizes(), ", first ", first.sizes(), ", second ",
              second.sizes(), ", out ", out.sizes());
  const auto dtype = x.scalar_type();
  TORCH_CHECK(dtype == at::kComplexFloat || dtype == at::kComplexDouble,
              "densecnn.axes_transform: x must be complex64 or complex128, got ", dtype);
  TORCH_CHECK(first.scalar_type() == dtype && second.scalar_type() == dtype && out.scalar_type() == dtype,
              "densecnn.axes_transform: first, second and out must have x's dtype ", dtype);
  TORCH_CHECK(out.is_contiguous(), "densecnn.axes_transform: out must be contiguous");
  if (out.numel() == 0) return;
  const at::Tensor xc = x.contiguous(), fc = first.contiguous(), sc = second.contiguous();
  if (dtype == at::kComplexFloat) {
    axes_transform_impl<float>(reinterpret_cast<const float*>(xc.const_data_ptr()),
                               reinterpret_cast<const float*>(fc.const_data_ptr()),
                               reinterpret_cast<const float*>(sc.const_data_ptr()),
                               reinterpret_cast<float*>(out.mutable_data_ptr()), a_in, b_in, a_out, b_out, n);
  } else {
    axes_transform_impl<double>(reinterpret_cast<const double*>(xc.const_data_ptr()),
                                reinterpret_cast<const double*>(fc.const_data_ptr()),
                                reinterpret_cast<const double*>(sc.const_data_ptr()),
                                reinterpret_cast<double*>(out.mutable_data_ptr()), a_in, b_in, a_out, b_out, n);
  }
}

}  // namespace

TORCH_LIBRARY_IMPL(densecnn, CPU, m) { m.impl("axes_transform", &axes_transform_cpu); }

}  // namespace densecnn
