"""Candidate solvers for each dense op: different exact ways to compute the same stride-1 dilated conv or pool.

A solver is a function ``(spec, x) -> y`` registered under a name for the ops it implements; ``applies(name, spec)``
says whether it can run a given layer. The find step (:mod:`densecnn.ops.find`) times the applicable ones and keeps
the fastest. Every solver is exact (equal to the native dilated op up to float summation order) and differentiable.

Solvers:
- ``native``: torch's dilated op (``F.conv2d(dilation=d)``, ``F.max_pool2d(dilation=d, stride=1)``, average pooling as a
  depthwise conv), in whatever memory format ``x`` has.
- ``s2b`` (space-to-batch): pixel (q·d + r) of the input belongs to sub-grid r; a d-dilated window only ever reads one
  sub-grid, so the d×d sub-grids are moved into the batch, the *undilated* op runs on them, and the results are moved
  back. Exact, and often much faster where torch's dilated kernels are slow (large dilations, pooling).
- ``ext``: densecnn's own kernels (``cuda_ext``, see :mod:`densecnn.ops.ext`), when built.
- ``ext_fused``: the ext pooling kernel fused with the following tanh/ReLU, for a pool step that has one.
- ``fft``: convs in the frequency domain on overlap-save tiles of the sub-grids, every stage a GEMM
  (:mod:`densecnn.ops.fft_conv`); its cost does not grow with the kernel size.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from . import fft_conv, native

Pair = tuple[int, int]


@dataclass(frozen=True)
class ConvSpec:
    """A stride-1 dilated conv: weight (K, C/groups, kh, kw), optional bias (K,)."""

    weight: torch.Tensor
    bias: torch.Tensor | None
    dilation: Pair
    groups: int

    op = "conv2d"
    activation = None  # convs absorb no activation (class attributes, not fields)

    @property
    def kernel(self) -> Pair:
        return tuple(self.weight.shape[2:])


@dataclass(frozen=True)
class PoolSpec:
    """A stride-1 dilated max or average pool, optionally followed by a pointwise ``activation`` ("tanh", "relu")."""

    op: str  # "max_pool2d" or "avg_pool2d"
    kernel: Pair
    dilation: Pair
    divisor: int | None = None
    activation: str | None = None


Spec = ConvSpec | PoolSpec


def _ext():
    from . import ext_module

    return ext_module()


def _activate(y: torch.Tensor, activation: str | None) -> torch.Tensor:
    if activation == "tanh":
        return torch.tanh(y)
    if activation == "relu":
        return torch.relu(y)
    return y


# --- native --------------------------------------------------------------------------------------------------------


def _run_ops(ops_module, spec: Spec, x: torch.Tensor) -> torch.Tensor:
    """``spec`` through a module of dense ops with the signatures of :mod:`densecnn.ops.native`."""
    if isinstance(spec, ConvSpec):
        return ops_module.conv2d(x, spec.weight, spec.bias, spec.dilation, spec.groups)
    if spec.op == "max_pool2d":
        y = ops_module.max_pool2d(x, spec.kernel, spec.dilation)
    else:
        y = ops_module.avg_pool2d(x, spec.kernel, spec.dilation, spec.divisor)
    return _activate(y, spec.activation)


def _native(spec: Spec, x: torch.Tensor) -> torch.Tensor:
    return _run_ops(native, spec, x)


# --- space-to-batch ------------------------------------------------------------------------------------------------


def _is_channels_last(x: torch.Tensor) -> bool:
    return not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last)


def to_subgrids(x: torch.Tensor, dilation: Pair) -> torch.Tensor:
    """(N, C, H, W) -> (N·dh·dw, C, ⌈H/dh⌉, ⌈W/dw⌉): pixel (q·dh + r, p·dw + s) goes to (q, p) of sub-grid (r, s).

    The image is zero-padded to a multiple of the dilation; the padded pixels only feed outputs that are cropped.
    The result keeps ``x``'s memory format (NCHW or channels_last).
    """
    n, c, h, w = x.shape
    dh, dw = dilation
    hs, ws = -(-h // dh), -(-w // dw)
    if (hs * dh, ws * dw) != (h, w):
        x = F.pad(x, (0, ws * dw - w, 0, hs * dh - h))
    if _is_channels_last(x):
        nhwc = x.permute(0, 2, 3, 1).reshape(n, hs, dh, ws, dw, c)  # (N, Hs, dh, Ws, dw, C)
        return nhwc.permute(0, 2, 4, 1, 3, 5).reshape(n * dh * dw, hs, ws, c).permute(0, 3, 1, 2)
    grids = x.reshape(n, c, hs, dh, ws, dw)  # (N, C, Hs, dh, Ws, dw)
    return grids.permute(0, 3, 5, 1, 2, 4).reshape(n * dh * dw, c, hs, ws)


def from_subgrids(y: torch.Tensor, n: int, dilation: Pair, size: Pair) -> torch.Tensor:
    """Inverse of :func:`to_subgrids` for the op's output: (N·dh·dw, K, ho, wo) -> (N, K, H', W') cropped to ``size``."""
    _, k, ho, wo = y.shape
    dh, dw = dilation
    if _is_channels_last(y):
        nhwc = y.permute(0, 2, 3, 1).reshape(n, dh, dw, ho, wo, k)  # (N, dh, dw, ho, wo, K)
        full = nhwc.permute(0, 3, 1, 4, 2, 5).reshape(n, ho * dh, wo * dw, k).permute(0, 3, 1, 2)
    else:
        grids = y.reshape(n, dh, dw, k, ho, wo)  # (N, dh, dw, K, ho, wo)
        full = grids.permute(0, 3, 4, 1, 5, 2).reshape(n, k, ho * dh, wo * dw)
    return full[:, :, : size[0], : size[1]]


def _output_size(x: torch.Tensor, kernel: Pair, dilation: Pair) -> Pair:
    return tuple(x.shape[2 + a] - (kernel[a] - 1) * dilation[a] for a in (0, 1))


def _space_to_batch(spec: Spec, x: torch.Tensor) -> torch.Tensor:
    size = _output_size(x, spec.kernel, spec.dilation)
    subgrids = to_subgrids(x, spec.dilation) if spec.dilation != (1, 1) else x
    if isinstance(spec, ConvSpec):
        y = F.conv2d(subgrids, spec.weight, spec.bias, groups=spec.groups)
    elif spec.op == "max_pool2d":
        y = F.max_pool2d(subgrids, spec.kernel, 1)
    else:
        y = F.avg_pool2d(subgrids, spec.kernel, 1, divisor_override=spec.divisor)
    if spec.dilation != (1, 1):
        y = from_subgrids(y, x.shape[0], spec.dilation, size)
    return _activate(y, spec.activation)


# --- densecnn's kernels --------------------------------------------------------------------------------------------


def _ext_op(spec: Spec, x: torch.Tensor) -> torch.Tensor:
    return _run_ops(_ext(), spec, x)


def _ext_fused(spec: PoolSpec, x: torch.Tensor) -> torch.Tensor:
    mode = "max" if spec.op == "max_pool2d" else "avg"
    return _ext().pool2d_activation(x, spec.kernel, spec.dilation, mode, spec.activation, spec.divisor)


# --- registry ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Solver:
    name: str
    run: Callable[[Spec, torch.Tensor], torch.Tensor]
    applies: Callable[[Spec], bool]
    needs_ext: bool = False


def _dilated(spec: Spec) -> bool:
    return spec.dilation != (1, 1) and spec.kernel != (1, 1)


SOLVERS: dict[str, Solver] = {
    solver.name: solver
    for solver in (
        Solver("native", _native, lambda spec: True),
        Solver("s2b", _space_to_batch, lambda spec: _dilated(spec) or spec.op == "avg_pool2d"),
        Solver("ext", _ext_op, lambda spec: True, needs_ext=True),
        Solver("ext_fused", _ext_fused, lambda spec: spec.activation is not None, needs_ext=True),
        Solver("fft", fft_conv.conv2d, fft_conv.applies),
    )
}


def candidates(spec: Spec, *, ext_available: bool) -> list[str]:
    """Names of the solvers that can run ``spec`` here, ``native`` first."""
    return [s.name for s in SOLVERS.values() if s.applies(spec) and (ext_available or not s.needs_ext)]


def run(name: str, spec: Spec, x: torch.Tensor) -> torch.Tensor:
    """Run ``spec`` on ``x`` (N, C, H, W) with solver ``name``; the output keeps ``x``'s memory format.

    The input's dtype is the compute dtype: conv parameters are cast to it (differentiably), so a bfloat16 image
    runs the whole net in bfloat16.
    """
    if isinstance(spec, ConvSpec) and spec.weight.dtype != x.dtype:
        bias = None if spec.bias is None else spec.bias.to(x.dtype)
        spec = ConvSpec(spec.weight.to(x.dtype), bias, spec.dilation, spec.groups)
    y = SOLVERS[name].run(spec, x)
    return y.contiguous(
        memory_format=torch.channels_last if _is_channels_last(x) else torch.contiguous_format
    )
