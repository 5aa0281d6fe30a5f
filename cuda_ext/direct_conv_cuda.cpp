// CUDA registration of the direct convolution for few input channels (direct_conv_kernels.cu).
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "direct_conv_args.h"
#include "kernels.h"

namespace densecnn {
namespace {

at::Tensor direct_conv_cuda(const at::Tensor& input_, const at::Tensor& weight_,
                            const c10::optional<at::Tensor>& bias, at::IntArrayRef dilation) {
  const c10::cuda::CUDAGuard guard(input_.device());
  const at::Tensor input = input_.contiguous(), weight = weight_.contiguous();
  const at::Tensor b = bias.has_value() ? bias->contiguous() : at::Tensor();
  const DirectConvGeometry g = direct_conv_geometry(input_, weight, dilation);  // read as NC*, written in its layout
  at::Tensor y = empty_in_layout(direct_conv_output_shape(g, input.dim() - 2), input.options(), g.channels_last);
  AT_DISPATCH_FLOATING_TYPES(input.scalar_type(), "densecnn_direct_conv_cuda", [&] {
    C10_CUDA_CHECK(launch_direct_conv<scalar_t>(g, input.const_data_ptr<scalar_t>(),
                                                weight.const_data_ptr<scalar_t>(),
                                                b.defined() ? b.const_data_ptr<scalar_t>() : nullptr,
                                                y.mutable_data_ptr<scalar_t>(), at::cuda::getCurrentCUDAStream()));
  });
  return y;
}

}  // namespace

TORCH_LIBRARY_IMPL(densecnn, CUDA, m) { m.impl("direct_conv", &direct_conv_cuda); }

}  // namespace densecnn
