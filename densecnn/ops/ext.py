"""densecnn's own kernels (``cuda_ext/``, compiled as ``densecnn._C``) as autograd-capable torch ops.

Loading ``densecnn._C`` registers ``torch.ops.densecnn.*`` (schemas in ``cuda_ext/ops.cpp``, CPU and CUDA kernels
per backend); this module adds their fake (shape) kernels and autograd formulas, and typed wrappers.

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

from ..geometry import output_size, reach
from . import native

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


# ---- shapes and layouts, as the kernels see them ----


def _is_channels_last(x: torch.Tensor) -> bool:
    """Whether the kernels run (and return) channels-last; mirrors ``is_channels_last`` in cuda_ext/pool_args.h."""
    return math.prod(x.shape[2:]) > 1 and x.stride(1) == 1


def _empty(like: torch.Tensor, shape, channels_last: bool, dtype=None) -> torch.Tensor:
    """An (N, C, ...) tensor in the kernels' layout: channels-last is (N, ..., C) in memory for any rank."""
    dtype = dtype or like.dtype
    if not channels_last:
        return torch.empty(shape, dtype=dtype, device=like.device)
    n, c, *spatial = shape
    return torch.empty((n, *spatial, c), dtype=dtype, device=like.device).movedim(-1, 1)


def _pooled_shape(shape, kernel, dilation, first_axis: int = 0) -> list[int]:
    """(N, C, spatial...) with the spatial axes from ``first_axis`` on pooled (stride 1, no padding)."""
    n, c, *spatial = shape
    pooled = output_size(
        tuple(spatial[first_axis:]), tuple(kernel[first_axis:]), tuple(dilation[first_axis:])
    )
    return [n, c, *spatial[:first_axis], *pooled]


def _unpooled_shape(shape, kernel, dilation) -> list[int]:
    n, c, *spatial = shape
    return [n, c, *(s + r for s, r in zip(spatial, reach(tuple(kernel), tuple(dilation))))]


def _activation_grad(y: torch.Tensor, activation: str) -> torch.Tensor | None:
    """d activation / d input, from the activation's output y (None for the identity)."""
    if activation == "tanh":
        return 1 - y * y
    if activation == "relu":
        return (y > 0).to(y.dtype)
    return None


def _gather_argmax(t: torch.Tensor, taps, dilation) -> torch.Tensor:
    """t (N, C, *input) at each max-pooling output's argmax -> (N, C, *output); ``taps`` are the forward's.

    The passes ran innermost axis first, so the argmax is traced outermost first: taps[0] says which tap won
    along axis 0 for each output, which fixes where taps[1] is read, and so on.
    """
    n, c, *out = taps[0].shape
    axes = len(out)
    index = [
        torch.arange(size, device=t.device).view([size if b == a else 1 for b in range(axes)])
        for a, size in enumerate(out)
    ]  # per axis, the output's coordinate (broadcast), becoming the argmax's
    for a, tap in enumerate(taps):
        extent = tap.shape[2:]
        flat = sum(index[b] * math.prod(extent[b + 1 :]) for b in range(axes))  # (N|1, C|1, *out)
        chosen = tap.flatten(2).gather(2, flat.expand(n, c, *out).flatten(2)).view(n, c, *out)
        index[a] = index[a] + chosen.long() * dilation[a]
    input_extent = t.shape[2:]
    flat = sum(index[b] * math.prod(input_extent[b + 1 :]) for b in range(axes))
    return t.flatten(2).gather(2, flat.expand(n, c, *out).flatten(2)).view(n, c, *out)


# ---- per-op registration: fake kernels and autograd formulas ----


def _register_max_pool(ops) -> None:
    @torch.library.register_fake("densecnn::max_pool")
    def _(input, kernel, dilation, activation, with_taps):
        channels_last = _is_channels_last(input)
        y = _empty(input, _pooled_shape(input.shape, kernel, dilation), channels_last)
        taps = [
            _empty(input, _pooled_shape(input.shape, kernel, dilation, a), channels_last, torch.uint8)
            for a in range(len(kernel) if with_taps else 0)
        ]
        return y, taps

    def setup(ctx, inputs, output):
        _, ctx.kernel, ctx.dilation, ctx.activation, ctx.with_taps = inputs
        y, taps = output
        ctx.save_for_backward(y if ctx.activation != "none" else None, *taps)

    def backward(ctx, grad_y, _grad_taps):
        if not ctx.with_taps:
            raise RuntimeError(
                "densecnn::max_pool ran with with_taps=False, so it kept no argmax for backward; "
                "call densecnn.ops.ext.max_pool, which keeps it whenever the input requires grad"
            )
        y, *taps = ctx.saved_tensors
        grad_x = ops.max_pool_backward(grad_y, y, taps, ctx.kernel, ctx.dilation, ctx.activation)
        return grad_x, None, None, None, None

    torch.library.register_autograd("densecnn::max_pool", backward, setup_context=setup)


def _register_max_pool_backward(ops) -> None:
    @torch.library.register_fake("densecnn::max_pool_backward")
    def _(grad_output, output, taps, kernel, dilation, activation):
        shape = _unpooled_shape(grad_output.shape, kernel, dilation)
        return _empty(grad_output, shape, _is_channels_last(taps[-1]))

    # The backward op is linear in grad_output; its own gradient makes double backward work.
    def setup(ctx, inputs, output):
        grad_y, y, taps, _, ctx.dilation, ctx.activation = inputs
        ctx.axes = len(taps)
        ctx.save_for_backward(grad_y, y, *taps)

    def backward(ctx, grad_grad_x):
        grad_y, y, *taps = ctx.saved_tensors
        gathered = _gather_argmax(grad_grad_x, taps, ctx.dilation)  # (N, C, *output)
        local = _activation_grad(y, ctx.activation) if y is not None else None
        grad_grad_y = gathered if local is None else gathered * local
        grad_out = gathered * grad_y * (-2 * y) if ctx.activation == "tanh" else None  # relu'' = 0
        return grad_grad_y, grad_out, [None] * ctx.axes, None, None, None

    torch.library.register_autograd("densecnn::max_pool_backward", backward, setup_context=setup)


def _register_avg_pool(ops) -> None:
    @torch.library.register_fake("densecnn::avg_pool")
    def _(input, kernel, dilation, divisor, activation):
        return _empty(input, _pooled_shape(input.shape, kernel, dilation), _is_channels_last(input))

    def setup(ctx, inputs, output):
        _, ctx.kernel, ctx.dilation, ctx.divisor, ctx.activation = inputs
        ctx.save_for_backward(output if ctx.activation != "none" else None)

    def backward(ctx, grad_y):
        (y,) = ctx.saved_tensors
        grad_x = ops.avg_pool_backward(grad_y, y, ctx.kernel, ctx.dilation, ctx.divisor, ctx.activation)
        return grad_x, None, None, None, None

    torch.library.register_autograd("densecnn::avg_pool", backward, setup_context=setup)


def _register_avg_pool_backward(ops) -> None:
    @torch.library.register_fake("densecnn::avg_pool_backward")
    def _(grad_output, output, kernel, dilation, divisor, activation):
        shape = _unpooled_shape(grad_output.shape, kernel, dilation)
        return _empty(grad_output, shape, _is_channels_last(grad_output))

    def setup(ctx, inputs, output):
        grad_y, y, ctx.kernel, ctx.dilation, ctx.divisor, ctx.activation = inputs
        ctx.save_for_backward(grad_y, y)

    def backward(ctx, grad_grad_x):
        grad_y, y = ctx.saved_tensors
        pooled = ops.avg_pool(grad_grad_x, ctx.kernel, ctx.dilation, ctx.divisor, "none")  # (N, C, *output)
        local = _activation_grad(y, ctx.activation) if y is not None else None
        grad_grad_y = pooled if local is None else pooled * local
        grad_out = pooled * grad_y * (-2 * y) if ctx.activation == "tanh" else None
        return grad_grad_y, grad_out, None, None, None, None

    torch.library.register_autograd("densecnn::avg_pool_backward", backward, setup_context=setup)


def _register_conv2d(ops) -> None:
    @torch.library.register_fake("densecnn::conv2d")
    def _(input, weight, bias, dilation, groups):
        shape = _pooled_shape((input.shape[0], weight.shape[0], *input.shape[2:]), weight.shape[2:], dilation)
        return _empty(input, shape, _is_channels_last(input))

    def setup(ctx, inputs, output):
        input, weight, bias, ctx.dilation, ctx.groups = inputs
        ctx.has_bias = bias is not None
        ctx.save_for_backward(input, weight)

    def backward(ctx, grad_y):
        input, weight = ctx.saved_tensors
        mask = [ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.has_bias and ctx.needs_input_grad[2]]
        grads = ops.conv2d_backward(grad_y, input, weight, ctx.dilation, ctx.groups, mask)
        return *(grad if needed else None for grad, needed in zip(grads, mask, strict=True)), None, None

    torch.library.register_autograd("densecnn::conv2d", backward, setup_context=setup)


def _register_conv2d_backward(ops) -> None:
    @torch.library.register_fake("densecnn::conv2d_backward")
    def _(grad_output, input, weight, dilation, groups, output_mask):
        return (
            _empty(input, input.shape, _is_channels_last(input)) if output_mask[0] else input.new_empty(0),
            weight.new_empty(weight.shape) if output_mask[1] else input.new_empty(0),
            weight.new_empty(weight.shape[0]) if output_mask[2] else input.new_empty(0),
        )


def _register_direct_conv(ops) -> None:
    @torch.library.register_fake("densecnn::direct_conv")
    def _(input, weight, bias, dilation):
        shape = _pooled_shape((input.shape[0], weight.shape[0], *input.shape[2:]), weight.shape[2:], dilation)
        return _empty(input, shape, _is_channels_last(input))

    def setup(ctx, inputs, output):
        input, weight, bias, ctx.dilation = inputs
        ctx.has_bias = bias is not None
        ctx.save_for_backward(input, weight)

    def backward(ctx, grad_y):
        input, weight = ctx.saved_tensors
        needs = ctx.needs_input_grad
        return *native.conv_backward(
            grad_y, input, weight, ctx.dilation, (needs[0], needs[1], ctx.has_bias and needs[2])
        ), None

    torch.library.register_autograd("densecnn::direct_conv", backward, setup_context=setup)


if available():
    for _register_op in (
        _register_max_pool,
        _register_max_pool_backward,
        _register_avg_pool,
        _register_avg_pool_backward,
        _register_conv2d,
        _register_conv2d_backward,
        _register_direct_conv,
    ):
        _register_op(torch.ops.densecnn)
