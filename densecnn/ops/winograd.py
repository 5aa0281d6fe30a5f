"""The ``winograd`` solver: stride-1 dilated 3×3 (images) and 3×3×3 (volumes) convolutions by Winograd's F(m, 3).

Along one axis, m consecutive outputs of a 3-tap correlation are ``Aᵀ[(G g) ⊙ (Bᵀ x)]`` for an input tile x of
α = m + 2 values (Lavin & Gray, "Fast Algorithms for Convolutional Neural Networks"); applied along every axis, an
m×m (m×m×m) output tile costs α² (α³) products per channel pair instead of 9·m² (27·m³): 2.25× fewer for F(2, 3)
in 2-D, 4× for F(4, 3) in 2-D, 3.4× / 8× in 3-D. A d-dilated conv is undilated on each of its d-sub-grids, so a
tile is m outputs of one sub-grid (outputs d apart in the map) and its input is read at stride d, straight from the
map: no space-to-batch copy.

The op ``densecnn::winograd_conv`` (C++, ``cuda_ext/winograd.h``) runs, per chunk of tiles small enough to stay in
cache:

1. the input transform: gathers each tile and applies Bᵀ along every axis, written as V (α^n, tiles, C);
2. one batched GEMM, ``V[ξ] @ U[ξ]`` for the α^n points ξ, against the transformed kernel U = G g Gᵀ (α^n, C, K),
   computed here in float64 once per weight version and cached (inference);
3. the output transform: Aᵀ along every axis, plus the bias, written into the (N, K, ...) output in the input's
   memory format.

The tile size m is chosen per number of axes and channels (:func:`tile_size`) by measured float32 rounding error and
speed. The op's own gradients are those of the direct conv, computed by torch's convolution backward; a training
plan may take the input gradient as the Winograd conv of the output gradient (:func:`input_gradient`: the op reads
its 2·d padding as zeros, no padded copy) instead (the ``winograd`` gradient solver, :mod:`densecnn.ops.gradients`).
bfloat16/float16 inputs are computed in float32 and rounded back.

>>> from densecnn.ops.solvers import ConvOp
>>> op = ConvOp(torch.randn(8, 4, 3, 3), torch.randn(8), (4, 4), 1)
>>> conv(op, torch.randn(1, 4, 40, 40)).shape  # == F.conv2d(x, w, b, dilation=4) to rounding
torch.Size([1, 8, 32, 32])
"""

from __future__ import annotations

import torch

from ..geometry import output_size
from . import weight_cache

COMPUTE_DTYPES = (torch.float32, torch.float64)
# The float32 error of F(m, 3) grows with m, with the channels summed and with the number of axes: measured on one
# layer with all-positive inputs, relative to the layer's largest output (docs/performance.md, "Winograd").
WIDE = 128  # input channels beyond which a smaller tile is used
CACHE_SIZE = 32  # transformed kernels kept (inference), least recently used dropped first

# G of F(m, 3) (α × 3): the kernel transform; rows are the interpolation points 0, ±1, ∞ and, for m = 3, 1/2,
# for m = 4, ±2.
_KERNEL_TRANSFORMS = {
    2: [[1, 0, 0], [1 / 2, 1 / 2, 1 / 2], [1 / 2, -1 / 2, 1 / 2], [0, 0, 1]],
    3: [[2, 0, 0], [1, 1, 1], [-1 / 3, 1 / 3, -1 / 3], [-8 / 3, -4 / 3, -2 / 3], [0, 0, 1]],
    4: [
        [1 / 4, 0, 0],
        [-1 / 6, -1 / 6, -1 / 6],
        [-1 / 6, 1 / 6, -1 / 6],
        [1 / 24, 1 / 12, 1 / 6],
        [1 / 24, -1 / 12, 1 / 6],
        [0, 0, 1],
    ],
}


def applies(op) -> bool:
    """Ungrouped 3×3 and 3×3×3 convs, at any dilation (the solver also needs densecnn's kernels built)."""
    return op.name in ("conv2d", "conv3d") and op.groups == 1 and op.kernel == (3,) * len(op.kernel)


def tile_size(axes: int, channels: int) -> int:
    """m of F(m, 3) for ``axes`` spatial axes and ``channels`` input channels: F(4, 3) for images and F(3, 3) for
    volumes, one smaller beyond :data:`WIDE` channels (F(4, 3) misses the float32 bound in 3-D)."""
    return (4 if axes == 2 else 3) - (channels > WIDE)


def conv(op, x: torch.Tensor, m: int | None = None) -> torch.Tensor:
    """Stride-1 dilated ``op`` (a 3×3 or 3×3×3 :class:`~densecnn.ops.solvers.ConvOp`) on x (N, C, *S) ->
    (N, K, *(S - 2·d)), in x's memory format and dtype; ``m`` overrides the tile size (2, 3 or 4)."""
    return _conv(x, op.weight, op.bias, tuple(op.dilation), m, None, cached=True)


def input_gradient(grad_y: torch.Tensor, weight: torch.Tensor, dilation) -> torch.Tensor:
    """The input gradient (N, C, *S) of a 3×3 (3×3×3) conv from its output gradient (N, K, *(S - 2·d)): the Winograd
    conv of the output gradient zero-padded by 2·d (read as zeros, never materialised) with the flipped, transposed
    kernel (transformed afresh: a flipped copy is a new tensor every call, never a cache key)."""
    flipped = weight.flip(list(range(2, weight.dim()))).transpose(0, 1)  # (C, K, 3, ...)
    return _conv(grad_y, flipped, None, tuple(dilation), None, [2 * d for d in dilation], cached=False)


def weight_gradient(
    grad_y: torch.Tensor, x: torch.Tensor, dilation, m: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The weight gradient (K, C, 3, ...) of a 3×3 (3×3×3) conv from its output gradient (N, K, *(S - 2·d)) and
    input x (N, C, *S), and the bias's (K,). The kernels sum V[ξ]ᵀ z[ξ] over the tiles (V the input's transform,
    z = A·g·Aᵀ the output gradient's): the gradient of the transformed kernel U = G·w·Gᵀ, from which the weight's is
    Gᵀ·(it)·G along every axis, here in float64. The bias's is the output gradient's sum, read off z where A's row
    is all ones: the output gradient is not read again for it. ``m`` of F(m, 3): by default the forward's
    (:func:`tile_size`), whose float32 error the weight gradient's stays within (measured in
    tests/ops/test_winograd.py).

    >>> grad_w, grad_b = weight_gradient(torch.randn(1, 8, 32, 32), torch.randn(1, 4, 40, 40), (4, 4))
    >>> grad_w.shape, grad_b.shape
    (torch.Size([8, 4, 3, 3]), torch.Size([8]))
    """
    if x.dtype not in COMPUTE_DTYPES:
        grad_w, grad_b = weight_gradient(grad_y.float(), x.float(), dilation, m)
        return grad_w.to(x.dtype), grad_b.to(x.dtype)
    axes, c, k = x.dim() - 2, int(x.shape[1]), int(grad_y.shape[1])
    m = m or tile_size(axes, c)
    dilation = [int(d) for d in dilation]
    transformed, grad_b = torch.ops.densecnn.winograd_conv_weight_grad(
        x, grad_y.to(x.dtype), dilation, m
    )  # (α^n, C, K), (K,)
    g = torch.tensor(_KERNEL_TRANSFORMS[m], dtype=torch.float64, device=x.device)  # (α, 3)
    t = transformed.double().view(*(m + 2,) * axes, c, k)
    if axes == 2:
        grad = torch.einsum("ia,jb,ijck->kcab", g, g, t)
    else:
        grad = torch.einsum("ia,jb,lz,ijlck->kcabz", g, g, g, t)
    return grad.to(x.dtype), grad_b


def _conv(
    x, weight, bias, dilation, m: int | None, padding: list[int] | None, *, cached: bool
) -> torch.Tensor:
    """x (N, C, *S) zero-padded by ``padding`` per axis (None: none), convolved with weight (K, C, 3, ...);
    ``cached``: the transformed kernel may come from (and go to) the cache, as a model's weight's may."""
    if x.dtype not in COMPUTE_DTYPES:
        return _conv(x.float(), weight, bias, dilation, m, padding, cached=cached).to(x.dtype)
    weight = weight.to(x.dtype)
    bias = None if bias is None else bias.to(x.dtype)
    axes = x.dim() - 2
    padding = [int(p) for p in padding] if padding else []
    padded = tuple(s + 2 * p for s, p in zip(x.shape[2:], padding or [0] * axes))
    if min(output_size(padded, tuple(weight.shape[2:]), dilation)) < 1:
        raise ValueError(
            f"a {'x'.join(map(str, x.shape[2:]))} input is smaller than the 3-tap kernel at dilation "
            f"{dilation} reaches; pad it (DenseCNN does) or use a smaller dilation"
        )
    m = m or tile_size(axes, x.shape[1])
    # here, where the grad mode is the caller's (the cache depends on it)
    u = transformed_kernel(weight, m) if cached else _transform_kernel(weight, m)
    bias = None if bias is None else bias.contiguous()
    return torch.ops.densecnn.winograd_conv(x, weight, u, bias, list(dilation), m, padding)


def positions(out: int, dilation: int, m: int) -> int:
    """Tile positions along an axis of ``out`` outputs: ``dilation`` sub-grids of ⌈⌈out/d⌉/m⌉ tiles each."""
    per_subgrid = -(-out // dilation)
    return dilation * -(-per_subgrid // m)


# --- the transformed kernel ----------------------------------------------------------------------------------------

_kernels = weight_cache.TransformCache(CACHE_SIZE)


def transformed_kernel(weight: torch.Tensor, m: int) -> torch.Tensor:
    """U = G g Gᵀ along every axis, (α^n, C, K), computed in float64 and cast to the weight's dtype.

    Cached while the weight's values are unchanged when no gradient is wanted
    (:class:`~densecnn.ops.weight_cache.TransformCache`); computed afresh in training, whose weights change every
    step.
    """
    if not weight_cache.cacheable(weight):
        return _transform_kernel(weight, m)
    return _kernels.get(weight, (m,), lambda: _transform_kernel(weight, m))


def _transform_kernel(weight: torch.Tensor, m: int) -> torch.Tensor:
    g = torch.tensor(_KERNEL_TRANSFORMS[m], dtype=torch.float64, device=weight.device)  # (α, 3)
    w = weight.detach().double()  # (K, C, 3, ...)
    if w.dim() == 4:
        u = torch.einsum("ia,jb,kcab->ijck", g, g, w)  # (α, α, C, K)
    else:
        u = torch.einsum("ia,jb,lz,kcabz->ijlck", g, g, g, w)  # (α, α, α, C, K)
    return u.reshape(-1, *u.shape[-2:]).to(weight.dtype).contiguous()
