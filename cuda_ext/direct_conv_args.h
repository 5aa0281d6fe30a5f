// Checks and geometry of the direct convolution's arguments, shared by its CPU and CUDA registrations.
#pragma once

#include <ATen/ATen.h>

#include <vector>

#include "direct_conv.h"
#include "pool_args.h"

namespace densecnn {

// The output takes the input's layout (`is_channels_last`); the kernels read the input as NC*.
inline DirectConvGeometry direct_conv_geometry(const at::Tensor& input, const at::Tensor& weight, at::IntArrayRef dilation) {
  const int64_t axes = input.dim() - 2;
  TORCH_CHECK(axes >= 1 && axes <= 3, "densecnn::direct_conv: input must be (N, C, *S) with 1-3 spatial axes");
  TORCH_CHECK(weight.dim() == input.dim() && weight.size(1) == input.size(1) && weight.device() == input.device(),
              "densecnn::direct_conv: weight must be (K, C, *k) with the input's C and number of axes, on the input's "
              "device");
  TORCH_CHECK(static_cast<int64_t>(dilation.size()) == axes, "densecnn::direct_conv: one dilation per axis");
  int64_t size[3] = {1, 1, 1}, kernel[3] = {1, 1, 1}, dil[3] = {1, 1, 1};
  for (int64_t a = 0; a < axes; ++a) {
    size[3 - axes + a] = input.size(2 + a);
    kernel[3 - axes + a] = weight.size(2 + a);
    dil[3 - axes + a] = dilation[a];
  }
  int64_t out[3];
  for (int a = 0; a < 3; ++a) {
    out[a] = size[a] - (kernel[a] - 1) * dil[a];
    TORCH_CHECK(out[a] >= 1 && dil[a] >= 1, "densecnn::direct_conv: input smaller than the dilated kernel");
  }
  return {input.size(0), input.size(1), weight.size(0), size[0], size[1], size[2], out[0], out[1], out[2],
          static_cast<int32_t>(kernel[0]), static_cast<int32_t>(kernel[1]), static_cast<int32_t>(kernel[2]),
          static_cast<int32_t>(dil[0]), static_cast<int32_t>(dil[1]), static_cast<int32_t>(dil[2]),
          is_channels_last(input)};
}

// (N, K, *S') with the input's number of spatial axes.
inline std::vector<int64_t> direct_conv_output_shape(const DirectConvGeometry& g, int64_t axes) {
  std::vector<int64_t> shape = {g.batch, g.out_channels};
  const int64_t out[3] = {g.out_depth, g.out_rows, g.out_cols};
  for (int64_t a = 3 - axes; a < 3; ++a) shape.push_back(out[a]);
  return shape;
}

}  // namespace densecnn
