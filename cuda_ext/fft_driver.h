// The frequency-domain convolution (fft_elements.h), written once for every device: `Transforms` supplies the
// device's tile transforms (CpuTransforms in fft_cpu.cpp, CudaTransforms in fft_cuda.cpp); the channel mixing is
// one batched complex GEMM per group of tiles (at::bmm: MKL on CPU, cuBLAS on CUDA), the frequencies as the batch.
//
// Tiles go through in groups sized so that a group's spectra stay near kGroupBytes: the buffers are allocated once
// and reused, and the forward transform, the GEMM and the inverse of a group run while its data is in cache.
//
// The weight gradient reuses the forward transform on both the input and the output gradient, and sums the products
// of their spectra over the tiles with the same batched GEMM, the tiles as its contraction.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <tuple>

#include "fft_elements.h"
#include "pool_args.h"

namespace densecnn {

constexpr int64_t kGroupBytes = 6 << 20;
constexpr int64_t kMinGroupTiles = 32;
// The gradients' groups: at least this many tiles. The weight gradient's GEMM contracts over a group's tiles and each
// group's GEMMs pack the kernel spectrum anew, so longer groups cost less there (the two gradients of stages_46's
// 5×5 d4 conv at 256²: 6% less time with 128 than with 32), where the forward's are best kept in cache.
constexpr int64_t kMinGradientGroupTiles = 128;

// The tiling of x (N, C, H, W), zero-padded by `padding` (rows, columns) on each side, for a conv with K output
// channels (the kernel is tile - valid + 1).
inline FftGeometry fft_geometry(const at::Tensor& x, int64_t out_channels, at::IntArrayRef tile, at::IntArrayRef valid,
                                at::IntArrayRef dilation, at::IntArrayRef padding = {0, 0}) {
  TORCH_CHECK(x.dim() == 4, "densecnn.fft_conv2d: expected a 4-D (N, C, H, W) input, got shape ", x.sizes());
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble,
              "densecnn.fft_conv2d: dtype must be float32 or float64, got ", x.scalar_type());
  TORCH_CHECK(tile.size() == 2 && valid.size() == 2 && dilation.size() == 2 && padding.size() == 2,
              "densecnn.fft_conv2d: tile, valid, dilation and padding take two ints (h, w)");
  TORCH_CHECK(padding[0] >= 0 && padding[1] >= 0, "densecnn.fft_conv2d: padding must be >= 0, got ", padding);
  FftGeometry g;
  g.batch = x.size(0);
  g.channels = x.size(1);
  g.rows = x.size(2);
  g.cols = x.size(3);
  g.th = static_cast<int32_t>(tile[0]);
  g.tw = static_cast<int32_t>(tile[1]);
  g.sh = static_cast<int32_t>(valid[0]);
  g.sw = static_cast<int32_t>(valid[1]);
  g.dh = static_cast<int32_t>(dilation[0]);
  g.dw = static_cast<int32_t>(dilation[1]);
  TORCH_CHECK(g.dh >= 1 && g.dw >= 1 && g.sh >= 1 && g.sw >= 1 && g.sh <= g.th && g.sw <= g.tw,
              "densecnn.fft_conv2d: need 1 <= valid <= tile and dilation >= 1, got tile ", tile, ", valid ", valid,
              ", dilation ", dilation);
  g.freqs = g.tw / 2 + 1;
  g.read_h = g.th;
  g.read_w = g.tw;
  g.write_h = g.sh;
  g.write_w = g.sw;
  const int64_t kh = g.th - g.sh + 1, kw = g.tw - g.sw + 1;  // the kernel the tiles were cut for
  g.pad_h = static_cast<int32_t>(padding[0]);
  g.pad_w = static_cast<int32_t>(padding[1]);
  g.out_rows = g.rows + 2 * g.pad_h - (kh - 1) * g.dh;
  g.out_cols = g.cols + 2 * g.pad_w - (kw - 1) * g.dw;
  TORCH_CHECK(g.out_rows >= 1 && g.out_cols >= 1, "densecnn.fft_conv2d: a ", kh, "x", kw,
              " kernel with dilation ", dilation, " does not fit in the ", g.rows, "x", g.cols, " input");
  g.out_channels = out_channels;
  const int64_t sub_rows = (g.out_rows + g.dh - 1) / g.dh, sub_cols = (g.out_cols + g.dw - 1) / g.dw;
  g.tiles_h = (sub_rows + g.sh - 1) / g.sh;
  g.tiles_w = (sub_cols + g.sw - 1) / g.sw;
  g.tiles = g.batch * g.dh * g.dw * g.tiles_h * g.tiles_w;
  for (int d = 0; d < 4; ++d) g.x_stride[d] = x.stride(d);
  return g;
}

// [cos_h | sin_h | cos_w | sin_w] of g's tile, computed in double and rounded to `like`'s dtype, on its device.
inline at::Tensor fft_twiddle_table(const FftGeometry& g, const at::Tensor& like) {
  at::Tensor table = at::empty({twiddle_table_size(g)}, like.options().dtype(at::kDouble).device(at::kCPU));
  double* out = table.mutable_data_ptr<double>();
  const double pi = std::acos(-1.0);
  for (int32_t m = 0; m < g.th; ++m) {
    out[m] = std::cos(2 * pi * m / g.th);
    out[g.th + m] = std::sin(2 * pi * m / g.th);
  }
  for (int32_t m = 0; m < g.tw; ++m) {
    out[2 * g.th + m] = std::cos(2 * pi * m / g.tw);
    out[2 * g.th + g.tw + m] = std::sin(2 * pi * m / g.tw);
  }
  return table.to(like.options());
}

inline int64_t fft_group_tiles(const FftGeometry& g, int64_t element_size, int64_t min_tiles = kMinGroupTiles) {
  const int64_t per_tile = fft_points(g) * std::max(g.channels, g.out_channels) * 2 * element_size;
  return std::min(g.tiles, std::max(min_tiles, kGroupBytes / std::max<int64_t>(per_tile, 1)));
}

// The output gradient's tiles of a conv tiled as g: the same origins, only their sh×sw valid part read, unpadded,
// transformed conjugated (the weight gradient's G and the input gradient's).
inline FftGeometry fft_gradient_geometry(const FftGeometry& g, const at::Tensor& grad_output) {
  FftGeometry gg = g;
  gg.channels = g.out_channels;
  gg.rows = g.out_rows;
  gg.cols = g.out_cols;
  gg.read_h = g.sh;
  gg.read_w = g.sw;
  gg.pad_h = gg.pad_w = 0;
  gg.conjugate = true;
  for (int d = 0; d < 4; ++d) gg.x_stride[d] = grad_output.stride(d);
  return gg;
}

// The input gradient's inverse of a conv tiled as g: whole tiles of the input's C channels, read conjugated and added
// into grad_input (the input's geometry, grad_input's strides).
inline FftGeometry fft_adjoint_geometry(const FftGeometry& g, const at::Tensor& grad_input) {
  FftGeometry ga = g;
  ga.out_channels = g.channels;
  ga.write_h = g.th;
  ga.write_w = g.tw;
  ga.conjugate = true;
  ga.adjoint = true;
  for (int d = 0; d < 4; ++d) ga.x_stride[d] = grad_input.stride(d);
  return ga;
}

inline void check_output_gradient(const char* op, const FftGeometry& g, const at::Tensor& input,
                                  const at::Tensor& grad_output) {
  TORCH_CHECK(grad_output.dim() == 4, "densecnn.", op, ": expected a 4-D (N, K, H', W') output gradient, got shape ",
              grad_output.sizes());
  TORCH_CHECK(grad_output.size(0) == g.batch && grad_output.size(2) == g.out_rows && grad_output.size(3) == g.out_cols &&
                  grad_output.scalar_type() == input.scalar_type() && grad_output.device() == input.device(),
              "densecnn.", op, ": the output gradient must be (", g.batch, ", K, ", g.out_rows, ", ", g.out_cols,
              ") of the input's dtype and device, got ", grad_output.sizes(), " ", grad_output.scalar_type());
}

inline void check_kernel_spectrum(const char* op, const FftGeometry& g, const at::Tensor& spectrum,
                                  const at::Tensor& grad_output) {
  TORCH_CHECK(spectrum.dim() == 3 && spectrum.is_complex() && spectrum.device() == grad_output.device() &&
                  at::toRealValueType(spectrum.scalar_type()) == grad_output.scalar_type() &&
                  spectrum.size(2) == grad_output.size(1),
              "densecnn.", op, ": the kernel spectrum must be complex (th·(tw/2+1), C, K) of the output "
              "gradient's dtype and device with K = its channels, got ", spectrum.sizes(), " ", spectrum.scalar_type());
  TORCH_CHECK(spectrum.size(0) == fft_points(g) && spectrum.size(1) == g.channels, "densecnn.", op,
              ": the kernel spectrum must be (", fft_points(g), ", ", g.channels, ", K) for the tile (", g.th, ", ",
              g.tw, "), got ", spectrum.sizes());
}

// The convolution; with keep_input_spectra also the input's tile spectra, (tiles·P·C·2) real values of (re, im) pairs
// in tile order (each group's (count, P, C, 2) block), for fft_conv2d_backward to take instead of transforming the
// input again (else an undefined tensor).
template <class Transforms>
std::tuple<at::Tensor, at::Tensor> fft_conv2d_tiles(const at::Tensor& input, const at::Tensor& weight,
                                                    const at::Tensor& spectrum, const c10::optional<at::Tensor>& bias,
                                                    at::IntArrayRef tile, at::IntArrayRef valid,
                                                    at::IntArrayRef dilation, at::IntArrayRef padding,
                                                    bool keep_input_spectra = false) {
  TORCH_CHECK(spectrum.dim() == 3 && spectrum.is_complex() && spectrum.device() == input.device() &&
                  at::toRealValueType(spectrum.scalar_type()) == input.scalar_type(),
              "densecnn.fft_conv2d: the kernel spectrum must be complex (th·(tw/2+1), C, K) of the input's dtype and "
              "device, got ", spectrum.sizes(), " ", spectrum.scalar_type(), " on ", spectrum.device());
  FftGeometry g = fft_geometry(input, spectrum.size(2), tile, valid, dilation, padding);
  TORCH_CHECK(spectrum.size(0) == fft_points(g) && spectrum.size(1) == g.channels,
              "densecnn.fft_conv2d: the kernel spectrum must be (th·(tw/2+1), C, K) = (", fft_points(g), ", ",
              g.channels, ", K), got ", spectrum.sizes());
  check_conv_weight("fft_conv2d", weight, input, g.out_channels, {g.th - g.sh + 1, g.tw - g.sw + 1});
  if (bias.has_value()) {
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == g.out_channels && bias->scalar_type() == input.scalar_type() &&
                    bias->device() == input.device(),
                "densecnn.fft_conv2d: bias must have shape (", g.out_channels,
                ",) and the input's dtype and device, got ", bias->sizes(), " ", bias->scalar_type(), " on ",
                bias->device());
  }
  at::Tensor y = empty_in_layout({g.batch, g.out_channels, g.out_rows, g.out_cols}, input.options(),
                                 is_channels_last(input));
  // a training step's forward writes every tile's spectra out anyway: its groups as long as the gradients'
  const int64_t group =
      fft_group_tiles(g, input.element_size(), keep_input_spectra ? kMinGradientGroupTiles : kMinGroupTiles);
  const int64_t points = fft_points(g);
  // the input's spectra: one group's reused workspace, or every tile's when kept
  at::Tensor x_spectrum =
      empty_output({points * (keep_input_spectra ? g.tiles : group) * g.channels * 2}, input.options());
  if (y.numel() == 0) return {y, keep_input_spectra ? x_spectrum : at::Tensor()};
  for (int d = 0; d < 4; ++d) g.y_stride[d] = y.stride(d);
  const at::Tensor twiddles = fft_twiddle_table(g, input);
  const at::Tensor weights = spectrum.contiguous();
  const c10::optional<at::Tensor> b = bias.has_value() ? c10::optional<at::Tensor>(bias->contiguous()) : bias;
  at::Tensor product = empty_output({points * group * g.out_channels}, spectrum.options());  // reused workspace
  for (int64_t first = 0; first < g.tiles; first += group) {
    const int64_t count = std::min(group, g.tiles - first);
    const int64_t offset = keep_input_spectra ? points * first * g.channels * 2 : 0;
    at::Tensor xs = x_spectrum.narrow(0, offset, points * count * g.channels * 2).view({count, points, g.channels, 2});
    Transforms::forward(input, g, first, count, twiddles, xs);
    at::Tensor ys = product.narrow(0, 0, points * count * g.out_channels).view({points, count, g.out_channels});
    at::bmm_out(ys, at::view_as_complex(xs).transpose(0, 1), weights);  // (P, count, C) @ (P, C, K)
    Transforms::inverse(at::view_as_real(ys), b, g, first, count, twiddles, y);
  }
  return {y, keep_input_spectra ? x_spectrum : at::Tensor()};
}

// One group of tiles [first, first + count) of the output gradient transformed into the workspace g_spectrum:
// their spectra conj(G), (count, P, K, 2) (gg: fft_gradient_geometry, whose channels are the output's K).
template <class Transforms>
at::Tensor output_gradient_spectra(const at::Tensor& grad_output, const FftGeometry& gg, int64_t first, int64_t count,
                                   const at::Tensor& twiddles, const at::Tensor& g_spectrum) {
  const int64_t points = fft_points(gg);
  at::Tensor gs = g_spectrum.narrow(0, 0, points * count * gg.channels * 2).view({count, points, gg.channels, 2});
  Transforms::forward(grad_output, gg, first, count, twiddles, gs);
  return gs;
}

// One group of tiles [first, first + count) of the weight gradient's spectrum: the input's tiles transformed into
// the workspace x_spectrum (or taken from kept, every tile's spectra as the forward kept them), their products with
// the output gradient's (gs, conj(G)) summed over the group into result (the first group writes it: no zero fill).
template <class Transforms>
void add_weight_spectrum(const at::Tensor& input, const FftGeometry& g, int64_t first, int64_t count,
                         const at::Tensor& twiddles, const at::Tensor& x_spectrum, const at::Tensor& gs,
                         at::Tensor& result, const at::Tensor& kept = at::Tensor()) {
  const int64_t points = fft_points(g), size = points * count * g.channels * 2;
  at::Tensor xs = (kept.defined() ? kept.narrow(0, points * first * g.channels * 2, size) : x_spectrum.narrow(0, 0, size))
                      .view({count, points, g.channels, 2});
  if (!kept.defined()) Transforms::forward(input, g, first, count, twiddles, xs);
  // (P, C, count) @ (P, count, K)
  const at::Tensor x_t = at::view_as_complex(xs).permute({1, 2, 0}), g_t = at::view_as_complex(gs).transpose(0, 1);
  if (first == 0) {
    at::bmm_out(result, x_t, g_t);
  } else {
    result.baddbmm_(x_t, g_t);
  }
}

// One group of tiles of the input gradient: the output gradient's spectra (gs, conj(G)) times Sᵀ (weights, the
// kernel spectrum transposed, (P, K, C)) into the workspace product, inverse-transformed whole and added into
// grad_input (ga: fft_adjoint_geometry).
template <class Transforms>
void add_input_gradient(const FftGeometry& ga, int64_t first, int64_t count, const at::Tensor& twiddles,
                        const at::Tensor& gs, const at::Tensor& weights, const at::Tensor& product,
                        at::Tensor& grad_input) {
  const int64_t points = fft_points(ga);
  at::Tensor xs = product.narrow(0, 0, points * count * ga.out_channels).view({points, count, ga.out_channels});
  at::bmm_out(xs, at::view_as_complex(gs).transpose(0, 1), weights);  // (P, count, K) @ (P, K, C)
  Transforms::inverse(at::view_as_real(xs), c10::nullopt, ga, first, count, twiddles, grad_input);
}

// The spectrum of the weight's gradient: Σ over tiles of X · conj(G), complex (P, C, K) in the kernel spectrum's
// layout, X the tiles' spectra of the input and G those of the output gradient (its sh×sw valid part of each tile,
// zero-padded: the tiles of the output do not overlap). The circular correlation this is the spectrum of equals, at
// the kh×kw taps, the weight gradient Σ_outputs grad_y · x (no tap wraps around: a + i < sh + kh - 1 = th); the
// caller reads the taps from it (densecnn/ops/fft_conv.py).
template <class Transforms>
at::Tensor fft_conv2d_weight_spectrum_tiles(const at::Tensor& input, const at::Tensor& grad_output,
                                            at::IntArrayRef tile, at::IntArrayRef valid, at::IntArrayRef dilation) {
  TORCH_CHECK(grad_output.dim() == 4, "densecnn.fft_conv2d_weight_spectrum: expected a 4-D (N, K, H', W') output "
              "gradient, got shape ", grad_output.sizes());
  const FftGeometry g = fft_geometry(input, grad_output.size(1), tile, valid, dilation);
  check_output_gradient("fft_conv2d_weight_spectrum", g, input, grad_output);
  const FftGeometry gg = fft_gradient_geometry(g, grad_output);
  const int64_t points = fft_points(g);
  const auto complex_options = input.options().dtype(c10::toComplexType(input.scalar_type()));
  if (g.tiles == 0) return at::zeros({points, g.channels, g.out_channels}, complex_options);
  at::Tensor result = empty_output({points, g.channels, g.out_channels}, complex_options);
  const at::Tensor twiddles = fft_twiddle_table(g, input);
  const int64_t group = fft_group_tiles(g, input.element_size(), kMinGradientGroupTiles);
  at::Tensor x_spectrum = empty_output({points * group * g.channels * 2}, input.options());  // reused workspaces
  at::Tensor g_spectrum = empty_output({points * group * g.out_channels * 2}, input.options());
  for (int64_t first = 0; first < g.tiles; first += group) {
    const int64_t count = std::min(group, g.tiles - first);
    const at::Tensor gs = output_gradient_spectra<Transforms>(grad_output, gg, first, count, twiddles, g_spectrum);
    add_weight_spectrum<Transforms>(input, g, first, count, twiddles, x_spectrum, gs, result);
  }
  return result;
}

// The input's gradient (N, C, H, W) of fft_conv2d, from the output's: the adjoint of overlap-save on the forward's
// tiles. Each tile of the output gradient (its sh×sw part, zero-padded to th×tw, as in the weight gradient) is
// transformed, multiplied by the conjugate transpose of the kernel spectrum (the forward's S, (P, C, K)), inverse-
// transformed whole and added into the input gradient where the tile came from (overlap-add). conj(G)·Sᵀ is the
// conjugate of G·Sᴴ: the forward transform writes conj(G), the GEMM takes the spectrum as it is (transposed view),
// and the inverse reads its input conjugated. The padded reach of the output gradient is never transformed.
template <class Transforms>
at::Tensor fft_conv2d_input_grad_tiles(const at::Tensor& grad_output, const at::Tensor& spectrum,
                                       at::IntArrayRef input_size, at::IntArrayRef tile, at::IntArrayRef valid,
                                       at::IntArrayRef dilation, at::IntArrayRef padding) {
  TORCH_CHECK(grad_output.dim() == 4 && input_size.size() == 2, "densecnn.fft_conv2d_input_grad: expected a 4-D "
              "(N, K, H', W') output gradient and input_size (H, W), got ", grad_output.sizes(), " and ", input_size);
  TORCH_CHECK(spectrum.dim() == 3, "densecnn.fft_conv2d_input_grad: the kernel spectrum must be complex "
              "(th·(tw/2+1), C, K), got ", spectrum.sizes());
  at::Tensor grad_input = empty_in_layout({grad_output.size(0), spectrum.size(1), input_size[0], input_size[1]},
                                          grad_output.options(), is_channels_last(grad_output));
  grad_input.zero_();
  FftGeometry g = fft_geometry(grad_input, spectrum.size(2), tile, valid, dilation, padding);
  check_kernel_spectrum("fft_conv2d_input_grad", g, spectrum, grad_output);
  TORCH_CHECK(grad_output.size(2) == g.out_rows && grad_output.size(3) == g.out_cols,
              "densecnn.fft_conv2d_input_grad: the output gradient must be (N, K, ", g.out_rows, ", ", g.out_cols,
              ") for the input ", input_size, ", got ", grad_output.sizes());
  if (grad_input.numel() == 0 || g.tiles == 0) return grad_input;
  const FftGeometry gg = fft_gradient_geometry(g, grad_output), ga = fft_adjoint_geometry(g, grad_input);
  const at::Tensor twiddles = fft_twiddle_table(g, grad_output);
  const int64_t group = fft_group_tiles(g, grad_output.element_size(), kMinGradientGroupTiles);
  const int64_t points = fft_points(g);
  const at::Tensor weights = spectrum.contiguous().transpose(1, 2);  // (P, K, C): Sᵀ, read transposed by the GEMM
  at::Tensor g_spectrum = empty_output({points * group * g.out_channels * 2}, grad_output.options());
  at::Tensor product = empty_output({points * group * g.channels}, spectrum.options());
  for (int64_t first = 0; first < g.tiles; first += group) {
    const int64_t count = std::min(group, g.tiles - first);
    const at::Tensor gs = output_gradient_spectra<Transforms>(grad_output, gg, first, count, twiddles, g_spectrum);
    add_input_gradient<Transforms>(ga, first, count, twiddles, gs, weights, product, grad_input);
  }
  return grad_input;
}

// Both gradients of an unpadded fft_conv2d in one pass over the tiles: (the input's gradient, as
// fft_conv2d_input_grad; the weight gradient's spectrum, as fft_conv2d_weight_spectrum; the output gradient summed
// over all but its channels, the bias's gradient (K,)), equal to those two ops' results and to that sum. Each group's
// output-gradient spectra conj(G) are transformed once and serve all three: the input gradient's product with Sᵀ,
// the weight gradient's sum of X · conj(G), and the bias's sum of the tiles' DC terms (point 0 of a tile's spectrum
// is the sum of its values; the tiles' valid parts do not overlap and cover the output gradient), so the output
// gradient is not read again for it.
// input_spectra: the input's tile spectra fft_conv2d_with_input_spectra kept, taken instead of transforming the
// input again.
template <class Transforms>
std::tuple<at::Tensor, at::Tensor, at::Tensor> fft_conv2d_backward_tiles(
    const at::Tensor& input, const at::Tensor& grad_output, const at::Tensor& spectrum, at::IntArrayRef tile,
    at::IntArrayRef valid, at::IntArrayRef dilation, const c10::optional<at::Tensor>& input_spectra) {
  TORCH_CHECK(grad_output.dim() == 4 && spectrum.dim() == 3, "densecnn.fft_conv2d_backward: expected a 4-D "
              "(N, K, H', W') output gradient and a complex (th·(tw/2+1), C, K) kernel spectrum, got ",
              grad_output.sizes(), " and ", spectrum.sizes());
  const FftGeometry g = fft_geometry(input, grad_output.size(1), tile, valid, dilation);
  check_output_gradient("fft_conv2d_backward", g, input, grad_output);
  check_kernel_spectrum("fft_conv2d_backward", g, spectrum, grad_output);
  const at::Tensor kept = input_spectra.has_value() ? input_spectra->contiguous() : at::Tensor();
  TORCH_CHECK(!kept.defined() || (kept.numel() == g.tiles * fft_points(g) * g.channels * 2 &&
                                  kept.scalar_type() == input.scalar_type() && kept.device() == input.device()),
              "densecnn.fft_conv2d_backward: input_spectra must be the ", g.tiles * fft_points(g) * g.channels * 2,
              " values fft_conv2d_with_input_spectra kept for this input and tile, got ", kept.sizes(), " ",
              kept.scalar_type());
  at::Tensor grad_input = empty_in_layout(input.sizes(), grad_output.options(), is_channels_last(grad_output));
  grad_input.zero_();
  const int64_t points = fft_points(g);
  const auto complex_options = input.options().dtype(c10::toComplexType(input.scalar_type()));
  if (g.tiles == 0) {
    return {grad_input, at::zeros({points, g.channels, g.out_channels}, complex_options),
            at::zeros({g.out_channels}, grad_output.options())};
  }
  at::Tensor result = empty_output({points, g.channels, g.out_channels}, complex_options);
  at::Tensor grad_bias = at::zeros({g.out_channels}, grad_output.options());
  const FftGeometry gg = fft_gradient_geometry(g, grad_output), ga = fft_adjoint_geometry(g, grad_input);
  const at::Tensor twiddles = fft_twiddle_table(g, input);
  const int64_t group = fft_group_tiles(g, input.element_size(), kMinGradientGroupTiles);
  const at::Tensor weights = spectrum.contiguous().transpose(1, 2);  // (P, K, C): Sᵀ
  at::Tensor g_spectrum = empty_output({points * group * g.out_channels * 2}, input.options());  // reused workspaces
  at::Tensor x_spectrum = kept.defined() ? at::Tensor() : empty_output({points * group * g.channels * 2}, input.options());
  at::Tensor product = empty_output({points * group * g.channels}, spectrum.options());
  for (int64_t first = 0; first < g.tiles; first += group) {
    const int64_t count = std::min(group, g.tiles - first);
    const at::Tensor gs = output_gradient_spectra<Transforms>(grad_output, gg, first, count, twiddles, g_spectrum);
    add_input_gradient<Transforms>(ga, first, count, twiddles, gs, weights, product, grad_input);
    add_weight_spectrum<Transforms>(input, g, first, count, twiddles, x_spectrum, gs, result, kept);
    grad_bias.add_(gs.select(1, 0).select(2, 0).sum(0));  // the real parts of the tiles' DC terms, (count, K) -> (K,)
  }
  return {grad_input, result, grad_bias};
}

}  // namespace densecnn
