// CPU direct convolution for few input channels (the first layer of most nets: 1 or 3 channels), where torch's
// convolutions reach a fraction of the FMA rate their GEMMs reach on wide layers. Each work item is one output row
// (n, d, h) (or a run of kRunCols columns of it) of a block of kBlock output channels: registers hold kBlock × one
// vector of outputs, and every input vector
// loaded is multiplied into all kBlock channels (a broadcast weight each), so no im2col buffer is written.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <vector>

#include "cpu_isa.h"
#include "direct_conv.h"
#include "direct_conv_args.h"
#include "gpu_loops.h"
#include "pool_args.h"

namespace densecnn {
namespace {

constexpr int kBlock = 8;           // output channels per register block
constexpr int64_t kRunCols = 1024;  // columns per work item (long rows, e.g. signals, are split for the threads)

// Outputs [w0, w0 + width) of row (n, d, h) for channels [k0, k0 + kBlock) of the padded packed weight
// (K/kBlock, C·taps, kBlock); kFull: width == lanes (whole-vector loads and stores).
template <typename T, bool kFull>
DENSECNN_ALWAYS_INLINE void row_block(const DirectConvGeometry& g, const T* x, const T* packed, const T* bias,
                                      T* y, int64_t n, int64_t k0, int64_t d, int64_t h, int64_t w0, int64_t width) {
  Vec<T> acc[kBlock];
#pragma GCC unroll 8
  for (int k = 0; k < kBlock; ++k) acc[k] = Vec<T>{} + bias[k0 + k];
  const T* wk = packed + k0 * g.channels * g.kd * g.kh * g.kw;
  for (int64_t c = 0; c < g.channels; ++c) {
    for (int32_t a = 0; a < g.kd; ++a) {
      for (int32_t b = 0; b < g.kh; ++b) {
        const T* src = x + (((n * g.channels + c) * g.depth + d + a * g.dd) * g.rows + h + b * g.dh) * g.cols + w0;
        for (int32_t t = 0; t < g.kw; ++t, wk += kBlock) {
          Vec<T> v;
          if (kFull) {
            __builtin_memcpy(&v, src + t * g.dw, sizeof(v));
          } else {
            v = Vec<T>{};
            for (int64_t l = 0; l < width; ++l) v[l] = src[t * g.dw + l];
          }
#pragma GCC unroll 8
          for (int k = 0; k < kBlock; ++k) acc[k] += wk[k] * v;
        }
      }
    }
  }
  const int64_t channels = std::min<int64_t>(kBlock, g.out_channels - k0);
  T* out = y + direct_conv_offset(g, n, k0, d, h, w0);
  if (g.channels_last) {  // (.., W', K): each output pixel's block of channels is contiguous
    for (int64_t l = 0; l < width; ++l) {
      for (int64_t k = 0; k < channels; ++k) out[l * g.out_channels + k] = acc[k][l];
    }
    return;
  }
  const int64_t plane = g.out_depth * g.out_rows * g.out_cols;
  for (int64_t k = 0; k < channels; ++k) {
    if (kFull) {
      __builtin_memcpy(out + k * plane, &acc[k], sizeof(acc[k]));
    } else {
      for (int64_t l = 0; l < width; ++l) out[k * plane + l] = acc[k][l];
    }
  }
}

template <typename T>
DENSECNN_ALWAYS_INLINE void rows_loop(const DirectConvGeometry& g, const T* x, const T* packed, const T* bias, T* y,
                                      int64_t begin, int64_t end) {
  constexpr int L = lanes<T>();
  const int64_t blocks = (g.out_channels + kBlock - 1) / kBlock, runs = (g.out_cols + kRunCols - 1) / kRunCols;
  for (int64_t item = begin; item < end; ++item) {  // item = (((n · D' + d) · H' + h) · runs + run) · blocks + block
    const int64_t k0 = item % blocks * kBlock, run = item / blocks % runs, h = item / (blocks * runs) % g.out_rows;
    const int64_t d = item / (blocks * runs * g.out_rows) % g.out_depth;
    const int64_t n = item / (blocks * runs * g.out_rows * g.out_depth);
    if (g.out_cols < L) {
      row_block<T, false>(g, x, packed, bias, y, n, k0, d, h, 0, g.out_cols);
      continue;
    }
    // Whole vectors; the last one ends at the row's end, recomputing (identically) some of its neighbour's outputs.
    const int64_t stop = std::min(g.out_cols, (run + 1) * kRunCols);
    for (int64_t w0 = run * kRunCols; w0 < stop; w0 += L) {
      row_block<T, true>(g, x, packed, bias, y, n, k0, d, h, std::min<int64_t>(w0, g.out_cols - L), L);
    }
  }
}

DENSECNN_MULTIVERSION void rows(const DirectConvGeometry& g, const float* x, const float* packed, const float* bias,
                                float* y, int64_t begin, int64_t end) {
  rows_loop(g, x, packed, bias, y, begin, end);
}
DENSECNN_MULTIVERSION void rows(const DirectConvGeometry& g, const double* x, const double* packed,
                                const double* bias, double* y, int64_t begin, int64_t end) {
  rows_loop(g, x, packed, bias, y, begin, end);
}

at::Tensor direct_conv_cpu(const at::Tensor& input_, const at::Tensor& weight_, const c10::optional<at::Tensor>& bias,
                           at::IntArrayRef dilation) {
  const at::Tensor input = input_.contiguous(), weight = weight_.contiguous();
  const DirectConvGeometry g = direct_conv_geometry(input_, weight, dilation);  // read as NC*, written in its layout
  at::Tensor y = empty_in_layout(direct_conv_output_shape(g, input.dim() - 2), input.options(), g.channels_last);
  const int64_t taps = g.channels * g.kd * g.kh * g.kw;
  const at::Tensor b = bias.has_value() ? bias->contiguous() : at::Tensor();
  AT_DISPATCH_FLOATING_TYPES(input.scalar_type(), "densecnn_direct_conv", [&] {
    const scalar_t* x = input.const_data_ptr<scalar_t>();
    const scalar_t* w = weight.const_data_ptr<scalar_t>();
    scalar_t* out_data = y.mutable_data_ptr<scalar_t>();
    if (gpu_loops_on_cpu()) {
      const scalar_t* b_data = b.defined() ? b.const_data_ptr<scalar_t>() : nullptr;
      for_each_element(direct_conv_size(g), [&](int64_t e) { direct_conv_at(g, x, w, b_data, out_data, e); });
      return;
    }
    // Weight packed as (K/kBlock, C·taps, kBlock), zero-padded to whole blocks; bias padded alike.
    const int64_t blocks = (g.out_channels + kBlock - 1) / kBlock;
    std::vector<scalar_t> packed(blocks * kBlock * taps, scalar_t(0)), padded_bias(blocks * kBlock, scalar_t(0));
    for (int64_t k = 0; k < g.out_channels; ++k) {
      for (int64_t t = 0; t < taps; ++t) packed[(k / kBlock * taps + t) * kBlock + k % kBlock] = w[k * taps + t];
    }
    if (b.defined()) {
      std::copy(b.const_data_ptr<scalar_t>(), b.const_data_ptr<scalar_t>() + g.out_channels, padded_bias.begin());
    }
    const int64_t runs = (g.out_cols + kRunCols - 1) / kRunCols;
    const int64_t items = g.batch * g.out_depth * g.out_rows * runs * blocks;
    at::parallel_for(0, items, 1, [&](int64_t begin, int64_t end) {
      rows(g, x, packed.data(), padded_bias.data(), out_data, begin, end);
    });
  });
  return y;
}

}  // namespace

TORCH_LIBRARY_IMPL(densecnn, CPU, m) { m.impl("direct_conv", &direct_conv_cpu); }

}  // namespace densecnn
