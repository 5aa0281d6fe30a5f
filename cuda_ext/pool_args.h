// Argument checking, layout choice and output allocation shared by the CPU and CUDA pooling launchers.
#pragma once

#include <ATen/ATen.h>

#include <string>

#include <c10/util/Optional.h>
#include <c10/util/string_view.h>

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

// A checked forward pooling call: the input made contiguous in the layout the kernels run in.
struct PoolCall {
  at::MemoryFormat layout;
  PoolGeometry geometry;
  Activation activation;
  at::Tensor input;
  int64_t out_cols;  // W'
};

inline PoolCall prepare_pool(const char* op, const at::Tensor& input, at::IntArrayRef kernel,
                             at::IntArrayRef dilation, c10::string_view activation) {
  PoolCall call;
  call.layout = pool_layout(input);
  call.geometry = pool_geometry(op, input.sizes(), kernel, dilation, call.layout);
  check_pool_dtype(op, input);
  call.activation = parse_activation(std::string(activation));
  call.input = input.contiguous(call.layout);
  call.out_cols = input.size(3) - (kernel[1] - 1) * dilation[1];
  return call;
}

// A checked backward pooling call: grad_output and the forward output (needed by a fused activation's derivative;
// grad_output stands in when there is none) made contiguous in `layout`.
struct PoolBackwardCall {
  PoolGeometry geometry;
  Activation activation;
  at::Tensor grad_output, output;
  int64_t in_cols;  // W
};

inline PoolBackwardCall prepare_pool_backward(const char* op, const at::Tensor& grad_output,
                                              const c10::optional<at::Tensor>& output, at::MemoryFormat layout,
                                              at::IntArrayRef kernel, at::IntArrayRef dilation,
                                              c10::string_view activation) {
  PoolBackwardCall call;
  call.activation = parse_activation(std::string(activation));
  TORCH_CHECK(call.activation == Activation::kNone || output.has_value(), "densecnn.", op, ": activation='",
              activation, "' needs the forward output");
  call.geometry = backward_geometry(op, grad_output, kernel, dilation, layout);
  check_pool_dtype(op, grad_output);
  call.grad_output = grad_output.contiguous(layout);
  if (call.activation == Activation::kNone) {
    call.output = call.grad_output;
  } else {
    TORCH_CHECK(output->sizes() == grad_output.sizes() && output->scalar_type() == grad_output.scalar_type(),
                "densecnn.", op, ": output ", output->sizes(), " does not match grad_output ", grad_output.sizes());
    call.output = output->contiguous(layout);
  }
  call.in_cols = grad_output.size(3) + (kernel[1] - 1) * dilation[1];
  return call;
}

inline void check_taps(const char* op, const PoolBackwardCall& call, const at::Tensor& row_tap,
                       const at::Tensor& col_tap, at::IntArrayRef kernel) {
  const auto& gy = call.grad_output;
  TORCH_CHECK(col_tap.sizes() == gy.sizes() && row_tap.dim() == 4 && row_tap.size(2) == call.geometry.rows &&
                  row_tap.size(3) == gy.size(3) && row_tap.scalar_type() == at::kByte &&
                  col_tap.scalar_type() == at::kByte,
              "densecnn.", op, ": the taps ", row_tap.sizes(), ", ", col_tap.sizes(), " do not belong to grad_output ",
              gy.sizes(), "; pass those of the same forward call, made with with_taps=True");
  TORCH_CHECK(kernel[0] <= 255 && kernel[1] <= 255, "densecnn.", op, ": kernel ", kernel, " is too large");
}

}  // namespace densecnn
