// Argument checking, layout choice and output allocation shared by the CPU and CUDA pooling launchers, for inputs
// (N, C, L), (N, C, H, W) and (N, C, D, H, W).
#pragma once

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include <c10/util/Optional.h>
#include <c10/util/string_view.h>

#include "common.h"
#include "output_buffers.h"

namespace densecnn {

// Kernels run on the input's own layout: channels-last when its channel stride is 1 (then the kernels vectorise
// over W·C), contiguous otherwise. A one-channel tensor is both; its channel stride says which it was made as
// (`x.to(memory_format=torch.channels_last)` gives stride 1), so that a channels-last net's outputs stay
// channels-last. Channels-last is (N, ..., C) in memory whatever the number of spatial axes: torch's channels_last
// (4-D) and channels_last_3d (5-D), and the (N, L, C) of a transposed signal.
// Must agree with `_is_channels_last` in densecnn/ops/registrations.py (the fake kernels).
inline bool is_channels_last(const at::Tensor& x) {
  if (x.dim() < 3) return false;
  int64_t spatial = 1;
  for (int64_t d = 2; d < x.dim(); ++d) spatial *= x.size(d);
  return spatial > 1 && x.stride(1) == 1;
}

// x with its elements laid out compactly in the given layout (no copy when they already are).
inline at::Tensor in_layout(const at::Tensor& x, bool channels_last) {
  return channels_last ? x.movedim(1, -1).contiguous().movedim(-1, 1) : x.contiguous();
}

// An uninitialised (N, C, ...) tensor of `sizes` in the given layout (on the CPU, large ones reused across calls:
// output_buffers.h).
inline at::Tensor empty_in_layout(at::IntArrayRef sizes, const at::TensorOptions& options, bool channels_last) {
  if (!channels_last) return empty_output(sizes, options);
  std::vector<int64_t> memory_order{sizes[0]};
  memory_order.insert(memory_order.end(), sizes.begin() + 2, sizes.end());
  memory_order.push_back(sizes[1]);
  return empty_output(memory_order, options).movedim(-1, 1);
}

inline Activation parse_activation(const std::string& name) {
  if (name == "none") return Activation::kNone;
  if (name == "relu") return Activation::kRelu;
  if (name == "tanh") return Activation::kTanh;
  TORCH_CHECK(false, "densecnn: activation='", name, "' is not supported; use one of none, relu, tanh");
}

inline void check_pool_dtype(const char* op, const at::Tensor& x) {
  const auto dtype = x.scalar_type();
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kDouble || dtype == at::kBFloat16 || dtype == at::kHalf,
              "densecnn.", op, ": dtype must be float32, float64, bfloat16 or float16, got ", dtype,
              "; convert with .float()");
}

inline std::string join_sizes(at::IntArrayRef sizes) {
  std::string text;
  for (size_t i = 0; i < sizes.size(); ++i) text += (i ? "x" : "") + std::to_string(sizes[i]);
  return text;
}

// The weight (K, C, *kernel) that a conv computing with a transform of it (Winograd's U, the FFT's spectrum) takes
// alongside the transform: the op's gradients are taken for it (densecnn/ops/registrations.py), so it must be the
// weight the transform was made from, as far as shapes can tell.
inline void check_conv_weight(const char* op, const at::Tensor& weight, const at::Tensor& input, int64_t out_channels,
                              at::IntArrayRef kernel) {
  std::vector<int64_t> expected{out_channels, input.size(1)};
  expected.insert(expected.end(), kernel.begin(), kernel.end());
  TORCH_CHECK(weight.sizes() == at::IntArrayRef(expected) && weight.scalar_type() == input.scalar_type() &&
                  weight.device() == input.device(),
              "densecnn.", op, ": weight must be the ", at::IntArrayRef(expected),
              " weight the transformed kernel was made from, in the input's dtype and on its device; got ",
              weight.sizes(), " ", weight.scalar_type(), " on ", weight.device());
}

// Checks a pooling call on an input of `sizes` (N, C, spatial...) and returns its geometry in the given layout.
inline PoolGeometry pool_geometry(const char* op, at::IntArrayRef sizes, at::IntArrayRef kernel,
                                  at::IntArrayRef dilation, bool channels_last) {
  const int64_t axes = static_cast<int64_t>(sizes.size()) - 2;
  TORCH_CHECK(axes >= 1 && axes <= kMaxAxes, "densecnn.", op,
              ": expected a 3-D (N, C, L), 4-D (N, C, H, W) or 5-D (N, C, D, H, W) input, got shape ", sizes);
  TORCH_CHECK(static_cast<int64_t>(kernel.size()) == axes && static_cast<int64_t>(dilation.size()) == axes,
              "densecnn.", op, ": kernel ", kernel, " and dilation ", dilation, " need one entry per spatial axis (",
              axes, ") of the input ", sizes);
  std::vector<int64_t> span(axes), spatial(sizes.begin() + 2, sizes.end());
  for (int64_t a = 0; a < axes; ++a) {
    TORCH_CHECK(kernel[a] >= 1, "densecnn.", op, ": kernel must be positive ints, got ", kernel);
    TORCH_CHECK(dilation[a] >= 1, "densecnn.", op, ": dilation must be positive ints, got ", dilation);
    span[a] = (kernel[a] - 1) * dilation[a] + 1;
  }
  for (int64_t a = 0; a < axes; ++a) {
    TORCH_CHECK(spatial[a] >= span[a], "densecnn.", op, ": kernel ", kernel, " with dilation ", dilation, " spans ",
                join_sizes(span), " pixels but the input is only ", join_sizes(spatial),
                "; use a larger input (stride-1 ops without padding shrink it by the span minus one)");
  }
  const int64_t n = sizes[0], c = sizes[1];
  PoolGeometry g;
  g.axes = static_cast<int32_t>(axes);
  g.planes = channels_last ? n : n * c;
  for (int64_t a = 0; a < axes; ++a) {
    const int64_t unit = channels_last && a == axes - 1 ? c : 1;  // channels ride along in the innermost axis
    g.size[a] = spatial[a] * unit;
    g.out[a] = (spatial[a] - span[a] + 1) * unit;
    g.step[a] = dilation[a] * unit;
    g.kernel[a] = static_cast<int32_t>(kernel[a]);
  }
  return g;
}

// (N, C, spatial...) after pooling the axes from `first_pooled` on: the shape of that pass's output.
inline std::vector<int64_t> pooled_sizes(at::IntArrayRef sizes, at::IntArrayRef kernel, at::IntArrayRef dilation,
                                         int64_t first_pooled) {
  std::vector<int64_t> out(sizes.begin(), sizes.end());
  for (int64_t a = first_pooled; a < static_cast<int64_t>(kernel.size()); ++a) {
    out[a + 2] -= (kernel[a] - 1) * dilation[a];
  }
  return out;
}

// The input sizes of the forward call whose output has `out_sizes`.
inline std::vector<int64_t> unpooled_sizes(const char* op, at::IntArrayRef out_sizes, at::IntArrayRef kernel,
                                           at::IntArrayRef dilation) {
  TORCH_CHECK(out_sizes.size() >= 3 && kernel.size() == out_sizes.size() - 2 && dilation.size() == kernel.size(),
              "densecnn.", op, ": grad_output ", out_sizes, " does not match kernel ", kernel, " and dilation ",
              dilation);
  std::vector<int64_t> sizes(out_sizes.begin(), out_sizes.end());
  for (size_t a = 0; a < kernel.size(); ++a) sizes[a + 2] += (kernel[a] - 1) * dilation[a];
  return sizes;
}

// Max pooling keeps its argmax as uint8 tap numbers.
inline void check_max_kernel(const char* op, at::IntArrayRef kernel) {
  for (const int64_t k : kernel) {
    TORCH_CHECK(k <= 255, "densecnn.", op, ": kernel ", kernel,
                " is too large for the ext kernels (at most 255 taps per axis); use backend='native'");
  }
}

// A checked forward pooling call: the input made compact in the layout the kernels run in.
struct PoolCall {
  bool channels_last;
  PoolGeometry geometry;
  Activation activation;
  at::Tensor input;
  std::vector<int64_t> out_sizes;
};

inline PoolCall prepare_pool(const char* op, const at::Tensor& input, at::IntArrayRef kernel,
                             at::IntArrayRef dilation, c10::string_view activation) {
  PoolCall call;
  call.channels_last = is_channels_last(input);
  call.geometry = pool_geometry(op, input.sizes(), kernel, dilation, call.channels_last);
  check_pool_dtype(op, input);
  call.activation = parse_activation(std::string(activation));
  call.input = in_layout(input, call.channels_last);
  call.out_sizes = pooled_sizes(input.sizes(), kernel, dilation, 0);
  return call;
}

// Per axis a, the argmax taps of the pass along a: uint8 of that pass's output shape (pooled_sizes from a).
inline std::vector<at::Tensor> empty_taps(const PoolCall& call, at::IntArrayRef kernel, at::IntArrayRef dilation) {
  std::vector<at::Tensor> taps;
  for (int64_t a = 0; a < static_cast<int64_t>(kernel.size()); ++a) {
    taps.push_back(empty_in_layout(pooled_sizes(call.input.sizes(), kernel, dilation, a),
                                   call.input.options().dtype(at::kByte), call.channels_last));
  }
  return taps;
}

// A checked backward pooling call: grad_output and the forward output (needed by a fused activation's derivative;
// absent otherwise) made compact in the layout, and the geometry of the forward call.
struct PoolBackwardCall {
  bool channels_last;
  PoolGeometry geometry;
  Activation activation;
  at::Tensor grad_output;
  c10::optional<at::Tensor> output;
  std::vector<int64_t> in_sizes;
};

inline PoolBackwardCall prepare_pool_backward(const char* op, const at::Tensor& grad_output,
                                              const c10::optional<at::Tensor>& output, bool channels_last,
                                              at::IntArrayRef kernel, at::IntArrayRef dilation,
                                              c10::string_view activation) {
  PoolBackwardCall call;
  call.channels_last = channels_last;
  call.activation = parse_activation(std::string(activation));
  TORCH_CHECK(call.activation == Activation::kNone || output.has_value(), "densecnn.", op, ": activation='",
              activation, "' needs the forward output");
  call.in_sizes = unpooled_sizes(op, grad_output.sizes(), kernel, dilation);
  call.geometry = pool_geometry(op, call.in_sizes, kernel, dilation, channels_last);
  check_pool_dtype(op, grad_output);
  call.grad_output = in_layout(grad_output, channels_last);
  if (call.activation != Activation::kNone) {
    TORCH_CHECK(output->sizes() == grad_output.sizes() && output->scalar_type() == grad_output.scalar_type() &&
                    output->device() == grad_output.device(),
                "densecnn.", op, ": output ", output->sizes(), " ", output->scalar_type(), " on ", output->device(),
                " does not match grad_output ", grad_output.sizes(), " ", grad_output.scalar_type(), " on ",
                grad_output.device());
    call.output = in_layout(*output, channels_last);
  }
  return call;
}

// The taps of the forward call that made grad_output's output, made compact in the call's layout.
inline std::vector<at::Tensor> checked_taps(const char* op, const PoolBackwardCall& call, at::TensorList taps,
                                            at::IntArrayRef kernel, at::IntArrayRef dilation) {
  TORCH_CHECK(taps.size() == kernel.size(), "densecnn.", op, ": got ", taps.size(), " tap tensors for ",
              kernel.size(), " spatial axes; pass those of the same forward call, made with with_taps=True");
  std::vector<at::Tensor> compact;
  for (size_t a = 0; a < taps.size(); ++a) {
    const auto expected = pooled_sizes(call.in_sizes, kernel, dilation, static_cast<int64_t>(a));
    TORCH_CHECK(taps[a].sizes() == at::IntArrayRef(expected) && taps[a].scalar_type() == at::kByte &&
                    taps[a].device() == call.grad_output.device(),
                "densecnn.", op, ": taps[", a, "] ", taps[a].sizes(), " on ", taps[a].device(),
                " does not belong to grad_output ", call.grad_output.sizes(), " on ", call.grad_output.device(),
                "; pass the taps of the same forward call, made with with_taps=True");
    compact.push_back(in_layout(taps[a], call.channels_last));
  }
  return compact;
}

}  // namespace densecnn
