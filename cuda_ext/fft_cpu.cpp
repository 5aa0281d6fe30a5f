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
#include <cstring>
#include <vector>

#include "cpu_isa.h"
#include "fft_driver.h"
#include "fft_elements.h"
#include "gpu_loops.h"

namespace densecnn {
namespace {

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

// Where a small matrix reads its input vectors and writes its output vectors: input j is in_a[j·in_stride] for
// j < in_split, else in_b[(j - in_split)·in_stride]; output row r goes to out_a[r·out_stride] for r < out_split,
// else out_b[(r - out_split)·out_stride] (the real and imaginary halves of a complex vector may lie apart).
template <typename T>
struct Operands {
  const Lanes<T>* in_a;
  const Lanes<T>* in_b;
  int64_t in_split, in_stride;
  Lanes<T>* out_a;
  Lanes<T>* out_b;
  int64_t out_split, out_stride;
};

// Rows [r, r + K) of out = m · in (m is rows × inner), K independent sums in flight.
template <typename T, int K>
DENSECNN_ALWAYS_INLINE void apply_rows(const T* m, int64_t r, int64_t inner, const Operands<T>& o) {
  Lanes<T> acc[K] = {};
  for (int64_t j = 0; j < o.in_split; ++j) {
    const Lanes<T> x = o.in_a[j * o.in_stride];
#pragma GCC unroll 8
    for (int i = 0; i < K; ++i) acc[i] += m[(r + i) * inner + j] * x;
  }
  for (int64_t j = o.in_split; j < inner; ++j) {
    const Lanes<T> x = o.in_b[(j - o.in_split) * o.in_stride];
#pragma GCC unroll 8
    for (int i = 0; i < K; ++i) acc[i] += m[(r + i) * inner + j] * x;
  }
#pragma GCC unroll 8
  for (int i = 0; i < K; ++i) {
    const int64_t row = r + i;
    Lanes<T>* dst = row < o.out_split ? o.out_a + row * o.out_stride : o.out_b + (row - o.out_split) * o.out_stride;
    *dst = acc[i];
  }
}

// out = m · in for a (rows × inner) matrix m on vectors of channel lanes: blocks of 8 rows, then 4, 2, 1.
template <typename T>
DENSECNN_ALWAYS_INLINE void apply_matrix(const T* m, int64_t rows, int64_t inner,
                                                        const Operands<T>& o) {
  int64_t r = 0;
  for (; r + 8 <= rows; r += 8) apply_rows<T, 8>(m, r, inner, o);
  if (r + 4 <= rows) apply_rows<T, 4>(m, r, inner, o), r += 4;
  if (r + 2 <= rows) apply_rows<T, 2>(m, r, inner, o), r += 2;
  if (r < rows) apply_rows<T, 1>(m, r, inner, o);
}

// The common case: contiguous input, output rows out_stride apart.
template <typename T>
DENSECNN_ALWAYS_INLINE void apply_matrix(const T* m, int64_t rows, int64_t inner, const Lanes<T>* in,
                                                        Lanes<T>* out, int64_t out_stride) {
  apply_matrix<T>(m, rows, inner, Operands<T>{in, in, inner, 1, out, out, rows, out_stride});
}

// The real (2n × 2n) matrix of the length-n complex DFT with exponent sign σ: input (re_0..re_{n-1}, im_0..), output
// the same; e^{σ·2πi jk/n} = c + iσs turns (a + ib) into (ac - σbs) + i(σas + bc).
template <typename T>
std::vector<T> complex_dft_matrix(int64_t n, int sign) {
  std::vector<T> m(4 * n * n);
  const double pi = std::acos(-1.0);
  for (int64_t k = 0; k < n; ++k) {
    for (int64_t j = 0; j < n; ++j) {
      const double angle = 2 * pi * static_cast<double>(j * k % n) / n;
      const double c = std::cos(angle), s = sign * std::sin(angle);
      m[k * 2 * n + j] = static_cast<T>(c);
      m[k * 2 * n + n + j] = static_cast<T>(-s);
      m[(n + k) * 2 * n + j] = static_cast<T>(s);
      m[(n + k) * 2 * n + n + j] = static_cast<T>(c);
    }
  }
  return m;
}

// A length-n complex DFT on vectors of channel lanes, by one level of Cooley-Tukey: n = n1·n2 with n1 the largest
// factor <= sqrt(n); n2 DFTs of length n1 on the stride-n2 samples, twiddles, n1 DFTs of length n2, each a small
// matrix. 4n(n1 + n2) multiply-adds per vector instead of 4n² (a prime n keeps the plain matrix).
template <typename T>
struct ComplexDft {
  int64_t n, n1, n2;
  std::vector<T> m1, m2, twiddle_re, twiddle_im;

  ComplexDft(int64_t length, int sign) : n(length), n1(1), n2(length) {
    for (int64_t d = 2; d * d <= n; ++d) {
      if (n % d == 0) n1 = d;
    }
    n2 = n / n1;
    m1 = complex_dft_matrix<T>(n1, sign);
    m2 = complex_dft_matrix<T>(n2, sign);
    twiddle_re.resize(n);
    twiddle_im.resize(n);
    const double pi = std::acos(-1.0);
    for (int64_t k1 = 0; k1 < n1; ++k1) {
      for (int64_t j2 = 0; j2 < n2; ++j2) {
        const double angle = 2 * pi * static_cast<double>(j2 * k1 % n) / n;
        twiddle_re[k1 * n2 + j2] = static_cast<T>(std::cos(angle));
        twiddle_im[k1 * n2 + j2] = static_cast<T>(sign * std::sin(angle));
      }
    }
  }

  // out (re block of n, im block of n) = DFT(in) (same layout); `scratch` holds 2n vectors.
  DENSECNN_ALWAYS_INLINE void run(const Lanes<T>* in, Lanes<T>* out, Lanes<T>* scratch) const {
    if (n1 == 1) return apply_matrix<T>(m2.data(), 2 * n, 2 * n, Operands<T>{in, in + n, n, 1, out, out + n, n, 1});
    // scratch[re|im][k1][j2] = Σ_j1 in[n2·j1 + j2] · w_n1^(j1·k1), times the twiddle w_n^(j2·k1)
    Lanes<T>* re = scratch;
    Lanes<T>* im = scratch + n;
    for (int64_t j2 = 0; j2 < n2; ++j2) {
      apply_matrix<T>(m1.data(), 2 * n1, 2 * n1, Operands<T>{in + j2, in + n + j2, n1, n2, re + j2, im + j2, n1, n2});
    }
    for (int64_t k1 = 1; k1 < n1; ++k1) {
      for (int64_t j2 = 1; j2 < n2; ++j2) {
        const T c = twiddle_re[k1 * n2 + j2], sn = twiddle_im[k1 * n2 + j2];
        const Lanes<T> a = re[k1 * n2 + j2], b = im[k1 * n2 + j2];
        re[k1 * n2 + j2] = a * c - b * sn;
        im[k1 * n2 + j2] = a * sn + b * c;
      }
    }
    // out[k1 + n1·k2] = Σ_j2 scratch[k1][j2] · w_n2^(j2·k2)
    for (int64_t k1 = 0; k1 < n1; ++k1) {
      apply_matrix<T>(m2.data(), 2 * n2, 2 * n2,
                      Operands<T>{re + k1 * n2, im + k1 * n2, n2, 1, out + k1, out + n + k1, n2, n1});
    }
  }
};

// The DFT matrices of one tile size, computed in double and rounded to T.
template <typename T>
struct DftMatrices {
  std::vector<T> row;                // (2F, tw): forward real DFT along w, real parts then imaginary parts
  ComplexDft<T> col, inv_col;        // the complex DFTs along h, forward and inverse
  std::vector<T> inv_row;            // (write_w, 2F): the written columns of the real inverse DFT along w, scaled

  explicit DftMatrices(const FftGeometry& g) : col(g.th, -1), inv_col(g.th, 1) {
    const int64_t tw = g.tw, f_count = g.freqs, th = g.th;
    const double pi = std::acos(-1.0);
    auto angle_w = [&](int64_t m) { return 2 * pi * static_cast<double>(m % tw) / tw; };
    row.resize(2 * f_count * tw);
    for (int64_t f = 0; f < f_count; ++f) {
      for (int64_t b = 0; b < tw; ++b) {
        row[f * tw + b] = static_cast<T>(std::cos(angle_w(f * b)));
        row[(f_count + f) * tw + b] = static_cast<T>(-std::sin(angle_w(f * b)));
      }
    }
    inv_row.resize(g.write_w * 2 * f_count);
    for (int64_t b = 0; b < g.write_w; ++b) {
      for (int64_t f = 0; f < f_count; ++f) {
        const double weight = (f == 0 || 2 * f == tw ? 1.0 : 2.0) / static_cast<double>(th * tw);
        inv_row[b * 2 * f_count + f] = static_cast<T>(weight * std::cos(angle_w(f * b)));
        inv_row[b * 2 * f_count + f_count + f] = static_cast<T>(-weight * std::sin(angle_w(f * b)));
      }
    }
  }
};

// Per-thread buffers of the transforms, in vectors of channel lanes (held as scalars: a std::vector of the vector
// type would drop its alignment attribute).
template <typename T>
struct TileBuffers {
  std::vector<T> storage;
  Lanes<T>*row, *stage, *rows, *column, *scratch;
  explicit TileBuffers(const FftGeometry& g) {
    const int64_t sizes[5] = {std::max<int64_t>(g.tw, g.write_w), g.freqs * 2 * g.th, g.write_h * 2 * g.freqs,
                              2 * g.th, 2 * g.th};
    storage.assign((sizes[0] + sizes[1] + sizes[2] + sizes[3] + sizes[4]) * kLanes<T>, T(0));
    Lanes<T>* next = reinterpret_cast<Lanes<T>*>(storage.data());
    Lanes<T>** slots[5] = {&row, &stage, &rows, &column, &scratch};
    for (int i = 0; i < 5; ++i) {
      *slots[i] = next;
      next += sizes[i];
    }
  }
};

// Work item (tile t of the group, channels [c0, c0 + kLanes)) of the forward transform: spectrum (count, P, C, 2),
// each tile's spectrum in one block (the GEMM reads it per frequency with a row stride of P·C).
template <typename T>
DENSECNN_ALWAYS_INLINE void forward_item_impl(const FftGeometry& g, const DftMatrices<T>& dft,
                                                             const T* x, int64_t first, int64_t count, T* spectrum,
                                                             int64_t t, int64_t c0, TileBuffers<T>& buf) {
  constexpr int V = kLanes<T>;
  const int64_t th = g.th, tw = g.tw, f_count = g.freqs, lanes = std::min<int64_t>(V, g.channels - c0);
  const bool whole = lanes == V && g.x_stride[1] == 1;  // channels_last with a full block: one vector load
  int64_t n, row0, col0;
  tile_origin(g, first + t, n, row0, col0);
  const T* image = x + n * g.x_stride[0] + c0 * g.x_stride[1];
  Lanes<T>* row = buf.row;
  Lanes<T>* stage = buf.stage;
  // The tile's pixels lie dw pixels apart, too far for the hardware prefetcher: each row asks for the one two rows
  // on (its pixel's lanes; in channels_last, the first block asks for all channels of the pixel).
  const int64_t span = whole && c0 == 0 ? g.channels : lanes;
  auto prefetch_row = [&](int64_t a) {
    const int64_t r = row0 + a * g.dh - g.pad_h;
    if (a >= g.read_h || r < 0 || r >= g.rows) return;
    for (int64_t b = 0; b < g.read_w && col0 + b * g.dw - g.pad_w < g.cols; ++b) {
      if (col0 + b * g.dw < g.pad_w) continue;
      const T* pixel = image + r * g.x_stride[2] + (col0 + b * g.dw - g.pad_w) * g.x_stride[3];
      for (int64_t v = 0; v < span; v += 64 / sizeof(T)) __builtin_prefetch(pixel + v * g.x_stride[1]);
    }
  };
  prefetch_row(0);
  prefetch_row(1);
  for (int64_t a = 0; a < th; ++a) {  // real DFT of each row: stage[f][re|im][a]
    const int64_t r = row0 + a * g.dh - g.pad_h;
    if (a >= g.read_h || r < 0 || r >= g.rows) {  // a row of zeros
      for (int64_t f = 0; f < f_count; ++f) stage[f * 2 * th + a] = stage[f * 2 * th + th + a] = Lanes<T>{};
      continue;
    }
    prefetch_row(a + 2);
    std::fill(row, row + tw, Lanes<T>{});
    for (int64_t b = 0; b < g.read_w; ++b) {
      const int64_t c = col0 + b * g.dw - g.pad_w;
      if (c < 0) continue;
      if (c >= g.cols) break;
      const T* src = image + r * g.x_stride[2] + c * g.x_stride[3];
      if (whole) {
        std::memcpy(&row[b], src, sizeof(Lanes<T>));
      } else {
        for (int64_t v = 0; v < lanes; ++v) row[b][v] = src[v * g.x_stride[1]];
      }
    }
    apply_matrix<T>(dft.row.data(), 2 * f_count, tw, Operands<T>{row, row, tw, 1, stage + a, stage + th + a, f_count, 2 * th});
  }
  const T sign = g.conjugate ? T(-1) : T(1);
  for (int64_t f = 0; f < f_count; ++f) {  // complex DFT of each column, written as (count, P, C) pairs
    dft.col.run(stage + f * 2 * th, buf.column, buf.scratch);
    for (int64_t u = 0; u < th; ++u) {
      T* dst = spectrum + 2 * ((t * th * f_count + u * f_count + f) * g.channels + c0);
      const Lanes<T> re = buf.column[u], im = sign * buf.column[th + u];
      if (lanes == V) {
        T pairs[2 * V];
        for (int v = 0; v < V; ++v) {
          pairs[2 * v] = re[v];
          pairs[2 * v + 1] = im[v];
        }
        std::memcpy(dst, pairs, sizeof(pairs));
      } else {
        for (int64_t v = 0; v < lanes; ++v) {
          dst[2 * v] = re[v];
          dst[2 * v + 1] = im[v];
        }
      }
    }
  }
}

// Work item (tile t of the group, output channels [k0, k0 + kLanes)) of the inverse transform: the valid part of
// the tile, plus the bias, into y; in the adjoint, the whole tile added into the input gradient y.
template <typename T>
DENSECNN_ALWAYS_INLINE void inverse_item_impl(const FftGeometry& g, const DftMatrices<T>& dft,
                                                             const T* product, const T* bias, int64_t first,
                                                             int64_t count, T* y, int64_t t, int64_t k0,
                                                             TileBuffers<T>& buf) {
  constexpr int V = kLanes<T>;
  const int64_t th = g.th, f_count = g.freqs, lanes = std::min<int64_t>(V, g.out_channels - k0);
  int64_t n, row0, col0;
  tile_origin(g, first + t, n, row0, col0);
  Lanes<T>* stage = buf.stage;
  Lanes<T>* rows = buf.rows;
  constexpr int64_t kAhead = 16;  // frequencies lie count·K values apart: ask for the data that far ahead
  for (int64_t p = 0; p < th * f_count; ++p) {  // stage[f][re|im][u]
    const int64_t u = p / f_count, f = p % f_count;
    const T* src = product + 2 * ((p * count + t) * g.out_channels + k0);
    if (p + kAhead < th * f_count) {
      const T* next = src + 2 * kAhead * count * g.out_channels;
      __builtin_prefetch(next);
      __builtin_prefetch(next + 2 * lanes - 1);
    }
    Lanes<T>& re = stage[f * 2 * th + u];
    Lanes<T>& im = stage[f * 2 * th + th + u];
    if (lanes == V) {
      T pairs[2 * V];
      std::memcpy(pairs, src, sizeof(pairs));
      for (int v = 0; v < V; ++v) {
        re[v] = pairs[2 * v];
        im[v] = pairs[2 * v + 1];
      }
    } else {
      for (int64_t v = 0; v < lanes; ++v) {
        re[v] = src[2 * v];
        im[v] = src[2 * v + 1];
      }
    }
    if (g.conjugate) im = -im;
  }
  for (int64_t f = 0; f < f_count; ++f) {  // inverse DFT along h, written rows: rows[a][re|im][f]
    dft.inv_col.run(stage + f * 2 * th, buf.column, buf.scratch);
    for (int64_t a = 0; a < g.write_h; ++a) {
      rows[a * 2 * f_count + f] = buf.column[a];
      rows[a * 2 * f_count + f_count + f] = buf.column[th + a];
    }
  }
  Lanes<T> offset = {};
  for (int64_t v = 0; v < lanes && bias != nullptr; ++v) offset[v] = bias[k0 + v];
  // y's geometry: the output's, or in the adjoint the (unpadded) input's, whose pixel is the tile's less the padding
  const int64_t* stride = g.adjoint ? g.x_stride : g.y_stride;
  const int64_t y_rows = g.adjoint ? g.rows : g.out_rows, y_cols = g.adjoint ? g.cols : g.out_cols;
  const int64_t shift_h = g.adjoint ? g.pad_h : 0, shift_w = g.adjoint ? g.pad_w : 0;
  const bool whole = lanes == V && stride[1] == 1;
  T* image = y + n * stride[0] + k0 * stride[1];
  Lanes<T>* out = buf.row;
  auto prefetch_row = [&](int64_t a) {  // for writing, as in the forward transform
    const int64_t r = row0 + a * g.dh - shift_h;
    if (a >= g.write_h || r < 0 || r >= y_rows) return;
    for (int64_t b = 0; b < g.write_w && col0 + b * g.dw - shift_w < y_cols; ++b) {
      if (col0 + b * g.dw >= shift_w) __builtin_prefetch(image + r * stride[2] + (col0 + b * g.dw - shift_w) * stride[3], 1);
    }
  };
  prefetch_row(0);
  for (int64_t a = 0; a < g.write_h; ++a) {  // real inverse DFT along w, written columns, into y
    prefetch_row(a + 1);
    const int64_t r = row0 + a * g.dh - shift_h;
    if (r < 0) continue;
    if (r >= y_rows) break;
    apply_matrix<T>(dft.inv_row.data(), g.write_w, 2 * f_count, rows + a * 2 * f_count, out, 1);
    for (int64_t b = 0; b < g.write_w; ++b) {
      const int64_t c = col0 + b * g.dw - shift_w;
      if (c < 0) continue;
      if (c >= y_cols) break;
      T* dst = image + r * stride[2] + c * stride[3];
      Lanes<T> value = out[b] + offset;
      if (whole) {
        if (g.adjoint) {  // overlap-add: overlapping tiles (one sub-grid's) run in turn, never two at once
          Lanes<T> sum;
          std::memcpy(&sum, dst, sizeof(sum));
          value += sum;
        }
        std::memcpy(dst, &value, sizeof(value));
      } else if (g.adjoint) {
        for (int64_t v = 0; v < lanes; ++v) dst[v * stride[1]] += value[v];
      } else {
        for (int64_t v = 0; v < lanes; ++v) dst[v * stride[1]] = value[v];
      }
    }
  }
}

// The work items compiled for each ISA (everything they call is inlined into the clone).
#define DENSECNN_FFT_ITEMS(T)                                                                                     \
  DENSECNN_MULTIVERSION void forward_item(const FftGeometry& g, const DftMatrices<T>& dft, const T* x,            \
                                          int64_t first, int64_t count, T* spectrum, int64_t t, int64_t c0,       \
                                          TileBuffers<T>& buf) {                                                  \
    forward_item_impl<T>(g, dft, x, first, count, spectrum, t, c0, buf);                                          \
  }                                                                                                               \
  DENSECNN_MULTIVERSION void inverse_item(const FftGeometry& g, const DftMatrices<T>& dft, const T* product,      \
                                          const T* bias, int64_t first, int64_t count, T* y, int64_t t,           \
                                          int64_t k0, TileBuffers<T>& buf) {                                      \
    inverse_item_impl<T>(g, dft, product, bias, first, count, y, t, k0, buf);                                     \
  }
DENSECNN_FFT_ITEMS(float)
DENSECNN_FFT_ITEMS(double)

// Forward transform of tiles [first, first + count), all channels, into spectrum (count, P, C, 2).
template <typename T>
void forward_tiles(const FftGeometry& g, const T* x, int64_t first, int64_t count, T* spectrum) {
  const DftMatrices<T> dft(g);
  const int64_t blocks = (g.channels + kLanes<T> - 1) / kLanes<T>;
  at::parallel_for(0, count * blocks, 1, [&](int64_t begin, int64_t end) {
    TileBuffers<T> buf(g);
    for (int64_t item = begin; item < end; ++item) {
      forward_item(g, dft, x, first, count, spectrum, item / blocks, item % blocks * kLanes<T>, buf);
    }
  });
}

// Inverse transform of the product spectrum (P, count, K, 2) of tiles [first, first + count).
template <typename T>
void inverse_tiles(const FftGeometry& g, const T* product, const T* bias, int64_t first, int64_t count, T* y) {
  const DftMatrices<T> dft(g);
  const int64_t blocks = (g.out_channels + kLanes<T> - 1) / kLanes<T>;
  at::parallel_for(0, count * blocks, 1, [&](int64_t begin, int64_t end) {
    TileBuffers<T> buf(g);
    for (int64_t item = begin; item < end; ++item) {
      inverse_item(g, dft, product, bias, first, count, y, item / blocks, item % blocks * kLanes<T>, buf);
    }
  });
}

// The adjoint's inverse transform of the product spectrum (P, count, C, 2) of tiles [first, first + count): each
// whole tile added into the input gradient y. Tiles of one sub-grid overlap, those of different sub-grids never
// do: one work item is a sub-grid and a block of channels, and takes that sub-grid's tiles in turn.
template <typename T>
void adjoint_tiles(const FftGeometry& g, const T* product, int64_t first, int64_t count, T* y) {
  const DftMatrices<T> dft(g);
  const int64_t blocks = (g.out_channels + kLanes<T> - 1) / kLanes<T>;
  const int64_t per_grid = g.tiles_h * g.tiles_w, first_grid = first / per_grid;
  const int64_t grids = (first + count - 1) / per_grid - first_grid + 1;
  at::parallel_for(0, grids * blocks, 1, [&](int64_t begin, int64_t end) {
    TileBuffers<T> buf(g);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t grid = first_grid + item / blocks;
      const int64_t lo = std::max(first, grid * per_grid) - first;
      const int64_t hi = std::min(first + count, (grid + 1) * per_grid) - first;
      for (int64_t t = lo; t < hi; ++t) {
        inverse_item(g, dft, product, nullptr, first, count, y, t, item % blocks * kLanes<T>, buf);
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
      if (!gpu_loops_on_cpu()) {
        if (g.adjoint) return adjoint_tiles<scalar_t>(g, src, first, count, dst);
        return inverse_tiles<scalar_t>(g, src, b, first, count, dst);
      }
      const Twiddles<scalar_t> w = twiddles_of(g, twiddles.const_data_ptr<scalar_t>());
      std::vector<scalar_t> cols(2 * fft_inverse_cols_size(g, count));
      for_each_element(fft_inverse_cols_size(g, count),
                       [&](int64_t e) { fft_inverse_cols_at(g, src, count, w, cols.data(), e); });
      if (!g.adjoint) {
        return for_each_element(fft_inverse_rows_size(g, count),
                                [&](int64_t e) { fft_inverse_rows_at(g, cols.data(), b, first, w, dst, e); });
      }
      std::vector<scalar_t> tiles(fft_inverse_rows_size(g, count));  // (count, C, th, tw), then overlap-added
      for_each_element(fft_inverse_rows_size(g, count),
                       [&](int64_t e) { fft_inverse_rows_at(g, cols.data(), b, first, w, tiles.data(), e); });
      for_each_element(fft_overlap_add_size(g),
                       [&](int64_t e) { fft_overlap_add_at(g, tiles.data(), first, count, dst, e); });
    });
  }
};

at::Tensor fft_conv2d_cpu(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& spectrum,
                          const c10::optional<at::Tensor>& bias, at::IntArrayRef tile, at::IntArrayRef valid,
                          at::IntArrayRef dilation, at::IntArrayRef padding) {
  return std::get<0>(fft_conv2d_tiles<CpuTransforms>(input, weight, spectrum, bias, tile, valid, dilation, padding));
}

at::Tensor fft_conv2d_weight_spectrum_cpu(const at::Tensor& input, const at::Tensor& grad_output, at::IntArrayRef tile,
                                          at::IntArrayRef valid, at::IntArrayRef dilation) {
  return fft_conv2d_weight_spectrum_tiles<CpuTransforms>(input, grad_output, tile, valid, dilation);
}

at::Tensor fft_conv2d_input_grad_cpu(const at::Tensor& grad_output, const at::Tensor& spectrum,
                                     at::IntArrayRef input_size, at::IntArrayRef tile, at::IntArrayRef valid,
                                     at::IntArrayRef dilation, at::IntArrayRef padding) {
  return fft_conv2d_input_grad_tiles<CpuTransforms>(grad_output, spectrum, input_size, tile, valid, dilation, padding);
}

std::tuple<at::Tensor, at::Tensor> fft_conv2d_with_input_spectra_cpu(const at::Tensor& input, const at::Tensor& weight,
                                                                     const at::Tensor& spectrum,
                                                                     const c10::optional<at::Tensor>& bias,
                                                                     at::IntArrayRef tile, at::IntArrayRef valid,
                                                                     at::IntArrayRef dilation) {
  return fft_conv2d_tiles<CpuTransforms>(input, weight, spectrum, bias, tile, valid, dilation, {0, 0}, true);
}

std::tuple<at::Tensor, at::Tensor> fft_conv2d_backward_cpu(const at::Tensor& input, const at::Tensor& grad_output,
                                                           const at::Tensor& spectrum, at::IntArrayRef tile,
                                                           at::IntArrayRef valid, at::IntArrayRef dilation,
                                                           const c10::optional<at::Tensor>& input_spectra) {
  return fft_conv2d_backward_tiles<CpuTransforms>(input, grad_output, spectrum, tile, valid, dilation, input_spectra);
}

}  // namespace

TORCH_LIBRARY_IMPL(densecnn, CPU, m) {
  m.impl("fft_conv2d_backward", &fft_conv2d_backward_cpu);
  m.impl("fft_conv2d_with_input_spectra", &fft_conv2d_with_input_spectra_cpu);
  m.impl("fft_conv2d_input_grad", &fft_conv2d_input_grad_cpu);
  m.impl("fft_conv2d", &fft_conv2d_cpu);
  m.impl("fft_conv2d_weight_spectrum", &fft_conv2d_weight_spectrum_cpu);
}

}  // namespace densecnn
