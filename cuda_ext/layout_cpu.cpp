// CPU conversion of a channels-last tensor to NC* memory (a net's channels-last scores handed back in the layout
// torch's ops and users expect). Channels-last is one (pixels, C) matrix per image in memory; NC* is its transpose.
// Each work item transposes a block of kBlockPixels pixels: its C·kBlockPixels values stay in L1 while each
// channel's run of kBlockPixels is written contiguously, and the output comes from the reused output buffers
// (output_buffers.h), so that a large result costs no fresh pages.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>

#include "cpu_isa.h"
#include "output_buffers.h"
#include "pool_args.h"

namespace densecnn {
namespace {

constexpr int64_t kBlockPixels = 64;
constexpr int64_t kItemValues = 32768;  // values a parallel work item moves at least

// out (C, pixels) from in (pixels, C): pixels [p0, p0 + count) of one image. Bytes of the element size (U).
template <typename U>
DENSECNN_ALWAYS_INLINE void transpose_block_loop(const U* in, U* out, int64_t channels, int64_t pixels, int64_t p0,
                                                 int64_t count) {
  for (int64_t c = 0; c < channels; ++c) {
    const U* src = in + p0 * channels + c;
    U* dst = out + c * pixels + p0;
#pragma GCC ivdep
    for (int64_t p = 0; p < count; ++p) dst[p] = src[p * channels];
  }
}

#define DENSECNN_TRANSPOSE_BLOCK(U)                                                                            \
  DENSECNN_MULTIVERSION void transpose_block(const U* in, U* out, int64_t channels, int64_t pixels, int64_t p0, \
                                             int64_t count) {                                                  \
    transpose_block_loop(in, out, channels, pixels, p0, count);                                               \
  }
DENSECNN_TRANSPOSE_BLOCK(uint8_t)
DENSECNN_TRANSPOSE_BLOCK(uint16_t)
DENSECNN_TRANSPOSE_BLOCK(uint32_t)
DENSECNN_TRANSPOSE_BLOCK(uint64_t)

template <typename U>
void transpose_images(const U* in, U* out, int64_t images, int64_t channels, int64_t pixels) {
  const int64_t blocks = (pixels + kBlockPixels - 1) / kBlockPixels;
  const int64_t grain = std::max<int64_t>(1, kItemValues / (kBlockPixels * channels));
  at::parallel_for(0, images * blocks, grain, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t image = item / blocks, p0 = item % blocks * kBlockPixels;
      const int64_t offset = image * pixels * channels;
      transpose_block(in + offset, out + offset, channels, pixels, p0, std::min(kBlockPixels, pixels - p0));
    }
  });
}

at::Tensor channels_first_cpu(const at::Tensor& x) {
  TORCH_CHECK(x.dim() >= 3, "densecnn.channels_first: expected an (N, C, ...) tensor, got shape ", x.sizes());
  const at::Tensor matrix = in_layout(x, true);  // (N, ..., C) compact in memory: no copy when x already is
  at::Tensor out = empty_output(x.sizes(), x.options());
  if (x.numel() == 0) return out;
  const int64_t images = x.size(0), channels = x.size(1), pixels = x.numel() / (images * channels);
  // the elements moved as unsigned integers of their size: any dtype's bits
  const auto transpose = [&](auto element) {
    using U = decltype(element);
    transpose_images(static_cast<const U*>(matrix.const_data_ptr()), static_cast<U*>(out.mutable_data_ptr()), images,
                     channels, pixels);
  };
  switch (x.element_size()) {
    case 1:
      transpose(uint8_t{});
      break;
    case 2:
      transpose(uint16_t{});
      break;
    case 4:
      transpose(uint32_t{});
      break;
    case 8:
      transpose(uint64_t{});
      break;
    default:
      TORCH_CHECK(false, "densecnn.channels_first: elements of ", x.element_size(),
                  " bytes are not supported; use x.contiguous()");
  }
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(densecnn, CPU, m) { m.impl("channels_first", &channels_first_cpu); }

}  // namespace densecnn
