// CUDA registrations of the pooling ops: argument checks and allocation as on the CPU (pool_args.h), then the
// launchers of pool_kernels.cu on the current stream of the input's device.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <torch/library.h>

#include "common.h"
#include "kernels.h"
#include "pool_args.h"

namespace densecnn {
namespace {

// torch's scalar types as the kernels' CUDA types (same bits).
template <typename T>
struct CudaTypeOf {
  using type = T;
};
template <>
struct CudaTypeOf<at::BFloat16> {
  using type = __nv_bfloat16;
};
template <>
struct CudaTypeOf<at::Half> {
  using type = __half;
};

template <typename T>
using CudaType = typename CudaTypeOf<T>::type;

template <typename T>
const CudaType<T>* cuda_data(const at::Tensor& t) {
  return reinterpret_cast<const CudaType<T>*>(t.const_data_ptr<T>());
}
template <typename T>
CudaType<T>* cuda_data(at::Tensor& t) {
  return reinterpret_cast<CudaType<T>*>(t.mutable_data_ptr<T>());
}

// Scratch for the arrays between passes, in the accumulation type.
template <typename T>
at::Tensor scratch_for(const PoolGeometry& g, const at::Tensor& like) {
  using A = Acc<CudaType<T>>;
  return at::empty({2 * intermediate_size(g)}, like.options().dtype(c10::CppTypeToScalarType<A>::value));
}

template <typename T>
Acc<CudaType<T>>* scratch_data(at::Tensor& scratch) {
  return scratch.mutable_data_ptr<Acc<CudaType<T>>>();
}

std::tuple<at::Tensor, std::vector<at::Tensor>> max_pool_cuda(const at::Tensor& input, at::IntArrayRef kernel,
                                                              at::IntArrayRef dilation, c10::string_view activation,
                                                              bool with_taps) {
  const c10::cuda::CUDAGuard guard(input.device());
  const PoolCall call = prepare_pool("max_pool", input, kernel, dilation, activation);
  check_max_kernel("max_pool", kernel);
  const at::Tensor& x = call.input;
  at::Tensor y = empty_in_layout(call.out_sizes, x.options(), call.channels_last);
  std::vector<at::Tensor> taps = with_taps ? empty_taps(call, kernel, dilation) : std::vector<at::Tensor>{};
  if (y.numel() == 0) return {y, taps};
  uint8_t* tap_ptrs[kMaxAxes] = {nullptr, nullptr, nullptr};
  for (size_t a = 0; a < taps.size(); ++a) tap_ptrs[a] = taps[a].mutable_data_ptr<uint8_t>();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "densecnn_max_pool_cuda", [&] {
    at::Tensor scratch = scratch_for<scalar_t>(call.geometry, x);
    C10_CUDA_CHECK(launch_max_pool_forward(call.geometry, cuda_data<scalar_t>(x), cuda_data<scalar_t>(y),
                                           with_taps ? tap_ptrs : nullptr, call.activation,
                                           scratch_data<scalar_t>(scratch), at::cuda::getCurrentCUDAStream()));
  });
  return {y, taps};
}

at::Tensor max_pool_backward_cuda(const at::Tensor& grad_output, const c10::optional<at::Tensor>& output,
                                  at::TensorList taps, at::IntArrayRef kernel, at::IntArrayRef dilation,
                                  c10::string_view activation) {
  const c10::cuda::CUDAGuard guard(grad_output.device());
  const char* op = "max_pool_backward";
  TORCH_CHECK(!taps.empty(), "densecnn.", op, ": no taps; pass those of the forward call made with with_taps=True");
  check_max_kernel(op, kernel);
  const PoolBackwardCall call =
      prepare_pool_backward(op, grad_output, output, is_channels_last(taps.back()), kernel, dilation, activation);
  const std::vector<at::Tensor> compact_taps = checked_taps(op, call, taps, kernel, dilation);
  at::Tensor grad_x = empty_in_layout(call.in_sizes, grad_output.options(), call.channels_last);
  if (grad_x.numel() == 0) return grad_x;
  const uint8_t* tap_ptrs[kMaxAxes] = {nullptr, nullptr, nullptr};
  for (size_t a = 0; a < compact_taps.size(); ++a) tap_ptrs[a] = compact_taps[a].const_data_ptr<uint8_t>();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, grad_output.scalar_type(),
                                  "densecnn_max_pool_backward_cuda", [&] {
    at::Tensor scratch = scratch_for<scalar_t>(call.geometry, grad_output);
    C10_CUDA_CHECK(launch_max_pool_backward(
        call.geometry, cuda_data<scalar_t>(call.grad_output),
        call.output ? cuda_data<scalar_t>(*call.output) : nullptr, tap_ptrs, cuda_data<scalar_t>(grad_x),
        call.activation, scratch_data<scalar_t>(scratch), at::cuda::getCurrentCUDAStream()));
  });
  return grad_x;
}

at::Tensor avg_pool_cuda(const at::Tensor& input, at::IntArrayRef kernel, at::IntArrayRef dilation, int64_t divisor,
                         c10::string_view activation) {
  const c10::cuda::CUDAGuard guard(input.device());
  const PoolCall call = prepare_pool("avg_pool", input, kernel, dilation, activation);
  TORCH_CHECK(divisor >= 1, "densecnn.avg_pool: divisor must be a positive int, got ", divisor);
  const at::Tensor& x = call.input;
  at::Tensor y = empty_in_layout(call.out_sizes, x.options(), call.channels_last);
  if (y.numel() == 0) return y;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "densecnn_avg_pool_cuda", [&] {
    at::Tensor scratch = scratch_for<scalar_t>(call.geometry, x);
    C10_CUDA_CHECK(launch_avg_pool_forward(call.geometry, cuda_data<scalar_t>(x), cuda_data<scalar_t>(y), divisor,
                                           call.activation, scratch_data<scalar_t>(scratch),
                                           at::cuda::getCurrentCUDAStream()));
  });
  return y;
}

at::Tensor avg_pool_backward_cuda(const at::Tensor& grad_output, const c10::optional<at::Tensor>& output,
                                  at::IntArrayRef kernel, at::IntArrayRef dilation, int64_t divisor,
                                  c10::string_view activation) {
  const c10::cuda::CUDAGuard guard(grad_output.device());
  const char* op = "avg_pool_backward";
  TORCH_CHECK(divisor >= 1, "densecnn.", op, ": divisor must be a positive int, got ", divisor);
  const PoolBackwardCall call = prepare_pool_backward(op, grad_output, output, is_channels_last(grad_output), kernel,
                                                      dilation, activation);
  at::Tensor grad_x = empty_in_layout(call.in_sizes, grad_output.options(), call.channels_last);
  if (grad_x.numel() == 0) return grad_x;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, grad_output.scalar_type(),
                                  "densecnn_avg_pool_backward_cuda", [&] {
    at::Tensor scratch = scratch_for<scalar_t>(call.geometry, grad_output);
    C10_CUDA_CHECK(launch_avg_pool_backward(
        call.geometry, cuda_data<scalar_t>(call.grad_output),
        call.output ? cuda_data<scalar_t>(*call.output) : nullptr, cuda_data<scalar_t>(grad_x), divisor,
        call.activation, scratch_data<scalar_t>(scratch), at::cuda::getCurrentCUDAStream()));
  });
  return grad_x;
}

}  // namespace

TORCH_LIBRARY_IMPL(densecnn, CUDA, m) {
  m.impl("max_pool", &max_pool_cuda);
  m.impl("max_pool_backward", &max_pool_backward_cuda);
  m.impl("avg_pool", &avg_pool_cuda);
  m.impl("avg_pool_backward", &avg_pool_backward_cuda);
}

}  // namespace densecnn
