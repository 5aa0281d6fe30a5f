// CUDA registration of the im2col + GEMM convolution: conv_driver.h with the im2col/col2im of conv_kernels.cu;
// the GEMMs go to cuBLAS through at::mm. (On a GPU, densecnn's solver choice normally prefers cuDNN.)
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "common.h"
#include "conv_driver.h"
#include "kernels.h"

namespace densecnn {
namespace {

struct CudaUnroll {
  static void im2col(const at::Tensor& image, const ConvGeometry& g, int64_t band_start, int64_t rows,
                     at::Tensor& col) {
    AT_DISPATCH_FLOATING_TYPES(image.scalar_type(), "densecnn_im2col_cuda", [&] {
      C10_CUDA_CHECK(launch_im2col<scalar_t>(g, image.const_data_ptr<scalar_t>(), band_start, rows,
                                             col.mutable_data_ptr<scalar_t>(), at::cuda::getCurrentCUDAStream()));
    });
  }

  static void col2im_add(const at::Tensor& grad_col, const ConvGeometry& g, int64_t band_start, int64_t rows,
                         at::Tensor& grad_image) {
    AT_DISPATCH_FLOATING_TYPES(grad_col.scalar_type(), "densecnn_col2im_cuda", [&] {
      C10_CUDA_CHECK(launch_col2im_add<scalar_t>(g, grad_col.const_data_ptr<scalar_t>(), band_start, rows,
                                                 grad_image.mutable_data_ptr<scalar_t>(),
                                                 at::cuda::getCurrentCUDAStream()));
    });
  }
};

at::Tensor conv2d_cuda(const at::Tensor& input, const at::Tensor& weight, const c10::optional<at::Tensor>& bias,
                       at::IntArrayRef dilation, int64_t groups) {
  const c10::cuda::CUDAGuard guard(input.device());
  return conv2d_im2col<CudaUnroll>(input, weight, bias, dilation, groups);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> conv2d_backward_cuda(const at::Tensor& grad_output,
                                                                    const at::Tensor& input, const at::Tensor& weight,
                                                                    at::IntArrayRef dilation, int64_t groups,
                                                                    std::array<bool, 3> output_mask) {
  const c10::cuda::CUDAGuard guard(input.device());
  return conv2d_im2col_backward<CudaUnroll>(grad_output, input, weight, dilation, groups, output_mask);
}

}  // namespace

TORCH_LIBRARY_IMPL(densecnn, CUDA, m) {
  m.impl("conv2d", &conv2d_cuda);
  m.impl("conv2d_backward", &conv2d_backward_cuda);
}

}  // namespace densecnn
