// The bodies of the CUDA kernels, one output element per call, as HOST_DEVICE_INLINE functions: the .cu kernels
// are grid-stride loops over them, and the CPU runs the very same functions when the tests switch the CPU ops to
// the GPU's loop structure (`densecnn::_use_gpu_loops_on_cpu`), so the CUDA kernels' logic is tested without a GPU.
#pragma once

#include <cstdint>

#include "common.h"

namespace densecnn {

// One pass of the pooling ops (common.h AxisPass): element e of the pass output is (o, l, i) of (outer, out_len,
// inner); its window reads src[(o·in_len + l + t·dilation)·inner + i] for the taps t < kernel. S and D are the
// source and destination types (storage T, or the accumulation type A of the scratch between passes); the last
// pass applies the activation and writes the output.
template <typename A, typename S, typename D>
HOST_DEVICE_INLINE void max_pass_at(const AxisPass& p, const S* src, D* dst, uint8_t* tap, Activation activation,
                                    int64_t e) {
  const int64_t i = e % p.inner, l = e / p.inner % p.out_len, o = e / (p.inner * p.out_len);
  A best;
  int32_t best_tap;
  max_scan(src + (o * p.in_len + l) * p.inner + i, p.dilation * p.inner, p.kernel, best, best_tap);
  dst[e] = narrow<D>(activation_forward(best, activation));
  if (tap != nullptr) tap[e] = static_cast<uint8_t>(best_tap);
}

template <typename A, typename S, typename D>
HOST_DEVICE_INLINE void sum_pass_at(const AxisPass& p, const S* src, D* dst, A scale, Activation activation,
                                    int64_t e) {
  const int64_t i = e % p.inner, l = e / p.inner % p.out_len, o = e / (p.inner * p.out_len);
  const A sum = sum_scan<A>(src + (o * p.in_len + l) * p.inner + i, p.dilation * p.inner, p.kernel);
  dst[e] = narrow<D>(activation_forward(sum * scale, activation));
}

// The gradient flowing back through output element o_index of a pass: grad · activation'(y), where y (the forward
// output) is given only to the first backward pass (the last forward pass, which applied the activation).
template <typename A, typename G, typename Y>
HOST_DEVICE_INLINE A incoming_grad(const G* grad, const Y* y, Activation activation, int64_t o_index) {
  const A g = widen<A>(grad[o_index]);
  return y == nullptr ? g : g * activation_grad(widen<A>(y[o_index]), activation);
}

// Backward of a pass, as a gather (race-free, one thread per element): element e = (o, l, i) of the pass INPUT
// receives the gradient of the outputs (o, l - t·dilation, i) whose argmax tap is t.
template <typename A, typename G, typename Y, typename D>
HOST_DEVICE_INLINE void max_pass_backward_at(const AxisPass& p, const G* grad, const Y* y, const uint8_t* tap,
                                             D* grad_in, Activation activation, int64_t e) {
  const int64_t i = e % p.inner, l = e / p.inner % p.in_len, o = e / (p.inner * p.in_len);
  A sum = A(0);
  for (int32_t t = 0; t < p.kernel; ++t) {
    const int64_t l_out = l - t * p.dilation;
    if (l_out < 0) break;
    if (l_out >= p.out_len) continue;
    const int64_t o_index = (o * p.out_len + l_out) * p.inner + i;
    if (tap[o_index] == t) sum += incoming_grad<A>(grad, y, activation, o_index);
  }
  grad_in[e] = narrow<D>(sum);
}

template <typename A, typename G, typename Y, typename D>
HOST_DEVICE_INLINE void sum_pass_backward_at(const AxisPass& p, const G* grad, const Y* y, D* grad_in, A scale,
                                             Activation activation, int64_t e) {
  const int64_t i = e % p.inner, l = e / p.inner % p.in_len, o = e / (p.inner * p.in_len);
  A sum = A(0);
  for (int32_t t = 0; t < p.kernel; ++t) {
    const int64_t l_out = l - t * p.dilation;
    if (l_out < 0) break;
    if (l_out < p.out_len) sum += incoming_grad<A>(grad, y, activation, (o * p.out_len + l_out) * p.inner + i);
  }
  grad_in[e] = narrow<D>(sum * scale);
}

// The order of the passes and the arrays they run between, shared by the CUDA launchers and the CPU's run of the
// per-element bodies. Forward: innermost axis first; the first pass reads x, the last writes y (the only pass that
// applies the activation and the average's scale), and the passes between alternate between two scratch slots of
// intermediate_size values. `run(axis, pass, src, dst, last)` runs one pass.
template <typename T, typename Run>
void forward_passes(const PoolGeometry& g, const T* x, T* y, Acc<T>* scratch, Run&& run) {
  Acc<T>* slots[2] = {scratch, scratch + intermediate_size(g)};
  const Acc<T>* src = nullptr;
  for (int a = g.axes - 1; a >= 0; --a) {
    const AxisPass p = axis_pass(g, a);
    Acc<T>* dst = slots[a % 2];
    const bool first = a == g.axes - 1, last = a == 0;
    if (first && last) {
      run(a, p, x, y, true);
    } else if (first) {
      run(a, p, x, dst, false);
    } else if (last) {
      run(a, p, src, y, true);
    } else {
      run(a, p, src, dst, false);
    }
    src = dst;
  }
}

// Backward: the passes' gathers in reverse order, outermost axis first, from grad_y to grad_x. Only the first
// gather sees the forward output y (for the activation's derivative; null when there is none) and applies the
// scale. `run(axis, pass, grad, y, grad_in, first)` runs one gather.
template <typename T, typename Run>
void backward_passes(const PoolGeometry& g, const T* grad_y, const T* y, T* grad_x, Acc<T>* scratch, Run&& run) {
  Acc<T>* slots[2] = {scratch, scratch + intermediate_size(g)};
  const Acc<T>* grad = nullptr;
  const T* no_output = nullptr;
  for (int a = 0; a < g.axes; ++a) {
    const AxisPass p = axis_pass(g, a);
    Acc<T>* dst = slots[a % 2];
    const bool first = a == 0, last = a == g.axes - 1;
    if (first && last) {
      run(a, p, grad_y, y, grad_x, true);
    } else if (first) {
      run(a, p, grad_y, y, dst, true);
    } else if (last) {
      run(a, p, grad, no_output, grad_x, false);
    } else {
      run(a, p, grad, no_output, dst, false);
    }
    grad = dst;
  }
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
