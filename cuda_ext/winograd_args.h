// Argument checks and geometry of the Winograd transform ops (winograd.h), shared by the CPU and CUDA launchers.
#pragma once

#include <ATen/ATen.h>

#include <utility>
#include <vector>

#include <c10/util/Optional.h>

#include "winograd.h"

namespace densecnn {

// Tile positions along an axis of output extent `out` at dilation d: d sub-grids of ⌈⌈out/d⌉/m⌉ tiles.
inline int64_t winograd_positions(int64_t out, int64_t dilation, int64_t m) {
  const int64_t per_subgrid = (out + dilation - 1) / dilation;
  return dilation * ((per_subgrid + m - 1) / m);
}

inline void check_winograd_call(const char* op, const at::Tensor& map, at::IntArrayRef dilation, int64_t m) {
  TORCH_CHECK(map.dim() == 4 || map.dim() == 5, "densecnn.", op,
              ": expected a 4-D (N, C, H, W) or 5-D (N, C, D, H, W) map, got shape ", map.sizes());
  TORCH_CHECK(static_cast<int64_t>(dilation.size()) == map.dim() - 2, "densecnn.", op, ": dilation ", dilation,
              " needs one entry per spatial axis of ", map.sizes());
  for (const int64_t d : dilation) TORCH_CHECK(d >= 1, "densecnn.", op, ": dilation must be positive, got ", dilation);
  TORCH_CHECK(m >= 2 && m <= 4, "densecnn.", op, ": tile size m must be 2, 3 or 4 (F(m, 3)), got ", m);
  TORCH_CHECK(map.scalar_type() == at::kFloat || map.scalar_type() == at::kDouble, "densecnn.", op,
              ": dtype must be float32 or float64, got ", map.scalar_type(), "; convert with .float()");
}

// The geometry of a map (N, C, ...) addressed through its strides; `out` is the conv's output extent per axis.
inline WinogradGeometry winograd_geometry(const at::Tensor& map, at::IntArrayRef out, at::IntArrayRef dilation,
                                          int64_t m, int64_t tile_begin, int64_t tile_count) {
  WinogradGeometry g;
  g.axes = static_cast<int32_t>(map.dim() - 2);
  g.channels = map.size(1);
  g.transformed_channels = g.channels;
  g.stride_n = map.stride(0);
  g.stride_c = map.stride(1);
  for (int a = 0; a < g.axes; ++a) {
    g.size[a] = map.size(a + 2);
    g.out[a] = out[a];
    g.dilation[a] = dilation[a];
    g.positions[a] = winograd_positions(out[a], dilation[a], m);
    g.stride[a] = map.stride(a + 2);
    g.pad[a] = 0;
  }
  g.tile_begin = tile_begin;
  g.tile_count = tile_count;
  return g;
}

// The input transform: the input x (N, C, *S), zero-padded by `padding` per axis (empty: none), and its output
// extent S + 2·padding - 2·d; checks the chunk lies in the tile grid.
inline WinogradGeometry winograd_input_geometry(const at::Tensor& x, at::IntArrayRef dilation, int64_t m,
                                                int64_t tile_begin, int64_t tile_count,
                                                at::IntArrayRef padding = {}) {
  check_winograd_call("winograd_conv", x, dilation, m);
  TORCH_CHECK(padding.empty() || static_cast<int64_t>(padding.size()) == x.dim() - 2, "densecnn.winograd_conv: ",
              "padding ", padding, " needs one entry per spatial axis of ", x.sizes(), " (or none)");
  std::vector<int64_t> out;
  for (int64_t a = 0; a < x.dim() - 2; ++a) {
    const int64_t pad = padding.empty() ? 0 : padding[a];
    TORCH_CHECK(pad >= 0, "densecnn.winograd_conv: padding must be >= 0, got ", padding);
    out.push_back(x.size(a + 2) + 2 * pad - 2 * dilation[a]);
    TORCH_CHECK(out.back() >= 1, "densecnn.winograd_conv: a 3-tap kernel at dilation ", dilation, " spans ",
                2 * dilation[a] + 1, " pixels along axis ", a, " but the padded input has only ",
                x.size(a + 2) + 2 * pad);
  }
  WinogradGeometry g = winograd_geometry(x, out, dilation, m, tile_begin, tile_count);
  for (int64_t a = 0; a < x.dim() - 2; ++a) g.pad[a] = padding.empty() ? 0 : padding[a];
  TORCH_CHECK(tile_begin >= 0 && tile_count >= 0 && tile_begin + tile_count <= winograd_tiles(g, x.size(0)),
              "densecnn.winograd_conv: tiles [", tile_begin, ", ", tile_begin + tile_count, ") outside the ",
              winograd_tiles(g, x.size(0)), " tiles of the problem");
  return g;
}

// The output transform: the output y (N, K, *O) the transformed chunk (α^n, tiles, K) is written into.
inline WinogradGeometry winograd_output_geometry(const at::Tensor& y, const at::Tensor& transformed,
                                                 const c10::optional<at::Tensor>& bias, at::IntArrayRef dilation,
                                                 int64_t m, int64_t tile_begin) {
  check_winograd_call("winograd_conv", y, dilation, m);
  const int64_t points = y.dim() == 4 ? (m + 2) * (m + 2) : (m + 2) * (m + 2) * (m + 2);
  TORCH_CHECK(transformed.dim() == 3 && transformed.size(0) == points && transformed.size(2) == y.size(1) &&
                  transformed.is_contiguous() && transformed.scalar_type() == y.scalar_type() &&
                  transformed.device() == y.device(),
              "densecnn.winograd_conv: transformed must be a contiguous (", points, ", tiles, ", y.size(1),
              ") tensor of the output's dtype and device, got ", transformed.sizes());
  if (bias.has_value()) {
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == y.size(1) && bias->is_contiguous() &&
                    bias->scalar_type() == y.scalar_type() && bias->device() == y.device(),
                "densecnn.winograd_conv: bias must be a contiguous (", y.size(1),
                ",) tensor of the output's dtype and device");
  }
  const std::vector<int64_t> out(y.sizes().begin() + 2, y.sizes().end());
  const WinogradGeometry g = winograd_geometry(y, out, dilation, m, tile_begin, transformed.size(1));
  TORCH_CHECK(tile_begin >= 0 && tile_begin + g.tile_count <= winograd_tiles(g, y.size(0)),
              "densecnn.winograd_conv: tiles [", tile_begin, ", ", tile_begin + g.tile_count, ") outside the ",
              winograd_tiles(g, y.size(0)), " tiles of the problem");
  return g;
}

// The output-gradient transform (the weight gradient): the output gradient (N, K, *O) of the conv whose input
// geometry is `in` (its tiles are the input's); checks its shape, dtype and device against the input.
inline WinogradGeometry winograd_output_gradient_geometry(const at::Tensor& grad_output, const at::Tensor& input,
                                                          const WinogradGeometry& in, at::IntArrayRef dilation,
                                                          int64_t m) {
  std::vector<int64_t> expected{input.size(0), grad_output.dim() > 1 ? grad_output.size(1) : 0};
  for (int a = 0; a < in.axes; ++a) expected.push_back(in.out[a]);
  TORCH_CHECK(grad_output.sizes() == at::IntArrayRef(expected) && grad_output.scalar_type() == input.scalar_type() &&
                  grad_output.device() == input.device(),
              "densecnn.winograd_conv_weight_grad: the output gradient must be (N, K, *(S - 2·d)) = ", expected,
              " of the input's dtype and device, got ", grad_output.sizes(), " ", grad_output.scalar_type());
  const std::vector<int64_t> out(grad_output.sizes().begin() + 2, grad_output.sizes().end());
  return winograd_geometry(grad_output, out, dilation, m, 0, 0);
}

}  // namespace densecnn
