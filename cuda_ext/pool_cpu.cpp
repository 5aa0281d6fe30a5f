// CPU kernels of the d-sparse (stride-1, dilated) pooling ops: max and average, forward and backward, optionally
// fused with the activation that follows.
//
// Work is split into blocks (plane, band of rows, chunk of a row) run by at::parallel_for; inside a block every loop
// runs over the contiguous dimension so the compiler vectorises it (W in NCHW, W·C in channels_last).
// Max pooling is separable: a row pass (max over the kw taps of each input row) then a column pass (max over kh rows
// of the row pass), each done by doubling — max over taps {0..2p-1} = max of two windows of p taps — so a k-tap
// window costs ceil(log2 k) vector ops per output instead of k. Row pass first, first-max-wins on ties and
// last-NaN-wins (common.h), gives exactly F.max_pool2d's argmax (first maximum in row-major window order).
// The argmax is kept as two uint8 tap numbers: `row_tap` (which of the kw taps won in each row-pass element) and
// `col_tap` (which of the kh rows won for each output); backward gathers through them, race-free and vectorised.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <type_traits>
#include <vector>

#include "common.h"
#include "elements.h"
#include "gpu_loops.h"
#include "pool_args.h"

namespace densecnn {
namespace {

constexpr int64_t kChunk = 2048;       // output elements of a row handled by one block
constexpr int64_t kBandElems = 32768;  // target size of a block's row-pass buffer (values), to stay in L2

// The inner loops below are compiled for several ISAs — AVX-512, AVX2 and the x86-64 baseline — and the best one
// the CPU supports is picked when the library loads (GCC function multiversioning, `target_clones`). The build
// therefore needs no -march flag and the same wheel runs on any x86-64 CPU.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define DENSECNN_MULTIVERSION __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define DENSECNN_MULTIVERSION
#endif
#define DENSECNN_ALWAYS_INLINE inline __attribute__((always_inline))

// One doubling step: o[j] = max(a[j], a[j + shift]) for j < m, the right operand's tap offset by `tap_shift`.
// `o` may equal `a` (j only reads positions >= j, so the in-place loop is dependence-free).
template <typename T, bool kTaps, bool kFirst>
DENSECNN_ALWAYS_INLINE void max_step_loop(const T* a, const int32_t* a_tap, int64_t shift, int32_t tap_shift,
                                          int64_t m, T* o, int32_t* o_tap) {
#pragma GCC ivdep
  for (int64_t j = 0; j < m; ++j) {
    T best = a[j];
    int32_t best_tap = kFirst ? 0 : (kTaps ? a_tap[j] : 0);
    const int32_t right_tap = (kFirst ? 0 : (kTaps ? a_tap[j + shift] : 0)) + tap_shift;
    max_update(best, best_tap, a[j + shift], right_tap);
    o[j] = best;
    if (kTaps) o_tap[j] = best_tap;
  }
}

template <bool B>
using Flag = std::integral_constant<bool, B>;

#define DENSECNN_MAX_STEP(T, TAPS, FIRST)                                                                       \
  DENSECNN_MULTIVERSION void max_step(Flag<TAPS>, Flag<FIRST>, const T* a, const int32_t* a_tap, int64_t shift, \
                                      int32_t tap_shift, int64_t m, T* o, int32_t* o_tap) {                    \
    max_step_loop<T, TAPS, FIRST>(a, a_tap, shift, tap_shift, m, o, o_tap);                                     \
  }
DENSECNN_MAX_STEP(float, false, false)
DENSECNN_MAX_STEP(float, false, true)
DENSECNN_MAX_STEP(float, true, false)
DENSECNN_MAX_STEP(float, true, true)
DENSECNN_MAX_STEP(double, false, false)
DENSECNN_MAX_STEP(double, false, true)
DENSECNN_MAX_STEP(double, true, false)
DENSECNN_MAX_STEP(double, true, true)

// acc[j] += taps[j] == tap ? src[j] : 0 — the backward gathers through the argmax taps.
template <typename T>
DENSECNN_ALWAYS_INLINE void select_add_loop(T* acc, const T* src, const uint8_t* taps, int32_t tap, int64_t n) {
#pragma GCC ivdep
  for (int64_t j = 0; j < n; ++j) {
    const T value = src[j];  // an unconditional load, then a select: the loop if-converts and vectorises
    acc[j] += taps[j] == tap ? value : T(0);
  }
}
DENSECNN_MULTIVERSION void select_add(float* acc, const float* src, const uint8_t* taps, int32_t tap, int64_t n) {
  select_add_loop(acc, src, taps, tap, n);
}
DENSECNN_MULTIVERSION void select_add(double* acc, const double* src, const uint8_t* taps, int32_t tap, int64_t n) {
  select_add_loop(acc, src, taps, tap, n);
}

template <typename T>
DENSECNN_ALWAYS_INLINE void add_loop(T* acc, const T* src, int64_t n) {
#pragma GCC ivdep
  for (int64_t j = 0; j < n; ++j) acc[j] += src[j];
}
DENSECNN_MULTIVERSION void add(float* acc, const float* src, int64_t n) { add_loop(acc, src, n); }
DENSECNN_MULTIVERSION void add(double* acc, const double* src, int64_t n) { add_loop(acc, src, n); }

DENSECNN_MULTIVERSION void narrow_taps(const int32_t* src, uint8_t* dst, int64_t n) {
  for (int64_t j = 0; j < n; ++j) dst[j] = static_cast<uint8_t>(src[j]);
}

// dst[j] = activation(src[j] · scale), and the gradient factor grad[j] · activation'(y[j]).
template <typename T, Activation kAct>
DENSECNN_ALWAYS_INLINE void activate_loop(const T* src, T scale, T* dst, int64_t n) {
#pragma GCC ivdep
  for (int64_t j = 0; j < n; ++j) dst[j] = activation_forward(src[j] * scale, kAct);
}
template <typename T, Activation kAct>
DENSECNN_ALWAYS_INLINE void activation_grad_loop(const T* grad, const T* y, T* dst, int64_t n) {
#pragma GCC ivdep
  for (int64_t j = 0; j < n; ++j) dst[j] = grad[j] * activation_grad(y[j], kAct);
}

template <Activation A>
using Act = std::integral_constant<Activation, A>;

#define DENSECNN_ACTIVATION(T, ACT)                                                                                 \
  DENSECNN_MULTIVERSION void activate(Act<ACT>, const T* src, T scale, T* dst, int64_t n) {                         \
    activate_loop<T, ACT>(src, scale, dst, n);                                                                      \
  }                                                                                                                 \
  DENSECNN_MULTIVERSION void activation_grad(Act<ACT>, const T* grad, const T* y, T* dst, int64_t n) {             \
    activation_grad_loop<T, ACT>(grad, y, dst, n);                                                                  \
  }
DENSECNN_ACTIVATION(float, Activation::kNone)
DENSECNN_ACTIVATION(float, Activation::kRelu)
DENSECNN_ACTIVATION(float, Activation::kTanh)
DENSECNN_ACTIVATION(double, Activation::kNone)
DENSECNN_ACTIVATION(double, Activation::kRelu)
DENSECNN_ACTIVATION(double, Activation::kTanh)

// out[j] = max over taps t < k of src[j + t·step], and the winning t, for j < n - (k-1)·step, by doubling.
// `buf` has room for n elements.
template <typename T, bool kTaps>
void window_max(const T* src, int64_t n, int32_t k, int64_t step, T* out, int32_t* out_tap, T* buf,
                int32_t* buf_tap) {
  if (k == 1) {
    std::copy(src, src + n, out);
    if (kTaps) std::fill(out_tap, out_tap + n, 0);
    return;
  }
  int32_t shifts[40];  // tap shifts of the doubling steps: 1, 2, 4, ..., then the remainder
  int levels = 0, p = 1;
  for (; 2 * p <= k; p *= 2) shifts[levels++] = p;
  if (p < k) shifts[levels++] = k - p;
  int64_t len = n;
  for (int level = 0; level < levels; ++level) {
    const int64_t shift = shifts[level] * step;
    len -= shift;
    T* o = level == levels - 1 ? out : buf;
    int32_t* o_tap = level == levels - 1 ? out_tap : buf_tap;
    if (level == 0) {
      max_step(Flag<kTaps>{}, Flag<true>{}, src, nullptr, shift, shifts[level], len, o, o_tap);
    } else {
      max_step(Flag<kTaps>{}, Flag<false>{}, buf, buf_tap, shift, shifts[level], len, o, o_tap);
    }
  }
}

// Calls f(std::integral_constant<Activation, a>) so kernels get the activation as a compile-time constant.
template <typename F>
void dispatch_activation(Activation a, F&& f) {
  switch (a) {
    case Activation::kRelu:
      return f(std::integral_constant<Activation, Activation::kRelu>{});
    case Activation::kTanh:
      return f(std::integral_constant<Activation, Activation::kTanh>{});
    default:
      return f(std::integral_constant<Activation, Activation::kNone>{});
  }
}

// Splits a plane into blocks of output rows × output row elements.
// One work item: rows [row0, row1) and row elements [col0, col1) of one plane.
struct Block {
  int64_t plane, row0, row1, col0, col1;
};

struct Blocks {
  int64_t rows, row_len, band_rows, chunk, bands, chunks;
  Blocks(const PoolGeometry& g, int64_t rows_, int64_t row_len_, int64_t halo_rows) : rows(rows_), row_len(row_len_) {
    chunk = std::max<int64_t>(1, std::min(row_len, kChunk));
    band_rows = std::max<int64_t>(8, kBandElems / chunk - halo_rows);
    band_rows = std::max<int64_t>(1, std::min(band_rows, rows));
    bands = (rows + band_rows - 1) / band_rows;
    chunks = (row_len + chunk - 1) / chunk;
  }
  int64_t count(const PoolGeometry& g) const { return g.planes * bands * chunks; }
  Block at(int64_t item) const {
    const int64_t row0 = item / chunks % bands * band_rows, col0 = item % chunks * chunk;
    return {item / (bands * chunks), row0, std::min(row0 + band_rows, rows), col0, std::min(col0 + chunk, row_len)};
  }
};

template <typename T, bool kTaps, Activation kAct>
void max_pool_forward(const PoolGeometry& g, const T* x, T* y, uint8_t* row_tap, uint8_t* col_tap) {
  const int64_t halo = (g.kh - 1) * g.tap_rows;
  const Blocks blocks(g, g.out_rows, g.out_row_len, halo);
  at::parallel_for(0, blocks.count(g), 1, [&](int64_t begin, int64_t end) {
    const int64_t band_len = (blocks.band_rows + halo) * blocks.chunk;
    const int64_t row_in = blocks.chunk + (g.kw - 1) * g.tap_step;
    std::vector<T> band(band_len), band_buf(band_len), row_buf(row_in), col(band_len);
    std::vector<int32_t> band_tap(kTaps ? band_len : 0), band_buf_tap(kTaps ? band_len : 0),
        row_buf_tap(kTaps ? row_in : 0), col_tap_buf(kTaps ? band_len : 0);
    for (int64_t item = begin; item < end; ++item) {
      const Block block = blocks.at(item);
      const int64_t plane = block.plane, i0 = block.row0, i1 = block.row1, e0 = block.col0, e1 = block.col1;
      const bool last_band = i1 == g.out_rows;
      const int64_t w = e1 - e0, rows_in = i1 - i0 + halo;
      const T* xp = x + plane * g.rows * g.row_len;
      // Row pass: band[r][j] = max over the kw taps of input row i0 + r, for the chunk's output elements.
      for (int64_t r = 0; r < rows_in; ++r) {
        const int64_t row = i0 + r;
        window_max<T, kTaps>(xp + row * g.row_len + e0, w + (g.kw - 1) * g.tap_step, g.kw, g.tap_step,
                             band.data() + r * w, band_tap.data() + r * w, row_buf.data(), row_buf_tap.data());
        if (kTaps && (row < i1 || last_band)) {  // each block stores the row taps of the rows it owns
          narrow_taps(band_tap.data() + r * w, row_tap + (plane * g.rows + row) * g.out_row_len + e0, w);
        }
      }
      // Column pass over the flattened band: a shift of one tap is tap_rows whole rows.
      window_max<T, kTaps>(band.data(), rows_in * w, g.kh, g.tap_rows * w, col.data(),
                           col_tap_buf.data(), band_buf.data(), band_buf_tap.data());
      for (int64_t i = i0; i < i1; ++i) {
        const T* src = col.data() + (i - i0) * w;
        T* dst = y + (plane * g.out_rows + i) * g.out_row_len + e0;
        activate(Act<kAct>{}, src, T(1), dst, w);
        if (kTaps) {
          narrow_taps(col_tap_buf.data() + (i - i0) * w, col_tap + (plane * g.out_rows + i) * g.out_row_len + e0, w);
        }
      }
    }
  });
}

// grad_x[r][c] = Σ_b [row_tap[r][c - b·step] == b] · G[r][c - b·step], where
// G[r][j] = Σ_a [col_tap[r - a·dh][j] == a] · grad_y[r - a·dh][j] · activation'(y[r - a·dh][j]).
// Blocks are bands of INPUT rows, so every block writes only its own rows of grad_x.
template <typename T, Activation kAct>
void max_pool_backward(const PoolGeometry& g, const T* grad_y, const T* y, const uint8_t* row_tap,
                       const uint8_t* col_tap, T* grad_x) {
  const Blocks blocks(g, g.rows, g.row_len, 0);
  const int64_t reach = (g.kw - 1) * g.tap_step;
  at::parallel_for(0, blocks.count(g), 1, [&](int64_t begin, int64_t end) {
    std::vector<T> gathered(blocks.chunk + reach), scaled(kAct == Activation::kNone ? 0 : blocks.chunk + reach);
    for (int64_t item = begin; item < end; ++item) {
      const Block block = blocks.at(item);
      const int64_t plane = block.plane, r0 = block.row0, r1 = block.row1, c0 = block.col0, c1 = block.col1;
      const int64_t j0 = std::max<int64_t>(0, c0 - reach), j1 = std::min(c1, g.out_row_len);
      const int64_t out_base = plane * g.out_rows * g.out_row_len;
      for (int64_t r = r0; r < r1; ++r) {
        T* gr = gathered.data();  // gr[j - j0]: the gathered gradient of row-pass element j in [j0, j1)
        std::fill(gathered.begin(), gathered.end(), T(0));
        for (int32_t a = 0; a < g.kh; ++a) {
          const int64_t i = r - a * g.tap_rows;
          if (i < 0 || i >= g.out_rows) continue;
          const int64_t off = out_base + i * g.out_row_len + j0;
          const T* gy = grad_y + off;
          if (kAct != Activation::kNone) {
            activation_grad(Act<kAct>{}, gy, y + off, scaled.data(), j1 - j0);
            gy = scaled.data();
          }
          select_add(gr, gy, col_tap + off, a, j1 - j0);
        }
        T* gx = grad_x + (plane * g.rows + r) * g.row_len;
        const uint8_t* rt = row_tap + (plane * g.rows + r) * g.out_row_len;
        std::fill(gx + c0, gx + c1, T(0));
        for (int32_t b = 0; b < g.kw; ++b) {
          const int64_t shift = b * g.tap_step;
          const int64_t lo = std::max(j0, c0 - shift), hi = std::min(j1, c1 - shift);
          select_add(gx + lo + shift, gr + (lo - j0), rt + lo, b, hi - lo);
        }
      }
    }
  });
}

// Average pooling: y = activation(Σ taps / divisor), separable (row sums, then column sums of row sums).
template <typename T, Activation kAct>
void avg_pool_forward(const PoolGeometry& g, const T* x, T* y, int64_t divisor) {
  const int64_t halo = (g.kh - 1) * g.tap_rows;
  const Blocks blocks(g, g.out_rows, g.out_row_len, halo);
  const T scale = T(1) / T(divisor);
  at::parallel_for(0, blocks.count(g), 1, [&](int64_t begin, int64_t end) {
    std::vector<T> band((blocks.band_rows + halo) * blocks.chunk), acc(blocks.chunk);
    for (int64_t item = begin; item < end; ++item) {
      const Block block = blocks.at(item);
      const int64_t plane = block.plane, i0 = block.row0, i1 = block.row1, e0 = block.col0, e1 = block.col1;
      const int64_t w = e1 - e0, rows_in = i1 - i0 + halo;
      const T* xp = x + plane * g.rows * g.row_len + e0;
      for (int64_t r = 0; r < rows_in; ++r) {
        const T* src = xp + (i0 + r) * g.row_len;
        T* dst = band.data() + r * w;
        std::copy(src, src + w, dst);
        for (int32_t b = 1; b < g.kw; ++b) add(dst, src + b * g.tap_step, w);
      }
      for (int64_t i = i0; i < i1; ++i) {
        const T* first = band.data() + (i - i0) * w;
        std::copy(first, first + w, acc.begin());
        for (int32_t a = 1; a < g.kh; ++a) add(acc.data(), first + a * g.tap_rows * w, w);
        activate(Act<kAct>{}, acc.data(), scale, y + (plane * g.out_rows + i) * g.out_row_len + e0, w);
      }
    }
  });
}

// grad_x[r][c] = Σ_{a,b} grad_y[r - a·dh][c - b·step] · activation'(y[...]) / divisor (taps inside the output),
// as a column gather into a row buffer followed by shifted adds along the row.
template <typename T, Activation kAct>
void avg_pool_backward(const PoolGeometry& g, const T* grad_y, const T* y, T* grad_x, int64_t divisor) {
  const Blocks blocks(g, g.rows, g.row_len, 0);
  const int64_t reach = (g.kw - 1) * g.tap_step;
  const T scale = T(1) / T(divisor);
  at::parallel_for(0, blocks.count(g), 1, [&](int64_t begin, int64_t end) {
    std::vector<T> gathered(blocks.chunk + reach), scaled(kAct == Activation::kNone ? 0 : blocks.chunk + reach);
    for (int64_t item = begin; item < end; ++item) {
      const Block block = blocks.at(item);
      const int64_t plane = block.plane, r0 = block.row0, r1 = block.row1, c0 = block.col0, c1 = block.col1;
      const int64_t j0 = std::max<int64_t>(0, c0 - reach), j1 = std::min(c1, g.out_row_len);
      const int64_t out_base = plane * g.out_rows * g.out_row_len;
      for (int64_t r = r0; r < r1; ++r) {
        T* gr = gathered.data();  // gr[j - j0]: the column sum of grad_y feeding row-pass element j
        std::fill(gathered.begin(), gathered.end(), T(0));
        for (int32_t a = 0; a < g.kh; ++a) {
          const int64_t i = r - a * g.tap_rows;
          if (i < 0 || i >= g.out_rows) continue;
          const int64_t off = out_base + i * g.out_row_len + j0;
          const T* gy = grad_y + off;
          if (kAct != Activation::kNone) {
            activation_grad(Act<kAct>{}, gy, y + off, scaled.data(), j1 - j0);
            gy = scaled.data();
          }
          add(gr, gy, j1 - j0);
        }
        T* gx = grad_x + (plane * g.rows + r) * g.row_len;
        std::fill(gx + c0, gx + c1, T(0));
        for (int32_t b = 0; b < g.kw; ++b) {
          const int64_t shift = b * g.tap_step;
          const int64_t lo = std::max(j0, c0 - shift), hi = std::min(j1, c1 - shift);
          add(gx + lo + shift, gr + (lo - j0), hi - lo);
        }
        activate(Act<Activation::kNone>{}, gx + c0, scale, gx + c0, c1 - c0);
      }
    }
  });
}

// ---- torch-facing CPU ops ----

std::tuple<at::Tensor, at::Tensor, at::Tensor> max_pool2d_cpu(const at::Tensor& input, at::IntArrayRef kernel,
                                                              at::IntArrayRef dilation, c10::string_view activation,
                                                              bool with_taps) {
  const PoolCall call = prepare_pool("max_pool2d", input, kernel, dilation, activation);
  TORCH_CHECK(kernel[0] <= 255 && kernel[1] <= 255, "densecnn.max_pool2d: kernel ", kernel,
              " is too large for the ext kernels (at most 255 taps per axis); use backend='native'");
  const PoolGeometry& g = call.geometry;
  const at::Tensor& x = call.input;
  at::Tensor y = empty_like_layout(x, g.out_rows, call.out_cols, x.scalar_type(), call.layout);
  at::Tensor row_tap = empty_like_layout(x, with_taps ? g.rows : 0, with_taps ? call.out_cols : 0, at::kByte,
                                         call.layout);
  at::Tensor col_tap = empty_like_layout(x, with_taps ? g.out_rows : 0, with_taps ? call.out_cols : 0, at::kByte,
                                         call.layout);
  if (y.numel() == 0) return {y, row_tap, col_tap};
  if (gpu_loops_on_cpu()) {
    at::Tensor row_max = at::empty({row_pass_size(g)}, x.options());
    AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "densecnn_max_pool2d_gpu_loops", [&] {
      const scalar_t* xp = x.const_data_ptr<scalar_t>();
      scalar_t* rm = row_max.mutable_data_ptr<scalar_t>();
      scalar_t* yp = y.mutable_data_ptr<scalar_t>();
      uint8_t* rt = with_taps ? row_tap.mutable_data_ptr<uint8_t>() : nullptr;
      uint8_t* ct = with_taps ? col_tap.mutable_data_ptr<uint8_t>() : nullptr;
      for_each_element(row_pass_size(g), [&](int64_t i) { max_row_pass_at(g, xp, rm, rt, i); });
      for_each_element(output_size(g), [&](int64_t i) { max_col_pass_at(g, rm, yp, ct, call.activation, i); });
    });
    return {y, row_tap, col_tap};
  }
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "densecnn_max_pool2d", [&] {
    dispatch_activation(call.activation, [&](auto act_constant) {
      constexpr Activation kAct = decltype(act_constant)::value;
      if (with_taps) {
        max_pool_forward<scalar_t, true, kAct>(g, x.const_data_ptr<scalar_t>(), y.mutable_data_ptr<scalar_t>(),
                                               row_tap.mutable_data_ptr<uint8_t>(),
                                               col_tap.mutable_data_ptr<uint8_t>());
      } else {
        max_pool_forward<scalar_t, false, kAct>(g, x.const_data_ptr<scalar_t>(), y.mutable_data_ptr<scalar_t>(),
                                                nullptr, nullptr);
      }
    });
  });
  return {y, row_tap, col_tap};
}

at::Tensor max_pool2d_backward_cpu(const at::Tensor& grad_output, const c10::optional<at::Tensor>& output,
                                   const at::Tensor& row_tap, const at::Tensor& col_tap, at::IntArrayRef kernel,
                                   at::IntArrayRef dilation, c10::string_view activation) {
  const char* op = "max_pool2d_backward";
  const auto layout = pool_layout(col_tap);
  const PoolBackwardCall call = prepare_pool_backward(op, grad_output, output, layout, kernel, dilation, activation);
  check_taps(op, call, row_tap, col_tap, kernel);
  const PoolGeometry& g = call.geometry;
  const at::Tensor rt = row_tap.contiguous(layout), ct = col_tap.contiguous(layout);
  at::Tensor grad_x = empty_like_layout(call.grad_output, g.rows, call.in_cols, grad_output.scalar_type(), layout);
  if (grad_x.numel() == 0) return grad_x;
  if (gpu_loops_on_cpu()) {
    AT_DISPATCH_FLOATING_TYPES(grad_output.scalar_type(), "densecnn_max_pool2d_backward_gpu_loops", [&] {
      const scalar_t* gy = call.grad_output.const_data_ptr<scalar_t>();
      const scalar_t* yp = call.output.const_data_ptr<scalar_t>();
      const uint8_t* rtp = rt.const_data_ptr<uint8_t>();
      const uint8_t* ctp = ct.const_data_ptr<uint8_t>();
      scalar_t* gx = grad_x.mutable_data_ptr<scalar_t>();
      for_each_element(input_size(g), [&](int64_t i) { max_backward_at(g, gy, yp, rtp, ctp, gx, call.activation, i); });
    });
    return grad_x;
  }
  AT_DISPATCH_FLOATING_TYPES(grad_output.scalar_type(), "densecnn_max_pool2d_backward", [&] {
    dispatch_activation(call.activation, [&](auto act_constant) {
      max_pool_backward<scalar_t, decltype(act_constant)::value>(
          g, call.grad_output.const_data_ptr<scalar_t>(), call.output.const_data_ptr<scalar_t>(),
          rt.const_data_ptr<uint8_t>(), ct.const_data_ptr<uint8_t>(), grad_x.mutable_data_ptr<scalar_t>());
    });
  });
  return grad_x;
}

at::Tensor avg_pool2d_cpu(const at::Tensor& input, at::IntArrayRef kernel, at::IntArrayRef dilation,
                          int64_t divisor, c10::string_view activation) {
  const PoolCall call = prepare_pool("avg_pool2d", input, kernel, dilation, activation);
  TORCH_CHECK(divisor >= 1, "densecnn.avg_pool2d: divisor must be a positive int, got ", divisor);
  const at::Tensor& x = call.input;
  at::Tensor y = empty_like_layout(x, call.geometry.out_rows, call.out_cols, x.scalar_type(), call.layout);
  if (y.numel() == 0) return y;
  if (gpu_loops_on_cpu()) {
    const PoolGeometry& g = call.geometry;
    at::Tensor row_sum = at::empty({row_pass_size(g)}, x.options());
    AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "densecnn_avg_pool2d_gpu_loops", [&] {
      const scalar_t* xp = x.const_data_ptr<scalar_t>();
      scalar_t* rs = row_sum.mutable_data_ptr<scalar_t>();
      scalar_t* yp = y.mutable_data_ptr<scalar_t>();
      const scalar_t scale = scalar_t(1) / scalar_t(divisor);
      for_each_element(row_pass_size(g), [&](int64_t i) { sum_row_pass_at(g, xp, rs, i); });
      for_each_element(output_size(g), [&](int64_t i) { avg_col_pass_at(g, rs, yp, scale, call.activation, i); });
    });
    return y;
  }
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "densecnn_avg_pool2d", [&] {
    dispatch_activation(call.activation, [&](auto act_constant) {
      avg_pool_forward<scalar_t, decltype(act_constant)::value>(call.geometry, x.const_data_ptr<scalar_t>(),
                                                                y.mutable_data_ptr<scalar_t>(), divisor);
    });
  });
  return y;
}

at::Tensor avg_pool2d_backward_cpu(const at::Tensor& grad_output, const c10::optional<at::Tensor>& output,
                                   at::IntArrayRef kernel, at::IntArrayRef dilation, int64_t divisor,
                                   c10::string_view activation) {
  TORCH_CHECK(divisor >= 1, "densecnn.avg_pool2d_backward: divisor must be a positive int, got ", divisor);
  const auto layout = pool_layout(grad_output);
  const PoolBackwardCall call =
      prepare_pool_backward("avg_pool2d_backward", grad_output, output, layout, kernel, dilation, activation);
  at::Tensor grad_x =
      empty_like_layout(call.grad_output, call.geometry.rows, call.in_cols, grad_output.scalar_type(), layout);
  if (grad_x.numel() == 0) return grad_x;
  if (gpu_loops_on_cpu()) {
    AT_DISPATCH_FLOATING_TYPES(grad_output.scalar_type(), "densecnn_avg_pool2d_backward_gpu_loops", [&] {
      const scalar_t* gy = call.grad_output.const_data_ptr<scalar_t>();
      const scalar_t* yp = call.output.const_data_ptr<scalar_t>();
      scalar_t* gx = grad_x.mutable_data_ptr<scalar_t>();
      const scalar_t scale = scalar_t(1) / scalar_t(divisor);
      for_each_element(input_size(call.geometry),
                       [&](int64_t i) { avg_backward_at(call.geometry, gy, yp, gx, scale, call.activation, i); });
    });
    return grad_x;
  }
  AT_DISPATCH_FLOATING_TYPES(grad_output.scalar_type(), "densecnn_avg_pool2d_backward", [&] {
    dispatch_activation(call.activation, [&](auto act_constant) {
      avg_pool_backward<scalar_t, decltype(act_constant)::value>(
          call.geometry, call.grad_output.const_data_ptr<scalar_t>(), call.output.const_data_ptr<scalar_t>(),
          grad_x.mutable_data_ptr<scalar_t>(), divisor);
    });
  });
  return grad_x;
}

}  // namespace

TORCH_LIBRARY_IMPL(densecnn, CPU, m) {
  m.impl("max_pool2d", &max_pool2d_cpu);
  m.impl("max_pool2d_backward", &max_pool2d_backward_cpu);
  m.impl("avg_pool2d", &avg_pool2d_cpu);
  m.impl("avg_pool2d_backward", &avg_pool2d_backward_cpu);
}

}  // namespace densecnn
