// CPU conversions between channels-last and NC* memory: a net's channels-last scores handed back in the layout
// torch's ops and users expect (channels_first), and their NC* gradient handed back to the channels-last layers
// (channels_last). Channels-last is one (pixels, C) matrix per image in memory; NC* is its transpose. Each work item
// transposes a block of kBlockPixels pixels: its C·kBlockPixels values stay in L1 while each channel's run of
// kBlockPixels is read or written contiguously, and the output comes from the reused output buffers
// (output_buffers.h), so that a large result costs no fresh pages.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "cpu_isa.h"
#include "output_buffers.h"
#include "pool_args.h"

namespace densecnn {
namespace {

constexpr int64_t kBlockPixels = 64;
constexpr int64_t kItemValues = 32768;  // values a parallel work item moves at least

// Pixels [p0, p0 + count) of one image, bytes of the element size (U): out (C, pixels) from in (pixels, C)
// (kToChannelsLast false), or out (pixels, C) from in (C, pixels).
template <bool kToChannelsLast, typename U>
DENSECNN_ALWAYS_INLINE void transpose_block_loop(const U* in, U* out, int64_t channels, int64_t pixels, int64_t p0,
                                                 int64_t count) {
  for (int64_t c = 0; c < channels; ++c) {
    const U* src = kToChannelsLast ? in + c * pixels + p0 : in + p0 * channels + c;
    U* dst = kToChannelsLast ? out + p0 * channels + c : out + c * pixels + p0;
    if constexpr (kToChannelsLast) {
#pragma GCC ivdep
      for (int64_t p = 0; p < count; ++p) dst[p * channels] = src[p];
    } else {
#pragma GCC ivdep
      for (int64_t p = 0; p < count; ++p) dst[p] = src[p * channels];
    }
  }
}

#define DENSECNN_TRANSPOSE_BLOCK(U)                                                                                 \
  DENSECNN_MULTIVERSION void transpose_block(std::false_type, const U* in, U* out, int64_t channels, int64_t pixels, \
                                             int64_t p0, int64_t count) {                                           \
    transpose_block_loop<false>(in, out, channels, pixels, p0, count);                                             \
  }                                                                                                                 \
  DENSECNN_MULTIVERSION void transpose_block(std::true_type, const U* in, U* out, int64_t channels, int64_t pixels,  \
                                             int64_t p0, int64_t count) {                                           \
    transpose_block_loop<true>(in, out, channels, pixels, p0, count);                                              \
  }
DENSECNN_TRANSPOSE_BLOCK(uint8_t)
DENSECNN_TRANSPOSE_BLOCK(uint16_t)
DENSECNN_TRANSPOSE_BLOCK(uint32_t)
DENSECNN_TRANSPOSE_BLOCK(uint64_t)

template <bool kToChannelsLast, typename U>
void transpose_images(const U* in, U* out, int64_t images, int64_t channels, int64_t pixels) {
  const int64_t blocks = (pixels + kBlockPixels - 1) / kBlockPixels;
  const int64_t grain = std::max<int64_t>(1, kItemValues / (kBlockPixels * channels));
  at::parallel_for(0, images * blocks, grain, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t image = item / blocks, p0 = item % blocks * kBlockPixels;
      const int64_t offset = image * pixels * channels;
      transpose_block(std::integral_constant<bool, kToChannelsLast>{}, in + offset, out + offset, channels, pixels, p0,
                      std::min(kBlockPixels, pixels - p0));
    }
  });
}

// x (N, C, ...) in the other layout's memory -> the same values channels-last (kToChannelsLast) or in NC*.
template <bool kToChannelsLast>
at::Tensor transposed(const char* op, const at::Tensor& x) {
  TORCH_CHECK(x.dim() >= 3, "densecnn.", op, ": expected an (N, C, ...) tensor, got shape ", x.sizes());
  const at::Tensor source = in_layout(x, !kToChannelsLast);  // compact in memory: no copy when x already is
  at::Tensor out = empty_in_layout(x.sizes(), x.options(), kToChannelsLast);
  if (x.numel() == 0) return out;
  const int64_t images = x.size(0), channels = x.size(1), pixels = x.numel() / (images * channels);
  // the elements moved as unsigned integers of their size: any dtype's bits
  const auto transpose = [&](auto element) {
    using U = decltype(element);
    transpose_images<kToChannelsLast>(static_cast<const U*>(source.const_data_ptr()),
                                      static_cast<U*>(out.mutable_data_ptr()), images, channels, pixels);
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
      TORCH_CHECK(false, "densecnn.", op, ": elements of ", x.element_size(),
                  " bytes are not supported; use torch's copy (x.contiguous(memory_format=...))");
  }
  return out;
}

at::Tensor channels_first_cpu(const at::Tensor& x) { return transposed<false>("channels_first", x); }

at::Tensor channels_last_cpu(const at::Tensor& x) { return transposed<true>("channels_last", x); }

}  // namespace

TORCH_LIBRARY_IMPL(densecnn, CPU, m) {
  m.impl("channels_first", &channels_first_cpu);
  m.impl("channels_last", &channels_last_cpu);
}

}  // namespace densecnn
