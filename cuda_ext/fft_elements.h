// The frequency-domain convolution's tile transforms (the `fft` solver, densecnn/ops/fft_conv.py): geometry and the
// per-element bodies that the CUDA kernels (fft_kernels.cu) run and that the CPU runs when the tests switch it to the
// GPU's loop structure (gpu_loops.h). The CPU's own loops (fft_cpu.cpp) compute the same sums, blocked over lanes of
// channels.
//
// A stride-1 conv with dilation (dh, dw) reads one of the dh×dw interleaved sub-grids of its input. Each sub-grid is
// cut into overlapping th×tw tiles (overlap-save): tile (ti, tj) of sub-grid (r, s) of image n holds input pixels
// (row0 + a·dh, col0 + b·dw) for a < th, b < tw, with row0 = ti·sh·dh + r and col0 = tj·sw·dw + s (zero past the
// image; a padded input is read as if its pad_h, pad_w zero rows and columns were there), and its first sh×sw
// outputs of the circular correlation are the outputs at the same places. Tiles are
// numbered (n, r, s, ti, tj), last fastest, and handled in groups of consecutive tiles.
//
// The spectra are complex, stored as (re, im) pairs: the input's (tiles, P, C), the product's (P, tiles, K), for the
// frequency p = u·F + f (u < th along h; f < F = tw/2 + 1 along w, the real DFT's half spectrum).
//   forward:  X[u, f] = Σ_a Σ_b x[a, b] · e^{-2πi (u·a/th + f·b/tw)}
//   inverse:  y[a, b] = 1/(th·tw) · Σ_f c_f · Re(Σ_u Y[u, f] · e^{+2πi (u·a/th + f·b/tw)}) + bias
// with c_f = 1 for f = 0 and the Nyquist frequency, 2 otherwise (the missing half of the spectrum is conjugate).
// Each transform runs in two passes, one axis each, through a scratch of row transforms.
#pragma once

#include <cstdint>

#include "elements.h"

namespace densecnn {

struct FftGeometry {
  int64_t batch = 0, channels = 0, out_channels = 0;
  int64_t rows = 0, cols = 0, out_rows = 0, out_cols = 0;  // input (H, W) and output (H', W')
  int32_t th = 0, tw = 0, sh = 0, sw = 0, dh = 1, dw = 1;  // tile, its valid part, dilation
  int32_t freqs = 0;                                       // F = tw/2 + 1
  // Rows and columns of each tile the forward transform reads (the rest is zero): th×tw for a conv's input; sh×sw
  // for an output gradient in the weight gradient, whose tiles do not overlap.
  int32_t read_h = 0, read_w = 0;
  // Zero rows and columns before the input's first (and as many after): the tiles cover the padded input, whose
  // pixel (R, C) is the input's (R - pad_h, C - pad_w); the output is that of the padded input.
  int32_t pad_h = 0, pad_w = 0;
  // The forward transform writes conj(X) (the output gradient's, in both gradients); the inverse reads conj(Y).
  bool conjugate = false;
  // Rows and columns of each tile the inverse transform writes: sh×sw for a conv's output; th×tw in the input
  // gradient (the adjoint of overlap-save), whose whole tiles are added into the input's gradient.
  int32_t write_h = 0, write_w = 0;
  // The inverse computes the input gradient: y has the input's geometry (rows, cols, pad_h, pad_w, x_stride) and
  // receives the sum of the tiles covering each pixel (overlap-add); out_channels is then the input's C.
  bool adjoint = false;
  int64_t tiles_h = 0, tiles_w = 0, tiles = 0;             // per sub-grid and axis; in all
  int64_t x_stride[4] = {0, 0, 0, 0};                      // input strides (N, C, H, W)
  int64_t y_stride[4] = {0, 0, 0, 0};                      // output strides (N, K, H', W')
};

HOST_DEVICE_INLINE int64_t fft_points(const FftGeometry& g) { return static_cast<int64_t>(g.th) * g.freqs; }

// Image n and the top-left pixel (row0, col0) of tile t; its pixel (a, b) is (row0 + a·dh, col0 + b·dw).
HOST_DEVICE_INLINE void tile_origin(const FftGeometry& g, int64_t t, int64_t& n, int64_t& row0, int64_t& col0) {
  const int64_t tj = t % g.tiles_w, ti = t / g.tiles_w % g.tiles_h, grid = t / (g.tiles_w * g.tiles_h);
  const int64_t s = grid % g.dw, r = grid / g.dw % g.dh;
  n = grid / (static_cast<int64_t>(g.dw) * g.dh);
  row0 = ti * g.sh * g.dh + r;
  col0 = tj * g.sw * g.dw + s;
}

// The twiddles cos(2πm/T) and sin(2πm/T), m < T, of both axes, in one table: [cos_h | sin_h | cos_w | sin_w].
template <typename T>
struct Twiddles {
  const T* cos_h;
  const T* sin_h;
  const T* cos_w;
  const T* sin_w;
};

template <typename T>
HOST_DEVICE_INLINE Twiddles<T> twiddles_of(const FftGeometry& g, const T* table) {
  return {table, table + g.th, table + 2 * g.th, table + 2 * g.th + g.tw};
}

HOST_DEVICE_INLINE int64_t twiddle_table_size(const FftGeometry& g) { return 2 * (g.th + g.tw); }

// Forward pass 1, element e = (t, c, a, f) of the group's row transforms (count tiles from `first`):
// rows[e] = Σ_b x[a, b] · e^{-2πi f·b/tw}, over the read_h×read_w pixels read of each tile.
template <typename T>
HOST_DEVICE_INLINE void fft_forward_rows_at(const FftGeometry& g, const T* x, int64_t first, Twiddles<T> w,
                                            T* rows, int64_t e) {
  const int64_t f = e % g.freqs, a = e / g.freqs % g.th, c = e / (g.freqs * g.th) % g.channels;
  const int64_t t = first + e / (g.freqs * g.th * g.channels);
  int64_t n, row0, col0;
  tile_origin(g, t, n, row0, col0);
  const int64_t row = row0 + a * g.dh - g.pad_h;
  T re = T(0), im = T(0);
  if (a < g.read_h && row >= 0 && row < g.rows) {
    const T* src = x + n * g.x_stride[0] + c * g.x_stride[1] + row * g.x_stride[2];
    for (int32_t b = 0; b < g.read_w; ++b) {
      const int64_t col = col0 + static_cast<int64_t>(b) * g.dw - g.pad_w;
      if (col < 0) continue;
      if (col >= g.cols) break;
      const T v = src[col * g.x_stride[3]];
      const int64_t m = f * b % g.tw;
      re += v * w.cos_w[m];
      im -= v * w.sin_w[m];
    }
  }
  rows[2 * e] = re;
  rows[2 * e + 1] = im;
}

// Forward pass 2, element e = (u, f, t, c): the group's spectrum, stored (count, P, C) so that each tile's spectrum
// is one block, at [t, p = u·F + f, c] = Σ_a rows[t, c, a, f] · e^{-2πi u·a/th} (conjugated if g.conjugate).
template <typename T>
HOST_DEVICE_INLINE void fft_forward_cols_at(const FftGeometry& g, const T* rows, int64_t count, Twiddles<T> w,
                                            T* spectrum, int64_t e) {
  const int64_t c = e % g.channels, t = e / g.channels % count, p = e / (g.channels * count);
  const int64_t f = p % g.freqs, u = p / g.freqs;
  const T* src = rows + 2 * ((t * g.channels + c) * g.th * g.freqs + f);
  T re = T(0), im = T(0);
  for (int32_t a = 0; a < g.th; ++a) {
    const T sr = src[2 * a * g.freqs], si = src[2 * a * g.freqs + 1];
    const int64_t m = u * a % g.th;
    re += sr * w.cos_h[m] + si * w.sin_h[m];
    im += si * w.cos_h[m] - sr * w.sin_h[m];
  }
  const int64_t at = (t * fft_points(g) + p) * g.channels + c;
  spectrum[2 * at] = re;
  spectrum[2 * at + 1] = g.conjugate ? -im : im;
}

// Inverse pass 1, element e = (t, k, a, f) for the written rows a < write_h: cols[e] = Σ_u Y[u, f, t, k] ·
// e^{+2πi u·a/th}, Y the group's product spectrum (P, count, K) (conjugated if g.conjugate).
template <typename T>
HOST_DEVICE_INLINE void fft_inverse_cols_at(const FftGeometry& g, const T* product, int64_t count, Twiddles<T> w,
                                            T* cols, int64_t e) {
  const int64_t f = e % g.freqs, a = e / g.freqs % g.write_h, k = e / (g.freqs * g.write_h) % g.out_channels;
  const int64_t t = e / (g.freqs * g.write_h * g.out_channels);
  T re = T(0), im = T(0);
  for (int32_t u = 0; u < g.th; ++u) {
    const int64_t at = 2 * (((u * g.freqs + f) * count + t) * g.out_channels + k);
    const T yr = product[at], yi = g.conjugate ? -product[at + 1] : product[at + 1];
    const int64_t m = u * a % g.th;
    re += yr * w.cos_h[m] - yi * w.sin_h[m];
    im += yr * w.sin_h[m] + yi * w.cos_h[m];
  }
  cols[2 * e] = re;
  cols[2 * e + 1] = im;
}

// Inverse pass 2, element e = (t, k, a, b) of the written part of the group's tiles: the real inverse DFT along w,
// scaled, plus the bias, written to y where the pixel is inside the output; in the adjoint, to the tiles' buffer y
// (count, C, th, tw) at e, which fft_overlap_add_at sums into the input's gradient.
template <typename T>
HOST_DEVICE_INLINE void fft_inverse_rows_at(const FftGeometry& g, const T* cols, const T* bias, int64_t first,
                                            Twiddles<T> w, T* y, int64_t e) {
  const int64_t b = e % g.write_w, a = e / g.write_w % g.write_h;
  const int64_t k = e / (static_cast<int64_t>(g.write_w) * g.write_h) % g.out_channels;
  const int64_t t = e / (static_cast<int64_t>(g.write_w) * g.write_h * g.out_channels);
  int64_t n, row0, col0;
  tile_origin(g, first + t, n, row0, col0);
  const int64_t row = row0 + a * g.dh, col = col0 + b * g.dw;
  if (!g.adjoint && (row >= g.out_rows || col >= g.out_cols)) return;
  const T* src = cols + 2 * (((t * g.out_channels + k) * g.write_h + a) * g.freqs);
  T sum = T(0);
  for (int32_t f = 0; f < g.freqs; ++f) {
    const int64_t m = f * b % g.tw;
    const T term = src[2 * f] * w.cos_w[m] - src[2 * f + 1] * w.sin_w[m];
    sum += (f == 0 || 2 * f == g.tw) ? term : T(2) * term;
  }
  const T scale = T(1) / (static_cast<T>(g.th) * static_cast<T>(g.tw));
  const T value = sum * scale + (bias == nullptr ? T(0) : bias[k]);
  if (g.adjoint) {
    y[e] = value;
    return;
  }
  y[n * g.y_stride[0] + k * g.y_stride[1] + row * g.y_stride[2] + col * g.y_stride[3]] = value;
}

// The adjoint's overlap-add, element e = (n, c, i, j) of the input gradient y (the input's geometry and strides):
// adds the values at (i, j) of the group's tiles (count, C, th, tw) that cover the pixel. Every pixel gathers its
// own sum, so no two elements write the same value.
template <typename T>
HOST_DEVICE_INLINE void fft_overlap_add_at(const FftGeometry& g, const T* tiles, int64_t first, int64_t count, T* y,
                                           int64_t e) {
  const int64_t j = e % g.cols, i = e / g.cols % g.rows, c = e / (g.cols * g.rows) % g.out_channels;
  const int64_t n = e / (g.cols * g.rows * g.out_channels);
  const int64_t row = i + g.pad_h, col = j + g.pad_w;  // in the padded input
  const int64_t r = row % g.dh, s = col % g.dw, sub_row = row / g.dh, sub_col = col / g.dw;
  const int64_t grid = (n * g.dh + r) * g.dw + s;
  // tiles ti with ti·sh <= sub_row < ti·sh + th
  const int64_t ti_last = sub_row / g.sh < g.tiles_h - 1 ? sub_row / g.sh : g.tiles_h - 1;
  const int64_t tj_last = sub_col / g.sw < g.tiles_w - 1 ? sub_col / g.sw : g.tiles_w - 1;
  T sum = T(0);
  for (int64_t ti = ti_last; ti >= 0 && sub_row - ti * g.sh < g.th; --ti) {
    for (int64_t tj = tj_last; tj >= 0 && sub_col - tj * g.sw < g.tw; --tj) {
      const int64_t t = (grid * g.tiles_h + ti) * g.tiles_w + tj - first;
      if (t < 0 || t >= count) continue;
      sum += tiles[((t * g.out_channels + c) * g.th + (sub_row - ti * g.sh)) * g.tw + (sub_col - tj * g.sw)];
    }
  }
  y[n * g.x_stride[0] + c * g.x_stride[1] + i * g.x_stride[2] + j * g.x_stride[3]] += sum;
}

HOST_DEVICE_INLINE int64_t fft_forward_rows_size(const FftGeometry& g, int64_t count) {
  return count * g.channels * g.th * g.freqs;
}
HOST_DEVICE_INLINE int64_t fft_spectrum_size(const FftGeometry& g, int64_t count, int64_t channels) {
  return fft_points(g) * count * channels;
}
HOST_DEVICE_INLINE int64_t fft_inverse_cols_size(const FftGeometry& g, int64_t count) {
  return count * g.out_channels * g.write_h * g.freqs;
}
HOST_DEVICE_INLINE int64_t fft_inverse_rows_size(const FftGeometry& g, int64_t count) {
  return count * g.out_channels * g.write_h * g.write_w;
}
HOST_DEVICE_INLINE int64_t fft_overlap_add_size(const FftGeometry& g) {
  return g.batch * g.out_channels * g.rows * g.cols;
}

}  // namespace densecnn
