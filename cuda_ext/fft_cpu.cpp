// CPU tile transforms of the frequency-domain convolution (fft_driver.h). One work item is one tile and a block of
// kLanes channels: the tile is read once, and every transform along an axis is a small matrix (the DFT's, in L1)
// applied to vectors of kLanes channels, so the arithmetic vectorises across channels and the spectrum is written
// in the GEMM's layout, channels innermost. The inverse reads the product spectrum the same way and writes the
// valid part of each tile, plus the bias, straight into the output, in either memory format.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "fft_driver.h"
#include "fft_elements.h"
#include "gpu_loops.h"

namespace densecnn {
namespace {

// As in pool_cpu.cpp: the hot loop is compiled for AVX-512, AVX2 and the x86-64 baseline, picked at load time.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define DENSECNN_FFT_MULTIVERSION __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define DENSECNN_FFT_MULTIVERSION
#endif

// A vector of channel lanes (GCC/Clang vector extension): 512 bits, i.e. one AVX-512 register, two AVX2 registers
// or four SSE registers, whichever clone runs. Aligned like its elements (buffers need no over-aligned allocation;
// loads and stores are the unaligned kind).
typedef float FloatLanes __attribute__((vector_size(64), aligned(alignof(float))));
typedef double DoubleLanes __attribute__((vector_size(64), aligned(alignof(double))));
template <typename T>
struct LanesOf;
template <>
struct LanesOf<float> {
  using type = FloatLanes;
};
template <>
struct LanesOf<double> {
  using type = DoubleLanes;
};
template <typename T>
using Lanes = typename LanesOf<T>::type;
template <typename T>
constexpr int kLanes = sizeof(Lanes<T>) / sizeof(T);  // channels per work item

// out[r·out_stride] = Σ_j m[r·inner + j] · in[j] for r < rows: a small matrix applied to vectors of channel lanes,
// eight rows at a time to keep independent sums in flight.
template <typename T>
inline __attribute__((always_inline)) void apply_matrix(const T* m, int64_t rows, int64_t inner, const Lanes<T>* in,
                                                        Lanes<T>* out, int64_t out_stride) {
  constexpr int kRows = 8;
  int64_t r = 0;
  for (; r + kRows <= rows; r += kRows) {
    Lanes<T> acc[kRows] = {};
    for (int64_t j = 0; j < inner; ++j) {
      const Lanes<T> x = in[j];
#pragma GCC unroll 8
      for (int i = 0; i < kRows; ++i) acc[i] += m[(r + i) * inner + j] * x;
    }
#pragma GCC unroll 8
    for (int i = 0; i < kRows; ++i) out[(r + i) * out_stride] = acc[i];
  }
  for (; r < rows; ++r) {
    Lanes<T> acc = {};
    for (int64_t j = 0; j < inner; ++j) acc += m[r * inner + j] * in[j];
    out[r * out_stride] = acc;
  }
}

DENSECNN_FFT_MULTIVERSION void apply(const float* m, int64_t rows, int64_t inner, const FloatLanes* in,
                                     FloatLanes* out, int64_t out_stride) {
  apply_matrix<float>(m, rows, inner, in, out, out_stride);
}
DENSECNN_FFT_MULTIVERSION void apply(const double* m, int64_t rows, int64_t inner, const DoubleLanes* in,
                                     DoubleLanes* out, int64_t out_stride) {
  apply_matrix<double>(m, rows, inner, in, out, out_stride);
}

// The DFT matrices of one tile size, computed in double and rounded to T.
template <typename T>
struct DftMatrices {
  std::vector<T> row_cos, row_msin;  // (F, tw): forward real DFT along w, real and imaginary parts
  std::vector<T> col;                // (2th, 2th): forward complex DFT along h on (re rows, im rows)
  std::vector<T> inv_col_re, inv_col_im;  // (sh, 2th): the valid rows of the inverse DFT along h
  std::vector<T> inv_row;                 // (sw, 2F): the valid columns of the real inverse DFT along w, scaled

  explicit DftMatrices(const FftGeometry& g) {
    const int64_t th = g.th, tw = g.tw, f_count = g.freqs;
    const double pi = std::acos(-1.0);
    auto angle_h = [&](int64_t m) { return 2 * pi * static_cast<double>(m % th) / th; };
    auto angle_w = [&](int64_t m) { return 2 * pi * static_cast<double>(m % tw) / tw; };
    row_cos.resize(f_count * tw);
    row_msin.resize(f_count * tw);
    for (int64_t f = 0; f < f_count; ++f) {
      for (int64_t b = 0; b < tw; ++b) {
        row_cos[f * tw + b] = static_cast<T>(std::cos(angle_w(f * b)));
        row_msin[f * tw + b] = static_cast<T>(-std::sin(angle_w(f * b)));
      }
    }
    col.resize(4 * th * th);
    for (int64_t u = 0; u < th; ++u) {
      for (int64_t a = 0; a < th; ++a) {
        const double c = std::cos(angle_h(u * a)), s = std::sin(angle_h(u * a));
        col[u * 2 * th + a] = static_cast<T>(c);  // re_u += cos·re_a + sin·im_a
        col[u * 2 * th + th + a] = static_cast<T>(s);
        col[(th + u) * 2 * th + a] = static_cast<T>(-s);  // im_u += -sin·re_a + cos·im_a
        col[(th + u) * 2 * th + th + a] = static_cast<T>(c);
      }
    }
    inv_col_re.resize(g.sh * 2 * th);
    inv_col_im.resize(g.sh * 2 * th);
    for (int64_t a = 0; a < g.sh; ++a) {
      for (int64_t u = 0; u < th; ++u) {
        const double c = std::cos(angle_h(u * a)), s = std::sin(angle_h(u * a));
        inv_col_re[a * 2 * th + u] = static_cast<T>(c);  // re_a += cos·re_u - sin·im_u
        inv_col_re[a * 2 * th + th + u] = static_cast<T>(-s);
        inv_col_im[a * 2 * th + u] = static_cast<T>(s);  // im_a += sin·re_u + cos·im_u
        inv_col_im[a * 2 * th + th + u] = static_cast<T>(c);
      }
    }
    inv_row.resize(g.sw * 2 * f_count);
    for (int64_t b = 0; b < g.sw; ++b) {
      for (int64_t f = 0; f < f_count; ++f) {
        const double weight = (f == 0 || 2 * f == tw ? 1.0 : 2.0) / static_cast<double>(th * tw);
        inv_row[b * 2 * f_count + f] = static_cast<T>(weight * std::cos(angle_w(f * b)));
        inv_row[b * 2 * f_count + f_count + f] = static_cast<T>(-weight * std::sin(angle_w(f * b)));
      }
    }
  }
};

// Forward transform of tiles [first, first + count), all channels, into spectrum (P, count, C, 2).
template <typename T>
void forward_tiles(const FftGeometry& g, const T* x, int64_t first, int64_t count, T* spectrum) {
  constexpr int V = kLanes<T>;
  const DftMatrices<T> dft(g);
  const int64_t th = g.th, tw = g.tw, f_count = g.freqs, blocks = (g.channels + V - 1) / V;
  at::parallel_for(0, count * blocks, 1, [&](int64_t begin, int64_t end) {
    std::vector<Lanes<T>> row(tw), stage(f_count * 2 * th), column(2 * th);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t t = item / blocks, c0 = item % blocks * V, lanes = std::min<int64_t>(V, g.channels - c0);
      int64_t n, row0, col0;
      tile_origin(g, first + t, n, row0, col0);
      const T* image = x + n * g.x_stride[0] + c0 * g.x_stride[1];
      for (int64_t a = 0; a < th; ++a) {  // real DFT of each row: stage[f][re|im][a][lane]
        std::fill(row.begin(), row.end(), Lanes<T>{});
        const int64_t r = row0 + a * g.dh;
        if (r < g.rows) {
          for (int64_t b = 0; b < tw; ++b) {
            const int64_t c = col0 + b * g.dw;
            if (c >= g.cols) break;
            const T* src = image + r * g.x_stride[2] + c * g.x_stride[3];
            for (int64_t v = 0; v < lanes; ++v) row[b][v] = src[v * g.x_stride[1]];
          }
        }
        apply(dft.row_cos.data(), f_count, tw, row.data(), stage.data() + a, 2 * th);
        apply(dft.row_msin.data(), f_count, tw, row.data(), stage.data() + th + a, 2 * th);
      }
      for (int64_t f = 0; f < f_count; ++f) {  // complex DFT of each column, written as (P, count, C) pairs
        apply(dft.col.data(), 2 * th, 2 * th, stage.data() + f * 2 * th, column.data(), 1);
        for (int64_t u = 0; u < th; ++u) {
          T* dst = spectrum + 2 * (((u * f_count + f) * count + t) * g.channels + c0);
          for (int64_t v = 0; v < lanes; ++v) {
            dst[2 * v] = column[u][v];
            dst[2 * v + 1] = column[th + u][v];
          }
        }
      }
    }
  });
}

// Inverse transform of the product spectrum (P, count, K, 2) of tiles [first, first + count): their valid parts,
// plus the bias, into y.
template <typename T>
void inverse_tiles(const FftGeometry& g, const T* product, const T* bias, int64_t first, int64_t count, T* y) {
  constexpr int V = kLanes<T>;
  const DftMatrices<T> dft(g);
  const int64_t th = g.th, f_count = g.freqs, blocks = (g.out_channels + V - 1) / V;
  at::parallel_for(0, count * blocks, 1, [&](int64_t begin, int64_t end) {
    std::vector<Lanes<T>> stage(f_count * 2 * th, Lanes<T>{}), rows(g.sh * 2 * f_count), out(g.sw);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t t = item / blocks, k0 = item % blocks * V, lanes = std::min<int64_t>(V, g.out_channels - k0);
      int64_t n, row0, col0;
      tile_origin(g, first + t, n, row0, col0);
      for (int64_t p = 0; p < th * f_count; ++p) {  // stage[f][re|im][u][lane]
        const int64_t u = p / f_count, f = p % f_count;
        const T* src = product + 2 * ((p * count + t) * g.out_channels + k0);
        Lanes<T>& re = stage[f * 2 * th + u];
        Lanes<T>& im = stage[f * 2 * th + th + u];
        for (int64_t v = 0; v < lanes; ++v) {
          re[v] = src[2 * v];
          im[v] = src[2 * v + 1];
        }
      }
      for (int64_t f = 0; f < f_count; ++f) {  // inverse DFT along h, valid rows: rows[a][re|im][f][lane]
        const Lanes<T>* column = stage.data() + f * 2 * th;
        apply(dft.inv_col_re.data(), g.sh, 2 * th, column, rows.data() + f, 2 * f_count);
        apply(dft.inv_col_im.data(), g.sh, 2 * th, column, rows.data() + f_count + f, 2 * f_count);
      }
      T* image = y + n * g.y_stride[0] + k0 * g.y_stride[1];
      for (int64_t a = 0; a < g.sh; ++a) {  // real inverse DFT along w, valid columns, into the output
        const int64_t r = row0 + a * g.dh;
        if (r >= g.out_rows) break;
        apply(dft.inv_row.data(), g.sw, 2 * f_count, rows.data() + a * 2 * f_count, out.data(), 1);
        for (int64_t b = 0; b < g.sw; ++b) {
          const int64_t c = col0 + b * g.dw;
          if (c >= g.out_cols) break;
          T* dst = image + r * g.y_stride[2] + c * g.y_stride[3];
          for (int64_t v = 0; v < lanes; ++v) {
            dst[v * g.y_stride[1]] = out[b][v] + (bias == nullptr ? T(0) : bias[k0 + v]);
          }
        }
      }
    }
  });
}

struct CpuTransforms {
  static void forward(const at::Tensor& x, const FftGeometry& g, int64_t first, int64_t count,
                      const at::Tensor& twiddles, at::Tensor& spectrum) {
    AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "densecnn_fft_forward", [&] {
      const scalar_t* src = x.const_data_ptr<scalar_t>();
      scalar_t* dst = spectrum.mutable_data_ptr<scalar_t>();
      if (!gpu_loops_on_cpu()) return forward_tiles<scalar_t>(g, src, first, count, dst);
      const Twiddles<scalar_t> w = twiddles_of(g, twiddles.const_data_ptr<scalar_t>());
      std::vector<scalar_t> rows(2 * fft_forward_rows_size(g, count));
      for_each_element(fft_forward_rows_size(g, count),
                       [&](int64_t e) { fft_forward_rows_at(g, src, first, w, rows.data(), e); });
      for_each_element(fft_spectrum_size(g, count, g.channels),
                       [&](int64_t e) { fft_forward_cols_at(g, rows.data(), count, w, dst, e); });
    });
  }

  static void inverse(const at::Tensor& product, const c10::optional<at::Tensor>& bias, const FftGeometry& g,
                      int64_t first, int64_t count, const at::Tensor& twiddles, at::Tensor& y) {
    AT_DISPATCH_FLOATING_TYPES(y.scalar_type(), "densecnn_fft_inverse", [&] {
      const scalar_t* src = product.const_data_ptr<scalar_t>();
      const scalar_t* b = bias.has_value() ? bias->const_data_ptr<scalar_t>() : nullptr;
      scalar_t* dst = y.mutable_data_ptr<scalar_t>();
      if (!gpu_loops_on_cpu()) return inverse_tiles<scalar_t>(g, src, b, first, count, dst);
      const Twiddles<scalar_t> w = twiddles_of(g, twiddles.const_data_ptr<scalar_t>());
      std::vector<scalar_t> cols(2 * fft_inverse_cols_size(g, count));
      for_each_element(fft_inverse_cols_size(g, count),
                       [&](int64_t e) { fft_inverse_cols_at(g, src, count, w, cols.data(), e); });
      for_each_element(fft_inverse_rows_size(g, count),
                       [&](int64_t e) { fft_inverse_rows_at(g, cols.data(), b, first, w, dst, e); });
    });
  }
};

at::Tensor fft_conv2d_cpu(const at::Tensor& input, const at::Tensor& spectrum, const c10::optional<at::Tensor>& bias,
                          at::IntArrayRef tile, at::IntArrayRef valid, at::IntArrayRef dilation) {
  return fft_conv2d_tiles<CpuTransforms>(input, spectrum, bias, tile, valid, dilation);
}

}  // namespace

TORCH_LIBRARY_IMPL(densecnn, CPU, m) { m.impl("fft_conv2d", &fft_conv2d_cpu); }

}  // namespace densecnn
