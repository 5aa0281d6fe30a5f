// Argument checking, layout choice and output allocation shared by the CPU and CUDA pooling launchers.
#pragma once

#include <ATen/ATen.h>

#include <string>

#include "common.h"

namespace densecnn {

// Kernels run on the input's own layout: channels_last when its channel stride is 1 (the NHWC kernels vectorise
// over W·C), NCHW otherwise. Must agree with `_layout` in densecnn/ops/ext.py (the fake kernels).
inline at::MemoryFormat pool_layout(const at::Tensor& x) {
  if (x.dim() != 4) return at::MemoryFormat::Contiguous;  // the op's checks then reject it
  const bool channels_last = x.size(1) > 1 && x.size(2) * x.size(3) > 1 && x.stride(1) == 1;
  return channels_last ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
}

inline Activation parse_activation(const std::string& name) {
  if (name == "none") return Activation::kNone;
  if (name == "relu") return Activation::kRelu;
  if (name == "tanh") return Activation::kTanh;
  TORCH_CHECK(false, "densecnn: activation='", name, "' is not supported; use one of none, relu, tanh");
}

inline void check_pool_dtype(const char* op, const at::Tensor& x) {
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble, "densecnn.", op,
              ": dtype must be float32 or float64, got ", x.scalar_type(), "; convert with .float()");
}

// Checks a pooling call on an input of `sizes` (N, C, H, W) and returns its geometry in `layout`.
inline PoolGeometry pool_geometry(const char* op, at::IntArrayRef sizes, at::IntArrayRef kernel,
                                  at::IntArrayRef dilation, at::MemoryFormat layout) {
  TORCH_CHECK(sizes.size() == 4, "densecnn.", op, ": expected a 4-D (N, C, H, W) input, got shape ", sizes);
  TORCH_CHECK(kernel.size() == 2 && kernel[0] >= 1 && kernel[1] >= 1, "densecnn.", op,
              ": kernel must be two positive ints (kh, kw), got ", kernel);
  TORCH_CHECK(dilation.size() == 2 && dilation[0] >= 1 && dilation[1] >= 1, "densecnn.", op,
              ": dilation must be two positive ints (dh, dw), got ", dilation);
  const int64_t n = sizes[0], c = sizes[1], h = sizes[2], w = sizes[3];
  const int64_t span_h = (kernel[0] - 1) * dilation[0] + 1, span_w = (kernel[1] - 1) * dilation[1] + 1;
  TORCH_CHECK(h >= span_h && w >= span_w, "densecnn.", op, ": kernel ", kernel, " with dilation ", dilation,
              " spans ", span_h, "x", span_w, " pixels but the input is only ", h, "x", w,
              "; use a larger input (stride-1 ops without padding shrink it by the span minus one)");
  const bool nhwc = layout == at::MemoryFormat::ChannelsLast;
  const int64_t inner = nhwc ? c : 1;  // elements per pixel within a plane row
  PoolGeometry g;
  g.planes = nhwc ? n : n * c;
  g.rows = h;
  g.row_len = w * inner;
  g.out_rows = h - span_h + 1;
  g.out_row_len = (w - span_w + 1) * inner;
  g.tap_rows = dilation[0];
  g.tap_step = dilation[1] * inner;
  g.kh = static_cast<int32_t>(kernel[0]);
  g.kw = static_cast<int32_t>(kernel[1]);
  return g;
}

// The geometry of the forward call whose output has the shape of `grad_output`.
inline PoolGeometry backward_geometry(const char* op, const at::Tensor& grad_output, at::IntArrayRef kernel,
                                      at::IntArrayRef dilation, at::MemoryFormat layout) {
  TORCH_CHECK(grad_output.dim() == 4, "densecnn.", op, ": expected a 4-D grad_output, got shape ",
              grad_output.sizes());
  TORCH_CHECK(kernel.size() == 2 && dilation.size() == 2, "densecnn.", op, ": kernel and dilation need 2 ints");
  const int64_t sizes[4] = {grad_output.size(0), grad_output.size(1),
                            grad_output.size(2) + (kernel[0] - 1) * dilation[0],
                            grad_output.size(3) + (kernel[1] - 1) * dilation[1]};
  return pool_geometry(op, sizes, kernel, dilation, layout);
}

// A (N, C, rows, cols) tensor like `x` in `layout`.
inline at::Tensor empty_like_layout(const at::Tensor& x, int64_t rows, int64_t cols, at::ScalarType dtype,
                                    at::MemoryFormat layout) {
  return at::empty({x.size(0), x.size(1), rows, cols}, x.options().dtype(dtype).memory_format(layout));
}

}  // namespace densecnn
