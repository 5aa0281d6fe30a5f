// CPU im2col/col2im for the banded im2col + GEMM convolution (conv_driver.h). Both loops copy or add whole output
// rows (W' contiguous elements), parallel over unrolled rows (im2col) or channels (col2im, race-free).
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>

#include "common.h"
#include "conv_driver.h"
#include "elements.h"
#include "gpu_loops.h"

namespace densecnn {
namespace {

struct CpuUnroll {
  // col (C·kh·kw, rows·W') <- taps of the (C, H, W) image for output rows [band_start, band_start + rows).
  static void im2col(const at::Tensor& image, const ConvGeometry& g, int64_t band_start, int64_t rows,
                     at::Tensor& col) {
    AT_DISPATCH_FLOATING_TYPES(image.scalar_type(), "densecnn_im2col", [&] {
      const scalar_t* x = image.const_data_ptr<scalar_t>();
      scalar_t* out = col.mutable_data_ptr<scalar_t>();
      if (gpu_loops_on_cpu()) {
        for_each_element(im2col_size(g, rows), [&](int64_t i) { im2col_at(g, x, band_start, rows, out, i); });
        return;
      }
      at::parallel_for(0, col.size(0), 1, [&](int64_t begin, int64_t end) {
        for (int64_t row = begin; row < end; ++row) {
          for (int64_t i = 0; i < rows; ++i) {
            const scalar_t* src = x + im2col_source(g, band_start, row, i * g.out_cols);
            std::copy(src, src + g.out_cols, out + (row * rows + i) * g.out_cols);
          }
        }
      });
    });
  }

  // grad_image (C, H, W) += col2im(grad_col) for the band.
  static void col2im_add(const at::Tensor& grad_col, const ConvGeometry& g, int64_t band_start, int64_t rows,
                         at::Tensor& grad_image) {
    AT_DISPATCH_FLOATING_TYPES(grad_col.scalar_type(), "densecnn_col2im", [&] {
      const scalar_t* src_all = grad_col.const_data_ptr<scalar_t>();
      scalar_t* gx = grad_image.mutable_data_ptr<scalar_t>();
      if (gpu_loops_on_cpu()) {
        for_each_element(g.channels * col2im_rows(g, rows) * g.cols,
                         [&](int64_t i) { col2im_add_at(g, src_all, band_start, rows, gx, i); });
        return;
      }
      at::parallel_for(0, g.channels, 1, [&](int64_t begin, int64_t end) {
        for (int64_t c = begin; c < end; ++c) {
          for (int32_t a = 0; a < g.kh; ++a) {
            for (int32_t b = 0; b < g.kw; ++b) {
              const int64_t row = (c * g.kh + a) * g.kw + b;
              for (int64_t i = 0; i < rows; ++i) {
                const scalar_t* src = src_all + (row * rows + i) * g.out_cols;
                scalar_t* dst = gx + (c * g.rows + band_start + i + a * g.dh) * g.cols + b * g.dw;
                for (int64_t j = 0; j < g.out_cols; ++j) dst[j] += src[j];
              }
            }
          }
        }
      });
    });
  }
};

at::Tensor conv2d_cpu(const at::Tensor& input, const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
                      at::IntArrayRef dilation, int64_t groups) {
  return conv2d_im2col<CpuUnroll>(input, weight, bias, dilation, groups);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> conv2d_backward_cpu(const at::Tensor& grad_output,
                                                                   const at::Tensor& input, const at::Tensor& weight,
                                                                   at::IntArrayRef dilation, int64_t groups,
                                                                   std::array<bool, 3> output_mask) {
  return conv2d_im2col_backward<CpuUnroll>(grad_output, input, weight, dilation, groups, output_mask);
}

}  // namespace

TORCH_LIBRARY_IMPL(densecnn, CPU, m) {
  m.impl("conv2d", &conv2d_cpu);
  m.impl("conv2d_backward", &conv2d_backward_cpu);
}

}  // namespace densecnn
