// CUDA registrations of the pooling ops: argument checks and allocation as on the CPU (pool_args.h), then the
// launchers of pool_kernels.cu on the current stream of the input's device.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "common.h"
#include "kernels.h"
#include "pool_args.h"

namespace densecnn {
namespace {

std::tuple<at::Tensor, at::Tensor, at::Tensor> max_pool2d_cuda(const at::Tensor& input, at::IntArrayRef kernel,
                                                               at::IntArrayRef dilation, c10::string_view activation,
                                                               bool with_taps) {
  const c10::cuda::CUDAGuard guard(input.device());
  const PoolCall call = prepare_pool("max_pool2d", input, kernel, dilation, activation);
  TORCH_CHECK(kernel[0] <= 255 && kernel[1] <= 255, "densecnn.max_pool2d: kernel ", kernel,
              " is too large for the ext kernels (at most 255 taps per axis); use backend='native'");
  const PoolGeometry& g = call.geometry;
  const at::Tensor& x = call.input;
  at::Tensor y = empty_like_layout(x, g.out_rows, call.out_cols, x.scalar_type(), call.layout);
  at::Tensor row_tap = empty_like_layout(x, with_taps ? g.rows : 0, with_taps ? call.out_cols : 0, at::kByte,
                                         call.layout);
  at::Tensor col_tap = empty_like_layout(x, with_taps ? g.out_rows : 0, with_taps ? call.out_cols : 0, at::kByte,
                                         call.layout);
  if (y.numel() == 0) return {y, row_tap, col_tap};
  at::Tensor row_max = at::empty({g.planes * g.rows * g.out_row_len}, x.options());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "densecnn_max_pool2d_cuda", [&] {
    C10_CUDA_CHECK(launch_max_pool_forward<scalar_t>(
        g, x.const_data_ptr<scalar_t>(), row_max.mutable_data_ptr<scalar_t>(), y.mutable_data_ptr<scalar_t>(),
        with_taps ? row_tap.mutable_data_ptr<uint8_t>() : nullptr,
        with_taps ? col_tap.mutable_data_ptr<uint8_t>() : nullptr, call.activation,
        at::cuda::getCurrentCUDAStream()));
  });
  return {y, row_tap, col_tap};
}

at::Tensor max_pool2d_backward_cuda(const at::Tensor& grad_output, const c10::optional<at::Tensor>& output,
                                    const at::Tensor& row_tap, const at::Tensor& col_tap, at::IntArrayRef kernel,
                                    at::IntArrayRef dilation, c10::string_view activation) {
  const c10::cuda::CUDAGuard guard(grad_output.device());
  const char* op = "max_pool2d_backward";
  const auto layout = pool_layout(col_tap);
  const PoolBackwardCall call = prepare_pool_backward(op, grad_output, output, layout, kernel, dilation, activation);
  check_taps(op, call, row_tap, col_tap, kernel);
  const at::Tensor rt = row_tap.contiguous(layout), ct = col_tap.contiguous(layout);
  at::Tensor grad_x =
      empty_like_layout(call.grad_output, call.geometry.rows, call.in_cols, grad_output.scalar_type(), layout);
  if (grad_x.numel() == 0) return grad_x;
  AT_DISPATCH_FLOATING_TYPES(grad_output.scalar_type(), "densecnn_max_pool2d_backward_cuda", [&] {
    C10_CUDA_CHECK(launch_max_pool_backward<scalar_t>(
        call.geometry, call.grad_output.const_data_ptr<scalar_t>(), call.output.const_data_ptr<scalar_t>(),
        rt.const_data_ptr<uint8_t>(), ct.const_data_ptr<uint8_t>(), grad_x.mutable_data_ptr<scalar_t>(),
        call.activation, at::cuda::getCurrentCUDAStream()));
  });
  return grad_x;
}

at::Tensor avg_pool2d_cuda(const at::Tensor& input, at::IntArrayRef kernel, at::IntArrayRef dilation,
                           int64_t divisor, c10::string_view activation) {
  const c10::cuda::CUDAGuard guard(input.device());
  const PoolCall call = prepare_pool("avg_pool2d", input, kernel, dilation, activation);
  TORCH_CHECK(divisor >= 1, "densecnn.avg_pool2d: divisor must be a positive int, got ", divisor);
  const PoolGeometry& g = call.geometry;
  const at::Tensor& x = call.input;
  at::Tensor y = empty_like_layout(x, g.out_rows, call.out_cols, x.scalar_type(), call.layout);
  if (y.numel() == 0) return y;
  at::Tensor row_sum = at::empty({g.planes * g.rows * g.out_row_len}, x.options());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "densecnn_avg_pool2d_cuda", [&] {
    C10_CUDA_CHECK(launch_avg_pool_forward<scalar_t>(g, x.const_data_ptr<scalar_t>(),
                                                     row_sum.mutable_data_ptr<scalar_t>(),
                                                     y.mutable_data_ptr<scalar_t>(), divisor, call.activation,
                                                     at::cuda::getCurrentCUDAStream()));
  });
  return y;
}

at::Tensor avg_pool2d_backward_cuda(const at::Tensor& grad_output, const c10::optional<at::Tensor>& output,
                                    at::IntArrayRef kernel, at::IntArrayRef dilation, int64_t divisor,
                                    c10::string_view activation) {
  const c10::cuda::CUDAGuard guard(grad_output.device());
  TORCH_CHECK(divisor >= 1, "densecnn.avg_pool2d_backward: divisor must be a positive int, got ", divisor);
  const auto layout = pool_layout(grad_output);
  const PoolBackwardCall call =
      prepare_pool_backward("avg_pool2d_backward", grad_output, output, layout, kernel, dilation, activation);
  at::Tensor grad_x =
      empty_like_layout(call.grad_output, call.geometry.rows, call.in_cols, grad_output.scalar_type(), layout);
  if (grad_x.numel() == 0) return grad_x;
  AT_DISPATCH_FLOATING_TYPES(grad_output.scalar_type(), "densecnn_avg_pool2d_backward_cuda", [&] {
    C10_CUDA_CHECK(launch_avg_pool_backward<scalar_t>(
        call.geometry, call.grad_output.const_data_ptr<scalar_t>(), call.output.const_data_ptr<scalar_t>(),
        grad_x.mutable_data_ptr<scalar_t>(), divisor, call.activation, at::cuda::getCurrentCUDAStream()));
  });
  return grad_x;
}

}  // namespace

TORCH_LIBRARY_IMPL(densecnn, CUDA, m) {
  m.impl("max_pool2d", &max_pool2d_cuda);
  m.impl("max_pool2d_backward", &max_pool2d_backward_cuda);
  m.impl("avg_pool2d", &avg_pool2d_cuda);
  m.impl("avg_pool2d_backward", &avg_pool2d_backward_cuda);
}

}  // namespace densecnn
