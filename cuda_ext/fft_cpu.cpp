// CPU tile transforms of the frequency-domain convolution (fft_driver.h). One work item is one tile and a block of
// kLanes channels: the tile is read once, and every transform along an axis is an FFT (its twiddles in L1) on
// vectors of kLanes channels, so the arithmetic vectorises across channels and the spectrum is written in the
// GEMM's layout, channels innermost. The inverse reads the product spectrum the same way and writes the valid part
// of each tile, plus the bias, straight into the output, in either memory format.
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

// A vector of channel lanes, B bytes (kVecBytes of the level that runs: cpu_isa.h). A work item takes kLanes
// channels, one 64-byte vector's worth, in vectors of its level's width.
template <typename T, int B>
using Lanes = Vec<T, B>;
template <typename T>
constexpr int kLanes = lanes<T>();  // channels per work item

// Where a small matrix reads its input vectors and writes its output vectors: input j is in_a[j·in_stride] for
// j < in_split, else in_b[(j - in_split)·in_stride]; output row r goes to out_a[r·out_stride] for r < out_split,
// else out_b[(r - out_split)·out_stride] (the real and imaginary halves of a complex vector may lie apart).
template <typename T, int B>
struct Operands {
  const Lanes<T, B>* in_a;
  const Lanes<T, B>* in_b;
  int64_t in_split, in_stride;
  Lanes<T, B>* out_a;
  Lanes<T, B>* out_b;
  int64_t out_split, out_stride;
};

// Rows [r, r + K) of out = m · in (m is rows × inner), K independent sums in flight.
template <typename T, int B, int K>
DENSECNN_ALWAYS_INLINE void apply_rows(const T* m, int64_t r, int64_t inner, const Operands<T, B>& o) {
  Lanes<T, B> acc[K] = {};
  for (int64_t j = 0; j < o.in_split; ++j) {
    const Lanes<T, B> x = o.in_a[j * o.in_stride];
#pragma GCC unroll 8
    for (int i = 0; i < K; ++i) acc[i] += m[(r + i) * inner + j] * x;
  }
  for (int64_t j = o.in_split; j < inner; ++j) {
    const Lanes<T, B> x = o.in_b[(j - o.in_split) * o.in_stride];
#pragma GCC unroll 8
    for (int i = 0; i < K; ++i) acc[i] += m[(r + i) * inner + j] * x;
  }
#pragma GCC unroll 8
  for (int i = 0; i < K; ++i) {
    const int64_t row = r + i;
    Lanes<T, B>* dst = row < o.out_split ? o.out_a + row * o.out_stride : o.out_b + (row - o.out_split) * o.out_stride;
    *dst = acc[i];
  }
}

// out = m · in for a (rows × inner) matrix m on vectors of channel lanes: blocks of 8 rows, then 4, 2, 1.
template <typename T, int B>
DENSECNN_ALWAYS_INLINE void apply_matrix(const T* m, int64_t rows, int64_t inner, const Operands<T, B>& o) {
  int64_t r = 0;
  for (; r + 8 <= rows; r += 8) apply_rows<T, B, 8>(m, r, inner, o);
  if (r + 4 <= rows) apply_rows<T, B, 4>(m, r, inner, o), r += 4;
  if (r + 2 <= rows) apply_rows<T, B, 2>(m, r, inner, o), r += 2;
  if (r < rows) apply_rows<T, B, 1>(m, r, inner, o);
}

// The common case: contiguous input, output rows out_stride apart.
template <typename T, int B>
DENSECNN_ALWAYS_INLINE void apply_matrix(const T* m, int64_t rows, int64_t inner, const Lanes<T, B>* in,
                                                        Lanes<T, B>* out, int64_t out_stride) {
  apply_matrix<T, B>(m, rows, inner, Operands<T, B>{in, in, inner, 1, out, out, rows, out_stride});
}

// re[a·cols + b] + i·im[a·cols + b] = e^{direction·2πi·ab/length} for a < rows, b < cols, computed in double and
// rounded to T: an FFT stage's twiddles, an odd radix's cosines and sines.
template <typename T>
void roots_of_unity(int64_t rows, int64_t cols, int64_t length, int direction, std::vector<T>& re,
                    std::vector<T>& im) {
  const double pi = std::acos(-1.0);
  re.resize(rows * cols);
  im.resize(rows * cols);
  for (int64_t a = 0; a < rows; ++a) {
    for (int64_t b = 0; b < cols; ++b) {
      const double angle = 2 * pi * static_cast<double>(a * b % length) / length;
      re[a * cols + b] = static_cast<T>(std::cos(angle));
      im[a * cols + b] = static_cast<T>(direction * std::sin(angle));
    }
  }
}

// A length-n complex DFT with exponent sign σ on vectors of channel lanes, by the Stockham autosort FFT: one stage
// per factor r of n (fours first, then twos, then odd primes), each reading one buffer and writing the other in
// natural order. A stage of length L (n = L·s, s the product of the radices before it) takes, for p < L/r and every
// q < s, the r inputs q + s(p + t·L/r), their r-point DFT (written out for r = 2 and 4; an odd r pairs t with r - t,
// so that each output needs (r-1)/2 cosine and sine sums), and writes output u times w_L^(p·u) to q + s(r·p + u).
// O(n·Σr) operations per vector where a DFT matrix takes 4n² (densecnn/ops/fft_conv.py counts them for the
// tile-size model).
template <typename T>
struct ComplexFft {
  static constexpr int kMaxHalf = 32;  // odd radices up to 65 (tiles are at most 64)
  struct Stage {
    int64_t radix, length, stride;
    std::vector<T> twiddle_re, twiddle_im;  // w_length^(p·u) for p < length/radix, u < radix: [p·radix + u]
    std::vector<T> cos_tu, sin_tu;          // odd radix: cos(2π·t·u/r) and σ·sin(2π·t·u/r), [t·radix + u]
  };
  int64_t n;
  T sign;
  std::vector<Stage> stages;

  ComplexFft(int64_t length, int direction) : n(length), sign(static_cast<T>(direction)) {
    std::vector<int64_t> radices;
    int64_t rest = n;
    while (rest % 4 == 0) radices.push_back(4), rest /= 4;
    while (rest % 2 == 0) radices.push_back(2), rest /= 2;
    for (int64_t f = 3; rest > 1; f += 2) {
      while (rest % f == 0) radices.push_back(f), rest /= f;
    }
    TORCH_CHECK(radices.empty() || *std::max_element(radices.begin(), radices.end()) <= 2 * kMaxHalf + 1,
                "densecnn.fft_conv2d: a tile side of ", n, " has a prime factor above ", 2 * kMaxHalf + 1);
    int64_t stage_length = n, stride = 1;
    for (int64_t r : radices) {
      Stage s{r, stage_length, stride, {}, {}, {}, {}};
      const int64_t m = stage_length / r;
      roots_of_unity(m, r, stage_length, direction, s.twiddle_re, s.twiddle_im);
      if (r % 2) roots_of_unity(r, r, r, direction, s.cos_tu, s.sin_tu);
      stages.push_back(std::move(s));
      stage_length = m;
      stride *= r;
    }
  }

  // out = DFT(in): input m's parts at in_re[m·in_stride], in_im[m·in_stride], output k's at out_re[k·out_stride],
  // out_im[k·out_stride]; `scratch` holds 4n vectors.
  template <int B>
  DENSECNN_ALWAYS_INLINE void run(const Lanes<T, B>* in_re, const Lanes<T, B>* in_im, int64_t in_stride, Lanes<T, B>* out_re,
                                  Lanes<T, B>* out_im, int64_t out_stride, Lanes<T, B>* scratch) const {
    Lanes<T, B>* x = scratch;      // re block of n, then im block of n
    Lanes<T, B>* y = scratch + 2 * n;
    for (int64_t m = 0; m < n; ++m) {
      x[m] = in_re[m * in_stride];
      x[n + m] = in_im[m * in_stride];
    }
    for (const Stage& s : stages) {
      if (s.radix == 4) {
        radix4<B>(s, x, y);
      } else if (s.radix == 2) {
        radix2<B>(s, x, y);
      } else {
        radix_odd<B>(s, x, y);
      }
      std::swap(x, y);
    }
    for (int64_t k = 0; k < n; ++k) {
      out_re[k * out_stride] = x[k];
      out_im[k * out_stride] = x[n + k];
    }
  }

  // out (re block of n, im block of n) = DFT(in) (same layout).
  template <int B>
  DENSECNN_ALWAYS_INLINE void run(const Lanes<T, B>* in, Lanes<T, B>* out, Lanes<T, B>* scratch) const {
    run<B>(in, in + n, 1, out, out + n, 1, scratch);
  }

 private:
  // y[at] = (re, im) · w, w = (wr, wi)
  template <int B>
  static DENSECNN_ALWAYS_INLINE void store(Lanes<T, B>* y, int64_t n_, int64_t at, Lanes<T, B> re, Lanes<T, B> im, T wr,
                                           T wi) {
    y[at] = re * wr - im * wi;
    y[n_ + at] = re * wi + im * wr;
  }

  template <int B>
  DENSECNN_ALWAYS_INLINE void radix2(const Stage& s, const Lanes<T, B>* x, Lanes<T, B>* y) const {
    const int64_t m = s.length / 2, st = s.stride;
    for (int64_t p = 0; p < m; ++p) {
      const T wr = s.twiddle_re[2 * p + 1], wi = s.twiddle_im[2 * p + 1];
      for (int64_t q = 0; q < st; ++q) {
        const int64_t a = q + st * p, b = a + st * m, out = q + st * 2 * p;
        const Lanes<T, B> ar = x[a], ai = x[n + a], br = x[b], bi = x[n + b];
        y[out] = ar + br;
        y[n + out] = ai + bi;
        store<B>(y, n, out + st, ar - br, ai - bi, wr, wi);
      }
    }
  }

  template <int B>
  DENSECNN_ALWAYS_INLINE void radix4(const Stage& s, const Lanes<T, B>* x, Lanes<T, B>* y) const {
    const int64_t m = s.length / 4, st = s.stride;
    for (int64_t p = 0; p < m; ++p) {
      const T* wr = &s.twiddle_re[4 * p];
      const T* wi = &s.twiddle_im[4 * p];
      for (int64_t q = 0; q < st; ++q) {
        const int64_t i0 = q + st * p, out = q + st * 4 * p;
        const int64_t i1 = i0 + st * m, i2 = i1 + st * m, i3 = i2 + st * m;
        const Lanes<T, B> s02r = x[i0] + x[i2], s02i = x[n + i0] + x[n + i2];
        const Lanes<T, B> d02r = x[i0] - x[i2], d02i = x[n + i0] - x[n + i2];
        const Lanes<T, B> s13r = x[i1] + x[i3], s13i = x[n + i1] + x[n + i3];
        const Lanes<T, B> d13r = x[i1] - x[i3], d13i = x[n + i1] - x[n + i3];
        // σi·(d13): (-σ·d13i, σ·d13r)
        const Lanes<T, B> rot_r = -sign * d13i, rot_i = sign * d13r;
        y[out] = s02r + s13r;
        y[n + out] = s02i + s13i;
        store<B>(y, n, out + st, d02r + rot_r, d02i + rot_i, wr[1], wi[1]);
        store<B>(y, n, out + 2 * st, s02r - s13r, s02i - s13i, wr[2], wi[2]);
        store<B>(y, n, out + 3 * st, d02r - rot_r, d02i - rot_i, wr[3], wi[3]);
      }
    }
  }

  template <int B>
  DENSECNN_ALWAYS_INLINE void radix_odd(const Stage& s, const Lanes<T, B>* x, Lanes<T, B>* y) const {
    const int64_t r = s.radix, half = r / 2, m = s.length / r, st = s.stride;
    Lanes<T, B> sum_r[kMaxHalf + 1], sum_i[kMaxHalf + 1], diff_r[kMaxHalf + 1], diff_i[kMaxHalf + 1];
    for (int64_t p = 0; p < m; ++p) {
      for (int64_t q = 0; q < st; ++q) {
        const int64_t i0 = q + st * p, out = q + st * r * p;
        const Lanes<T, B> x0r = x[i0], x0i = x[n + i0];
        Lanes<T, B> total_r = x0r, total_i = x0i;
        for (int64_t t = 1; t <= half; ++t) {  // pair input t with input r - t
          const int64_t a = i0 + st * m * t, b = i0 + st * m * (r - t);
          sum_r[t] = x[a] + x[b];
          sum_i[t] = x[n + a] + x[n + b];
          diff_r[t] = x[a] - x[b];
          diff_i[t] = x[n + a] - x[n + b];
          total_r += sum_r[t];
          total_i += sum_i[t];
        }
        y[out] = total_r;
        y[n + out] = total_i;
        for (int64_t u = 1; u <= half; ++u) {
          // output u = x0 + Σ_t cos·sum_t + i·Σ_t σ·sin·diff_t; output r - u the same with the second sum negated
          Lanes<T, B> c_r = x0r, c_i = x0i, s_r = {}, s_i = {};
          for (int64_t t = 1; t <= half; ++t) {
            const T c = s.cos_tu[t * r + u], sn = s.sin_tu[t * r + u];
            c_r += c * sum_r[t];
            c_i += c * sum_i[t];
            s_r += sn * diff_r[t];
            s_i += sn * diff_i[t];
          }
          const int64_t w = p * r;
          store<B>(y, n, out + st * u, c_r - s_i, c_i + s_r, s.twiddle_re[w + u], s.twiddle_im[w + u]);
          store<B>(y, n, out + st * (r - u), c_r + s_i, c_i - s_r, s.twiddle_re[w + r - u], s.twiddle_im[w + r - u]);
        }
      }
    }
  }
};

// The length-n real DFT along w on vectors of channel lanes, F = n/2 + 1 frequencies, and its inverse for a real
// signal (the Hermitian extension of F frequencies; the imaginary parts of the first and, for even n, the last are
// left out, as a real signal has none). An even n packs the even and odd samples as the real and imaginary parts of
// n/2 complex ones, takes their length-n/2 DFT (ComplexFft) and splits the two spectra with one butterfly per
// frequency (the inverse runs the same steps backwards). An odd n keeps the plain matrices.
template <typename T>
struct RealDft {
  int64_t n, freqs, half;
  ComplexFft<T> forward_half, inverse_half;  // length n/2 (even n)
  std::vector<T> cos_k, sin_k;               // cos(2πk/n), sin(2πk/n), k < F
  std::vector<T> forward_matrix, inverse_matrix;  // odd n: (2F, n) and (n, 2F), the inverse unscaled
  T scale;                                   // the inverse's factor

  // `scale`: the inverse's factor on top of the DFT's own 1/n.
  RealDft(int64_t length, double inverse_scale)
      : n(length), freqs(length / 2 + 1), half(length / 2), forward_half(std::max<int64_t>(half, 1), -1),
        inverse_half(std::max<int64_t>(half, 1), 1) {
    const double pi = std::acos(-1.0);
    auto angle = [&](int64_t m) { return 2 * pi * static_cast<double>(m % n) / n; };
    cos_k.resize(freqs);
    sin_k.resize(freqs);
    for (int64_t k = 0; k < freqs; ++k) {
      cos_k[k] = static_cast<T>(std::cos(angle(k)));
      sin_k[k] = static_cast<T>(std::sin(angle(k)));
    }
    if (n % 2 == 0) {
      scale = static_cast<T>(inverse_scale / static_cast<double>(n));
      return;
    }
    scale = T(1);
    forward_matrix.resize(2 * freqs * n);
    inverse_matrix.resize(n * 2 * freqs);
    for (int64_t f = 0; f < freqs; ++f) {
      for (int64_t b = 0; b < n; ++b) {
        forward_matrix[f * n + b] = static_cast<T>(std::cos(angle(f * b)));
        forward_matrix[(freqs + f) * n + b] = static_cast<T>(-std::sin(angle(f * b)));
        const double weight = (f == 0 ? 1.0 : 2.0) * inverse_scale / static_cast<double>(n);
        inverse_matrix[b * 2 * freqs + f] = static_cast<T>(weight * std::cos(angle(f * b)));
        inverse_matrix[b * 2 * freqs + freqs + f] = static_cast<T>(-weight * std::sin(angle(f * b)));
      }
    }
  }

  // Frequency k of the n real vectors `in` to out_re[k·out_stride], out_im[k·out_stride]; `scratch`: 3n vectors.
  template <int B>
  DENSECNN_ALWAYS_INLINE void forward(const Lanes<T, B>* in, Lanes<T, B>* out_re, Lanes<T, B>* out_im, int64_t out_stride,
                                      Lanes<T, B>* scratch) const {
    if (n % 2) {
      return apply_matrix<T, B>(forward_matrix.data(), 2 * freqs, n,
                                Operands<T, B>{in, in, n, 1, out_re, out_im, freqs, out_stride});
    }
    // z = DFT(even + i·odd); frequency k: E = (z[k] + conj z[-k]) / 2, O = (z[k] - conj z[-k]) / 2i, X = E + w^k O
    Lanes<T, B>* z_re = scratch;
    Lanes<T, B>* z_im = scratch + half;
    forward_half.template run<B>(in, in + 1, 2, z_re, z_im, 1, scratch + 2 * half);
    for (int64_t k = 0; k < freqs; ++k) {
      const int64_t p = k % half, q = (half - k) % half;
      const Lanes<T, B> a = z_re[p], b = z_im[p], c = z_re[q], d = z_im[q];
      const Lanes<T, B> e_re = T(0.5) * (a + c), e_im = T(0.5) * (b - d);
      const Lanes<T, B> o_re = T(0.5) * (b + d), o_im = T(0.5) * (c - a);
      const T wc = cos_k[k], ws = sin_k[k];  // w^k = wc - i·ws
      out_re[k * out_stride] = e_re + wc * o_re + ws * o_im;
      out_im[k * out_stride] = e_im + wc * o_im - ws * o_re;
    }
  }

  // out[0, count) (n vectors of room) = scale · the inverse DFT of the F frequencies re[k], im[k] (contiguous);
  // an even n computes all n; `scratch`: 3n vectors.
  template <int B>
  DENSECNN_ALWAYS_INLINE void inverse(const Lanes<T, B>* re, const Lanes<T, B>* im, Lanes<T, B>* out, int64_t count,
                                      Lanes<T, B>* scratch) const {
    if (n % 2) {
      return apply_matrix<T, B>(inverse_matrix.data(), count, 2 * freqs,
                                Operands<T, B>{re, im, freqs, 1, out, out, n, 1});
    }
    // Z[k] = E + i·O with E = X[k] + X[k + n/2], O = (X[k] - X[k + n/2]) w^-k and X[k + n/2] = conj X[n/2 - k]; then
    // even + i·odd = the inverse DFT of Z
    Lanes<T, B>* z_re = scratch;
    Lanes<T, B>* z_im = scratch + half;
    for (int64_t k = 0; k < half; ++k) {
      const Lanes<T, B> p_re = re[k], q_re = re[half - k];
      const Lanes<T, B> p_im = k ? im[k] : Lanes<T, B>{}, q_im = k ? -im[half - k] : Lanes<T, B>{};
      const Lanes<T, B> e_re = p_re + q_re, e_im = p_im + q_im, d_re = p_re - q_re, d_im = p_im - q_im;
      const T wc = cos_k[k], ws = sin_k[k];  // w^-k = wc + i·ws
      const Lanes<T, B> o_re = d_re * wc - d_im * ws, o_im = d_re * ws + d_im * wc;
      z_re[k] = scale * (e_re - o_im);
      z_im[k] = scale * (e_im + o_re);
    }
    inverse_half.template run<B>(z_re, z_im, 1, out, out + 1, 2, scratch + 2 * half);
  }
};

// The transforms of one tile size, their matrices and twiddles computed in double and rounded to T.
template <typename T>
struct DftMatrices {
  ComplexFft<T> col, inv_col;  // the complex DFTs along h, forward and inverse
  RealDft<T> row;              // the real DFT along w; its inverse scaled by 1/th, the h inverse's share

  explicit DftMatrices(const FftGeometry& g)
      : col(g.th, -1), inv_col(g.th, 1), row(g.tw, 1.0 / static_cast<double>(g.th)) {}
};

// Per-thread buffers of the transforms, each sized in 64-byte vectors of channel lanes (held as scalars: a
// std::vector of the vector type would drop its alignment attribute); a level with narrower vectors uses part of each
// (as<B>).
template <typename T>
struct TileBuffers {
  std::vector<T> storage;
  T *row, *stage, *rows, *column, *scratch, *row_scratch;
  explicit TileBuffers(const FftGeometry& g) {
    const int64_t sizes[6] = {std::max<int64_t>(g.tw, g.write_w), g.freqs * 2 * g.th, g.write_h * 2 * g.freqs,
                              2 * g.th, 4 * g.th, 3 * g.tw};
    storage.assign((sizes[0] + sizes[1] + sizes[2] + sizes[3] + sizes[4] + sizes[5]) * kLanes<T>, T(0));
    T* next = storage.data();
    T** slots[6] = {&row, &stage, &rows, &column, &scratch, &row_scratch};
    for (int i = 0; i < 6; ++i) {
      *slots[i] = next;
      next += sizes[i] * kLanes<T>;
    }
  }
  // The buffers as vectors of B bytes, in the order of the members above.
  template <int B>
  struct Views {
    Lanes<T, B> *row, *stage, *rows, *column, *scratch, *row_scratch;
  };
  template <int B>
  DENSECNN_ALWAYS_INLINE Views<B> as() {
    auto view = [](T* buffer) { return reinterpret_cast<Lanes<T, B>*>(buffer); };
    return {view(row), view(stage), view(rows), view(column), view(scratch), view(row_scratch)};
  }
};

// Work item (tile t of the group, channels [c0, c0 + kLanes)) of the forward transform: spectrum (count, P, C, 2),
// each tile's spectrum in one block (the GEMM reads it per frequency with a row stride of P·C).
template <typename T, int B>
DENSECNN_ALWAYS_INLINE void forward_item_impl(const FftGeometry& g, const DftMatrices<T>& dft,
                                                             const T* x, int64_t first, int64_t count, T* spectrum,
                                                             int64_t t, int64_t c0, TileBuffers<T>& buf) {
  constexpr int V = lanes<T, B>();
  const int64_t th = g.th, tw = g.tw, f_count = g.freqs, lanes = std::min<int64_t>(V, g.channels - c0);
  const bool whole = lanes == V && g.x_stride[1] == 1;  // channels_last with a full block: one vector load
  int64_t n, row0, col0;
  tile_origin(g, first + t, n, row0, col0);
  const T* image = x + n * g.x_stride[0] + c0 * g.x_stride[1];
  const auto [row, stage, rows, column, scratch, row_scratch] = buf.template as<B>();
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
      for (int64_t f = 0; f < f_count; ++f) stage[f * 2 * th + a] = stage[f * 2 * th + th + a] = Lanes<T, B>{};
      continue;
    }
    prefetch_row(a + 2);
    std::fill(row, row + tw, Lanes<T, B>{});
    for (int64_t b = 0; b < g.read_w; ++b) {
      const int64_t c = col0 + b * g.dw - g.pad_w;
      if (c < 0) continue;
      if (c >= g.cols) break;
      const T* src = image + r * g.x_stride[2] + c * g.x_stride[3];
      if (whole) {
        std::memcpy(&row[b], src, sizeof(Lanes<T, B>));
      } else {
        for (int64_t v = 0; v < lanes; ++v) row[b][v] = src[v * g.x_stride[1]];
      }
    }
    dft.row.template forward<B>(row, stage + a, stage + th + a, 2 * th, row_scratch);
  }
  const T sign = g.conjugate ? T(-1) : T(1);
  for (int64_t f = 0; f < f_count; ++f) {  // complex DFT of each column, written as (count, P, C) pairs
    dft.col.template run<B>(stage + f * 2 * th, column, scratch);
    for (int64_t u = 0; u < th; ++u) {
      T* dst = spectrum + 2 * ((t * th * f_count + u * f_count + f) * g.channels + c0);
      const Lanes<T, B> re = column[u], im = sign * column[th + u];
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
template <typename T, int B>
DENSECNN_ALWAYS_INLINE void inverse_item_impl(const FftGeometry& g, const DftMatrices<T>& dft,
                                                             const T* product, const T* bias, int64_t first,
                                                             int64_t count, T* y, int64_t t, int64_t k0,
                                                             TileBuffers<T>& buf) {
  constexpr int V = lanes<T, B>();
  const int64_t th = g.th, f_count = g.freqs, lanes = std::min<int64_t>(V, g.out_channels - k0);
  int64_t n, row0, col0;
  tile_origin(g, first + t, n, row0, col0);
  const auto [out, stage, rows, column, scratch, row_scratch] = buf.template as<B>();  // out: the row buffer
  constexpr int64_t kAhead = 16;  // frequencies lie count·K values apart: ask for the data that far ahead
  for (int64_t p = 0; p < th * f_count; ++p) {  // stage[f][re|im][u]
    const int64_t u = p / f_count, f = p % f_count;
    const T* src = product + 2 * ((p * count + t) * g.out_channels + k0);
    if (p + kAhead < th * f_count) {
      const T* next = src + 2 * kAhead * count * g.out_channels;
      __builtin_prefetch(next);
      __builtin_prefetch(next + 2 * lanes - 1);
    }
    Lanes<T, B>& re = stage[f * 2 * th + u];
    Lanes<T, B>& im = stage[f * 2 * th + th + u];
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
    dft.inv_col.template run<B>(stage + f * 2 * th, column, scratch);
    for (int64_t a = 0; a < g.write_h; ++a) {
      rows[a * 2 * f_count + f] = column[a];
      rows[a * 2 * f_count + f_count + f] = column[th + a];
    }
  }
  Lanes<T, B> offset = {};
  for (int64_t v = 0; v < lanes && bias != nullptr; ++v) offset[v] = bias[k0 + v];
  // y's geometry: the output's, or in the adjoint the (unpadded) input's, whose pixel is the tile's less the padding
  const int64_t* stride = g.adjoint ? g.x_stride : g.y_stride;
  const int64_t y_rows = g.adjoint ? g.rows : g.out_rows, y_cols = g.adjoint ? g.cols : g.out_cols;
  const int64_t shift_h = g.adjoint ? g.pad_h : 0, shift_w = g.adjoint ? g.pad_w : 0;
  const bool whole = lanes == V && stride[1] == 1;
  T* image = y + n * stride[0] + k0 * stride[1];
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
    dft.row.template inverse<B>(rows + a * 2 * f_count, rows + a * 2 * f_count + f_count, out, g.write_w,
                                row_scratch);
    for (int64_t b = 0; b < g.write_w; ++b) {
      const int64_t c = col0 + b * g.dw - shift_w;
      if (c < 0) continue;
      if (c >= y_cols) break;
      T* dst = image + r * stride[2] + c * stride[3];
      Lanes<T, B> value = out[b] + offset;
      if (whole) {
        if (g.adjoint) {  // overlap-add: overlapping tiles (one sub-grid's) run in turn, never two at once
          Lanes<T, B> sum;
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

// The work items compiled for each level (everything they call is inlined into them): the item's kLanes channels
// in vectors of the level's width.
#define DENSECNN_FFT_ITEMS(T)                                                                                      \
  DENSECNN_PER_LEVEL((void forward_item(const FftGeometry& g, const DftMatrices<T>& dft, const T* x, int64_t first, \
                                        int64_t count, T* spectrum, int64_t t, int64_t c0, TileBuffers<T>& buf)), \
                     const int64_t end = std::min<int64_t>(c0 + kLanes<T>, g.channels);                           \
                     for (int64_t c = c0; c < end; c += lanes<T, kVecBytes>()) {                                  \
                       forward_item_impl<T, kVecBytes>(g, dft, x, first, count, spectrum, t, c, buf);             \
                     })                                                                                           \
  DENSECNN_PER_LEVEL((void inverse_item(const FftGeometry& g, const DftMatrices<T>& dft, const T* product,         \
                                        const T* bias, int64_t first, int64_t count, T* y, int64_t t, int64_t k0, \
                                        TileBuffers<T>& buf)),                                                    \
                     const int64_t end = std::min<int64_t>(k0 + kLanes<T>, g.out_channels);                       \
                     for (int64_t k = k0; k < end; k += lanes<T, kVecBytes>()) {                                  \
                       inverse_item_impl<T, kVecBytes>(g, dft, product, bias, first, count, y, t, k, buf);        \
                     })
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

std::tuple<at::Tensor, at::Tensor, at::Tensor> fft_conv2d_backward_cpu(
    const at::Tensor& input, const at::Tensor& grad_output, const at::Tensor& spectrum, at::IntArrayRef tile,
    at::IntArrayRef valid, at::IntArrayRef dilation, const c10::optional<at::Tensor>& input_spectra) {
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
