// CPU direct convolution for few input channels (the first layer of most nets: 1 or 3 channels), where torch's
// convolutions reach a fraction of the FMA rate their GEMMs reach on wide layers. No im2col buffer is written: each
// work item is one output row (n, d, h) (or a run of kRunCols columns of it), its outputs kept in registers while
// the channels and taps are summed into them, blocked to suit the output's layout:
// - NC* outputs: kBlock output channels × one vector of a row's outputs, every input vector loaded multiplied into
//   all kBlock channels (a broadcast weight each), each channel's vector stored whole;
// - channels-last outputs: kPixels output pixels × one vector of output channels, every weight vector loaded
//   multiplied into all kPixels pixels (a broadcast input each), each pixel's channels stored whole (blocking as for
//   NC* would leave every output a scalar store at a stride of K).
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

constexpr int kBlock = 8;           // output channels per register block (NC* outputs)
constexpr int kPixels = 6;          // output pixels per register block (channels-last outputs)
constexpr int64_t kRunCols = 1024;  // columns per work item (long rows, e.g. signals, are split for the threads)

// The register blocks of output channels, [k0, k0 + block_width(g, k0, bytes)) each: kBlock wide for NC* outputs;
// for channels-last ones whole vectors of `bytes` (kVecBytes: cpu_isa.h), and half of one for a last block of at
// most that many channels.
template <typename T>
DENSECNN_ALWAYS_INLINE int64_t block_width(const DirectConvGeometry& g, int64_t k0, int bytes) {
  if (!g.channels_last) return kBlock;
  const int64_t whole = bytes / sizeof(T);
  return g.out_channels - k0 > whole / 2 ? whole : whole / 2;
}

// NC* outputs [w0, w0 + width) of row (n, d, h) for channels [k0, k0 + kBlock) of the packed weight (blocks of
// (C·taps, kBlock)), in vectors of B bytes; kFull: width == their lanes (whole-vector loads and stores).
template <int B, typename T, bool kFull>
DENSECNN_ALWAYS_INLINE void row_block(const DirectConvGeometry& g, const T* x, const T* packed, const T* bias,
                                      T* y, int64_t n, int64_t k0, int64_t d, int64_t h, int64_t w0, int64_t width) {
  using V = Vec<T, B>;
  V acc[kBlock];
#pragma GCC unroll 8
  for (int k = 0; k < kBlock; ++k) acc[k] = V{} + bias[k0 + k];
  const T* wk = packed + k0 * g.channels * g.kd * g.kh * g.kw;
  for (int64_t c = 0; c < g.channels; ++c) {
    for (int32_t a = 0; a < g.kd; ++a) {
      for (int32_t b = 0; b < g.kh; ++b) {
        const T* src = x + direct_conv_input_offset(g, n, c, d + a * g.dd, h + b * g.dh, w0);
        for (int32_t t = 0; t < g.kw; ++t, wk += kBlock) {
          V v;
          if (kFull) {
            __builtin_memcpy(&v, src + t * g.dw, sizeof(v));
          } else {
            v = V{};
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
  const int64_t plane = g.out_depth * g.out_rows * g.out_cols;
  for (int64_t k = 0; k < channels; ++k) {
    if (kFull) {
      __builtin_memcpy(out + k * plane, &acc[k], sizeof(acc[k]));
    } else {
      for (int64_t l = 0; l < width; ++l) out[k * plane + l] = acc[k][l];
    }
  }
}

// Channels-last outputs [w0, w0 + R) of row (n, d, h) for channels [k0, k0 + W) of the packed weight (a block of
// (C·taps, W)).
template <int R, int W, typename T>
DENSECNN_ALWAYS_INLINE void pixels_block(const DirectConvGeometry& g, const T* x, const T* packed, const T* bias,
                                         T* y, int64_t n, int64_t k0, int64_t d, int64_t h, int64_t w0) {
  using V = Vec<T, int(W * sizeof(T))>;
  V acc[R];
  V b;
  __builtin_memcpy(&b, bias + k0, sizeof(b));
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) acc[r] = b;
  const T* wk = packed + k0 * g.channels * g.kd * g.kh * g.kw;
  for (int64_t c = 0; c < g.channels; ++c) {
    for (int32_t a = 0; a < g.kd; ++a) {
      for (int32_t b = 0; b < g.kh; ++b) {
        const T* src = x + direct_conv_input_offset(g, n, c, d + a * g.dd, h + b * g.dh, w0);
        for (int32_t t = 0; t < g.kw; ++t, wk += W) {
          const T* tap = src + int64_t(t) * g.dw;  // the R pixels' inputs under tap t
          V weights;
          __builtin_memcpy(&weights, wk, sizeof(weights));
#pragma GCC unroll 8
          for (int r = 0; r < R; ++r) acc[r] += tap[r] * weights;
        }
      }
    }
  }
  const int64_t channels = std::min<int64_t>(W, g.out_channels - k0);
  T* out = y + direct_conv_offset(g, n, k0, d, h, w0);  // (.., W', K): a pixel's channels are contiguous
  for (int r = 0; r < R; ++r) {
    if (channels == W) {
      __builtin_memcpy(out + r * g.out_channels, &acc[r], sizeof(acc[r]));
    } else {
      for (int64_t k = 0; k < channels; ++k) out[r * g.out_channels + k] = acc[r][k];
    }
  }
}

// Channels-last outputs [begin, end) of row (n, d, h) for channels [k0, k0 + W): blocks of kPixels and a last
// block of what is left.
template <int W, typename T>
DENSECNN_ALWAYS_INLINE void pixels_run(const DirectConvGeometry& g, const T* x, const T* packed, const T* bias, T* y,
                                       int64_t n, int64_t k0, int64_t d, int64_t h, int64_t begin, int64_t end) {
  int64_t w0 = begin;
  for (; w0 + kPixels <= end; w0 += kPixels) pixels_block<kPixels, W>(g, x, packed, bias, y, n, k0, d, h, w0);
  switch (end - w0) {
    case 0: break;
    case 1: pixels_block<1, W>(g, x, packed, bias, y, n, k0, d, h, w0); break;
    case 2: pixels_block<2, W>(g, x, packed, bias, y, n, k0, d, h, w0); break;
    case 3: pixels_block<3, W>(g, x, packed, bias, y, n, k0, d, h, w0); break;
    case 4: pixels_block<4, W>(g, x, packed, bias, y, n, k0, d, h, w0); break;
    default: pixels_block<5, W>(g, x, packed, bias, y, n, k0, d, h, w0);
  }
}

// Work items [begin, end), in vectors of B bytes.
template <int B, typename T>
DENSECNN_ALWAYS_INLINE void rows_loop(const DirectConvGeometry& g, const T* x, const T* packed, const T* bias, T* y,
                                      int64_t begin, int64_t end) {
  constexpr int L = lanes<T, B>();
  // NC* outputs: one block of kBlock channels per item; channels-last ones: all of a pixel's channels in one item
  const int64_t blocks = g.channels_last ? 1 : (g.out_channels + kBlock - 1) / kBlock;
  const int64_t runs = (g.out_cols + kRunCols - 1) / kRunCols;
  for (int64_t item = begin; item < end; ++item) {  // item = (((n · D' + d) · H' + h) · runs + run) · blocks + block
    const int64_t block = item % blocks, run = item / blocks % runs, h = item / (blocks * runs) % g.out_rows;
    const int64_t d = item / (blocks * runs * g.out_rows) % g.out_depth;
    const int64_t n = item / (blocks * runs * g.out_rows * g.out_depth);
    const int64_t stop = std::min(g.out_cols, (run + 1) * kRunCols);
    if (g.channels_last) {
      for (int64_t k0 = 0; k0 < g.out_channels; k0 += block_width<T>(g, k0, B)) {
        if (block_width<T>(g, k0, B) == L) {
          pixels_run<L>(g, x, packed, bias, y, n, k0, d, h, run * kRunCols, stop);
        } else {
          pixels_run<L / 2>(g, x, packed, bias, y, n, k0, d, h, run * kRunCols, stop);
        }
      }
      continue;
    }
    const int64_t k0 = block * kBlock;
    if (g.out_cols < L) {
      row_block<B, T, false>(g, x, packed, bias, y, n, k0, d, h, 0, g.out_cols);
      continue;
    }
    // Whole vectors; the last one ends at the row's end, recomputing (identically) some of its neighbour's outputs.
    for (int64_t w0 = run * kRunCols; w0 < stop; w0 += L) {
      row_block<B, T, true>(g, x, packed, bias, y, n, k0, d, h, std::min<int64_t>(w0, g.out_cols - L), L);
    }
  }
}

#define DENSECNN_DIRECT_ROWS(T)                                                                               \
  DENSECNN_PER_LEVEL((void rows(const DirectConvGeometry& g, const T* x, const T* packed, const T* bias, T* y,  \
                                int64_t begin, int64_t end)),                                                  \
                     rows_loop<kVecBytes>(g, x, packed, bias, y, begin, end);)
DENSECNN_DIRECT_ROWS(float)
DENSECNN_DIRECT_ROWS(double)

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
    // Weight packed in the register blocks of output channels of the rows this CPU runs, [k0, k0 + width) a
    // (C·taps, width) matrix at k0 · taps, zero-padded past K; the bias padded alike.
    const int bytes = dispatched_vector_bytes();
    int64_t padded = 0;
    while (padded < g.out_channels) padded += block_width<scalar_t>(g, padded, bytes);
    std::vector<scalar_t> packed(padded * taps, scalar_t(0)), padded_bias(padded, scalar_t(0));
    for (int64_t k0 = 0; k0 < g.out_channels; k0 += block_width<scalar_t>(g, k0, bytes)) {
      const int64_t width = block_width<scalar_t>(g, k0, bytes);
      for (int64_t k = k0; k < std::min(k0 + width, g.out_channels); ++k) {
        for (int64_t t = 0; t < taps; ++t) packed[k0 * taps + t * width + k - k0] = w[k * taps + t];
      }
    }
    if (b.defined()) {
      std::copy(b.const_data_ptr<scalar_t>(), b.const_data_ptr<scalar_t>() + g.out_channels, padded_bias.begin());
    }
    const int64_t runs = (g.out_cols + kRunCols - 1) / kRunCols;
    const int64_t items = g.batch * g.out_depth * g.out_rows * runs * (g.channels_last ? 1 : padded / kBlock);
    at::parallel_for(0, items, 1, [&](int64_t begin, int64_t end) {
      rows(g, x, packed.data(), padded_bias.data(), out_data, begin, end);
    });
  });
  return y;
}

}  // namespace

TORCH_LIBRARY_IMPL(densecnn, CPU, m) { m.impl("direct_conv", &direct_conv_cpu); }

}  // namespace densecnn
