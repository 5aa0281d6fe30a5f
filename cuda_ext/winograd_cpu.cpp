// CPU loops of the Winograd transform ops (winograd.h): parallel over the chunk's tiles, each tile's transform run
// on blocks of kLanes channels at once so that every step of the per-tile body is a loop over kLanes contiguous
// values, which the compiler vectorises (AVX-512, AVX2 or baseline, picked at load time).
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>

#include "common.h"
#include "gpu_loops.h"
#include "winograd.h"
#include "winograd_args.h"

namespace densecnn {
namespace {

constexpr int kLanes = 16;  // channels per vectorised block: one AVX-512 float vector

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define DENSECNN_WINOGRAD_MULTIVERSION __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define DENSECNN_WINOGRAD_MULTIVERSION
#endif

template <int N>
using Int = std::integral_constant<int, N>;

template <int M, int AXES, typename T>
inline void input_tiles_loop(const WinogradGeometry& g, const T* x, T* v, int64_t begin, int64_t end) {
  alignas(64) Acc<T> buffer[winograd_buffer_size<M, AXES, kLanes>()];
  for (int64_t tile = begin; tile < end; ++tile) {
    for (int64_t c0 = 0; c0 < g.channels; c0 += kLanes) {
      const int lanes = static_cast<int>(std::min<int64_t>(kLanes, g.channels - c0));
      winograd_input_tile<M, AXES, kLanes>(g, x, v, tile, c0, lanes, buffer);
    }
  }
}

template <int M, int AXES, typename T>
inline void output_tiles_loop(const WinogradGeometry& g, const T* m, const T* bias, T* y, int64_t begin,
                              int64_t end) {
  alignas(64) Acc<T> buffer[winograd_buffer_size<M, AXES, kLanes>()];
  for (int64_t tile = begin; tile < end; ++tile) {
    for (int64_t k0 = 0; k0 < g.channels; k0 += kLanes) {
      const int lanes = static_cast<int>(std::min<int64_t>(kLanes, g.channels - k0));
      winograd_output_tile<M, AXES, kLanes>(g, m, bias, y, tile, k0, lanes, buffer);
    }
  }
}

#define DENSECNN_WINOGRAD_LOOPS(M, AXES, T)                                                                     \
  DENSECNN_WINOGRAD_MULTIVERSION void input_tiles(Int<M>, Int<AXES>, const WinogradGeometry& g, const T* x,    \
                                                  T* v, int64_t begin, int64_t end) {                          \
    input_tiles_loop<M, AXES>(g, x, v, begin, end);                                                            \
  }                                                                                                            \
  DENSECNN_WINOGRAD_MULTIVERSION void output_tiles(Int<M>, Int<AXES>, const WinogradGeometry& g, const T* m,   \
                                                   const T* bias, T* y, int64_t begin, int64_t end) {          \
    output_tiles_loop<M, AXES>(g, m, bias, y, begin, end);                                                     \
  }
DENSECNN_WINOGRAD_LOOPS(2, 2, float)
DENSECNN_WINOGRAD_LOOPS(2, 3, float)
DENSECNN_WINOGRAD_LOOPS(4, 2, float)
DENSECNN_WINOGRAD_LOOPS(4, 3, float)
DENSECNN_WINOGRAD_LOOPS(2, 2, double)
DENSECNN_WINOGRAD_LOOPS(2, 3, double)
DENSECNN_WINOGRAD_LOOPS(4, 2, double)
DENSECNN_WINOGRAD_LOOPS(4, 3, double)

at::Tensor winograd_input_cpu(const at::Tensor& input, at::IntArrayRef dilation, int64_t m, int64_t tile_begin,
                              int64_t tile_count) {
  const WinogradGeometry g = winograd_input_geometry(input, dilation, m, tile_begin, tile_count);
  const int64_t points = g.axes == 2 ? (m + 2) * (m + 2) : (m + 2) * (m + 2) * (m + 2);
  at::Tensor v = at::empty({points, tile_count, g.channels}, input.options());
  if (v.numel() == 0) return v;
  AT_DISPATCH_FLOATING_TYPES(input.scalar_type(), "densecnn_winograd_input", [&] {
    const scalar_t* x = input.const_data_ptr<scalar_t>();
    scalar_t* out = v.mutable_data_ptr<scalar_t>();
    dispatch_winograd(m, g.axes, [&](auto m_tag, auto axes_tag) {
      constexpr int M = decltype(m_tag)::value, AXES = decltype(axes_tag)::value;
      if (gpu_loops_on_cpu()) {
        for_each_element(tile_count * g.channels, [&](int64_t i) { winograd_input_at<M, AXES>(g, x, out, i); });
        return;
      }
      at::parallel_for(0, tile_count, 8, [&](int64_t begin, int64_t end) {
        input_tiles(m_tag, axes_tag, g, x, out, begin, end);
      });
    });
  });
  return v;
}

void winograd_output_cpu(at::Tensor& output, const at::Tensor& transformed, const c10::optional<at::Tensor>& bias,
                         at::IntArrayRef dilation, int64_t m, int64_t tile_begin) {
  const WinogradGeometry g = winograd_output_geometry(output, transformed, bias, dilation, m, tile_begin);
  if (g.tile_count == 0 || output.numel() == 0) return;
  AT_DISPATCH_FLOATING_TYPES(output.scalar_type(), "densecnn_winograd_output", [&] {
    const scalar_t* src = transformed.const_data_ptr<scalar_t>();
    const scalar_t* b = bias.has_value() ? bias->const_data_ptr<scalar_t>() : nullptr;
    scalar_t* y = output.mutable_data_ptr<scalar_t>();
    dispatch_winograd(m, g.axes, [&](auto m_tag, auto axes_tag) {
      constexpr int M = decltype(m_tag)::value, AXES = decltype(axes_tag)::value;
      if (gpu_loops_on_cpu()) {
        for_each_element(g.tile_count * g.channels,
                         [&](int64_t i) { winograd_output_at<M, AXES>(g, src, b, y, i); });
        return;
      }
      at::parallel_for(0, g.tile_count, 8, [&](int64_t begin, int64_t end) {
        output_tiles(m_tag, axes_tag, g, src, b, y, begin, end);
      });
    });
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(densecnn, CPU, m) {
  m.impl("winograd_input", &winograd_input_cpu);
  m.impl("winograd_output", &winograd_output_cpu);
}

}  // namespace densecnn
