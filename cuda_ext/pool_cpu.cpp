// CPU kernels of the d-sparse (stride-1, dilated) pooling ops over 1, 2 or 3 spatial axes: max and average,
// forward and backward, optionally fused with the activation that follows.
//
// Pooling is separable (common.h AxisPass): one pass per axis, innermost first, each a 1-d window over an array
// seen as (outer, len, inner). Every loop below runs over the contiguous dimension so the compiler vectorises it
// (W, or W·C in channels-last). A max pass works by doubling — max over taps {0..2p-1} = max of two windows of p
// taps — so a k-tap window costs ceil(log2 k) vector ops per output instead of k.
//
// Forward: the output is cut into boxes (a plane; per axis a block of outputs, the innermost a chunk of a row) run
// by at::parallel_for. A box reads its input box (the outputs' windows), runs the innermost pass row by row into a
// buffer that stays in L2, then the other passes over that buffer, and writes its outputs: one read of the input,
// one write of the output, whatever the number of axes. Max pooling keeps its argmax as one uint8 tap number per
// pass output (which of the k taps won); the backward gathers through them, race-free and vectorised.
//
// Reduced precision (bfloat16, float16) is widened to float when a row is read and rounded once when written:
// max is exact, sums accumulate in float.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <type_traits>
#include <vector>

#include <unistd.h>

#include "common.h"
#include "cpu_isa.h"
#include "elements.h"
#include "gpu_loops.h"
#include "pool_args.h"

namespace densecnn {
namespace {

constexpr int64_t kChunk = 2048;  // elements of a row handled by one backward work item (and the grain of a pass)
constexpr int64_t kMinChunk = 256, kMaxChunk = 16384;  // the forward's inner chunks (values): powers of 2 between
constexpr double kRowCallCost = 512;  // what a row's call to the doubling loops costs beyond its values, in values
constexpr int64_t kMinBlock = 8;      // outputs per box along an outer axis, at least (where the budget allows)
constexpr int64_t kOverflow = 4;      // boxes over this many times the budget are cut to fit it
constexpr int64_t kShortRow = 256;  // rows shorter than this (in elements) are pooled in runs of whole rows

// Bytes of this CPU's L2 cache per core (512 KiB where the system does not say).
inline int64_t l2_bytes() {
  static const int64_t bytes = [] {
    const long size = sysconf(_SC_LEVEL2_CACHE_SIZE);
    return size > 0 ? static_cast<int64_t>(size) : int64_t{512} << 10;
  }();
  return bytes;
}

// One doubling step: o[j] = max(a[j], a[j + shift]) for j < m, the right operand's tap offset by `tap_shift`.
// `o` may equal `a` (j only reads positions >= j, so the in-place loop is dependence-free).
template <typename T, bool kTaps, bool kFirst>
DENSECNN_ALWAYS_INLINE void max_step_loop(const T* a, const uint8_t* a_tap, int64_t shift, int32_t tap_shift,
                                          int64_t m, T* o, uint8_t* o_tap) {
#pragma GCC ivdep
  for (int64_t j = 0; j < m; ++j) {
    T best = a[j];
    uint8_t best_tap = kFirst ? 0 : (kTaps ? a_tap[j] : 0);
    const uint8_t right_tap = static_cast<uint8_t>((kFirst ? 0 : (kTaps ? a_tap[j + shift] : 0)) + tap_shift);
    max_update(best, best_tap, a[j + shift], right_tap);
    o[j] = best;
    if (kTaps) o_tap[j] = best_tap;
  }
}

template <bool B>
using Flag = std::integral_constant<bool, B>;

// o[j] = max(a[j], b[j]) by torch's rule (a NaN wins; `o` may be `a`): the streamed outermost pass folds its
// taps' slices.
template <typename T>
DENSECNN_ALWAYS_INLINE void max_of_loop(const T* a, const T* b, T* o, int64_t n) {
#pragma GCC ivdep
  for (int64_t j = 0; j < n; ++j) {
    T best = a[j];
    int32_t tap = 0;
    max_update(best, tap, b[j], 1);
    o[j] = best;
  }
}
DENSECNN_MULTIVERSION void max_of(const float* a, const float* b, float* o, int64_t n) { max_of_loop(a, b, o, n); }
DENSECNN_MULTIVERSION void max_of(const double* a, const double* b, double* o, int64_t n) {
  max_of_loop(a, b, o, n);
}

#define DENSECNN_MAX_STEP(T, TAPS, FIRST)                                                                       \
  DENSECNN_MULTIVERSION void max_step(Flag<TAPS>, Flag<FIRST>, const T* a, const uint8_t* a_tap, int64_t shift, \
                                      int32_t tap_shift, int64_t m, T* o, uint8_t* o_tap) {                    \
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

// Rows of reduced-precision storage widened to float on reading and rounded (to nearest even) on writing.
template <typename S, typename D>
DENSECNN_ALWAYS_INLINE void convert_loop(const S* src, D* dst, int64_t n) {
  for (int64_t j = 0; j < n; ++j) dst[j] = static_cast<D>(src[j]);
}
#define DENSECNN_CONVERT(S, D) \
  DENSECNN_MULTIVERSION void convert_row(const S* src, D* dst, int64_t n) { convert_loop(src, dst, n); }
DENSECNN_CONVERT(c10::BFloat16, float)
DENSECNN_CONVERT(float, c10::BFloat16)
DENSECNN_CONVERT(c10::Half, float)
DENSECNN_CONVERT(float, c10::Half)

// dst[j] = activation(src[j] · scale), and the gradient factor grad[j] · activation'(y[j]) · scale.
template <typename T, Activation kAct>
DENSECNN_ALWAYS_INLINE void activate_loop(const T* src, T scale, T* dst, int64_t n) {
#pragma GCC ivdep
  for (int64_t j = 0; j < n; ++j) dst[j] = activation_forward(src[j] * scale, kAct);
}
template <typename T, Activation kAct>
DENSECNN_ALWAYS_INLINE void activation_grad_loop(const T* grad, const T* y, T scale, T* dst, int64_t n) {
#pragma GCC ivdep
  for (int64_t j = 0; j < n; ++j) dst[j] = grad[j] * activation_grad(y[j], kAct) * scale;
}

template <Activation A>
using Act = std::integral_constant<Activation, A>;

#define DENSECNN_ACTIVATION(T, ACT)                                                                          \
  DENSECNN_MULTIVERSION void activate(Act<ACT>, const T* src, T scale, T* dst, int64_t n) {                  \
    activate_loop<T, ACT>(src, scale, dst, n);                                                               \
  }                                                                                                          \
  DENSECNN_MULTIVERSION void activation_grad(Act<ACT>, const T* grad, const T* y, T scale, T* dst, int64_t n) { \
    activation_grad_loop<T, ACT>(grad, y, scale, dst, n);                                                    \
  }
DENSECNN_ACTIVATION(float, Activation::kNone)
DENSECNN_ACTIVATION(float, Activation::kRelu)
DENSECNN_ACTIVATION(float, Activation::kTanh)
DENSECNN_ACTIVATION(double, Activation::kNone)
DENSECNN_ACTIVATION(double, Activation::kRelu)
DENSECNN_ACTIVATION(double, Activation::kTanh)

// A row of storage type T as accumulation type A: the row itself, or its widened copy in `buffer`.
template <typename A, typename T>
const A* widened(const T* row, int64_t n, A* buffer) {
  if constexpr (std::is_same_v<A, T>) {
    return row;
  } else {
    convert_row(row, buffer, n);
    return buffer;
  }
}

// dst (storage T) = activation(src · scale); `buffer` holds the float result before rounding to T.
template <typename T, typename A, Activation kAct>
void store_activated(const A* src, A scale, T* dst, A* buffer, int64_t n) {
  if constexpr (std::is_same_v<A, T>) {
    activate(Act<kAct>{}, src, scale, dst, n);
  } else {
    activate(Act<kAct>{}, src, scale, buffer, n);
    convert_row(buffer, dst, n);
  }
}

constexpr int kMaxLevels = 40;

// The tap shifts of a k-tap max by doubling — 1, 2, 4, ..., then the remainder, summing to k - 1 — into `shifts`;
// returns how many (0 for k = 1).
inline int doubling_shifts(int32_t k, int32_t* shifts) {
  int levels = 0;
  int32_t p = 1;
  for (; 2 * p <= k; p *= 2) shifts[levels++] = p;
  if (p < k) shifts[levels++] = k - p;
  return levels;
}

// out[j] = max over taps t < k of src[j + t·step], and the winning t, for j < n - (k-1)·step, by doubling.
// `buf` has room for n elements.
template <typename T, bool kTaps>
void window_max(const T* src, int64_t n, int32_t k, int64_t step, T* out, uint8_t* out_tap, T* buf,
                uint8_t* buf_tap) {
  if (k == 1) {
    std::copy(src, src + n, out);
    if (kTaps) std::fill(out_tap, out_tap + n, 0);
    return;
  }
  int32_t shifts[kMaxLevels];
  const int levels = doubling_shifts(k, shifts);
  int64_t len = n;
  for (int level = 0; level < levels; ++level) {
    const int64_t shift = shifts[level] * step;
    len -= shift;
    T* o = level == levels - 1 ? out : buf;
    uint8_t* o_tap = level == levels - 1 ? out_tap : buf_tap;
    if (level == 0) {
      max_step(Flag<kTaps>{}, Flag<true>{}, src, nullptr, shift, shifts[level], len, o, o_tap);
    } else {
      max_step(Flag<kTaps>{}, Flag<false>{}, buf, buf_tap, shift, shifts[level], len, o, o_tap);
    }
  }
}

// out[j] = sum over taps t < k of src[j + t·step], in tap order.
template <typename T>
void window_sum(const T* src, int64_t n, int32_t k, int64_t step, T* out) {
  const int64_t m = n - (k - 1) * step;
  std::copy(src, src + m, out);
  for (int32_t t = 1; t < k; ++t) add(out, src + t * step, m);
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

// Calls f(c) for every index c of the box of `count` axes with the given extents, in row-major order.
template <typename F>
void for_each_index(int count, const int64_t* extent, F&& f) {
  int64_t c[kMaxAxes] = {0, 0, 0};
  for (int b = 0; b < count; ++b) {
    if (extent[b] <= 0) return;
  }
  while (true) {
    f(static_cast<const int64_t*>(c));
    int b = count - 1;
    for (; b >= 0; --b) {
      if (++c[b] < extent[b]) break;
      c[b] = 0;
    }
    if (b < 0) return;
  }
}

// Row-major offset of index c + origin in an array of `count` axes with the given extents.
inline int64_t offset_of(int count, const int64_t* c, const int64_t* origin, const int64_t* extent) {
  int64_t offset = 0;
  for (int b = 0; b < count; ++b) offset = offset * extent[b] + origin[b] + c[b];
  return offset;
}

// One forward work item: a plane and, per axis, the outputs [o0, o1); `last` when the block is the axis's last.
struct Box {
  int64_t plane;
  int64_t o0[kMaxAxes], o1[kMaxAxes];
  bool last[kMaxAxes];
};

// The forward's boxes. The innermost axis is cut into chunks of outputs; each other axis, from the inside out, into
// blocks of at least kMinBlock outputs sized so that the box's input (outputs plus the window's reach) fills a
// buffer of `budget` values; a box's `buffers` such buffers take three quarters of the L2 cache. Where those
// minimum blocks take a box past kOverflow times the budget (long channels-last rows of a volume: 8 planes of 36
// rows of W·C values), the blocks are cut to fit it instead, room kept for kMinBlock outputs on every axis outside
// (boxes a little over the budget ran faster than cut ones: volumes in NCDHW). Every box reads its outputs' reach
// again and the innermost pass costs a call per row, so the chunk is the candidate with the fewest input values
// read per output, each row's call counted as kRowCallCost values: long chunks when the inner reach is long
// (channels-last rows, where it spans (k-1)·d·C values), short ones when the outer axes' reach is.
struct Boxes {
  int axes;
  int64_t planes, block[kMaxAxes], blocks[kMaxAxes], reach[kMaxAxes], out[kMaxAxes];
  int64_t budget;    // values a box's input may take
  int64_t capacity;  // values in the largest input box

  bool streamed = false;  // the outermost axis streamed slice by slice (see stream)
  // The slices a streamed box keeps in its rings: per doubling step of the outermost axis's max, its shift·step + 1
  // (reach + steps in all; an average's fold needs reach + 1 of them); and those steps, at least one.
  int64_t ring_slices = 0, outer_steps = 1;

  // `buffers` of values of `value_bytes` each and `tap_buffers` of one-byte taps share the budget; `may_stream`: the
  // forward can stream the outermost axis (no taps to keep, rows long enough to go one by one).
  Boxes(const PoolGeometry& g, int64_t value_bytes, int buffers, int tap_buffers, bool may_stream)
      : axes(g.axes), planes(g.planes), budget(l2_bytes() * 3 / 4 / (buffers * value_bytes + tap_buffers)) {
    for (int a = 0; a < axes; ++a) {
      reach[a] = (g.kernel[a] - 1) * g.step[a];
      out[a] = g.out[a];
    }
    int32_t shifts[kMaxLevels];
    outer_steps = std::max(doubling_shifts(g.kernel[0], shifts), 1);
    ring_slices = reach[0] + outer_steps;
    may_stream = may_stream && axes >= 2 && g.size[axes - 1] >= kShortRow;
    double best = 0;
    int64_t best_chunk = kMinChunk;
    bool best_streamed = false;
    for (int64_t chunk = kMinChunk; chunk <= kMaxChunk; chunk *= 2) {
      for (const bool stream_it : {false, true}) {
        if (stream_it && !may_stream) continue;
        const double cost = stream_it ? stream(chunk, budget * buffers) : shape(chunk);
        if ((chunk == kMinChunk && !stream_it) || cost < best) {
          best = cost;
          best_chunk = chunk;
          best_streamed = stream_it;
        }
      }
    }
    streamed = best_streamed;
    if (streamed) {
      stream(best_chunk, budget * buffers);
    } else {
      shape(best_chunk);
    }
  }

  // Sizes a streamed box for an inner chunk of `chunk` outputs within `total` values (the budgets of all the
  // buffers): along the outermost axis, a segment of many outputs whose input slices each go through the inner
  // passes once, into the rings that the outermost axis's steps read (ring_slices); the other axes cut so that a
  // slice, its passes' two buffers and the rings fit. Segments split the outermost axis only as far as the threads need
  // work items. Returns the cost per output, as cut's, with a call per slice for each outermost step and its store.
  double stream(int64_t chunk, int64_t total) {
    const int inner_axis = axes - 1;
    block[inner_axis] = std::max<int64_t>(1, std::min(out[inner_axis], chunk));
    capacity = block[inner_axis] + reach[inner_axis];
    const int64_t slice_budget = total / (3 + ring_slices);
    int64_t items = planes;
    for (int a = inner_axis; a >= 1; --a) {
      if (a < inner_axis) {
        block[a] = std::max<int64_t>(1, std::min(slice_budget / capacity - reach[a], out[a]));
        capacity *= block[a] + reach[a];
      }
      blocks[a] = (out[a] + block[a] - 1) / block[a];
      items *= blocks[a];
    }
    const int64_t wanted = (8 * static_cast<int64_t>(at::get_num_threads()) + items - 1) / items;
    const int64_t most = std::max<int64_t>(1, out[0] / (4 * ring_slices));  // segments of 4 rings' outputs at least
    block[0] = (out[0] + std::min(wanted, most) - 1) / std::min(wanted, most);
    blocks[0] = (out[0] + block[0] - 1) / block[0];
    double reads = 1;
    int64_t slice_out = 1;  // an output slice's values
    for (int a = 0; a < axes; ++a) {
      reads *= static_cast<double>(out[a] + blocks[a] * reach[a]) / out[a];
      if (a > 0) slice_out *= block[a];
    }
    // besides the rows' calls, a call per slice for each step along the outermost axis and its store
    const double slice_calls = kRowCallCost * (outer_steps + 1) / slice_out;
    return reads * (1 + kRowCallCost / (block[inner_axis] + reach[inner_axis]) + slice_calls);
  }

  // Sizes the blocks for an inner chunk of `chunk` outputs; returns the cost per output of that cut.
  double shape(int64_t chunk) {
    const double cost = cut(chunk, false);
    return capacity > kOverflow * budget ? cut(chunk, true) : cost;
  }

  // The blocks of `shape`, at least kMinBlock outputs on each outer axis or (`reserve`) within the budget.
  double cut(int64_t chunk, bool reserve) {
    const int inner_axis = axes - 1;
    block[inner_axis] = std::max<int64_t>(1, std::min(out[inner_axis], chunk));
    capacity = block[inner_axis] + reach[inner_axis];
    for (int a = axes - 2; a >= 0; --a) {
      int64_t outside = 1;  // the least the axes outside a take: kMinBlock outputs each (or all), with their reach
      for (int b = 0; reserve && b < a; ++b) outside *= std::min(kMinBlock, out[b]) + reach[b];
      const int64_t wanted = budget / (capacity * outside) - reach[a];
      block[a] = std::max<int64_t>(1, std::min(reserve ? wanted : std::max(kMinBlock, wanted), out[a]));
      capacity *= block[a] + reach[a];
    }
    double reads = 1;  // each block reads its outputs and the reach after them
    for (int a = 0; a < axes; ++a) {
      blocks[a] = (out[a] + block[a] - 1) / block[a];
      reads *= static_cast<double>(out[a] + blocks[a] * reach[a]) / out[a];
    }
    return reads * (1 + kRowCallCost / (block[inner_axis] + reach[inner_axis]));
  }

  int64_t count() const {
    int64_t n = planes;
    for (int a = 0; a < axes; ++a) n *= blocks[a];
    return n;
  }

  Box at(int64_t item) const {
    Box box;
    for (int a = axes - 1; a >= 0; --a) {
      const int64_t index = item % blocks[a];
      item /= blocks[a];
      box.o0[a] = index * block[a];
      box.o1[a] = std::min(box.o0[a] + block[a], out[a]);
      box.last[a] = index == blocks[a] - 1;
    }
    box.plane = item;
    return box;
  }
};

// Stores the taps of a pass (local box layout, `extent`; rows of `width` valid elements) into the
// pass's global tap array (extents `global`), for the positions this box owns: its outputs along pooled axes; along
// axes not pooled yet, its outputs' first taps, or everything up to the end of the axis when the box is the axis's
// last.
inline void store_taps(const Box& box, int axes, int pass_axis, const int64_t* extent, int64_t width,
                       const int64_t* global, const uint8_t* local_taps, uint8_t* taps) {
  const int rows_axes = axes - 1;
  int64_t owned[kMaxAxes];
  for (int b = 0; b < rows_axes; ++b) {
    owned[b] = b < pass_axis && box.last[b] ? extent[b] : box.o1[b] - box.o0[b];
  }
  const int64_t row_stride = extent[axes - 1];
  int64_t plane_rows = 1;
  for (int b = 0; b < rows_axes; ++b) plane_rows *= global[b];
  const int64_t zero[kMaxAxes] = {0, 0, 0};
  for_each_index(rows_axes, owned, [&](const int64_t* c) {
    const int64_t local = offset_of(rows_axes, c, zero, extent);
    const int64_t row = box.plane * plane_rows + offset_of(rows_axes, c, box.o0, global);
    const uint8_t* from = local_taps + local * row_stride;
    std::copy(from, from + width, taps + row * global[axes - 1] + box.o0[axes - 1]);
  });
}

// Forward without taps, the outermost axis streamed (Boxes::stream): each input slice of a box's segment goes
// through the inner passes once, the last of them writing into a ring of slices. A max then runs the outermost
// axis's doubling steps as slices arrive, each step on a ring of its own (its input's newest slice and the one
// shift·step before it), the last step giving an output slice: ceil(log2 k) passes a slice, as the boxes' doubling.
// An average folds the k slices of its window from the ring in tap order, as the boxes' sums do. Either way the
// output slice is then written out.
template <typename T, bool kMax, Activation kAct>
void pool_forward_streamed(const PoolGeometry& g, const Boxes& boxes, const T* x, T* y, Acc<T> scale) {
  using A = Acc<T>;
  const int axes = g.axes, inner_axis = axes - 1;
  int64_t in_plane = 1, out_plane = 1;
  for (int a = 0; a < axes; ++a) {
    in_plane *= g.size[a];
    out_plane *= g.out[a];
  }
  const int64_t slice_values = boxes.capacity, step0 = g.step[0], reach0 = boxes.reach[0];
  const int64_t zero[kMaxAxes] = {0, 0, 0};
  // The rings, one after the other in `ring`: a max's doubling steps' inputs (the slices themselves first), or an
  // average's (and a 1-tap window's) one ring of reach + 1 slices.
  int32_t shifts[kMaxLevels];
  const int levels = kMax ? doubling_shifts(g.kernel[0], shifts) : 0;
  const int rings = std::max(levels, 1);
  int64_t ring_size[kMaxLevels], ring_start[kMaxLevels], ring_slices = 0;
  for (int l = 0; l < rings; ++l) {
    ring_size[l] = levels > 0 ? shifts[l] * step0 + 1 : reach0 + 1;
    ring_start[l] = ring_slices;
    ring_slices += ring_size[l];
  }
  at::parallel_for(0, boxes.count(), 1, [&](int64_t begin, int64_t end) {
    const int64_t row_in = boxes.block[inner_axis] + boxes.reach[inner_axis];
    std::vector<A> band(slice_values), other(slice_values), buf(kMax ? slice_values : 0),
        ring(ring_slices * slice_values), folded(slice_values), row_buf(row_in),
        widen_buf(std::is_same_v<A, T> ? 0 : row_in);
    const auto in_ring = [&](int l, int64_t index) {  // slice `index` of ring l
      return ring.data() + (ring_start[l] + index % ring_size[l]) * slice_values;
    };
    for (int64_t item = begin; item < end; ++item) {
      const Box box = boxes.at(item);
      const int64_t w = box.o1[inner_axis] - box.o0[inner_axis], w_in = w + boxes.reach[inner_axis];
      int64_t slice_out = w;  // values of a slice after its passes
      for (int a = 1; a < inner_axis; ++a) slice_out *= box.o1[a] - box.o0[a];
      const T* xp = x + box.plane * in_plane;
      const int64_t first = box.o0[0], last = box.o1[0] + boxes.reach[0];  // the segment's input slices
      for (int64_t slice = first; slice < last; ++slice) {
        int64_t extent[kMaxAxes];  // the slice's local extents along axes 1.., shrinking as the passes pool them
        for (int a = 1; a < axes; ++a) extent[a] = box.o1[a] - box.o0[a] + (a == inner_axis ? 0 : boxes.reach[a]);
        A* slot = in_ring(0, slice);
        // The innermost pass, row by row of the slice (straight into the ring when there is no pass between).
        A* rows = inner_axis >= 2 ? band.data() : slot;
        for_each_index(inner_axis - 1, extent + 1, [&](const int64_t* c) {
          int64_t row = slice;
          for (int b = 1; b < inner_axis; ++b) row = row * g.size[b] + box.o0[b] + c[b - 1];
          const A* src = widened(xp + row * g.size[inner_axis] + box.o0[inner_axis], w_in, widen_buf.data());
          A* dst = rows + offset_of(inner_axis - 1, c, zero, extent + 1) * w;
          if constexpr (kMax) {
            window_max<A, false>(src, w_in, g.kernel[inner_axis], g.step[inner_axis], dst, nullptr,
                                 row_buf.data(), nullptr);
          } else {
            window_sum<A>(src, w_in, g.kernel[inner_axis], g.step[inner_axis], dst);
          }
        });
        // The passes between, each over the slice as (outer, len, inner), the last one into the ring.
        A* current = band.data();
        A* next = other.data();
        for (int a = inner_axis - 1; a >= 1; --a) {
          int64_t outer = 1, inner = w;
          for (int b = 1; b < a; ++b) outer *= extent[b];
          for (int b = a + 1; b < inner_axis; ++b) inner *= extent[b];
          const int64_t len = extent[a], pooled = box.o1[a] - box.o0[a];
          A* dst = a == 1 ? slot : next;
          for (int64_t o = 0; o < outer; ++o) {
            if constexpr (kMax) {
              window_max<A, false>(current + o * len * inner, len * inner, g.kernel[a], g.step[a] * inner,
                                   dst + o * pooled * inner, nullptr, buf.data(), nullptr);
            } else {
              window_sum<A>(current + o * len * inner, len * inner, g.kernel[a], g.step[a] * inner,
                            dst + o * pooled * inner);
            }
          }
          extent[a] = pooled;
          std::swap(current, next);
        }
        // The output slice whose window this slice completes: the max's doubling steps this slice makes possible
        // (each step's newest output, shift·step before its newest input), or the average's fold of its k slices.
        const int64_t ready = slice - reach0;
        const A* window = slot;
        if constexpr (kMax) {
          int64_t index = slice;
          for (int l = 0; l < levels; ++l) {
            index -= shifts[l] * step0;
            if (index < first) break;  // before the segment: no output of it needs this step's result
            A* dst = l + 1 < levels ? in_ring(l + 1, index) : folded.data();
            max_of(in_ring(l, index), in_ring(l, index + shifts[l] * step0), dst, slice_out);
            window = dst;
          }
          if (ready < first) continue;
        } else {
          if (ready < first) continue;
          window = in_ring(0, ready);
          for (int32_t t = 1; t < g.kernel[0]; ++t) {
            if (t == 1) std::copy(window, window + slice_out, folded.data());
            add(folded.data(), in_ring(0, ready + t * step0), slice_out);
            window = folded.data();
          }
        }
        for_each_index(inner_axis - 1, extent + 1, [&](const int64_t* c) {
          int64_t row = ready;
          for (int b = 1; b < inner_axis; ++b) row = row * g.out[b] + box.o0[b] + c[b - 1];
          T* dst = y + box.plane * out_plane + row * g.out[inner_axis] + box.o0[inner_axis];
          store_activated<T, A, kAct>(window + offset_of(inner_axis - 1, c, zero, extent + 1) * w, scale, dst,
                                      row_buf.data(), w);
        });
      }
    }
  });
}

// Forward of max (kMax) or average pooling; `taps[a]` receives the argmax taps of the pass along axis a (kTaps).
template <typename T, bool kMax, bool kTaps, Activation kAct>
void pool_forward(const PoolGeometry& g, const T* x, T* y, uint8_t* const* taps, Acc<T> scale) {
  using A = Acc<T>;
  const int axes = g.axes, inner_axis = axes - 1;
  const Boxes boxes(g, sizeof(A), 2 + (kMax ? 1 : 0) + (std::is_same_v<A, T> ? 0 : 1), kTaps ? 2 : 0, !kTaps);
  if constexpr (!kTaps) {
    if (boxes.streamed) return pool_forward_streamed<T, kMax, kAct>(g, boxes, x, y, scale);
  }
  int64_t in_plane = 1, out_plane = 1;
  for (int a = 0; a < axes; ++a) {
    in_plane *= g.size[a];
    out_plane *= g.out[a];
  }
  // When a box spans whole short rows, consecutive rows of the input are contiguous: the innermost pass then runs
  // over each run of rows in one call (short rows — volumes — would otherwise cost a call per row). The box keeps
  // the input's row length, and the last (k-1)·step elements of each of its rows hold values that are never stored.
  // Longer rows go one by one, so that the doubling steps of a row stay in L1.
  const bool whole_rows = axes >= 2 && boxes.blocks[inner_axis] == 1 && g.size[inner_axis] < kShortRow;
  at::parallel_for(0, boxes.count(), 1, [&](int64_t begin, int64_t end) {
    const int64_t row_in = boxes.block[inner_axis] + boxes.reach[inner_axis];
    std::vector<A> band(boxes.capacity), other(boxes.capacity), buf(kMax ? boxes.capacity : 0), row_buf(row_in),
        widen_buf(std::is_same_v<A, T> ? 0 : boxes.capacity);
    std::vector<uint8_t> tap_out(kTaps ? boxes.capacity : 0), tap_buf(kTaps ? boxes.capacity : 0),
        row_buf_tap(kTaps ? row_in : 0);
    for (int64_t item = begin; item < end; ++item) {
      const Box box = boxes.at(item);
      int64_t extent[kMaxAxes] = {};  // the box's local extents, shrinking as the passes pool their axes
      int64_t global[kMaxAxes] = {};  // the extents of the current pass's output over the whole plane
      const int64_t w = box.o1[inner_axis] - box.o0[inner_axis], w_in = w + boxes.reach[inner_axis];
      for (int a = 0; a < axes; ++a) {
        extent[a] = box.o1[a] - box.o0[a] + (a == inner_axis && !whole_rows ? 0 : boxes.reach[a]);
        global[a] = a == inner_axis ? g.out[a] : g.size[a];
      }
      const int64_t row_stride = extent[inner_axis];  // w, or w_in for whole rows
      const T* xp = x + box.plane * in_plane;
      const int64_t zero[kMaxAxes] = {0, 0, 0};
      // The innermost pass, from the input into the box: run by run of whole rows, or row by row.
      const int run_axes = whole_rows ? inner_axis - 1 : inner_axis;
      const int64_t run_rows = whole_rows ? extent[inner_axis - 1] : 1;
      for_each_index(run_axes, extent, [&](const int64_t* c) {
        int64_t local = offset_of(run_axes, c, zero, extent), row = offset_of(run_axes, c, box.o0, g.size);
        if (whole_rows) {
          local *= run_rows;
          row = row * g.size[inner_axis - 1] + box.o0[inner_axis - 1];
        }
        const int64_t n = (run_rows - 1) * row_stride + w_in;
        const A* src = widened(xp + row * g.size[inner_axis] + box.o0[inner_axis], n, widen_buf.data());
        A* dst = band.data() + local * row_stride;
        if constexpr (kMax) {
          window_max<A, kTaps>(src, n, g.kernel[inner_axis], g.step[inner_axis], dst,
                               tap_out.data() + local * row_stride, whole_rows ? buf.data() : row_buf.data(),
                               whole_rows ? tap_buf.data() : row_buf_tap.data());
        } else {
          window_sum<A>(src, n, g.kernel[inner_axis], g.step[inner_axis], dst);
        }
      });
      if (kTaps) store_taps(box, axes, inner_axis, extent, w, global, tap_out.data(), taps[inner_axis]);
      // The other passes, each over the box as (outer, len, inner).
      A* current = band.data();
      A* next = other.data();
      for (int a = inner_axis - 1; a >= 0; --a) {
        int64_t outer = 1, inner = 1;
        for (int b = 0; b < a; ++b) outer *= extent[b];
        for (int b = a + 1; b < axes; ++b) inner *= extent[b];
        const int64_t len = extent[a], pooled = box.o1[a] - box.o0[a];
        for (int64_t o = 0; o < outer; ++o) {
          const A* src = current + o * len * inner;
          if constexpr (kMax) {
            window_max<A, kTaps>(src, len * inner, g.kernel[a], g.step[a] * inner, next + o * pooled * inner,
                                 tap_out.data() + o * pooled * inner, buf.data(), tap_buf.data());
          } else {
            window_sum<A>(src, len * inner, g.kernel[a], g.step[a] * inner, next + o * pooled * inner);
          }
        }
        extent[a] = pooled;
        global[a] = g.out[a];
        if (kTaps) store_taps(box, axes, a, extent, w, global, tap_out.data(), taps[a]);
        std::swap(current, next);
      }
      // The outputs, row by row.
      for_each_index(inner_axis, extent, [&](const int64_t* c) {
        const int64_t local = offset_of(inner_axis, c, zero, extent);
        T* dst = y + box.plane * out_plane + offset_of(inner_axis, c, box.o0, g.out) * g.out[inner_axis] +
                 box.o0[inner_axis];
        store_activated<T, A, kAct>(current + local * row_stride, scale, dst, row_buf.data(), w);
      });
    }
  });
}

// Backward of one pass as a gather: grad_in (outer, in_len, inner) from grad (outer, out_len, inner), element
// (o, l, i) summing the outputs (o, l - t·dilation, i) — those whose argmax tap is t, for max. Seen along the
// flattened (len·inner) row of a slab, each tap t is one shifted contiguous range: vectorised and race-free.
template <typename A, bool kMax, typename D>
void gather_pass(const AxisPass& p, const A* grad, const uint8_t* tap, D* grad_in) {
  const int64_t row = p.in_len * p.inner, out_row = p.out_len * p.inner, shift = p.dilation * p.inner;
  const int64_t chunks = (row + kChunk - 1) / kChunk;
  at::parallel_for(0, p.outer * chunks, 1, [&](int64_t begin, int64_t end) {
    std::vector<A> acc(std::is_same_v<A, D> ? 0 : kChunk);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t o = item / chunks, c0 = item % chunks * kChunk, c1 = std::min(c0 + kChunk, row);
      A* sum;
      if constexpr (std::is_same_v<A, D>) {
        sum = grad_in + o * row + c0;
      } else {
        sum = acc.data();
      }
      std::fill(sum, sum + (c1 - c0), A(0));
      for (int32_t t = 0; t < p.kernel; ++t) {
        const int64_t lo = std::max(c0, t * shift), hi = std::min(c1, t * shift + out_row);
        if (lo >= hi) continue;
        const int64_t src = o * out_row + lo - t * shift;
        if constexpr (kMax) {
          select_add(sum + (lo - c0), grad + src, tap + src, t, hi - lo);
        } else {
          add(sum + (lo - c0), grad + src, hi - lo);
        }
      }
      if constexpr (!std::is_same_v<A, D>) convert_row(sum, grad_in + o * row + c0, c1 - c0);
    }
  });
}

// The last two backward gathers fused, row by row: along the rows (axis n-2) into a row buffer, then along the
// innermost axis straight into grad_x — one read of the gradient and one write of grad_x, as a 2-D image needs.
// grad (outer, H', W') is the gradient after pooling both axes; when `y` is given (the first gathers of a 2-D
// pooling), each gathered row is first multiplied by activation'(y) · scale.
template <typename A, bool kMax, typename D>
void gather_last_two(const PoolGeometry& g, const A* grad, const A* y, Activation activation, A scale,
                     const uint8_t* rows_tap, const uint8_t* row_tap, D* grad_x) {
  const AxisPass rows = axis_pass(g, g.axes - 2), row = axis_pass(g, g.axes - 1);
  const int64_t h = rows.in_len, h_out = rows.out_len, w_out = rows.inner, w = row.in_len;
  const int64_t reach = (row.kernel - 1) * row.dilation;
  const int64_t chunk = std::max<int64_t>(1, std::min(w, kChunk)), chunks = (w + chunk - 1) / chunk;
  const bool plain = y == nullptr && scale == A(1);
  at::parallel_for(0, rows.outer * h * chunks, 1, [&](int64_t begin, int64_t end) {
    std::vector<A> gathered(chunk + reach), scaled(plain ? 0 : chunk + reach), acc(std::is_same_v<A, D> ? 0 : chunk);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t o = item / (h * chunks), r = item / chunks % h, c0 = item % chunks * chunk;
      const int64_t c1 = std::min(c0 + chunk, w), j0 = std::max<int64_t>(0, c0 - reach), j1 = std::min(c1, w_out);
      std::fill(gathered.begin(), gathered.end(), A(0));  // gathered[j - j0]: the gradient of element j of row r
      for (int32_t a = 0; a < rows.kernel && j0 < j1; ++a) {
        const int64_t i = r - a * rows.dilation;
        if (i < 0) break;
        if (i >= h_out) continue;
        const int64_t off = (o * h_out + i) * w_out + j0;
        const A* gy = grad + off;
        if (!plain) {
          dispatch_activation(activation, [&](auto act_constant) {
            activation_grad(act_constant, gy, y == nullptr ? gy : y + off, scale, scaled.data(), j1 - j0);
          });
          gy = scaled.data();
        }
        if constexpr (kMax) {
          select_add(gathered.data(), gy, rows_tap + off, a, j1 - j0);
        } else {
          add(gathered.data(), gy, j1 - j0);
        }
      }
      D* gx_row = grad_x + (o * h + r) * w;
      A* sum;
      if constexpr (std::is_same_v<A, D>) {
        sum = gx_row + c0;
      } else {
        sum = acc.data();
      }
      std::fill(sum, sum + (c1 - c0), A(0));
      const uint8_t* taps_of_row = row_tap + (o * h + r) * w_out;
      for (int32_t b = 0; b < row.kernel; ++b) {
        const int64_t shift = b * row.dilation;
        const int64_t lo = std::max(j0, c0 - shift), hi = std::min(j1, c1 - shift);
        if (lo >= hi) continue;
        if constexpr (kMax) {
          select_add(sum + (lo + shift - c0), gathered.data() + (lo - j0), taps_of_row + lo, b, hi - lo);
        } else {
          add(sum + (lo + shift - c0), gathered.data() + (lo - j0), hi - lo);
        }
      }
      if constexpr (!std::is_same_v<A, D>) convert_row(sum, gx_row + c0, c1 - c0);
    }
  });
}

// Backward of max (kMax, through `taps`) or average pooling: the passes' gathers in reverse order, outermost axis
// first, from grad_y · activation'(y) · scale to grad_x; the last two fused (gather_last_two). `scratch`
// (backward_scratch_size values) first holds grad_y · activation'(y) · scale in the accumulation type when the
// gathers cannot apply it themselves, then two slots of intermediate_size values for the passes before the last two.
template <typename T>
bool needs_incoming(const PoolGeometry& g, Activation activation, Acc<T> scale) {
  const bool factor = activation != Activation::kNone || scale != Acc<T>(1);
  // gather_last_two applies it to each row it gathers, once per tap of the window along the rows: for 2 taps
  // cheaper than a pass of its own, for more (plain_133's 8 × 8 pool: 8 times each row) not
  const bool inline_factor = std::is_same_v<Acc<T>, T> && g.axes == 2 && g.kernel[0] <= 2;
  return !std::is_same_v<Acc<T>, T> || (factor && !inline_factor);
}

// Scratch values pool_backward needs: `incoming` (if needs_incoming), then the slots (for three axes).
template <typename T>
int64_t backward_scratch_size(const PoolGeometry& g, Activation activation, Acc<T> scale) {
  const int64_t incoming = needs_incoming<T>(g, activation, scale) ? pass_output_size(axis_pass(g, 0)) : 0;
  return incoming + (g.axes >= 3 ? 2 * intermediate_size(g) : 0);
}

template <typename T, bool kMax>
void pool_backward(const PoolGeometry& g, const T* grad_y, const T* y, const uint8_t* const* taps, T* grad_x,
                   Activation activation, Acc<T> scale, Acc<T>* scratch) {
  using A = Acc<T>;
  const A* grad = reinterpret_cast<const A*>(grad_y);  // used only when A is T
  const A* output = activation == Activation::kNone ? nullptr : reinterpret_cast<const A*>(y);
  A* incoming = scratch;
  if (needs_incoming<T>(g, activation, scale)) {
    const int64_t n_out = pass_output_size(axis_pass(g, 0));
    scratch += n_out;
    at::parallel_for(0, n_out, kChunk, [&](int64_t begin, int64_t end) {
      // Widened copies (reduced precision only) of one kChunk at a time: a thread's range is up to half the map
      constexpr bool kWidens = !std::is_same_v<A, T>;
      std::vector<A> gy(kWidens ? kChunk : 0), yy(kWidens && y != nullptr ? kChunk : 0);
      for (int64_t c0 = begin; c0 < end; c0 += kChunk) {
        const int64_t n = std::min(kChunk, end - c0);
        const A* gyp = widened(grad_y + c0, n, gy.data());
        const A* yp = y == nullptr ? gyp : widened(y + c0, n, yy.data());
        dispatch_activation(activation, [&](auto act_constant) {
          activation_grad(act_constant, gyp, yp, scale, incoming + c0, n);
        });
      }
    });
    grad = incoming;
    output = nullptr;
    activation = Activation::kNone;
    scale = A(1);
  }
  if (g.axes == 1) {
    gather_pass<A, kMax>(axis_pass(g, 0), grad, kMax ? taps[0] : nullptr, grad_x);
    return;
  }
  A* slots[2] = {scratch, scratch + intermediate_size(g)};
  for (int a = 0; a + 2 < g.axes; ++a) {
    gather_pass<A, kMax>(axis_pass(g, a), grad, kMax ? taps[a] : nullptr, slots[a % 2]);
    grad = slots[a % 2];
  }
  const int rows_axis = g.axes - 2;
  gather_last_two<A, kMax>(g, grad, output, activation, scale, kMax ? taps[rows_axis] : nullptr,
                           kMax ? taps[rows_axis + 1] : nullptr, grad_x);
}

// ---- the CUDA kernels' passes (elements.h), run on the CPU for the tests ----

template <typename T>
void max_forward_element_loops(const PoolGeometry& g, const T* x, T* y, uint8_t* const* taps, Activation activation,
                               Acc<T>* scratch) {
  forward_passes(g, x, y, scratch, [&](int a, const AxisPass& p, const auto* src, auto* dst, bool last) {
    uint8_t* tap = taps == nullptr ? nullptr : taps[a];
    const Activation act = last ? activation : Activation::kNone;
    for_each_element(pass_output_size(p), [&](int64_t e) { max_pass_at<Acc<T>>(p, src, dst, tap, act, e); });
  });
}

template <typename T>
void avg_forward_element_loops(const PoolGeometry& g, const T* x, T* y, Activation activation, Acc<T> scale,
                               Acc<T>* scratch) {
  forward_passes(g, x, y, scratch, [&](int, const AxisPass& p, const auto* src, auto* dst, bool last) {
    const Activation act = last ? activation : Activation::kNone;
    const Acc<T> s = last ? scale : Acc<T>(1);
    for_each_element(pass_output_size(p), [&](int64_t e) { sum_pass_at<Acc<T>>(p, src, dst, s, act, e); });
  });
}

// kMax: through the taps; otherwise average pooling (scale = 1 / divisor).
template <typename T, bool kMax>
void backward_element_loops(const PoolGeometry& g, const T* grad_y, const T* y, const uint8_t* const* taps,
                            T* grad_x, Activation activation, Acc<T> scale, Acc<T>* scratch) {
  using A = Acc<T>;
  const T* output = activation == Activation::kNone ? nullptr : y;
  backward_passes(g, grad_y, output, grad_x, scratch,
                  [&](int a, const AxisPass& p, const auto* grad, const T* out, auto* grad_in, bool first) {
                    const Activation act = first ? activation : Activation::kNone;
                    const A s = first ? scale : A(1);
                    for_each_element(pass_input_size(p), [&](int64_t e) {
                      if constexpr (kMax) {
                        max_pass_backward_at<A>(p, grad, out, taps[a], grad_in, act, e);
                      } else {
                        sum_pass_backward_at<A>(p, grad, out, grad_in, s, act, e);
                      }
                    });
                  });
}

// ---- torch-facing CPU ops ----

// A workspace of `size` accumulation values, on the output cache's blocks (output_buffers.h) as the outputs are: the
// backward's scaled incoming gradient is as large as its output gradient, and a fresh one past malloc's mmap
// threshold (32 MB) was mapped anew, page by page, on every call (8 crops of 191², 50 channels: 2.9× the backward).
template <typename T>
at::Tensor scratch_of(int64_t size, const at::Tensor& like) {
  return empty_output({size}, like.options().dtype(c10::CppTypeToScalarType<Acc<T>>::value));
}

// The two slots between passes of the per-element loops.
template <typename T>
at::Tensor scratch_for(const PoolGeometry& g, const at::Tensor& like) {
  return scratch_of<T>(2 * intermediate_size(g), like);
}

std::tuple<at::Tensor, std::vector<at::Tensor>> max_pool_cpu(const at::Tensor& input, at::IntArrayRef kernel,
                                                             at::IntArrayRef dilation, c10::string_view activation,
                                                             bool with_taps) {
  const PoolCall call = prepare_pool("max_pool", input, kernel, dilation, activation);
  check_max_kernel("max_pool", kernel);
  const PoolGeometry& g = call.geometry;
  const at::Tensor& x = call.input;
  at::Tensor y = empty_in_layout(call.out_sizes, x.options(), call.channels_last);
  std::vector<at::Tensor> taps = with_taps ? empty_taps(call, kernel, dilation) : std::vector<at::Tensor>{};
  if (y.numel() == 0) return {y, taps};
  uint8_t* tap_ptrs[kMaxAxes] = {nullptr, nullptr, nullptr};
  for (size_t a = 0; a < taps.size(); ++a) tap_ptrs[a] = taps[a].mutable_data_ptr<uint8_t>();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "densecnn_max_pool", [&] {
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    scalar_t* yp = y.mutable_data_ptr<scalar_t>();
    if (gpu_loops_on_cpu()) {
      at::Tensor scratch = scratch_for<scalar_t>(g, x);
      max_forward_element_loops(g, xp, yp, with_taps ? tap_ptrs : nullptr, call.activation,
                                scratch.mutable_data_ptr<Acc<scalar_t>>());
      return;
    }
    dispatch_activation(call.activation, [&](auto act_constant) {
      constexpr Activation kAct = decltype(act_constant)::value;
      if (with_taps) {
        pool_forward<scalar_t, true, true, kAct>(g, xp, yp, tap_ptrs, 1);
      } else {
        pool_forward<scalar_t, true, false, kAct>(g, xp, yp, nullptr, 1);
      }
    });
  });
  return {y, taps};
}

at::Tensor max_pool_backward_cpu(const at::Tensor& grad_output, const c10::optional<at::Tensor>& output,
                                 at::TensorList taps, at::IntArrayRef kernel, at::IntArrayRef dilation,
                                 c10::string_view activation) {
  const char* op = "max_pool_backward";
  TORCH_CHECK(!taps.empty(), "densecnn.", op, ": no taps; pass those of the forward call made with with_taps=True");
  check_max_kernel(op, kernel);
  const PoolBackwardCall call =
      prepare_pool_backward(op, grad_output, output, is_channels_last(taps.back()), kernel, dilation, activation);
  const std::vector<at::Tensor> compact_taps = checked_taps(op, call, taps, kernel, dilation);
  const PoolGeometry& g = call.geometry;
  at::Tensor grad_x = empty_in_layout(call.in_sizes, grad_output.options(), call.channels_last);
  if (grad_x.numel() == 0) return grad_x;
  const uint8_t* tap_ptrs[kMaxAxes] = {nullptr, nullptr, nullptr};
  for (size_t a = 0; a < compact_taps.size(); ++a) tap_ptrs[a] = compact_taps[a].const_data_ptr<uint8_t>();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, grad_output.scalar_type(), "densecnn_max_pool_backward",
                                  [&] {
    const scalar_t* gy = call.grad_output.const_data_ptr<scalar_t>();
    const scalar_t* yp = call.output ? call.output->const_data_ptr<scalar_t>() : nullptr;
    scalar_t* gx = grad_x.mutable_data_ptr<scalar_t>();
    if (gpu_loops_on_cpu()) {
      at::Tensor scratch = scratch_for<scalar_t>(g, grad_output);
      backward_element_loops<scalar_t, true>(g, gy, yp, tap_ptrs, gx, call.activation, 1,
                                             scratch.mutable_data_ptr<Acc<scalar_t>>());
    } else {
      at::Tensor scratch = scratch_of<scalar_t>(backward_scratch_size<scalar_t>(g, call.activation, 1), grad_output);
      pool_backward<scalar_t, true>(g, gy, yp, tap_ptrs, gx, call.activation, 1,
                                    scratch.mutable_data_ptr<Acc<scalar_t>>());
    }
  });
  return grad_x;
}

at::Tensor avg_pool_cpu(const at::Tensor& input, at::IntArrayRef kernel, at::IntArrayRef dilation, int64_t divisor,
                        c10::string_view activation) {
  const PoolCall call = prepare_pool("avg_pool", input, kernel, dilation, activation);
  TORCH_CHECK(divisor >= 1, "densecnn.avg_pool: divisor must be a positive int, got ", divisor);
  const PoolGeometry& g = call.geometry;
  const at::Tensor& x = call.input;
  at::Tensor y = empty_in_layout(call.out_sizes, x.options(), call.channels_last);
  if (y.numel() == 0) return y;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "densecnn_avg_pool", [&] {
    using A = Acc<scalar_t>;
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    scalar_t* yp = y.mutable_data_ptr<scalar_t>();
    const A scale = A(1) / A(divisor);
    if (gpu_loops_on_cpu()) {
      at::Tensor scratch = scratch_for<scalar_t>(g, x);
      avg_forward_element_loops(g, xp, yp, call.activation, scale, scratch.mutable_data_ptr<A>());
      return;
    }
    dispatch_activation(call.activation, [&](auto act_constant) {
      pool_forward<scalar_t, false, false, decltype(act_constant)::value>(g, xp, yp, nullptr, scale);
    });
  });
  return y;
}

at::Tensor avg_pool_backward_cpu(const at::Tensor& grad_output, const c10::optional<at::Tensor>& output,
                                 at::IntArrayRef kernel, at::IntArrayRef dilation, int64_t divisor,
                                 c10::string_view activation) {
  const char* op = "avg_pool_backward";
  TORCH_CHECK(divisor >= 1, "densecnn.", op, ": divisor must be a positive int, got ", divisor);
  const PoolBackwardCall call = prepare_pool_backward(op, grad_output, output, is_channels_last(grad_output), kernel,
                                                      dilation, activation);
  const PoolGeometry& g = call.geometry;
  at::Tensor grad_x = empty_in_layout(call.in_sizes, grad_output.options(), call.channels_last);
  if (grad_x.numel() == 0) return grad_x;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, grad_output.scalar_type(), "densecnn_avg_pool_backward",
                                  [&] {
    using A = Acc<scalar_t>;
    const scalar_t* gy = call.grad_output.const_data_ptr<scalar_t>();
    const scalar_t* yp = call.output ? call.output->const_data_ptr<scalar_t>() : nullptr;
    scalar_t* gx = grad_x.mutable_data_ptr<scalar_t>();
    const A scale = A(1) / A(divisor);
    if (gpu_loops_on_cpu()) {
      at::Tensor scratch = scratch_for<scalar_t>(g, grad_output);
      backward_element_loops<scalar_t, false>(g, gy, yp, nullptr, gx, call.activation, scale,
                                              scratch.mutable_data_ptr<A>());
    } else {
      at::Tensor scratch = scratch_of<scalar_t>(backward_scratch_size<scalar_t>(g, call.activation, scale), grad_output);
      pool_backward<scalar_t, false>(g, gy, yp, nullptr, gx, call.activation, scale, scratch.mutable_data_ptr<A>());
    }
  });
  return grad_x;
}

}  // namespace

TORCH_LIBRARY_IMPL(densecnn, CPU, m) {
  m.impl("max_pool", &max_pool_cpu);
  m.impl("max_pool_backward", &max_pool_backward_cpu);
  m.impl("avg_pool", &avg_pool_cpu);
  m.impl("avg_pool_backward", &avg_pool_backward_cpu);
}

}  // namespace densecnn
