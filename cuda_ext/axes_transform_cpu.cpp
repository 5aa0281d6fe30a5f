// CPU op applying a small complex matrix along each of the two leading axes of a complex (A, B, N) array:
// out[a', b', n] = Σ_a Σ_b first[a', a] · second[b', b] · x[a, b, n]. The FFT conv's kernel spectrum is this on the
// kernel's taps (the DFT matrices of the tile, (Th, kh) and (F, kw)), and the weight gradient's taps are its adjoint
// on the gradient's spectrum. Both are tall and thin — a few terms per output over tens of MB — where a BLAS GEMM
// with an inner dimension of 5 runs at a third of the memory's speed. Each work item here takes a chunk of n: the
// cheaper axis first into an intermediate that stays in L2, then the other axis, each output chunk summed in L1 and
// written once.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <vector>

#include "cpu_isa.h"

namespace densecnn {
namespace {

constexpr int64_t kChunk = 256;  // complex values of n per work item

// acc[j] (=, or += when kAdd) m · x[j] for j < n complex values, both interleaved (re, im).
template <typename T, bool kAdd>
DENSECNN_ALWAYS_INLINE void scaled_loop(T* acc, const T* x, T mr, T mi, int64_t n) {
#pragma GCC ivdep
  for (int64_t j = 0; j < n; ++j) {
    const T xr = x[2 * j], xi = x[2 * j + 1];
    const T re = mr * xr - mi * xi, im = mr * xi + mi * xr;
    acc[2 * j] = kAdd ? acc[2 * j] + re : re;
    acc[2 * j + 1] = kAdd ? acc[2 * j + 1] + im : im;
  }
}

#define DENSECNN_SCALED(T)                                                                                    \
  DENSECNN_MULTIVERSION void scaled(std::false_type, T* acc, const T* x, T mr, T mi, int64_t n) {             \
    scaled_loop<T, false>(acc, x, mr, mi, n);                                                                 \
  }                                                                                                           \
  DENSECNN_MULTIVERSION void scaled(std::true_type, T* acc, const T* x, T mr, T mi, int64_t n) {              \
    scaled_loop<T, true>(acc, x, mr, mi, n);                                                                  \
  }
DENSECNN_SCALED(float)
DENSECNN_SCALED(double)

// dst row r = Σ_t m[r, t] · src row t, for `rows` rows of a (rows × terms) complex matrix m; rows of n complex
// values, src row t at src + t·src_stride, dst row r at dst + r·dst_stride (strides in reals). Whichever side has
// more rows is gone through once, the other's rows staying in cache: each output row summed whole in turn when
// there are more of them (the spectrum: 5 taps to 38 frequencies, the outputs leaving cache once written), each
// source row read once into all the sums when there are more of those (the taps: 38 frequencies to 5 taps).
template <typename T>
void mix_rows(const T* m, int64_t rows, int64_t terms, const T* src, int64_t src_stride, T* dst, int64_t dst_stride,
              int64_t n) {
  const auto term = [&](int64_t r, int64_t t) {
    const T mr = m[2 * (r * terms + t)], mi = m[2 * (r * terms + t) + 1];
    if (t == 0) {
      scaled(std::false_type{}, dst + r * dst_stride, src + t * src_stride, mr, mi, n);
    } else {
      scaled(std::true_type{}, dst + r * dst_stride, src + t * src_stride, mr, mi, n);
    }
  };
  if (rows >= terms) {
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t t = 0; t < terms; ++t) term(r, t);
    }
  } else {
    for (int64_t t = 0; t < terms; ++t) {
      for (int64_t r = 0; r < rows; ++r) term(r, t);
    }
  }
}

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
