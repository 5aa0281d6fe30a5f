// CUDA registrations of the Winograd ops: the checks and geometry of winograd_args.h, the transform kernels of
// winograd_kernels.cu on the current stream, the batched GEMM on cuBLAS through at::bmm_out.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <algorithm>
#include <tuple>
#include <vector>

#include "common.h"
#include "kernels.h"
#include "pool_args.h"
#include "winograd_args.h"

namespace densecnn {
namespace {

constexpr int64_t kChunkBytes = 256 << 20;  // transformed input + products of one chunk of tiles

int64_t points_of(int64_t axes, int64_t m) { return axes == 2 ? (m + 2) * (m + 2) : (m + 2) * (m + 2) * (m + 2); }

at::Tensor winograd_input_cuda(const at::Tensor& input, at::IntArrayRef dilation, int64_t m, int64_t tile_begin,
                               int64_t tile_count, at::IntArrayRef padding) {
  const c10::cuda::CUDAGuard guard(input.device());
  const WinogradGeometry g = winograd_input_geometry(input, dilation, m, tile_begin, tile_count, padding);
  at::Tensor v = at::empty({points_of(g.axes, m), tile_count, g.channels}, input.options());
  if (v.numel() == 0) return v;
  AT_DISPATCH_FLOATING_TYPES(input.scalar_type(), "densecnn_winograd_input_cuda", [&] {
    C10_CUDA_CHECK(launch_winograd_input<scalar_t>(g, static_cast<int>(m), input.const_data_ptr<scalar_t>(),
                                                   v.mutable_data_ptr<scalar_t>(), at::cuda::getCurrentCUDAStream()));
  });
  return v;
}

void winograd_output_cuda(at::Tensor& output, const at::Tensor& transformed, const c10::optional<at::Tensor>& bias,
                          at::IntArrayRef dilation, int64_t m, int64_t tile_begin) {
  const c10::cuda::CUDAGuard guard(output.device());
  const WinogradGeometry g = winograd_output_geometry(output, transformed, bias, dilation, m, tile_begin);
  if (g.tile_count == 0 || output.numel() == 0) return;
  AT_DISPATCH_FLOATING_TYPES(output.scalar_type(), "densecnn_winograd_output_cuda", [&] {
    const scalar_t* b = bias.has_value() ? bias->const_data_ptr<scalar_t>() : nullptr;
    C10_CUDA_CHECK(launch_winograd_output<scalar_t>(g, static_cast<int>(m), transformed.const_data_ptr<scalar_t>(),
                                                    b, output.mutable_data_ptr<scalar_t>(),
                                                    at::cuda::getCurrentCUDAStream()));
  });
}

// The whole conv, chunk by chunk: the two transform kernels around one batched GEMM per chunk.
at::Tensor winograd_conv_cuda(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& kernel,
                              const c10::optional<at::Tensor>& bias, at::IntArrayRef dilation, int64_t m,
                              at::IntArrayRef padding) {
  const c10::cuda::CUDAGuard guard(input.device());
  const WinogradGeometry in = winograd_input_geometry(input, dilation, m, 0, 0, padding);
  const int64_t points = points_of(in.axes, m), k = kernel.size(-1);
  TORCH_CHECK(kernel.dim() == 3 && kernel.size(0) == points && kernel.size(1) == in.channels &&
                  kernel.is_contiguous() && kernel.scalar_type() == input.scalar_type(),
              "densecnn.winograd_conv: kernel must be the contiguous transformed kernel (", points, ", ", in.channels,
              ", K) of the input's dtype, got ", kernel.sizes());
  check_conv_weight("winograd_conv", weight, input, k, std::vector<int64_t>(in.axes, 3));
  std::vector<int64_t> out_sizes{input.size(0), k};
  for (int a = 0; a < in.axes; ++a) out_sizes.push_back(in.out[a]);
  at::Tensor y = empty_in_layout(out_sizes, input.options(), is_channels_last(input));
  const int64_t tiles = winograd_tiles(in, input.size(0));
  const int64_t chunk = std::max<int64_t>(1, kChunkBytes / (points * (in.channels + k) * input.element_size()));
  for (int64_t begin = 0; begin < tiles; begin += chunk) {
    const int64_t count = std::min(chunk, tiles - begin);
    const at::Tensor v = winograd_input_cuda(input, dilation, m, begin, count, padding);  // (α^n, count, C)
    winograd_output_cuda(y, at::bmm(v, kernel), bias, dilation, m, begin);
  }
  return y;
}

// The weight gradient's transformed form, chunk by chunk: V and z by the transform kernels, V[ξ]ᵀ z[ξ] summed on
// cuBLAS; and the bias's gradient, z at the sum point summed over the tiles.
std::tuple<at::Tensor, at::Tensor> winograd_conv_weight_grad_cuda(const at::Tensor& input,
                                                                  const at::Tensor& grad_output,
                                                                  at::IntArrayRef dilation, int64_t m) {
  const c10::cuda::CUDAGuard guard(input.device());
  const WinogradGeometry in = winograd_input_geometry(input, dilation, m, 0, 0);
  const WinogradGeometry out = winograd_output_gradient_geometry(grad_output, input, in, dilation, m);
  const int64_t points = points_of(in.axes, m), c = in.channels, k = out.channels;
  at::Tensor result = at::zeros({points, c, k}, input.options());
  at::Tensor bias = at::zeros({k}, input.options());
  const int64_t sum_point = winograd_sum_point(in.axes, m);
  const int64_t tiles = winograd_tiles(in, input.size(0));
  const int64_t chunk = std::max<int64_t>(1, kChunkBytes / (points * (c + k) * input.element_size()));
  for (int64_t begin = 0; begin < tiles; begin += chunk) {
    const int64_t count = std::min(chunk, tiles - begin);
    const at::Tensor v = winograd_input_cuda(input, dilation, m, begin, count, {});  // (α^n, count, C)
    WinogradGeometry g = out;
    g.tile_begin = begin;
    g.tile_count = count;
    at::Tensor z = at::empty({points, count, k}, input.options());
    AT_DISPATCH_FLOATING_TYPES(input.scalar_type(), "densecnn_winograd_output_gradient_cuda", [&] {
      C10_CUDA_CHECK(launch_winograd_output_gradient<scalar_t>(g, static_cast<int>(m),
                                                               grad_output.const_data_ptr<scalar_t>(),
                                                               z.mutable_data_ptr<scalar_t>(),
                                                               at::cuda::getCurrentCUDAStream()));
    });
    result.baddbmm_(v.transpose(1, 2), z);
    bias.add_(z.select(0, sum_point).sum(0));  // (count, K) -> (K,)
  }
  return {result, bias};
}

}  // namespace

TORCH_LIBRARY_IMPL(densecnn, CUDA, m) {
  m.impl("winograd_conv", &winograd_conv_cuda);
  m.impl("winograd_conv_weight_grad", &winograd_conv_weight_grad_cuda);
}

}  // namespace densecnn
