// CUDA registration of the frequency-domain convolution: fft_driver.h with the tile transforms of fft_kernels.cu;
// the channel mixing goes to cuBLAS through at::bmm.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "fft_driver.h"
#include "kernels.h"

namespace densecnn {
namespace {

struct CudaTransforms {
  static void forward(const at::Tensor& x, const FftGeometry& g, int64_t first, int64_t count,
                      const at::Tensor& twiddles, at::Tensor& spectrum) {
    AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "densecnn_fft_forward_cuda", [&] {
      at::Tensor rows = at::empty({2 * fft_forward_rows_size(g, count)}, x.options());
      C10_CUDA_CHECK(launch_fft_forward<scalar_t>(g, x.const_data_ptr<scalar_t>(), first, count,
                                                  twiddles.const_data_ptr<scalar_t>(), rows.mutable_data_ptr<scalar_t>(),
                                                  spectrum.mutable_data_ptr<scalar_t>(),
                                                  at::cuda::getCurrentCUDAStream()));
    });
  }

  static void inverse(const at::Tensor& product, const c10::optional<at::Tensor>& bias, const FftGeometry& g,
                      int64_t first, int64_t count, const at::Tensor& twiddles, at::Tensor& y) {
    AT_DISPATCH_FLOATING_TYPES(y.scalar_type(), "densecnn_fft_inverse_cuda", [&] {
      at::Tensor cols = at::empty({2 * fft_inverse_cols_size(g, count)}, y.options());
      if (g.adjoint) {
        at::Tensor tiles = at::empty({fft_inverse_rows_size(g, count)}, y.options());
        C10_CUDA_CHECK(launch_fft_adjoint<scalar_t>(
            g, product.const_data_ptr<scalar_t>(), first, count, twiddles.const_data_ptr<scalar_t>(),
            cols.mutable_data_ptr<scalar_t>(), tiles.mutable_data_ptr<scalar_t>(), y.mutable_data_ptr<scalar_t>(),
            at::cuda::getCurrentCUDAStream()));
        return;
      }
      C10_CUDA_CHECK(launch_fft_inverse<scalar_t>(
          g, product.const_data_ptr<scalar_t>(), bias.has_value() ? bias->const_data_ptr<scalar_t>() : nullptr,
          first, count, twiddles.const_data_ptr<scalar_t>(), cols.mutable_data_ptr<scalar_t>(),
          y.mutable_data_ptr<scalar_t>(), at::cuda::getCurrentCUDAStream()));
    });
  }
};

at::Tensor fft_conv2d_cuda(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& spectrum,
                           const c10::optional<at::Tensor>& bias, at::IntArrayRef tile, at::IntArrayRef valid,
                           at::IntArrayRef dilation, at::IntArrayRef padding) {
  const c10::cuda::CUDAGuard guard(input.device());
  return std::get<0>(fft_conv2d_tiles<CudaTransforms>(input, weight, spectrum, bias, tile, valid, dilation, padding));
}

at::Tensor fft_conv2d_weight_spectrum_cuda(const at::Tensor& input, const at::Tensor& grad_output,
                                           at::IntArrayRef tile, at::IntArrayRef valid, at::IntArrayRef dilation) {
  const c10::cuda::CUDAGuard guard(input.device());
  return fft_conv2d_weight_spectrum_tiles<CudaTransforms>(input, grad_output, tile, valid, dilation);
}

at::Tensor fft_conv2d_input_grad_cuda(const at::Tensor& grad_output, const at::Tensor& spectrum,
                                      at::IntArrayRef input_size, at::IntArrayRef tile, at::IntArrayRef valid,
                                      at::IntArrayRef dilation, at::IntArrayRef padding) {
  const c10::cuda::CUDAGuard guard(grad_output.device());
  return fft_conv2d_input_grad_tiles<CudaTransforms>(grad_output, spectrum, input_size, tile, valid, dilation,
                                                     padding);
}

std::tuple<at::Tensor, at::Tensor> fft_conv2d_with_input_spectra_cuda(const at::Tensor& input, const at::Tensor& weight,
                                                                      const at::Tensor& spectrum,
                                                                      const c10::optional<at::Tensor>& bias,
                                                                      at::IntArrayRef tile, at::IntArrayRef valid,
                                                                      at::IntArrayRef dilation) {
  const c10::cuda::CUDAGuard guard(input.device());
  return fft_conv2d_tiles<CudaTransforms>(input, weight, spectrum, bias, tile, valid, dilation, {0, 0}, true);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> fft_conv2d_backward_cuda(
    const at::Tensor& input, const at::Tensor& grad_output, const at::Tensor& spectrum, at::IntArrayRef tile,
    at::IntArrayRef valid, at::IntArrayRef dilation, const c10::optional<at::Tensor>& input_spectra) {
  const c10::cuda::CUDAGuard guard(input.device());
  return fft_conv2d_backward_tiles<CudaTransforms>(input, grad_output, spectrum, tile, valid, dilation, input_spectra);
}

}  // namespace

TORCH_LIBRARY_IMPL(densecnn, CUDA, m) {
  m.impl("fft_conv2d_backward", &fft_conv2d_backward_cuda);
  m.impl("fft_conv2d_with_input_spectra", &fft_conv2d_with_input_spectra_cuda);
  m.impl("fft_conv2d_input_grad", &fft_conv2d_input_grad_cuda);
  m.impl("fft_conv2d", &fft_conv2d_cuda);
  m.impl("fft_conv2d_weight_spectrum", &fft_conv2d_weight_spectrum_cuda);
}

}  // namespace densecnn
