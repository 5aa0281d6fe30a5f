// CPU loops of the Winograd conv op (winograd.h): parallel over chunks of tiles, each tile's transform run
// on blocks of kLanes channels at once so that every step of the per-tile body is a loop over kLanes contiguous
// values, which the compiler vectorises (AVX-512, AVX2 or baseline, picked at load time).
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <tuple>
#include <vector>

#include "common.h"
#include "cpu_isa.h"
#include "gpu_loops.h"
#include "pool_args.h"
#include "winograd.h"
#include "winograd_args.h"

namespace densecnn {
namespace {

template <int N>
using Int = std::integral_constant<int, N>;

constexpr int kLanes = 16;                // channels per vectorised block at most: one AVX-512 float vector
constexpr int64_t kChunkBytes = 1 << 20;  // one thread's chunk of transformed input + products: within its L2
constexpr int64_t kGradientChunkBytes = 8 << 20;  // the weight gradient's chunk of V and z, for both threads' GEMM
constexpr int64_t kThreadGradientChunkBytes = 512 << 10;  // one thread's chunk of V and z (own products): in its L2
constexpr int64_t kOwnProductsMax = 128 * 128;    // C·K up to which chunk_products beats MKL's batched GEMM

// One tile's transform for channels [c0, c0 + L); channels-last maps (unit channel stride) take the
// contiguous-load path.
template <int M, int AXES, int L, typename T, typename A>
WINOGRAD_INLINE void input_block(const WinogradGeometry& g, const T* x, T* v, int64_t tile, int64_t c0, A* buffer) {
  if (g.stride_c == 1) {
    winograd_input_tile<M, AXES, L, true>(g, x, v, tile, c0, L, buffer);
  } else {
    winograd_input_tile<M, AXES, L, false>(g, x, v, tile, c0, L, buffer);
  }
}

template <int M, int AXES, int L, typename T, typename A>
WINOGRAD_INLINE void output_gradient_block(const WinogradGeometry& g, const T* grad, T* z, int64_t tile, int64_t k0,
                                           A* buffer) {
  if (g.stride_c == 1) {
    winograd_output_gradient_tile<M, AXES, L, true>(g, grad, z, tile, k0, L, buffer);
  } else {
    winograd_output_gradient_tile<M, AXES, L, false>(g, grad, z, tile, k0, L, buffer);
  }
}

template <int M, int AXES, int L, typename T, typename A>
WINOGRAD_INLINE void output_block(const WinogradGeometry& g, const T* m, const T* bias, T* y, int64_t tile,
                                  int64_t k0, A* buffer) {
  if (g.stride_c == 1) {
    winograd_output_tile<M, AXES, L, true>(g, m, bias, y, tile, k0, L, buffer);
  } else {
    winograd_output_tile<M, AXES, L, false>(g, m, bias, y, tile, k0, L, buffer);
  }
}

// Asks for the cache lines of a tile's α^n input pixels (all their channels when channels-last, the first
// channel's line otherwise). A tile's pixels lie d apart along every axis, in α^(n-1) rows: too many streams for the
// hardware prefetcher to follow.
template <typename T>
struct PrefetchInput {
  const T* x;
  int64_t lines;  // cache lines of one pixel's channels (channels-last), else 1
  WINOGRAD_INLINE void operator()(int, int64_t offset, bool inside) {
    if (!inside) return;
    for (int64_t line = 0; line < lines; ++line) __builtin_prefetch(x + offset + line * (64 / sizeof(T)));
  }
};

template <int M, int AXES, typename T>
WINOGRAD_INLINE void prefetch_input_tile(const WinogradGeometry& g, const T* x, int64_t local) {
  int64_t origin[3] = {0, 0, 0};
  const int64_t n = tile_origin<M>(g, g.tile_begin + local, origin);
  const int64_t lines = g.stride_c == 1 ? (g.channels * int64_t(sizeof(T)) + 63) / 64 : 1;
  PrefetchInput<T> prefetch{x, lines};
  for_each_point<WinogradTile<M>::kAlpha, AXES>(g, origin, g.size, g.pad, n * g.stride_n, prefetch);
}

// The tiles [begin, end) of the chunk, the channels in whole blocks of 16, 8, 4 and 1 lanes (no masked tail).
template <int M, int AXES, typename T>
WINOGRAD_INLINE void input_tiles_loop(const WinogradGeometry& g, const T* x, T* v, int64_t begin, int64_t end) {
  alignas(64) Acc<T> buffer[winograd_buffer_size<M, AXES, kLanes>()];
  for (int64_t tile = begin; tile < end; ++tile) {
    if (tile + 1 < end) prefetch_input_tile<M, AXES>(g, x, tile + 1);
    int64_t c = 0;
    for (; c + 16 <= g.channels; c += 16) input_block<M, AXES, 16>(g, x, v, tile, c, buffer);
    for (; c + 8 <= g.channels; c += 8) input_block<M, AXES, 8>(g, x, v, tile, c, buffer);
    for (; c + 4 <= g.channels; c += 4) input_block<M, AXES, 4>(g, x, v, tile, c, buffer);
    for (; c < g.channels; ++c) input_block<M, AXES, 1>(g, x, v, tile, c, buffer);
  }
}

template <int M, int AXES, typename T>
WINOGRAD_INLINE void output_tiles_loop(const WinogradGeometry& g, const T* m, const T* bias, T* y, int64_t begin,
                                       int64_t end) {
  alignas(64) Acc<T> buffer[winograd_buffer_size<M, AXES, kLanes>()];
  for (int64_t tile = begin; tile < end; ++tile) {
    int64_t k = 0;
    for (; k + 16 <= g.channels; k += 16) output_block<M, AXES, 16>(g, m, bias, y, tile, k, buffer);
    for (; k + 8 <= g.channels; k += 8) output_block<M, AXES, 8>(g, m, bias, y, tile, k, buffer);
    for (; k + 4 <= g.channels; k += 4) output_block<M, AXES, 4>(g, m, bias, y, tile, k, buffer);
    for (; k < g.channels; ++k) output_block<M, AXES, 1>(g, m, bias, y, tile, k, buffer);
  }
}

template <int M, int AXES, typename T>
WINOGRAD_INLINE void output_gradient_tiles_loop(const WinogradGeometry& g, const T* grad, T* z, int64_t begin,
                                                int64_t end) {
  alignas(64) Acc<T> buffer[winograd_buffer_size<M, AXES, kLanes>()];
  for (int64_t tile = begin; tile < end; ++tile) {
    int64_t k = 0;
    for (; k + 16 <= g.channels; k += 16) output_gradient_block<M, AXES, 16>(g, grad, z, tile, k, buffer);
    for (; k + 8 <= g.channels; k += 8) output_gradient_block<M, AXES, 8>(g, grad, z, tile, k, buffer);
    for (; k + 4 <= g.channels; k += 4) output_gradient_block<M, AXES, 4>(g, grad, z, tile, k, buffer);
    for (; k < g.channels; ++k) output_gradient_block<M, AXES, 1>(g, grad, z, tile, k, buffer);
  }
}

// The chunk's products P[ξ] = V[ξ] @ U[ξ] for every point ξ: V (points, tiles, C), U (points, C, K) and P
// (points, tiles, K), K a multiple of kPaddedBytes (below). MKL's batched GEMM packs and scales its operands on
// every call, which on the few channels of 3-D nets cost as much as its products (docs/performance.md); here U[ξ]
// (C·K values) stays in L1 across the chunk's tiles, and each block of kTileRows tiles and one vector of output
// channels is kept in registers while the C input channels are summed into it (Vec, kVecBytes: cpu_isa.h). The
// weight gradient's Σ over tiles of V[ξ]ᵀ z[ξ] runs on the same block, its rows input channels and its sum over
// tiles.

// The products' columns (K) are padded with zero channels to whole kPaddedBytes: half an AVX-512 vector, whose
// last columns a half vector sums (K = 50 floats: 56 columns, where whole AVX-512 vectors took 64), and whole AVX2
// and baseline vectors.
constexpr int kPaddedBytes = 32;

// Rows summed at once: each vector of the right operand is read once for 6 rows, and 6 independent sums keep the FMA
// units busy through their latency (7 of the 16 or 32 vector registers).
constexpr int kTileRows = 6;

// Rows [0, R) of a product for the columns [k0, k0 + one vector of B bytes): row r is Σ over s < sums of
// a[r · row_step + s · sum_step] · b[s · k + k0], written to p[r · k + k0] (added to it when kAccumulate).
template <int R, bool kAccumulate, int B, typename T>
DENSECNN_ALWAYS_INLINE void product_rows(const T* a, int64_t row_step, int64_t sum_step, const T* b, int64_t sums,
                                         T* p, int64_t k, int64_t k0) {
  Vec<T, B> acc[R] = {};
  if constexpr (kAccumulate) {
    for (int r = 0; r < R; ++r) memcpy(&acc[r], p + r * k + k0, sizeof(acc[r]));
  }
  for (int64_t s = 0; s < sums; ++s) {
    Vec<T, B> row;
    memcpy(&row, b + s * k + k0, sizeof(row));
    for (int r = 0; r < R; ++r) acc[r] += a[r * row_step + s * sum_step] * row;
  }
  for (int r = 0; r < R; ++r) memcpy(p + r * k + k0, &acc[r], sizeof(acc[r]));
}

// Rows [0, rows) of a product (as product_rows), in blocks of kTileRows and a last block of what is left; the
// columns in whole vectors, and where k leaves half of one (k is padded to whole kPaddedBytes), a half vector.
template <bool kAccumulate, int B, typename T>
DENSECNN_ALWAYS_INLINE void product_blocks(const T* a, int64_t row_step, int64_t sum_step, const T* b, int64_t sums,
                                           T* p, int64_t rows, int64_t k) {
  constexpr int64_t width = lanes<T, B>();  // columns per vector
  for (int64_t r0 = 0; r0 < rows; r0 += kTileRows) {
    const auto block = [&](auto rows_tag) {
      constexpr int R = decltype(rows_tag)::value;
      int64_t k0 = 0;
      for (; k0 + width <= k; k0 += width) {
        product_rows<R, kAccumulate, B>(a + r0 * row_step, row_step, sum_step, b, sums, p + r0 * k, k, k0);
      }
      if constexpr (B > kPaddedBytes) {
        if (k0 < k) product_rows<R, kAccumulate, B / 2>(a + r0 * row_step, row_step, sum_step, b, sums, p + r0 * k, k, k0);
      }
    };
    switch (std::min<int64_t>(kTileRows, rows - r0)) {  // each pass over b sums all of the last block's rows
      case 1: block(Int<1>{}); break;
      case 2: block(Int<2>{}); break;
      case 3: block(Int<3>{}); break;
      case 4: block(Int<4>{}); break;
      case 5: block(Int<5>{}); break;
      default: block(Int<kTileRows>{});
    }
  }
}

// P[ξ] = V[ξ] @ U[ξ] for every point ξ: rows the chunk's tiles, sums over the C input channels.
template <int B, typename T>
DENSECNN_ALWAYS_INLINE void chunk_products_loop(const T* v, const T* u, T* p, int64_t points, int64_t tiles,
                                                int64_t c, int64_t k) {
  for (int64_t xi = 0; xi < points; ++xi) {
    product_blocks<false, B>(v + xi * tiles * c, c, 1, u + xi * c * k, c, p + xi * tiles * k, tiles, k);
  }
}

// Tiles summed per pass of the weight gradient's products: their rows of V[ξ] and z[ξ] (a few KB) stay in L1 while
// every block of R[ξ]'s rows and columns is summed over them; summed over a whole chunk of hundreds of tiles at once,
// each of those passes read them from L2 again, and the step's time varied by half with where the chunk's buffers
// lay in memory (docs/performance.md). The sums' order is the same either way: each block of R picks up from the
// last.
constexpr int64_t kGradientTileBlock = 32;

// R[ξ] += V[ξ]ᵀ z[ξ] for the points [first, last): V (points, tiles, C), z (points, tiles, K) and R (points, C, K),
// K a multiple of kPaddedBytes: rows the C input channels, sums over the chunk's tiles, kGradientTileBlock at a time.
template <int B, typename T>
DENSECNN_ALWAYS_INLINE void chunk_gradient_products_loop(const T* v, const T* z, T* r, int64_t first, int64_t last,
                                                         int64_t tiles, int64_t c, int64_t k) {
  for (int64_t xi = first; xi < last; ++xi) {
    for (int64_t t0 = 0; t0 < tiles; t0 += kGradientTileBlock) {
      const int64_t block = std::min(kGradientTileBlock, tiles - t0);
      product_blocks<true, B>(v + (xi * tiles + t0) * c, 1, c, z + (xi * tiles + t0) * k, block, r + xi * c * k,
                              c, k);
    }
  }
}

#define DENSECNN_WINOGRAD_PRODUCTS(T)                                                                          \
  DENSECNN_PER_LEVEL((void chunk_products(const T* v, const T* u, T* p, int64_t points, int64_t tiles, int64_t c, \
                                          int64_t k)),                                                           \
                     chunk_products_loop<kVecBytes>(v, u, p, points, tiles, c, k);)                              \
  DENSECNN_PER_LEVEL((void chunk_gradient_products(const T* v, const T* z, T* r, int64_t first, int64_t last,     \
                                                   int64_t tiles, int64_t c, int64_t k)),                        \
                     chunk_gradient_products_loop<kVecBytes>(v, z, r, first, last, tiles, c, k);)
DENSECNN_WINOGRAD_PRODUCTS(float)
DENSECNN_WINOGRAD_PRODUCTS(double)

#define DENSECNN_WINOGRAD_LOOPS(M, AXES, T)                                                                    \
  DENSECNN_MULTIVERSION void input_tiles(Int<M>, Int<AXES>, const WinogradGeometry& g, const T* x,             \
                                         T* v, int64_t begin, int64_t end) {                                   \
    input_tiles_loop<M, AXES>(g, x, v, begin, end);                                                            \
  }                                                                                                            \
  DENSECNN_MULTIVERSION void output_tiles(Int<M>, Int<AXES>, const WinogradGeometry& g, const T* m,            \
                                          const T* bias, T* y, int64_t begin, int64_t end) {                   \
    output_tiles_loop<M, AXES>(g, m, bias, y, begin, end);                                                     \
  }                                                                                                            \
  DENSECNN_MULTIVERSION void output_gradient_tiles(Int<M>, Int<AXES>, const WinogradGeometry& g,               \
                                                   const T* grad, T* z, int64_t begin, int64_t end) {          \
    output_gradient_tiles_loop<M, AXES>(g, grad, z, begin, end);                                               \
  }
DENSECNN_WINOGRAD_LOOPS(2, 2, float)
DENSECNN_WINOGRAD_LOOPS(2, 3, float)
DENSECNN_WINOGRAD_LOOPS(3, 2, float)
DENSECNN_WINOGRAD_LOOPS(3, 3, float)
DENSECNN_WINOGRAD_LOOPS(4, 2, float)
DENSECNN_WINOGRAD_LOOPS(4, 3, float)
DENSECNN_WINOGRAD_LOOPS(2, 2, double)
DENSECNN_WINOGRAD_LOOPS(2, 3, double)
DENSECNN_WINOGRAD_LOOPS(3, 2, double)
DENSECNN_WINOGRAD_LOOPS(3, 3, double)
DENSECNN_WINOGRAD_LOOPS(4, 2, double)
DENSECNN_WINOGRAD_LOOPS(4, 3, double)

// The whole convolution, each thread running the pipeline on its own chunks of tiles: input transform into V,
// V[ξ] @ U[ξ] (single-threaded inside the parallel region), output transform. The chunk's V and products live in
// buffers of the thread that stay in its L2, and the threads meet at one barrier per conv instead of three per chunk.
//
// With the CUDA kernels' per-element bodies on (tests), the two transforms run those bodies, one (tile, channel)
// pair per element, as the GPU does.
at::Tensor winograd_conv_cpu(const at::Tensor& input, const at::Tensor& weight, const at::Tensor& kernel,
                             const c10::optional<at::Tensor>& bias, at::IntArrayRef dilation, int64_t m,
                             at::IntArrayRef padding) {
  WinogradGeometry in = winograd_input_geometry(input, dilation, m, 0, 0, padding);
  const int64_t k = kernel.size(-1);
  const int64_t points = in.axes == 2 ? (m + 2) * (m + 2) : (m + 2) * (m + 2) * (m + 2);
  TORCH_CHECK(kernel.dim() == 3 && kernel.size(0) == points && kernel.size(1) == in.channels &&
                  kernel.is_contiguous() && kernel.scalar_type() == input.scalar_type(),
              "densecnn.winograd_conv: kernel must be the contiguous transformed kernel (", points, ", ", in.channels,
              ", K) of the input's dtype, got ", kernel.sizes());
  check_conv_weight("winograd_conv", weight, input, k, std::vector<int64_t>(in.axes, 3));
  std::vector<int64_t> out_sizes{input.size(0), k};
  for (int a = 0; a < in.axes; ++a) out_sizes.push_back(in.out[a]);
  at::Tensor y = empty_in_layout(out_sizes, input.options(), is_channels_last(input));
  const at::Tensor transformed = at::empty({points, 0, k}, input.options());
  WinogradGeometry out = winograd_output_geometry(y, transformed, bias, dilation, m, 0);
  const int64_t tiles = winograd_tiles(in, input.size(0));
  if (y.numel() == 0 || tiles == 0) return y;
  const bool gpu_loops = gpu_loops_on_cpu();
  // The own products take K in whole kPaddedBytes: U and the products are padded with zero channels up to them (the
  // output transform reads the first K). Even 2 channels padded to 16 took 0.6× MKL's time (docs/performance.md).
  const int64_t vector = kPaddedBytes / input.element_size();
  const int64_t k_padded = (k + vector - 1) / vector * vector;
  const bool own_products = in.channels * k_padded <= kOwnProductsMax;
  const int64_t k_products = own_products ? k_padded : k;
  out.transformed_channels = k_products;
  const at::Tensor u = k_products == k ? kernel : at::constant_pad_nd(kernel, {0, k_products - k});
  const int64_t chunk =
      std::max<int64_t>(1, kChunkBytes / (points * (in.channels + k_products) * input.element_size()));
  const int64_t chunks = (tiles + chunk - 1) / chunk;
  AT_DISPATCH_FLOATING_TYPES(input.scalar_type(), "densecnn_winograd_conv", [&] {
    const scalar_t* x = input.const_data_ptr<scalar_t>();
    const scalar_t* b = bias.has_value() ? bias->const_data_ptr<scalar_t>() : nullptr;
    scalar_t* y_data = y.mutable_data_ptr<scalar_t>();
    dispatch_winograd(m, in.axes, [&](auto m_tag, auto axes_tag) {
      constexpr int M = decltype(m_tag)::value, AXES = decltype(axes_tag)::value;
      at::parallel_for(0, chunks, 1, [&](int64_t first, int64_t last) {
        // Chunks are sized to stay under 1 MB, so these come from the cache only for layers too wide for that.
        at::Tensor v = empty_output({points * chunk * in.channels}, input.options());
        at::Tensor products = empty_output({points * chunk * k_products}, input.options());
        for (int64_t c = first; c < last; ++c) {
          WinogradGeometry gi = in, go = out;
          gi.tile_begin = go.tile_begin = c * chunk;
          gi.tile_count = go.tile_count = std::min(chunk, tiles - c * chunk);
          // V (α^n, tiles, C) and the products (α^n, tiles, K) at the buffers' starts: no tensor views made per
          // chunk (a forward runs hundreds of chunks, and each view costs microseconds of dispatch)
          scalar_t* v_data = v.mutable_data_ptr<scalar_t>();
          scalar_t* p_data = products.mutable_data_ptr<scalar_t>();
          if (gpu_loops) {
            for_each_element(gi.tile_count * in.channels,
                             [&](int64_t i) { winograd_input_at<M, AXES>(gi, x, v_data, i); });
          } else {
            input_tiles(m_tag, axes_tag, gi, x, v_data, 0, gi.tile_count);
          }
          if (own_products) {
            chunk_products(v_data, u.const_data_ptr<scalar_t>(), p_data, points, gi.tile_count, in.channels,
                           k_products);
          } else {
            at::Tensor p_chunk = products.narrow(0, 0, points * gi.tile_count * k).view({points, gi.tile_count, k});
            at::bmm_out(p_chunk, v.narrow(0, 0, points * gi.tile_count * in.channels)
                                     .view({points, gi.tile_count, in.channels}),
                        kernel);  // (α^n, tiles, K)
          }
          if (gpu_loops) {
            for_each_element(go.tile_count * k,
                             [&](int64_t i) { winograd_output_at<M, AXES>(go, p_data, b, y_data, i); });
          } else {
            output_tiles(m_tag, axes_tag, go, p_data, b, y_data, 0, go.tile_count);
          }
        }
      });
    });
  });
  return y;
}

// The weight gradient's own products on each thread's chunks of tiles, as the forward runs them: a thread
// transforms a chunk small enough for its L2 (V and z of kThreadGradientChunkBytes) and sums V[ξ]ᵀ z[ξ] into its own
// result (α^n, C, K_products), and the bias's gradient into its own sums (z at the sum point, in double); the
// threads' results are added up in thread order at the end. Chunks of megabytes shared by both threads, with the
// transforms, the products and a barrier each in turn, were slowed by half in some processes: their V and z were
// written by 36 streams at once (one per point ξ), however the process's pages lay in L2.
template <int M, int AXES, typename T>
void weight_gradient_by_threads(const WinogradGeometry& in, const WinogradGeometry& out, const T* x, const T* gy,
                                int64_t tiles, int64_t points, int64_t sum_point, T* result, double* bias) {
  const int64_t c = in.channels, k = out.channels, k_products = out.transformed_channels;
  const int64_t chunk = std::max<int64_t>(
      8, kThreadGradientChunkBytes / (points * (c + k_products) * static_cast<int64_t>(sizeof(T))));
  const int64_t chunks = (tiles + chunk - 1) / chunk;
  std::vector<std::vector<T>> results(at::get_num_threads());
  std::vector<std::vector<double>> bias_sums(results.size());
  at::parallel_for(0, chunks, 1, [&](int64_t first, int64_t last) {
    // z's padding channels, which the transform never writes, stay zero: what they add up stays finite
    std::vector<T> v(points * chunk * c), z(points * chunk * k_products, T(0)), r(points * c * k_products, T(0));
    std::vector<double> b(k, 0.0);
    for (int64_t index = first; index < last; ++index) {
      WinogradGeometry gi = in, go = out;
      gi.tile_begin = go.tile_begin = index * chunk;
      gi.tile_count = go.tile_count = std::min(chunk, tiles - index * chunk);
      input_tiles(Int<M>{}, Int<AXES>{}, gi, x, v.data(), 0, gi.tile_count);
      output_gradient_tiles(Int<M>{}, Int<AXES>{}, go, gy, z.data(), 0, go.tile_count);
      const T* sums = z.data() + sum_point * go.tile_count * k_products;  // (tiles, K_products)
      for (int64_t tile = 0; tile < go.tile_count; ++tile) {
        for (int64_t j = 0; j < k; ++j) b[j] += sums[tile * k_products + j];
      }
      chunk_gradient_products(v.data(), z.data(), r.data(), 0, points, gi.tile_count, c, k_products);
    }
    const size_t thread = static_cast<size_t>(at::get_thread_num());
    TORCH_INTERNAL_ASSERT(thread < results.size() && results[thread].empty());
    results[thread] = std::move(r);
    bias_sums[thread] = std::move(b);
  });
  for (size_t thread = 0; thread < results.size(); ++thread) {
    if (results[thread].empty()) continue;
    for (int64_t i = 0; i < points * c * k_products; ++i) result[i] += results[thread][i];
    for (int64_t j = 0; j < k; ++j) bias[j] += bias_sums[thread][j];
  }
}

// The weight gradient's transformed form, Σ over tiles of V[ξ]ᵀ z[ξ] (α^n, C, K), and the bias's gradient (z at
// the sum point added up, in double: a few thousand tiles' sums): by weight_gradient_by_threads where the own
// products take C·K (z and the result padded with zero channels up to whole kPaddedBytes); else chunk by chunk of
// tiles, the two transforms parallel over the chunk's tiles, then MKL's batched GEMM (C·K too large for the own
// products, kOwnProductsMax) or, with the CUDA kernels' per-element bodies on (tests), the own products parallel
// over the points ξ.
std::tuple<at::Tensor, at::Tensor> winograd_conv_weight_grad_cpu(const at::Tensor& input,
                                                                 const at::Tensor& grad_output,
                                                                 at::IntArrayRef dilation, int64_t m) {
  const WinogradGeometry in = winograd_input_geometry(input, dilation, m, 0, 0);
  WinogradGeometry out = winograd_output_gradient_geometry(grad_output, input, in, dilation, m);
  const int64_t c = in.channels, k = out.channels;
  const int64_t points = in.axes == 2 ? (m + 2) * (m + 2) : (m + 2) * (m + 2) * (m + 2);
  const int64_t tiles = winograd_tiles(in, input.size(0));
  if (tiles == 0) return {at::zeros({points, c, k}, input.options()), at::zeros({k}, input.options())};
  const int64_t vector = kPaddedBytes / input.element_size();
  const int64_t k_padded = (k + vector - 1) / vector * vector;
  const bool own_products = c * k_padded <= kOwnProductsMax;
  const int64_t k_products = own_products ? k_padded : k;
  out.transformed_channels = k_products;
  at::Tensor result = own_products ? at::zeros({points, c, k_products}, input.options())
                                   : at::empty({points, c, k}, input.options());
  const bool gpu_loops = gpu_loops_on_cpu();
  const int64_t sum_point = winograd_sum_point(in.axes, m);
  std::vector<double> bias_sums(k, 0.0);
  if (own_products && !gpu_loops) {
    AT_DISPATCH_FLOATING_TYPES(input.scalar_type(), "densecnn_winograd_conv_weight_grad", [&] {
      dispatch_winograd(m, in.axes, [&](auto m_tag, auto axes_tag) {
        weight_gradient_by_threads<decltype(m_tag)::value, decltype(axes_tag)::value>(
            in, out, input.const_data_ptr<scalar_t>(), grad_output.const_data_ptr<scalar_t>(), tiles, points,
            sum_point, result.mutable_data_ptr<scalar_t>(), bias_sums.data());
      });
    });
    const at::Tensor bias = at::tensor(bias_sums, at::TensorOptions().dtype(at::kDouble)).to(input.scalar_type());
    return {k_products == k ? result : result.narrow(2, 0, k).contiguous(), bias};
  }
  const int64_t chunk = std::min(
      tiles, std::max<int64_t>(64, kGradientChunkBytes / (points * (c + k_products) * input.element_size())));
  at::Tensor v = empty_output({points * chunk * c}, input.options());
  at::Tensor z = empty_output({points * chunk * k_products}, input.options());
  // The padding channels, which the transform never writes: zero, so that what they add up stays finite
  if (k_products > k) z.view({points * chunk, k_products}).narrow(1, k, k_products - k).zero_();
  AT_DISPATCH_FLOATING_TYPES(input.scalar_type(), "densecnn_winograd_conv_weight_grad", [&] {
    const scalar_t* x = input.const_data_ptr<scalar_t>();
    const scalar_t* gy = grad_output.const_data_ptr<scalar_t>();
    scalar_t* v_data = v.mutable_data_ptr<scalar_t>();
    scalar_t* z_data = z.mutable_data_ptr<scalar_t>();
    dispatch_winograd(m, in.axes, [&](auto m_tag, auto axes_tag) {
      constexpr int M = decltype(m_tag)::value, AXES = decltype(axes_tag)::value;
      for (int64_t first = 0; first < tiles; first += chunk) {
        WinogradGeometry gi = in, go = out;
        gi.tile_begin = go.tile_begin = first;
        gi.tile_count = go.tile_count = std::min(chunk, tiles - first);
        if (gpu_loops) {
          for_each_element(gi.tile_count * c, [&](int64_t i) { winograd_input_at<M, AXES>(gi, x, v_data, i); });
          for_each_element(go.tile_count * k,
                           [&](int64_t i) { winograd_output_gradient_at<M, AXES>(go, gy, z_data, i); });
        } else {
          at::parallel_for(0, gi.tile_count, 1, [&](int64_t begin, int64_t end) {
            input_tiles(m_tag, axes_tag, gi, x, v_data, begin, end);
            output_gradient_tiles(m_tag, axes_tag, go, gy, z_data, begin, end);
          });
        }
        const scalar_t* sums = z_data + sum_point * go.tile_count * k_products;  // (tiles, K_products)
        for (int64_t tile = 0; tile < go.tile_count; ++tile) {
          for (int64_t j = 0; j < k; ++j) bias_sums[j] += sums[tile * k_products + j];
        }
        if (own_products) {
          at::parallel_for(0, points, 1, [&](int64_t begin, int64_t end) {
            chunk_gradient_products(v_data, z_data, result.mutable_data_ptr<scalar_t>(), begin, end, gi.tile_count,
                                    c, k_products);
          });
          continue;
        }
        const at::Tensor v_t = v.narrow(0, 0, points * gi.tile_count * c)
                                   .view({points, gi.tile_count, c})
                                   .transpose(1, 2);  // (α^n, C, tiles)
        const at::Tensor z_chunk = z.narrow(0, 0, points * go.tile_count * k).view({points, go.tile_count, k});
        if (first == 0) {
          at::bmm_out(result, v_t, z_chunk);  // (α^n, C, tiles) @ (α^n, tiles, K)
        } else {
          result.baddbmm_(v_t, z_chunk);
        }
      }
    });
  });
  const at::Tensor bias = at::tensor(bias_sums, at::TensorOptions().dtype(at::kDouble)).to(input.scalar_type());
  return {k_products == k ? result : result.narrow(2, 0, k).contiguous(), bias};
}

}  // namespace

TORCH_LIBRARY_IMPL(densecnn, CPU, m) {
  m.impl("winograd_conv", &winograd_conv_cpu);
  m.impl("winograd_conv_weight_grad", &winograd_conv_weight_grad_cpu);
}

}  // namespace densecnn
