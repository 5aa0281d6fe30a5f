"""densecnn's own kernels (``cuda_ext/``, compiled as ``densecnn._C``) as autograd-capable torch ops.

Loading ``densecnn._C`` registers ``torch.ops.densecnn.*`` (schemas in ``cuda_ext/ops.cpp``, CPU and CUDA kernels
per device); :mod:`~densecnn.ops.registrations` adds their fake (shape) kernels and autograd formulas, and this
module the typed wrappers of the pools and of the im2col and direct convs.

All ops use stride 1 and no padding. The pooling ops take signals (N, C, L), images (N, C, H, W) and volumes
(N, C, D, H, W) with one kernel and dilation entry per spatial axis: a window k with dilation d maps each axis of
size S to S - (k-1)·d. Outputs keep the input's memory format (channels_last / channels_last_3d in, the same out).
Pooling supports float32, float64, bfloat16 and float16 (reduced precision accumulates in float32); the
convolution float32 and float64.

Importing never fails: when the extension is not built, :func:`available` is False and :func:`load_error` says why.

Example:
    >>> import torch
    >>> from densecnn.ops import ext
    >>> if ext.available():
    ...     y = ext.max_pool(torch.randn(1, 8, 20, 20, 20), (2, 2, 2), (4, 4, 4))  # (1, 8, 16, 16, 16)
    ...     y = ext.max_pool(torch.randn(1, 64, 40, 40), (2, 2), (2, 2))  # (1, 64, 38, 38)
"""

from __future__ import annotations

import math
import numbers
from pathlib import Path

import torch

ACTIVATIONS = ("none", "relu", "tanh")
POOL_MODES = ("max", "avg")

try:
    import densecnn._C  # loading the library registers torch.ops.densecnn.*

    _LOAD_ERROR: str | None = None
except (ImportError, OSError) as error:  # not built, or built against another torch
    _LOAD_ERROR = f"{type(error).__name__}: {error}"


def available() -> bool:
    """True when the compiled kernels (``densecnn._C``) are loaded and ``torch.ops.densecnn`` can be called."""
    return _LOAD_ERROR is None


def load_error() -> str | None:
    """Why the compiled kernels could not be loaded (None when :func:`available`)."""
    return _LOAD_ERROR


def library_file() -> Path | None:
    """The compiled library's file (None when it is not loaded)."""
    return Path(densecnn._C.__file__) if _LOAD_ERROR is None else None


def release_output_buffers() -> int:
    """Free the output buffers densecnn's CPU kernels keep for reuse that nothing refers to any more (as
    ``torch.cuda.empty_cache`` does for CUDA memory); returns the bytes released. Later calls allocate afresh.

    >>> release_output_buffers() >= 0
    True
    """
    _require()
    return torch.ops.densecnn.release_output_buffers()


def empty_buffer(size: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised contiguous CPU tensor on one of the buffers the CPU kernels reuse for their outputs: for a
    large result computed anew on every call by torch ops with ``out=`` (a fresh allocation above malloc's mmap
    threshold faults in every page on first write). Handed out again only once nothing refers to it.

    >>> spectrum = empty_buffer((38, 20 * 64 * 128), torch.complex64)  # 50 MB, mapped once per process
    >>> spectrum.is_contiguous()
    True
    """
    _require()
    return torch.ops.densecnn.empty_buffer(list(size), dtype)


def set_output_buffers(*, max_free_bytes: int, huge_pages: bool) -> None:
    """Set the CPU kernels' output buffers: at most ``max_free_bytes`` of free buffers kept for reuse (0: none; the
    least recently used beyond it are released now), and whether fresh ones are advised onto 2 MiB pages.
    :mod:`densecnn.ops.config` calls it with the config's ``output_cache_mb`` and ``huge_pages``.
    """
    _require()
    torch.ops.densecnn.set_output_buffers(max_free_bytes, huge_pages)


def _require() -> None:
    if _LOAD_ERROR is not None:
        raise RuntimeError(
            f"densecnn's compiled kernels are not available ({_LOAD_ERROR}); rebuild them with "
            "`pip install --no-build-isolation -e .` or use backend='native'"
        )


def _per_axis(name: str, value, axes: int) -> list[int]:
    """A positive int for every spatial axis, from an int or one entry per axis."""
    entries = [value] * axes if isinstance(value, numbers.Integral) else list(value)
    if len(entries) != axes or not all(
        isinstance(v, numbers.Integral) and not isinstance(v, bool) and v >= 1 for v in entries
    ):
        raise ValueError(
            f"{name} must be a positive int or one positive int per spatial axis ({axes}), got {value!r}"
        )
    return [int(v) for v in entries]


def _spatial_axes(x: torch.Tensor) -> int:
    if not 3 <= x.dim() <= 5:
        raise ValueError(
            "expected a 3-D (N, C, L), 4-D (N, C, H, W) or 5-D (N, C, D, H, W) input, "
            f"got shape {tuple(x.shape)}"
        )
    return x.dim() - 2


def _check_activation(activation: str) -> None:
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation={activation!r} is not supported; use one of {', '.join(ACTIVATIONS)}")


# ---- public wrappers ----


def max_pool(x: torch.Tensor, kernel, dilation) -> torch.Tensor:
    """Stride-1 dilated max pooling over every spatial axis of (N, C, L), (N, C, H, W) or (N, C, D, H, W), equal
    to ``F.max_pool{1,2,3}d(x, kernel, stride=1, dilation=dilation)``, gradient included (ties: first maximum in
    window order; NaN windows give NaN and send the gradient to their last NaN, as torch does).

    Example:
        >>> y = max_pool(torch.randn(2, 4, 30, 30, 30), 2, (1, 4, 4))  # (2, 4, 29, 26, 26)
    """
    return pool_activation(x, kernel, dilation, "max", "none")


def avg_pool(x: torch.Tensor, kernel, dilation, divisor: int | None = None) -> torch.Tensor:
    """Stride-1 dilated average pooling: the sum of the window's dilated taps over ``divisor`` (default: the
    number of taps, the product of ``kernel``).

    Example:
        >>> y = avg_pool(torch.randn(1, 3, 100), 4, 2)  # (1, 3, 94)
    """
    return pool_activation(x, kernel, dilation, "avg", "none", divisor)


def pool_activation(
    x: torch.Tensor, kernel, dilation, mode: str, activation: str, divisor: int | None = None
) -> torch.Tensor:
    """Pooling (``mode`` "max" or "avg") fused with the pointwise ``activation`` that follows it
    ("none", "relu", "tanh"): ``activation(pool(x))`` in one pass over memory, forward and backward.
    ``kernel`` and ``dilation`` are ints or have one entry per spatial axis.

    Example:
        >>> y = pool_activation(torch.randn(1, 50, 64, 64), (2, 2), (8, 8), "max", "tanh")  # (1, 50, 56, 56)
    """
    _require()
    axes = _spatial_axes(x)
    kernel, dilation = _per_axis("kernel", kernel, axes), _per_axis("dilation", dilation, axes)
    _check_activation(activation)
    if mode == "max":
        if divisor is not None:
            raise ValueError("divisor only applies to mode='avg'")
        with_taps = (
            torch.is_grad_enabled() and x.requires_grad
        )  # the argmax is only kept when backward may run
        return torch.ops.densecnn.max_pool(x, kernel, dilation, activation, with_taps)[0]
    if mode == "avg":
        if divisor is not None and (not isinstance(divisor, int) or divisor < 1):
            raise ValueError(f"divisor must be a positive int or None, got {divisor!r}")
        return torch.ops.densecnn.avg_pool(x, kernel, dilation, divisor or math.prod(kernel), activation)
    raise ValueError(f"mode={mode!r} is not supported; use one of {', '.join(POOL_MODES)}")


def conv2d(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, dilation, groups: int = 1):
    """Stride-1 dilated convolution by im2col + GEMM, the unrolled matrix built in bands of output rows (at most
    64 MiB each). x (N, C, H, W), weight (K, C/groups, kh, kw) -> (N, K, H', W'), like
    ``F.conv2d(x, weight, bias, stride=1, dilation=dilation, groups=groups)``.
    """
    _require()
    return torch.ops.densecnn.conv2d(x, weight, bias, _per_axis("dilation", dilation, 2), groups)


def direct_conv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, dilation) -> torch.Tensor:
    """Stride-1 dilated convolution (groups 1) computed directly, without an unrolled matrix: for the few input
    channels of a first layer. x (N, C, *S) with 1-3 spatial axes, weight (K, C, *k) -> (N, K, *S') in NC*, like
    ``F.conv3d(x, weight, bias, dilation=dilation)`` (conv1d, conv2d). Its gradients are torch's convolution backward.
    """
    _require()
    return torch.ops.densecnn.direct_conv(x, weight, bias, _per_axis("dilation", dilation, _spatial_axes(x)))
