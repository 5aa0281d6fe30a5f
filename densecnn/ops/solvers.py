"""Candidate solvers for each dense op: different exact ways to compute the same stride-1 dilated conv or pool.

A solver is a function ``(op, x) -> y`` registered under a name for the ops it implements; ``applies(name, op)``
says whether it can run a given layer. Tuning (:mod:`densecnn.ops.tune`) times the applicable ones and keeps
the fastest. Every solver is exact (equal to the native dilated op up to float summation order) and differentiable.

Solvers:
- ``native``: torch's dilated op (``F.conv2d(dilation=d)``, ``F.max_pool2d(dilation=d, stride=1)``, average pooling as a
  depthwise conv; ``conv1d``/``conv3d`` and so on for signals and volumes), in whatever memory format ``x`` has.
- ``s2b`` (space-to-batch): pixel (q·d + r) of the input belongs to sub-grid r; a d-dilated window only ever reads one
  sub-grid, so the d×d sub-grids (d×d×d for volumes) are moved into the batch, the *undilated* op runs on them, and
  the results are moved back. Exact, and often much faster where torch's dilated kernels are slow (large dilations,
  pooling).
- ``ext``: densecnn's own kernels (``cuda_ext``, see :mod:`densecnn.ops.ext`), when built; 2-D ops only.
- ``ext_fused``: the ext pooling kernel fused with the following tanh/ReLU, for a pool step that has one (2-D).
- ``fft``: 2-D convs in the frequency domain on overlap-save tiles of the sub-grids, transforms in densecnn's
  kernels and the channel mixing as batched complex GEMMs (:mod:`densecnn.ops.fft_conv`); its cost does not grow
  with the kernel size. Needs the kernels, like ``ext``.
- ``direct``: direct convolution in densecnn's kernels, register-blocked over output channels, for convs with few
  input channels (first layers) or a 1×1 kernel (heads), in 1-D, 2-D and 3-D; a grouped 1×1 conv of one input
  channel per group as a broadcast product.
- ``winograd``: 3×3 and 3×3×3 convs by Winograd's F(m, 3) on tiles of the sub-grids, read at stride d from the map
  (:mod:`densecnn.ops.winograd`, C++ transforms + one batched GEMM); 2.25–8× fewer multiplications.

Which solver runs each layer is the plan's choice (:mod:`densecnn.ops.plan`): from the shipped cost model at once
(:mod:`densecnn.ops.costmodel`), or from timings when asked to tune (:mod:`densecnn.ops.tune`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..geometry import Size, output_size
from . import ext, fft_conv, native, weight_cache, winograd
from .layout import is_channels_last, layout_of


@dataclass(frozen=True)
class ConvOp:
    """A stride-1 dilated conv: weight (K, C/groups, *k) with one kernel entry per spatial axis, optional bias (K,)."""

    weight: torch.Tensor
    bias: torch.Tensor | None
    dilation: Size
    groups: int

    activation = None  # convs absorb no activation (a class attribute, not a field)

    @property
    def kernel(self) -> Size:
        return tuple(self.weight.shape[2:])

    @property
    def name(self) -> str:
        """torch's name of the op: "conv1d", "conv2d" or "conv3d"."""
        return f"conv{len(self.kernel)}d"


@dataclass(frozen=True)
class PoolOp:
    """A stride-1 dilated max or average pool, optionally followed by a pointwise ``activation`` ("tanh", "relu")."""

    name: str  # torch's name of the op: "max_pool2d" or "avg_pool2d" ("max_pool3d", "avg_pool1d", ...)
    kernel: Size
    dilation: Size
    divisor: int | None = None
    activation: str | None = None

    @property
    def mode(self) -> str:
        """ "max" or "avg"."""
        return self.name[:3]


DenseOp = ConvOp | PoolOp


def _activate(y: torch.Tensor, activation: str | None) -> torch.Tensor:
    """``activation`` of a pool's fresh output; in place where autograd does not need it (one memory pass and no
    new buffer)."""
    if activation is None:
        return y
    if torch.is_grad_enabled() and y.requires_grad:
        return {"tanh": torch.tanh, "relu": torch.relu}[activation](y)
    return activate_(y, activation)


def activate_(y: torch.Tensor, activation: str) -> torch.Tensor:
    """``y`` overwritten by ``activation(y)`` ("tanh" or "relu")."""
    return {"tanh": torch.tanh_, "relu": torch.relu_}[activation](y)


# --- native --------------------------------------------------------------------------------------------------------


def _native(op: DenseOp, x: torch.Tensor) -> torch.Tensor:
    if isinstance(op, ConvOp):
        return native.conv(x, op.weight, op.bias, op.dilation, op.groups)
    if op.mode == "max":
        return _activate(native.max_pool(x, op.kernel, op.dilation), op.activation)
    return _activate(native.avg_pool(x, op.kernel, op.dilation, op.divisor), op.activation)


# --- space-to-batch ------------------------------------------------------------------------------------------------


def to_subgrids(x: torch.Tensor, dilation: Size) -> torch.Tensor:
    """(N, C, *S) -> (N·prod(d), C, *⌈S/d⌉): along each axis, pixel q·d + r goes to q of sub-grid r.

    For images, pixel (q·dh + r, p·dw + s) goes to (q, p) of sub-grid (r, s). The input is zero-padded to a multiple of
    the dilation; the padded pixels only feed outputs that are cropped. The result keeps ``x``'s memory format (NC*
    or channels-last).
    """
    n, c, *size = x.shape
    dims = len(size)
    sub = [-(-s // d) for s, d in zip(size, dilation, strict=True)]
    widths = [w for s, g, d in zip(reversed(size), reversed(sub), reversed(dilation)) for w in (0, g * d - s)]
    if any(widths):
        x = F.pad(x, widths)
    split = [v for g, d in zip(sub, dilation) for v in (g, d)]  # (S0, d0, S1, d1, ...)
    grid_axes = [1 + 2 * a for a in range(dims)]  # the S_a axes after the batch axis
    phase_axes = [2 + 2 * a for a in range(dims)]  # the d_a axes
    if is_channels_last(x):
        last = x.movedim(1, -1).reshape(n, *split, c)  # (N, S0, d0, ..., C)
        moved = last.permute(0, *phase_axes, *grid_axes, 1 + 2 * dims)
        return moved.reshape(n * math.prod(dilation), *sub, c).movedim(-1, 1)
    grids = x.reshape(n, c, *split)  # (N, C, S0, d0, S1, d1, ...)
    moved = grids.permute(0, *(a + 1 for a in phase_axes), 1, *(a + 1 for a in grid_axes))
    return moved.reshape(n * math.prod(dilation), c, *sub)


def from_subgrids(y: torch.Tensor, n: int, dilation: Size, size: Size) -> torch.Tensor:
    """Inverse of :func:`to_subgrids` for the op's output: (N·prod(d), K, *o) -> (N, K, *(o·d)) cropped to ``size``."""
    _, k, *out = y.shape
    dims = len(out)
    interleaved = [v for o, d in zip(out, dilation) for v in (o, d)]  # (o0, d0, o1, d1, ...)
    if is_channels_last(y):
        last = y.movedim(1, -1).reshape(n, *dilation, *out, k)  # (N, d0, d1, ..., o0, o1, ..., K)
        order = [i for a in range(dims) for i in (1 + dims + a, 1 + a)]
        full = last.permute(0, *order, 1 + 2 * dims).reshape(n, *interleaved, k)
        full = full.reshape(n, *(o * d for o, d in zip(out, dilation)), k).movedim(-1, 1)
    else:
        grids = y.reshape(n, *dilation, k, *out)  # (N, d0, d1, ..., K, o0, o1, ...)
        order = [i for a in range(dims) for i in (2 + dims + a, 1 + a)]
        full = grids.permute(0, 1 + dims, *order).reshape(n, k, *(o * d for o, d in zip(out, dilation)))
    return full[(slice(None), slice(None), *(slice(0, s) for s in size))]


def _space_to_batch(op: DenseOp, x: torch.Tensor) -> torch.Tensor:
    size = output_size(tuple(x.shape[2:]), op.kernel, op.dilation)
    dilated = any(d != 1 for d in op.dilation)
    subgrids = to_subgrids(x, op.dilation) if dilated else x
    ones = (1,) * len(op.kernel)
    if isinstance(op, ConvOp):
        y = native.conv(subgrids, op.weight, op.bias, ones, op.groups)
    elif op.mode == "max":
        y = native.max_pool(subgrids, op.kernel, ones)
    elif len(op.kernel) == 1:  # F.avg_pool1d has no divisor_override
        y = native.avg_pool(subgrids, op.kernel, ones, op.divisor)
    else:
        pool = getattr(F, op.name)
        y = pool(subgrids, op.kernel, 1, divisor_override=op.divisor)
    if dilated:
        y = from_subgrids(y, x.shape[0], op.dilation, size)
    return _activate(y, op.activation)


# --- densecnn's kernels --------------------------------------------------------------------------------------------


def _ext_op(op: DenseOp, x: torch.Tensor) -> torch.Tensor:
    if isinstance(op, ConvOp):
        return ext.conv2d(x, op.weight, op.bias, op.dilation, op.groups)
    if op.mode == "max":
        return _activate(ext.max_pool(x, op.kernel, op.dilation), op.activation)
    return _activate(ext.avg_pool(x, op.kernel, op.dilation, op.divisor), op.activation)


def _direct(op: ConvOp, x: torch.Tensor) -> torch.Tensor:
    if op.groups > 1:
        return _channel_multiples(op, x)
    return ext.direct_conv(x, op.weight, op.bias, op.dilation)


def _channel_multiples(op: ConvOp, x: torch.Tensor) -> torch.Tensor:
    """A 1×1 conv of one input channel per group: output channel g·m + j is channel g times weight g·m + j (plus
    its bias), a broadcast product in x's memory format, where torch's grouped conv runs in channels-last at 3–9×
    its NCHW time."""
    n, c, *size = x.shape
    per_channel = op.weight.reshape(c, -1)  # (C, m)
    if is_channels_last(x):
        y = x.movedim(1, -1).unsqueeze(-1) * per_channel  # (N, *S, C, m), contiguous
        if op.bias is not None:
            y = y + op.bias.view(c, -1)
        return y.reshape(n, *size, -1).movedim(-1, 1)  # (N, K, *S), channels-last
    spread = per_channel.view(c, -1, *(1,) * len(size))  # (C, m, 1, ...)
    y = x.unsqueeze(2) * spread  # (N, C, m, *S)
    if op.bias is not None:
        y = y + op.bias.view(c, -1, *(1,) * len(size))
    return y.reshape(n, -1, *size)  # (N, K, *S)


DIRECT_MAX_CHANNELS = 4  # the direct kernel's register blocking pays off only for a few input channels


def _direct_runs(op: DenseOp) -> bool:
    """Ungrouped convs with few input channels, or pointwise (1×1) ones: few multiply-adds per output either way;
    grouped 1×1 convs of one input channel per group (:func:`_channel_multiples`)."""
    if not isinstance(op, ConvOp):
        return False
    pointwise = math.prod(op.kernel) == 1
    if op.groups > 1:
        return pointwise and op.weight.shape[1] == 1
    return op.weight.shape[1] <= DIRECT_MAX_CHANNELS or pointwise


def _ext_fused(op: PoolOp, x: torch.Tensor) -> torch.Tensor:
    return ext.pool_activation(x, op.kernel, op.dilation, op.mode, op.activation, op.divisor)


# --- registry ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Solver:
    """A named way to run dense ops: ``run(op, x)`` where ``applies(op)``, for inputs of ``dtypes`` (None: any)."""

    name: str
    run: Callable[[DenseOp, torch.Tensor], torch.Tensor]
    applies: Callable[[DenseOp], bool]
    needs_ext: bool = False
    dtypes: frozenset[torch.dtype] | None = None

    def supports(self, dtype: torch.dtype) -> bool:
        return self.dtypes is None or dtype in self.dtypes


_EXT_DTYPES = frozenset({torch.float32, torch.float64})  # the ext conv's; its pooling also runs bf16/fp16
_EXT_POOL_DTYPES = _EXT_DTYPES | {torch.bfloat16, torch.float16}


def _dilated(op: DenseOp) -> bool:
    return any(d != 1 for d in op.dilation) and any(k != 1 for k in op.kernel)


def _ext_runs(op: DenseOp) -> bool:
    """densecnn's kernels pool along any number of axes; their convolution is 2-D only."""
    return isinstance(op, PoolOp) or len(op.kernel) == 2


SOLVERS: dict[str, Solver] = {
    solver.name: solver
    for solver in (
        Solver("native", _native, lambda op: True),
        Solver("s2b", _space_to_batch, lambda op: _dilated(op) or op.name.startswith("avg_pool")),
        Solver("ext", _ext_op, _ext_runs, needs_ext=True, dtypes=_EXT_DTYPES),
        Solver(
            "ext_fused",
            _ext_fused,
            lambda op: isinstance(op, PoolOp) and op.activation is not None,
            needs_ext=True,
            dtypes=_EXT_POOL_DTYPES,
        ),
        Solver("fft", fft_conv.conv2d, fft_conv.applies, needs_ext=True),
        Solver("direct", _direct, _direct_runs, needs_ext=True, dtypes=_EXT_DTYPES),
        Solver("winograd", winograd.conv, winograd.applies, needs_ext=True),
    )
}


def candidates(op: DenseOp, *, ext_available: bool, dtype: torch.dtype | None = None) -> list[str]:
    """Names of the solvers that can run ``op`` here (on inputs of ``dtype``, if given), ``native`` first."""
    return [
        s.name
        for s in SOLVERS.values()
        if s.applies(op) and (ext_available or not s.needs_ext) and (dtype is None or s.supports(dtype))
    ]


# id(weight) -> ((its version, the compute dtype), the weight with its subnormal entries zero, or None where it has
# none), for the weights no gradient is asked of; an entry goes with its weight.
_normal_weights = weight_cache.TransformCache(64)


def normal_weight(weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``weight`` with its subnormal entries in ``dtype`` (nonzero, below ``torch.finfo(dtype).tiny``) set to zero,
    at inference and eagerly (:func:`densecnn.ops.weight_cache.cacheable`; else ``weight`` as it is), computed once
    while the weight's values are unchanged. A product with a subnormal factor takes a slow microcode path on x86
    CPUs: the Gaussian tails of a fixed filter bank (1e-43 in float32, 54 of 5,859 taps) made its first two convs
    2–6× slower. What such a weight adds to an output is below ``tiny`` times the input, under float32's rounding of
    any normal output.

    >>> normal_weight(torch.tensor([1.0, 1e-40, 0.0]), torch.float32)
    tensor([1., 0., 0.])
    """
    if not (weight.is_floating_point() and weight_cache.cacheable(weight) and weight_cache.eager(weight)):
        return weight  # training, or traced (torch.compile, fake tensors): nothing to key a copy by

    def normal() -> torch.Tensor | None:
        subnormal = (weight != 0) & (weight.abs() < torch.finfo(dtype).tiny)
        return weight.masked_fill(subnormal, 0) if bool(subnormal.any()) else None

    cached = _normal_weights.get(weight, (dtype,), normal)
    return weight if cached is None else cached


def run(
    name: str, op: DenseOp, x: torch.Tensor, memory_format: torch.memory_format | None = None
) -> torch.Tensor:
    """Run ``op`` on ``x`` (N, C, *S) with solver ``name``; the output is in ``memory_format``, by default x's.
    (A one-channel input is both NC* and channels-last: a channels-last plan names its format so that the first
    layer's output is channels-last too.)

    The input's dtype is the compute dtype: conv parameters are cast to it (differentiably), so a bfloat16 image
    runs the whole net in bfloat16. At inference, weights too small to be normal numbers in it count as zero
    (:func:`normal_weight`).
    """
    if isinstance(op, ConvOp):
        weight = normal_weight(op.weight, x.dtype)
        if weight is not op.weight or weight.dtype != x.dtype:
            bias = None if op.bias is None else op.bias.to(x.dtype)
            op = ConvOp(weight.to(x.dtype), bias, op.dilation, op.groups)
    y = SOLVERS[name].run(op, x)
    return y.contiguous(memory_format=memory_format or layout_of(x))
