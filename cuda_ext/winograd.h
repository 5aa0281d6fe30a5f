// Winograd F(m, 3) transforms of stride-1 dilated 3×3 (images) and 3×3×3 (volumes) convolutions, per tile, shared
// by the CPU loops (winograd_cpu.cpp) and the CUDA kernels (winograd_kernels.cu). No torch includes.
//
// Lavin & Gray, "Fast Algorithms for Convolutional Neural Networks": along one axis, m outputs of a 3-tap
// correlation are Aᵀ[(G g) ⊙ (Bᵀ x)] for an input tile x of α = m + 2 values; along n axes the transforms are
// applied axis by axis and the α^n products become α^n matrix products over the channels.
//
// A d-dilated conv reads, for outputs q·d + r, only the sub-grid r of its input, where it is undilated. So an output
// tile is m outputs of one sub-grid (map positions (t·m + i)·d + r, i < m) and its input tile the α pixels
// (t·m + e)·d + r, e < α, read straight from the map at stride d: no space-to-batch copy. Along an axis with output
// extent O there are T = ⌈⌈O/d⌉/m⌉ tiles per sub-grid, d·T tile positions j = t·d + r (neighbouring positions
// read neighbouring pixels). Tile p of the whole problem is (n, j_0, ..., j_{n-1}) in row-major order; a chunk of
// consecutive tiles [tile_begin, tile_begin + tile_count) is transformed at a time so that its data stays in cache.
//
// Layouts: the transformed input V is (α^n, tiles, C) and the transformed output M (α^n, tiles, K), channels
// innermost, so V[ξ] @ U[ξ] with the transformed kernel U (α^n, C, K) is one batched GEMM. The maps (N, C, ...) are
// addressed through their strides, so NC* and channels-last inputs and outputs need no layout copy.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "common.h"

// The CPU loops are compiled once per ISA (target_clones in winograd_cpu.cpp); everything they call must be
// inlined into each clone to be compiled for its ISA, so on the host these functions are always inlined.
// The lane loops read and write distinct buffers: WINOGRAD_IVDEP tells GCC so, which lets it vectorise them.
#if defined(__CUDACC__)
#define WINOGRAD_INLINE __host__ __device__ __forceinline__
#define WINOGRAD_IVDEP
#else
#define WINOGRAD_INLINE inline __attribute__((always_inline))
#define WINOGRAD_IVDEP _Pragma("GCC ivdep")
#endif

namespace densecnn {

struct WinogradGeometry {
  int32_t axes;                 // spatial axes: 2 or 3
  int64_t channels;             // C (input transform) or K (output transform): the lanes
  // Values per tile in the transformed layouts (α^n, tiles, ·): the channels, or more where the CPU pads the
  // products to whole vectors (winograd_cpu.cpp)
  int64_t transformed_channels;
  int64_t size[kMaxAxes];       // map extent per axis: the input's (input transform) or the output's (output)
  int64_t out[kMaxAxes];        // output extent per axis: input - 2·d
  int64_t dilation[kMaxAxes];
  int64_t positions[kMaxAxes];  // tile positions per axis: d·T
  // Zero pixels before the map's first along each axis (as many after): the input transform reads the map as if
  // padded (an input gradient's zero-padded output gradient, never materialised); 0 for the output transform.
  int64_t pad[kMaxAxes];
  int64_t stride_n, stride_c, stride[kMaxAxes];  // element strides of the (N, C, ...) map
  int64_t tile_begin, tile_count;
};

template <int M>
struct WinogradTile {
  static constexpr int kAlpha = M + 2;
};

// One axis of the input transform, Bᵀ x, on `lanes` values per entry: in[e·step + l] -> out[i·step + l].
// F(2, 3): points 0, ±1, ∞.  F(3, 3): points 0, ±1, 1/2, ∞.  F(4, 3): points 0, ±1, ±2, ∞ (Lavin & Gray's).
template <int M, int L, typename A>
WINOGRAD_INLINE void input_transform_1d(const A* __restrict__ in, A* __restrict__ out, int64_t step) {
  if constexpr (M == 2) {
    WINOGRAD_IVDEP
    for (int l = 0; l < L; ++l) {
      const A d0 = in[l], d1 = in[step + l], d2 = in[2 * step + l], d3 = in[3 * step + l];
      out[l] = d0 - d2;
      out[step + l] = d1 + d2;
      out[2 * step + l] = d2 - d1;
      out[3 * step + l] = d1 - d3;
    }
  } else if constexpr (M == 3) {
    WINOGRAD_IVDEP
    for (int l = 0; l < L; ++l) {
      const A d0 = in[l], d1 = in[step + l], d2 = in[2 * step + l], d3 = in[3 * step + l], d4 = in[4 * step + l];
      const A h1 = A(0.5) * d1, h2 = A(0.5) * d2;
      out[l] = A(0.5) * d0 - d1 - h2 + d3;
      out[step + l] = h2 - h1 + d3;
      out[2 * step + l] = h1 - A(1.5) * d2 + d3;
      out[3 * step + l] = d3 - d1;
      out[4 * step + l] = h1 - d2 - A(0.5) * d3 + d4;
    }
  } else {
    static_assert(M == 4, "F(m, 3) is implemented for m = 2, 3 and 4");
    WINOGRAD_IVDEP
    for (int l = 0; l < L; ++l) {
      const A d0 = in[l], d1 = in[step + l], d2 = in[2 * step + l], d3 = in[3 * step + l];
      const A d4 = in[4 * step + l], d5 = in[5 * step + l];
      const A a = d4 - A(4) * d2, b = d3 - A(4) * d1;  // rows 1, 2: d4 - 4·d2 ± (d3 - 4·d1)
      const A c = d4 - d2, e = A(2) * (d3 - d1);        // rows 3, 4: d4 - d2 ± 2·(d3 - d1)
      out[l] = A(4) * d0 - A(5) * d2 + d4;
      out[step + l] = a + b;
      out[2 * step + l] = a - b;
      out[3 * step + l] = c + e;
      out[4 * step + l] = c - e;
      out[5 * step + l] = A(4) * d1 - A(5) * d3 + d5;
    }
  }
}

// One axis of the output transform, Aᵀ m: in[ξ·step + l] (α entries) -> out[i·step + l] (m entries).
template <int M, int L, typename A>
WINOGRAD_INLINE void output_transform_1d(const A* __restrict__ in, A* __restrict__ out, int64_t step) {
  if constexpr (M == 2) {
    WINOGRAD_IVDEP
    for (int l = 0; l < L; ++l) {
      const A m0 = in[l], m1 = in[step + l], m2 = in[2 * step + l], m3 = in[3 * step + l];
      out[l] = m0 + m1 + m2;
      out[step + l] = m1 - m2 - m3;
    }
  } else if constexpr (M == 3) {
    WINOGRAD_IVDEP
    for (int l = 0; l < L; ++l) {
      const A m0 = in[l], m1 = in[step + l], m2 = in[2 * step + l], m3 = in[3 * step + l], m4 = in[4 * step + l];
      out[l] = m0 + m1 + m2 + m3;
      out[step + l] = m1 - m2 + A(0.5) * m3;
      out[2 * step + l] = m1 + m2 + A(0.25) * m3 + m4;
    }
  } else {
    WINOGRAD_IVDEP
    for (int l = 0; l < L; ++l) {
      const A m0 = in[l], m1 = in[step + l], m2 = in[2 * step + l], m3 = in[3 * step + l];
      const A m4 = in[4 * step + l], m5 = in[5 * step + l];
      const A s1 = m1 + m2, d1 = m1 - m2, s2 = m3 + m4, d2 = m3 - m4;
      out[l] = m0 + s1 + s2;
      out[step + l] = d1 + A(2) * d2;
      out[2 * step + l] = s1 + A(4) * s2;
      out[3 * step + l] = d1 + A(8) * d2 + m5;
    }
  }
}

// One axis of the output-gradient transform (the weight gradient), A g, the adjoint of the output transform:
// in[i·step + l] (m entries) -> out[ξ·step + l] (α entries), out[ξ] = Σ_i Aᵀ[i][ξ] in[i].
template <int M, int L, typename A>
WINOGRAD_INLINE void output_gradient_transform_1d(const A* __restrict__ in, A* __restrict__ out, int64_t step) {
  if constexpr (M == 2) {
    WINOGRAD_IVDEP
    for (int l = 0; l < L; ++l) {
      const A g0 = in[l], g1 = in[step + l];
      out[l] = g0;
      out[step + l] = g0 + g1;
      out[2 * step + l] = g0 - g1;
      out[3 * step + l] = -g1;
    }
  } else if constexpr (M == 3) {
    WINOGRAD_IVDEP
    for (int l = 0; l < L; ++l) {
      const A g0 = in[l], g1 = in[step + l], g2 = in[2 * step + l];
      out[l] = g0;
      out[step + l] = g0 + g1 + g2;
      out[2 * step + l] = g0 - g1 + g2;
      out[3 * step + l] = g0 + A(0.5) * g1 + A(0.25) * g2;
      out[4 * step + l] = g2;
    }
  } else {
    WINOGRAD_IVDEP
    for (int l = 0; l < L; ++l) {
      const A g0 = in[l], g1 = in[step + l], g2 = in[2 * step + l], g3 = in[3 * step + l];
      const A even = g0 + g2, odd = g1 + g3, even2 = g0 + A(4) * g2, odd2 = A(2) * g1 + A(8) * g3;
      out[l] = g0;
      out[step + l] = even + odd;
      out[2 * step + l] = even - odd;
      out[3 * step + l] = even2 + odd2;
      out[4 * step + l] = even2 - odd2;
      out[5 * step + l] = g3;
    }
  }
}

// The point (1, ..., 1) of α^n, row-major: there the output gradient's transform is the tile's sum (row +1 of A, the
// point +1 of every F(m, 3) here, is all ones), so z at it, summed over the tiles, is the bias's gradient.
WINOGRAD_INLINE int64_t winograd_sum_point(int64_t axes, int64_t m) {
  const int64_t alpha = m + 2;
  return axes == 2 ? alpha + 1 : (alpha + 1) * alpha + 1;
}

// The 1-D transforms as function objects, for transform_axes.
template <int M, int L>
struct InputStep {
  template <typename A>
  WINOGRAD_INLINE void operator()(const A* in, A* out, int64_t step) const {
    input_transform_1d<M, L>(in, out, step);
  }
};
template <int M, int L>
struct OutputStep {
  template <typename A>
  WINOGRAD_INLINE void operator()(const A* in, A* out, int64_t step) const {
    output_transform_1d<M, L>(in, out, step);
  }
};
template <int M, int L>
struct OutputGradientStep {
  template <typename A>
  WINOGRAD_INLINE void operator()(const A* in, A* out, int64_t step) const {
    output_gradient_transform_1d<M, L>(in, out, step);
  }
};

// Calls body(std::integral_constant<int, M>, std::integral_constant<int, AXES>) for the runtime m and axes
// (the CPU loops' and the CUDA launchers' one dispatch; host code).
template <typename Body>
void dispatch_winograd(int64_t m, int64_t axes, Body&& body) {
  using I2 = std::integral_constant<int, 2>;
  using I3 = std::integral_constant<int, 3>;
  using I4 = std::integral_constant<int, 4>;
  if (m == 2 && axes == 2) return body(I2{}, I2{});
  if (m == 2 && axes == 3) return body(I2{}, I3{});
  if (m == 3 && axes == 2) return body(I3{}, I2{});
  if (m == 3 && axes == 3) return body(I3{}, I3{});
  if (m == 4 && axes == 2) return body(I4{}, I2{});
  return body(I4{}, I3{});
}

// Tile positions of the whole problem: N · Π d·T.
WINOGRAD_INLINE int64_t winograd_tiles(const WinogradGeometry& g, int64_t batch) {
  int64_t tiles = batch;
  for (int a = 0; a < g.axes; ++a) tiles *= g.positions[a];
  return tiles;
}

// Tile p -> its image n and, per axis, the map coordinate of its first output (t·m·d + r).
template <int M>
WINOGRAD_INLINE int64_t tile_origin(const WinogradGeometry& g, int64_t p, int64_t* origin) {
  for (int a = g.axes - 1; a >= 0; --a) {
    const int64_t j = p % g.positions[a];
    p /= g.positions[a];
    origin[a] = (j / g.dilation[a]) * M * g.dilation[a] + j % g.dilation[a];
  }
  return p;  // n
}

// Applies a 1-D transform along every axis of an n-d block of `lanes` vectors, last axis first, ping-ponging
// between `a` and `b`; `extent_in` entries per axis become `extent_out`. Returns the buffer holding the result.
template <int AXES, int L, typename A, typename Transform>
WINOGRAD_INLINE A* transform_axes(A* a, A* b, int extent_in, int extent_out, Transform transform) {
  int extent[3] = {extent_in, extent_in, extent_in};
  for (int axis = AXES - 1; axis >= 0; --axis) {
    int64_t outer = 1, inner = L;
    for (int q = 0; q < axis; ++q) outer *= extent[q];
    for (int q = axis + 1; q < AXES; ++q) inner *= extent[q];
    for (int64_t o = 0; o < outer; ++o) {
      for (int64_t i = 0; i < inner; i += L) {
        transform(a + o * extent_in * inner + i, b + o * extent_out * inner + i, inner);
      }
    }
    extent[axis] = extent_out;
    A* swap = a;
    a = b;
    b = swap;
  }
  return a;
}

// Per axis, the map offset of each of the tile's `extent` points (first at `origin` - `pad` of the map, then every
// d) and whether it lies inside the map (extent `limit`).
template <int EXTENT>
struct AxisPoints {
  int64_t offset[EXTENT];
  bool inside[EXTENT];
};

template <int EXTENT>
WINOGRAD_INLINE AxisPoints<EXTENT> axis_points(int64_t origin, int64_t dilation, int64_t limit, int64_t stride,
                                               int64_t pad) {
  AxisPoints<EXTENT> points;
  for (int e = 0; e < EXTENT; ++e) {
    const int64_t coordinate = origin + e * dilation - pad;
    points.inside[e] = coordinate >= 0 && coordinate < limit;
    points.offset[e] = points.inside[e] ? coordinate * stride : 0;
  }
  return points;
}

// Calls visit(point, offset, inside) for the EXTENT^AXES points of a tile in row-major order; `pad`: the map's
// padding per axis (see WinogradGeometry::pad).
template <int EXTENT, int AXES, typename Visit>
WINOGRAD_INLINE void for_each_point(const WinogradGeometry& g, const int64_t* origin, const int64_t* limit,
                                       const int64_t* pad, int64_t base, Visit& visit) {
  const AxisPoints<EXTENT> p0 = axis_points<EXTENT>(origin[0], g.dilation[0], limit[0], g.stride[0], pad[0]);
  const AxisPoints<EXTENT> p1 = axis_points<EXTENT>(origin[1], g.dilation[1], limit[1], g.stride[1], pad[1]);
  if constexpr (AXES == 2) {
    for (int e0 = 0; e0 < EXTENT; ++e0) {
      for (int e1 = 0; e1 < EXTENT; ++e1) {
        visit(e0 * EXTENT + e1, base + p0.offset[e0] + p1.offset[e1], p0.inside[e0] && p1.inside[e1]);
      }
    }
  } else {
    const AxisPoints<EXTENT> p2 = axis_points<EXTENT>(origin[2], g.dilation[2], limit[2], g.stride[2], pad[2]);
    for (int e0 = 0; e0 < EXTENT; ++e0) {
      for (int e1 = 0; e1 < EXTENT; ++e1) {
        const int64_t offset = base + p0.offset[e0] + p1.offset[e1];
        const bool inside = p0.inside[e0] && p1.inside[e1];
        for (int e2 = 0; e2 < EXTENT; ++e2) {
          visit((e0 * EXTENT + e1) * EXTENT + e2, offset + p2.offset[e2], inside && p2.inside[e2]);
        }
      }
    }
  }
}

// Gathers the α^n input pixels of a tile, `lanes` channels each (zero beyond the map and for lanes ≥ `lanes`);
// kUnitLanes: the channels are adjacent in memory (channels-last), so each point is one contiguous load.
template <int L, bool kUnitLanes, typename T, typename A>
struct GatherInput {
  const T* x;
  int64_t lane_stride;
  int lanes;
  A* dst;
  WINOGRAD_INLINE void operator()(int point, int64_t offset, bool inside) {
    A* out = dst + point * L;
    if constexpr (kUnitLanes && std::is_same_v<T, A>) {
      if (inside && lanes == L) {  // one vector copy (a per-lane loop compiles to pieces that stall the transform)
        memcpy(out, x + offset, L * sizeof(A));
        return;
      }
    }
    if (inside && lanes == L) {
      WINOGRAD_IVDEP
      for (int l = 0; l < L; ++l) out[l] = widen<A>(x[offset + (kUnitLanes ? l : l * lane_stride)]);
    } else if (inside) {
      for (int l = 0; l < L; ++l) {
        out[l] = l < lanes ? widen<A>(x[offset + (kUnitLanes ? l : l * lane_stride)]) : A(0);
      }
    } else {
      for (int l = 0; l < L; ++l) out[l] = A(0);
    }
  }
};

// Writes a tile's m^n outputs (+ bias) that fall inside the output map.
template <int L, bool kUnitLanes, typename T, typename A>
struct ScatterOutput {
  T* y;
  int64_t lane_stride;
  int lanes;
  const A* src;
  const A* bias;
  WINOGRAD_INLINE void operator()(int point, int64_t offset, bool inside) {
    if (!inside) return;
    const A* values = src + point * L;
    if (lanes == L) {
      WINOGRAD_IVDEP
      for (int l = 0; l < L; ++l) y[offset + (kUnitLanes ? l : l * lane_stride)] = narrow<T>(values[l] + bias[l]);
    } else {
      for (int l = 0; l < lanes; ++l) y[offset + (kUnitLanes ? l : l * lane_stride)] = narrow<T>(values[l] + bias[l]);
    }
  }
};

// Writes a tile's α^n transformed vectors (`lanes` of the L lanes) to base[point · plane + l]: the (α^n, tiles,
// channels) layout of V and z.
template <int kPoints, int L, typename T, typename A>
WINOGRAD_INLINE void store_transformed(const A* result, T* base, int64_t plane, int lanes) {
  if (lanes == L) {
    for (int point = 0; point < kPoints; ++point) {
      WINOGRAD_IVDEP
      for (int l = 0; l < L; ++l) base[point * plane + l] = narrow<T>(result[point * L + l]);
    }
  } else {
    for (int point = 0; point < kPoints; ++point) {
      for (int l = 0; l < lanes; ++l) base[point * plane + l] = narrow<T>(result[point * L + l]);
    }
  }
}

// The input transform of tile `local` (of the chunk) for channels [c0, c0 + lanes), lanes ≤ L: gathers the α^n
// input pixels (zero beyond the map), applies Bᵀ along every axis, and writes v[(ξ·tile_count + local)·C + c].
// `buffer` holds 2·α^n·L values of A.
template <int M, int AXES, int L, bool kUnitLanes, typename T, typename A>
WINOGRAD_INLINE void winograd_input_tile(const WinogradGeometry& g, const T* x, T* v, int64_t local, int64_t c0,
                                            int lanes, A* buffer) {
  constexpr int kAlpha = WinogradTile<M>::kAlpha;
  constexpr int kPoints = AXES == 2 ? kAlpha * kAlpha : kAlpha * kAlpha * kAlpha;
  int64_t origin[3] = {0, 0, 0};
  const int64_t n = tile_origin<M>(g, g.tile_begin + local, origin);
  GatherInput<L, kUnitLanes, T, A> gather{x, g.stride_c, lanes, buffer};
  for_each_point<kAlpha, AXES>(g, origin, g.size, g.pad, n * g.stride_n + c0 * g.stride_c, gather);
  const A* result = transform_axes<AXES, L>(buffer, buffer + kPoints * L, kAlpha, kAlpha, InputStep<M, L>{});
  store_transformed<kPoints, L>(result, v + local * g.transformed_channels + c0,
                                g.tile_count * g.transformed_channels, lanes);
}

// The output-gradient transform of tile `local` (the weight gradient) for output channels [k0, k0 + lanes): gathers
// the tile's m^n values of the output gradient, the map of g (zero beyond it and for lanes ≥ `lanes`), applies A
// along every axis and writes z[(ξ·tile_count + local)·K + k]. Σ over tiles of V[ξ]ᵀ z[ξ] is then the gradient of
// the transformed kernel U, from which the weight's follows by Gᵀ · G (densecnn/ops/winograd.py).
template <int M, int AXES, int L, bool kUnitLanes, typename T, typename A>
WINOGRAD_INLINE void winograd_output_gradient_tile(const WinogradGeometry& g, const T* grad, T* z, int64_t local,
                                                   int64_t k0, int lanes, A* buffer) {
  constexpr int kAlpha = WinogradTile<M>::kAlpha;
  constexpr int kPoints = AXES == 2 ? kAlpha * kAlpha : kAlpha * kAlpha * kAlpha;
  int64_t origin[3] = {0, 0, 0};
  const int64_t n = tile_origin<M>(g, g.tile_begin + local, origin);
  GatherInput<L, kUnitLanes, T, A> gather{grad, g.stride_c, lanes, buffer};
  const int64_t unpadded[3] = {0, 0, 0};
  for_each_point<M, AXES>(g, origin, g.out, unpadded, n * g.stride_n + k0 * g.stride_c, gather);
  const A* result = transform_axes<AXES, L>(buffer, buffer + kPoints * L, M, kAlpha, OutputGradientStep<M, L>{});
  store_transformed<kPoints, L>(result, z + local * g.transformed_channels + k0,
                                g.tile_count * g.transformed_channels, lanes);
}

// The output transform of tile `local` for output channels [k0, k0 + lanes): reads m[(ξ·tile_count + local)·K + k],
// applies Aᵀ along every axis, adds the bias and writes the m^n outputs that fall inside the output map y.
template <int M, int AXES, int L, bool kUnitLanes, typename T, typename A>
WINOGRAD_INLINE void winograd_output_tile(const WinogradGeometry& g, const T* m, const T* bias, T* y,
                                             int64_t local, int64_t k0, int lanes, A* buffer) {
  constexpr int kAlpha = WinogradTile<M>::kAlpha;
  constexpr int kPoints = AXES == 2 ? kAlpha * kAlpha : kAlpha * kAlpha * kAlpha;
  const int64_t plane = g.tile_count * g.transformed_channels;
  const T* base = m + local * g.transformed_channels + k0;
  if (lanes == L) {
    for (int point = 0; point < kPoints; ++point) {
      WINOGRAD_IVDEP
      for (int l = 0; l < L; ++l) buffer[point * L + l] = widen<A>(base[point * plane + l]);
    }
  } else {
    for (int point = 0; point < kPoints; ++point) {
      for (int l = 0; l < L; ++l) buffer[point * L + l] = l < lanes ? widen<A>(base[point * plane + l]) : A(0);
    }
  }
  const A* result = transform_axes<AXES, L>(buffer, buffer + kPoints * L, kAlpha, M, OutputStep<M, L>{});
  A lane_bias[L];
  for (int l = 0; l < L; ++l) lane_bias[l] = bias != nullptr && l < lanes ? widen<A>(bias[k0 + l]) : A(0);
  int64_t origin[3] = {0, 0, 0};
  const int64_t n = tile_origin<M>(g, g.tile_begin + local, origin);
  ScatterOutput<L, kUnitLanes, T, A> scatter{y, g.stride_c, lanes, result, lane_bias};
  const int64_t unpadded[3] = {0, 0, 0};
  for_each_point<M, AXES>(g, origin, g.out, unpadded, n * g.stride_n + k0 * g.stride_c, scatter);
}

// Scratch values of A one tile's transform needs: two n-d blocks of α^n lane vectors.
template <int M, int AXES, int L>
WINOGRAD_INLINE constexpr int winograd_buffer_size() {
  return 2 * L * (AXES == 2 ? (M + 2) * (M + 2) : (M + 2) * (M + 2) * (M + 2));
}

// The per-element bodies of the CUDA kernels (one (tile, channel) pair per thread, L = 1), also run by the CPU
// when the tests switch it to the GPU's loops.
template <int M, int AXES, typename T>
WINOGRAD_INLINE void winograd_input_at(const WinogradGeometry& g, const T* x, T* v, int64_t index) {
  Acc<T> buffer[winograd_buffer_size<M, AXES, 1>()];
  winograd_input_tile<M, AXES, 1, false>(g, x, v, index / g.channels, index % g.channels, 1, buffer);
}

template <int M, int AXES, typename T>
WINOGRAD_INLINE void winograd_output_at(const WinogradGeometry& g, const T* m, const T* bias, T* y,
                                           int64_t index) {
  Acc<T> buffer[winograd_buffer_size<M, AXES, 1>()];
  winograd_output_tile<M, AXES, 1, false>(g, m, bias, y, index / g.channels, index % g.channels, 1, buffer);
}

template <int M, int AXES, typename T>
WINOGRAD_INLINE void winograd_output_gradient_at(const WinogradGeometry& g, const T* grad, T* z, int64_t index) {
  Acc<T> buffer[winograd_buffer_size<M, AXES, 1>()];
  winograd_output_gradient_tile<M, AXES, 1, false>(g, grad, z, index / g.channels, index % g.channels, 1, buffer);
}

}  // namespace densecnn
