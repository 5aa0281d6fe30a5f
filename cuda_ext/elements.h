// The bodies of the CUDA kernels, one output element per call, as HOST_DEVICE_INLINE functions: the .cu kernels
// are grid-stride loops over them, and the CPU runs the very same functions when the tests switch the CPU ops to
// the GPU's loop structure (`densecnn::_use_gpu_loops_on_cpu`), so the CUDA kernels' logic is tested without a GPU.
#pragma once

#include <cstdint>

#include "common.h"

namespace densecnn {

// Row pass of max pooling over all rows: element index = (plane·H + r)·out_row_len + j.
HOST_DEVICE_INLINE int64_t row_pass_size(const PoolGeometry& g) { return g.planes * g.rows * g.out_row_len; }
HOST_DEVICE_INLINE int64_t output_size(const PoolGeometry& g) { return g.planes * g.out_rows * g.out_row_len; }
HOST_DEVICE_INLINE int64_t input_size(const PoolGeometry& g) { return g.planes * g.rows * g.row_len; }

template <typename T>
HOST_DEVICE_INLINE void max_row_pass_at(const PoolGeometry& g, const T* x, T* row_max, uint8_t* row_tap,
                                        int64_t index) {
  const int64_t j = index % g.out_row_len, row = index / g.out_row_len;  // row = plane·H + r
  T best;
  int32_t tap;
  max_scan(x + row * g.row_len + j, g.tap_step, g.kw, best, tap);
  row_max[index] = best;
  if (row_tap != nullptr) row_tap[index] = static_cast<uint8_t>(tap);
}

template <typename T>
HOST_DEVICE_INLINE void max_col_pass_at(const PoolGeometry& g, const T* row_max, T* y, uint8_t* col_tap,
                                        Activation activation, int64_t index) {
  const int64_t j = index % g.out_row_len, i = index / g.out_row_len % g.out_rows;
  const int64_t plane = index / (g.out_row_len * g.out_rows);
  T best;
  int32_t tap;
  max_scan(row_max + (plane * g.rows + i) * g.out_row_len + j, g.tap_rows * g.out_row_len, g.kh, best, tap);
  y[index] = activation_forward(best, activation);
  if (col_tap != nullptr) col_tap[index] = static_cast<uint8_t>(tap);
}

template <typename T>
HOST_DEVICE_INLINE void max_backward_at(const PoolGeometry& g, const T* grad_y, const T* y, const uint8_t* row_tap,
                                        const uint8_t* col_tap, T* grad_x, Activation activation, int64_t index) {
  const int64_t c = index % g.row_len, r = index / g.row_len % g.rows, plane = index / (g.row_len * g.rows);
  const int64_t out_plane = plane * g.out_rows * g.out_row_len;
  grad_x[index] = max_grad_gather(g, grad_y + out_plane, y + out_plane, row_tap + plane * g.rows * g.out_row_len,
                                  col_tap + out_plane, r, c, activation);
}

template <typename T>
HOST_DEVICE_INLINE void sum_row_pass_at(const PoolGeometry& g, const T* x, T* row_sum, int64_t index) {
  const int64_t j = index % g.out_row_len, row = index / g.out_row_len;
  row_sum[index] = sum_scan(x + row * g.row_len + j, g.tap_step, g.kw);
}

template <typename T>
HOST_DEVICE_INLINE void avg_col_pass_at(const PoolGeometry& g, const T* row_sum, T* y, T scale,
                                        Activation activation, int64_t index) {
  const int64_t j = index % g.out_row_len, i = index / g.out_row_len % g.out_rows;
  const int64_t plane = index / (g.out_row_len * g.out_rows);
  const T sum = sum_scan(row_sum + (plane * g.rows + i) * g.out_row_len + j, g.tap_rows * g.out_row_len, g.kh);
  y[index] = activation_forward(sum * scale, activation);
}

template <typename T>
HOST_DEVICE_INLINE void avg_backward_at(const PoolGeometry& g, const T* grad_y, const T* y, T* grad_x, T scale,
                                        Activation activation, int64_t index) {
  const int64_t c = index % g.row_len, r = index / g.row_len % g.rows, plane = index / (g.row_len * g.rows);
  const int64_t out_plane = plane * g.out_rows * g.out_row_len;
  grad_x[index] = avg_grad_gather(g, grad_y + out_plane, y + out_plane, r, c, scale, activation);
}

// im2col of a band: index over the (C·kh·kw, rows·W') unrolled matrix.
HOST_DEVICE_INLINE int64_t im2col_size(const ConvGeometry& g, int64_t rows) {
  return g.channels * g.kh * g.kw * rows * g.out_cols;
}

template <typename T>
HOST_DEVICE_INLINE void im2col_at(const ConvGeometry& g, const T* image, int64_t band_start, int64_t rows, T* col,
                                  int64_t index) {
  const int64_t pixels = rows * g.out_cols;
  col[index] = image[im2col_source(g, band_start, index / pixels, index % pixels)];
}

// col2im of a band: index over the input pixels (C, touched rows, W) its taps touched, rows from band_start.
HOST_DEVICE_INLINE int64_t col2im_rows(const ConvGeometry& g, int64_t rows) { return rows + (g.kh - 1) * g.dh; }

template <typename T>
HOST_DEVICE_INLINE void col2im_add_at(const ConvGeometry& g, const T* grad_col, int64_t band_start, int64_t rows,
                                      T* grad_image, int64_t index) {
  const int64_t touched = col2im_rows(g, rows);
  const int64_t q = index % g.cols, r = band_start + index / g.cols % touched, c = index / (g.cols * touched);
  grad_image[(c * g.rows + r) * g.cols + q] += col2im_gather(g, grad_col, band_start, rows, c, r, q);
}

}  // namespace densecnn
