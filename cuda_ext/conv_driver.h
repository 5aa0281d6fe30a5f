// The im2col + GEMM convolution, written once for every device: `Unroll` supplies the device's im2col and
// col2im (CpuUnroll in conv_cpu.cpp, CudaUnroll in conv_cuda.cpp); the GEMMs are at::mm / at::addmm, so they run
// on MKL/oneDNN on CPU and cuBLAS on CUDA.
//
// The unrolled matrix of one image would be (C·kh·kw) × (H'·W') — gigabytes for a 7×7 kernel over 512² — so it is
// built for a band of output rows at a time, sized to stay under kUnrolledBytes.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>

#include "common.h"
#include "pool_args.h"

namespace densecnn {

constexpr int64_t kUnrolledBytes = 64 << 20;

inline ConvGeometry conv_geometry(const char* op, const at::Tensor& x, const at::Tensor& weight,
                                  at::IntArrayRef dilation, int64_t groups) {
  TORCH_CHECK(x.dim() == 4, "densecnn.", op, ": expected a 4-D (N, C, H, W) input, got shape ", x.sizes());
  TORCH_CHECK(weight.dim() == 4, "densecnn.", op, ": expected a 4-D (K, C/groups, kh, kw) weight, got shape ",
              weight.sizes());
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble, "densecnn.", op,
              ": dtype must be float32 or float64, got ", x.scalar_type(), "; convert with .float()");
  TORCH_CHECK(weight.scalar_type() == x.scalar_type() && weight.device() == x.device(), "densecnn.", op,
              ": weight (", weight.scalar_type(), ", ", weight.device(), ") must match the input (",
              x.scalar_type(), ", ", x.device(), ")");
  TORCH_CHECK(dilation.size() == 2 && dilation[0] >= 1 && dilation[1] >= 1, "densecnn.", op,
              ": dilation must be two positive ints (dh, dw), got ", dilation);
  TORCH_CHECK(groups >= 1 && x.size(1) == weight.size(1) * groups && weight.size(0) % groups == 0, "densecnn.",
              op, ": input has ", x.size(1), " channels and weight ", weight.sizes(), " with groups=", groups,
              "; need C == weight.shape[1] * groups and K divisible by groups");
  ConvGeometry g;
  g.channels = x.size(1);
  g.rows = x.size(2);
  g.cols = x.size(3);
  g.kh = static_cast<int32_t>(weight.size(2));
  g.kw = static_cast<int32_t>(weight.size(3));
  g.dh = dilation[0];
  g.dw = dilation[1];
  const int64_t span_h = (g.kh - 1) * g.dh + 1, span_w = (g.kw - 1) * g.dw + 1;
  TORCH_CHECK(g.rows >= span_h && g.cols >= span_w, "densecnn.", op, ": a ", g.kh, "x", g.kw,
              " kernel with dilation ", dilation, " spans ", span_h, "x", span_w, " pixels but the input is only ",
              g.rows, "x", g.cols, "; use a larger input");
  g.out_rows = g.rows - span_h + 1;
  g.out_cols = g.cols - span_w + 1;
  return g;
}

inline int64_t band_rows_for(const ConvGeometry& g, int64_t element_size) {
  const int64_t row_bytes = g.channels * g.kh * g.kw * g.out_cols * element_size;
  return std::max<int64_t>(1, std::min(g.out_rows, kUnrolledBytes / std::max<int64_t>(row_bytes, 1)));
}

// Output rows [i0, i0 + rows) of image n as a (K, rows·W') matrix view of the NCHW tensor `t`.
inline at::Tensor band_view(const at::Tensor& t, int64_t n, const ConvGeometry& g, int64_t i0, int64_t rows) {
  return t.select(0, n).view({t.size(1), g.out_rows * g.out_cols}).narrow(1, i0 * g.out_cols, rows * g.out_cols);
}

// The conv runs in NCHW; its output goes back to the input's layout.
inline at::MemoryFormat conv_layout(const at::Tensor& input) {
  return is_channels_last(input) ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
}

template <class Unroll>
at::Tensor conv2d_im2col(const at::Tensor& input, const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
                         at::IntArrayRef dilation, int64_t groups) {
  const ConvGeometry g = conv_geometry("conv2d", input, weight, dilation, groups);
  const auto layout = conv_layout(input);
  const at::Tensor x = input.contiguous();  // the unrolling runs on NCHW
  const int64_t k = weight.size(0), k_group = k / groups, taps = weight.size(1) * g.kh * g.kw;
  if (bias.has_value()) {
    TORCH_CHECK(bias->dim() == 1 && bias->size(0) == k && bias->device() == x.device(),
                "densecnn.conv2d: bias must have shape (", k, ",) and be on the input's device, got ", bias->sizes(),
                " on ", bias->device());
  }
  at::Tensor y = empty_output({x.size(0), k, g.out_rows, g.out_cols}, x.options());
  if (y.numel() == 0) return y.contiguous(layout);
  const at::Tensor w = weight.reshape({groups, k_group, taps});  // (G, K/G, C/G·kh·kw)
  const int64_t band = band_rows_for(g, x.element_size());
  at::Tensor unrolled = at::empty({g.channels * g.kh * g.kw * band * g.out_cols}, x.options());
  for (int64_t n = 0; n < x.size(0); ++n) {
    for (int64_t i0 = 0; i0 < g.out_rows; i0 += band) {
      const int64_t rows = std::min(band, g.out_rows - i0);
      at::Tensor col = unrolled.narrow(0, 0, g.channels * g.kh * g.kw * rows * g.out_cols)
                           .view({g.channels * g.kh * g.kw, rows * g.out_cols});  // (C·kh·kw, rows·W')
      Unroll::im2col(x.select(0, n), g, i0, rows, col);
      const at::Tensor out = band_view(y, n, g, i0, rows);  // (K, rows·W')
      for (int64_t grp = 0; grp < groups; ++grp) {
        at::Tensor out_g = out.narrow(0, grp * k_group, k_group);
        const at::Tensor col_g = col.narrow(0, grp * taps, taps);
        if (bias.has_value()) {
          at::addmm_out(out_g, bias->narrow(0, grp * k_group, k_group).unsqueeze(1), w[grp], col_g);
        } else {
          at::mm_out(out_g, w[grp], col_g);
        }
      }
    }
  }
  return y.contiguous(layout);
}

template <class Unroll>
std::tuple<at::Tensor, at::Tensor, at::Tensor> conv2d_im2col_backward(const at::Tensor& grad_output,
                                                                      const at::Tensor& input,
                                                                      const at::Tensor& weight,
                                                                      at::IntArrayRef dilation, int64_t groups,
                                                                      std::array<bool, 3> output_mask) {
  const ConvGeometry g = conv_geometry("conv2d_backward", input, weight, dilation, groups);
  const int64_t k = weight.size(0), k_group = k / groups, taps = weight.size(1) * g.kh * g.kw;
  TORCH_CHECK(grad_output.dim() == 4 && grad_output.size(0) == input.size(0) && grad_output.size(1) == k &&
                  grad_output.size(2) == g.out_rows && grad_output.size(3) == g.out_cols,
              "densecnn.conv2d_backward: grad_output has shape ", grad_output.sizes(), " but the forward output is (",
              input.size(0), ", ", k, ", ", g.out_rows, ", ", g.out_cols, ")");
  const auto layout = conv_layout(input);
  const at::Tensor x = input.contiguous(), gy = grad_output.contiguous();
  const at::Tensor w = weight.reshape({groups, k_group, taps});
  at::Tensor grad_x = output_mask[0] ? at::zeros_like(x) : at::empty({0}, x.options());
  at::Tensor grad_w = output_mask[1] ? at::zeros({groups, k_group, taps}, x.options()) : at::empty({0}, x.options());
  at::Tensor grad_b = output_mask[2] ? gy.sum({0, 2, 3}) : at::empty({0}, x.options());
  const int64_t band = band_rows_for(g, x.element_size());
  const int64_t unrolled_size = g.channels * g.kh * g.kw * band * g.out_cols;
  at::Tensor unrolled = at::empty({output_mask[1] ? unrolled_size : 0}, x.options());
  at::Tensor grad_unrolled = at::empty({output_mask[0] ? unrolled_size : 0}, x.options());
  if (gy.numel() > 0 && (output_mask[0] || output_mask[1])) {
    for (int64_t n = 0; n < x.size(0); ++n) {
      for (int64_t i0 = 0; i0 < g.out_rows; i0 += band) {
        const int64_t rows = std::min(band, g.out_rows - i0);
        const int64_t unrolled_rows = g.channels * g.kh * g.kw;
        const at::Tensor gy_band = band_view(gy, n, g, i0, rows);  // (K, rows·W')
        at::Tensor col, grad_col;
        if (output_mask[1]) {
          col = unrolled.narrow(0, 0, unrolled_rows * rows * g.out_cols).view({unrolled_rows, rows * g.out_cols});
          Unroll::im2col(x.select(0, n), g, i0, rows, col);
        }
        if (output_mask[0]) {
          grad_col = grad_unrolled.narrow(0, 0, unrolled_rows * rows * g.out_cols)
                         .view({unrolled_rows, rows * g.out_cols});
        }
        for (int64_t grp = 0; grp < groups; ++grp) {
          const at::Tensor gy_g = gy_band.narrow(0, grp * k_group, k_group);  // (K/G, rows·W')
          if (output_mask[1]) grad_w[grp].addmm_(gy_g, col.narrow(0, grp * taps, taps).t());
          if (output_mask[0]) {
            at::Tensor grad_col_g = grad_col.narrow(0, grp * taps, taps);
            at::mm_out(grad_col_g, w[grp].t(), gy_g);
          }
        }
        if (output_mask[0]) {
          at::Tensor grad_image = grad_x.select(0, n);
          Unroll::col2im_add(grad_col, g, i0, rows, grad_image);
        }
      }
    }
  }
  return {output_mask[0] ? grad_x.contiguous(layout) : grad_x, output_mask[1] ? grad_w.view(weight.sizes()) : grad_w,
          grad_b};
}

}  // namespace densecnn
