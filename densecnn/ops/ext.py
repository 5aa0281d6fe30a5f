"""densecnn's own kernels (``cuda_ext/``, compiled as ``densecnn._C``) as autograd-capable torch ops.

Loading ``densecnn._C`` registers ``torch.ops.densecnn.*`` (schemas in ``cuda_ext/ops.cpp``, CPU and CUDA kernels
per backend); this module adds their fake (shape) kernels and autograd formulas and typed wrappers with the
signatures of :mod:`densecnn.ops.native`. All ops use stride 1 and no padding: a (kh, kw) window with dilation
(dh, dw) maps (N, C, H, W) to (N, C', H - (kh-1)·dh, W - (kw-1)·dw). Outputs keep the input's memory format
(channels_last in, channels_last out). Supported dtypes: float32, float64.

Importing never fails: when the extension is not built, :func:`available` is False and :func:`load_error` says why.

Example:
    >>> import torch
    >>> from densecnn.ops import ext
    >>> if ext.available():
    ...     y = ext.max_pool2d(torch.randn(1, 64, 40, 40), (2, 2), (2, 2))  # (1, 64, 38, 38)
"""

from __future__ import annotations

import torch

ACTIVATIONS = ("none", "relu", "tanh")
POOL_MODES = ("max", "avg")

try:
    from densecnn import _C  # noqa: F401  (loading the library registers torch.ops.densecnn.*)

    _LOAD_ERROR: str | None = None
except (ImportError, OSError) as error:  # not built, or built against another torch
    _LOAD_ERROR = f"{type(error).__name__}: {error}"


def available() -> bool:
    """True when the compiled kernels (``densecnn._C``) are loaded and ``torch.ops.densecnn`` can be called."""
    return _LOAD_ERROR is None


def load_error() -> str | None:
    """Why the compiled kernels could not be loaded (None when :func:`available`)."""
    return _LOAD_ERROR


def _require() -> None:
    if _LOAD_ERROR is not None:
        raise RuntimeError(
            f"densecnn's compiled kernels are not available ({_LOAD_ERROR}); rebuild them with "
            "`pip install --no-build-isolation -e .` or use backend='native'"
        )


def _pair(name: str, value) -> list[int]:
    pair = [value, value] if isinstance(value, int) else list(value)
    if len(pair) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in pair):
        raise ValueError(f"{name} must be a positive int or a pair of positive ints, got {value!r}")
    return pair


def _check_activation(activation: str) -> None:
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation={activation!r} is not supported; use one of {', '.join(ACTIVATIONS)}")


# ---- public wrappers ----


def max_pool2d(x: torch.Tensor, kernel, dilation) -> torch.Tensor:
    """Stride-1 dilated max pooling. (N, C, H, W) -> (N, C, H', W'), equal to
    ``F.max_pool2d(x, kernel, stride=1, dilation=dilation)``, gradient included (ties: first maximum in window
    order; NaN windows give NaN and send the gradient to their last NaN, as torch does).
    """
    return pool2d_activation(x, kernel, dilation, "max", "none")


def avg_pool2d(x: torch.Tensor, kernel, dilation, divisor: int | None = None) -> torch.Tensor:
    """Stride-1 dilated average pooling: the sum of the kh·kw dilated taps over ``divisor`` (default kh·kw)."""
    return pool2d_activation(x, kernel, dilation, "avg", "none", divisor)


def pool2d_activation(
    x: torch.Tensor, kernel, dilation, mode: str, activation: str, divisor: int | None = None
) -> torch.Tensor:
    """Pooling (``mode`` "max" or "avg") fused with the pointwise ``activation`` that follows it
    ("none", "relu", "tanh"): ``activation(pool(x))`` in one pass over memory, forward and backward.

    Example:
        >>> y = pool2d_activation(torch.randn(1, 50, 64, 64), (2, 2), (8, 8), "max", "tanh")  # (1, 50, 56, 56)
    """
    _require()
    kernel, dilation = _pair("kernel", kernel), _pair("dilation", dilation)
    _check_activation(activation)
    if mode == "max":
        if divisor is not None:
            raise ValueError("divisor only applies to mode='avg'")
        with_taps = (
            torch.is_grad_enabled() and x.requires_grad
        )  # the argmax is only kept when backward may run
        return torch.ops.densecnn.max_pool2d(x, kernel, dilation, activation, with_taps)[0]
    if mode == "avg":
        if divisor is not None and (not isinstance(divisor, int) or divisor < 1):
            raise ValueError(f"divisor must be a positive int or None, got {divisor!r}")
        return torch.ops.densecnn.avg_pool2d(
            x, kernel, dilation, divisor or kernel[0] * kernel[1], activation
        )
    raise ValueError(f"mode={mode!r} is not supported; use one of {', '.join(POOL_MODES)}")


def conv2d(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, dilation, groups: int = 1):
    """Stride-1 dilated convolution by im2col + GEMM, the unrolled matrix built in bands of output rows (at most
    64 MiB each). x (N, C, H, W), weight (K, C/groups, kh, kw) -> (N, K, H', W'), like
    ``F.conv2d(x, weight, bias, stride=1, dilation=dilation, groups=groups)``.
    """
    _require()
    return torch.ops.densecnn.conv2d(x, weight, bias, _pair("dilation", dilation), groups)


# ---- fake kernels and autograd (registered once the library is loaded) ----


def _layout(x: torch.Tensor) -> torch.memory_format:
    """The memory format the kernels run in and return; mirrors ``pool_layout`` in cuda_ext/pool_args.h."""
    channels_last = x.size(1) > 1 and x.size(2) * x.size(3) > 1 and x.stride(1) == 1
    return torch.channels_last if channels_last else torch.contiguous_format


def _empty(like: torch.Tensor, shape, layout, dtype=None) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype or like.dtype, device=like.device, memory_format=layout)


def _pooled_size(size: int, k: int, d: int) -> int:
    return size - (k - 1) * d


def _activation_grad(y: torch.Tensor, activation: str) -> torch.Tensor | None:
    """d activation / d input, from the activation's output y (None for the identity)."""
    if activation == "tanh":
        return 1 - y * y
    if activation == "relu":
        return (y > 0).to(y.dtype)
    return None


def _gather_argmax(t: torch.Tensor, row_tap: torch.Tensor, col_tap: torch.Tensor, dilation) -> torch.Tensor:
    """t (N, C, H, W) at each max-pooling output's argmax -> (N, C, H', W'); the taps are those of the forward."""
    n, c, oh, ow = col_tap.shape
    rows = (
        torch.arange(oh, device=t.device).view(1, 1, oh, 1) + col_tap.long() * dilation[0]
    )  # (N, C, H', W')
    cols = torch.arange(ow, device=t.device).view(1, 1, 1, ow) + row_tap.long().gather(2, rows) * dilation[1]
    return t.flatten(2).gather(2, (rows * t.shape[3] + cols).flatten(2)).view(n, c, oh, ow)


def _register() -> None:
    ops = torch.ops.densecnn

    @torch.library.register_fake("densecnn::max_pool2d")
    def _(input, kernel, dilation, activation, with_taps):
        n, c, h, w = input.shape
        oh, ow = _pooled_size(h, kernel[0], dilation[0]), _pooled_size(w, kernel[1], dilation[1])
        layout = _layout(input)
        taps = (h, ow, oh, ow) if with_taps else (0, 0, 0, 0)
        return (
            _empty(input, (n, c, oh, ow), layout),
            _empty(input, (n, c, taps[0], taps[1]), layout, torch.uint8),
            _empty(input, (n, c, taps[2], taps[3]), layout, torch.uint8),
        )

    @torch.library.register_fake("densecnn::max_pool2d_backward")
    def _(grad_output, output, row_tap, col_tap, kernel, dilation, activation):
        n, c, oh, ow = grad_output.shape
        shape = (n, c, oh + (kernel[0] - 1) * dilation[0], ow + (kernel[1] - 1) * dilation[1])
        return _empty(grad_output, shape, _layout(col_tap))

    @torch.library.register_fake("densecnn::avg_pool2d")
    def _(input, kernel, dilation, divisor, activation):
        n, c, h, w = input.shape
        shape = (n, c, _pooled_size(h, kernel[0], dilation[0]), _pooled_size(w, kernel[1], dilation[1]))
        return _empty(input, shape, _layout(input))

    @torch.library.register_fake("densecnn::avg_pool2d_backward")
    def _(grad_output, output, kernel, dilation, divisor, activation):
        n, c, oh, ow = grad_output.shape
        shape = (n, c, oh + (kernel[0] - 1) * dilation[0], ow + (kernel[1] - 1) * dilation[1])
        return _empty(grad_output, shape, _layout(grad_output))

    @torch.library.register_fake("densecnn::conv2d")
    def _(input, weight, bias, dilation, groups):
        n, _, h, w = input.shape
        k, _, kh, kw = weight.shape
        shape = (n, k, _pooled_size(h, kh, dilation[0]), _pooled_size(w, kw, dilation[1]))
        return _empty(input, shape, _layout(input))

    @torch.library.register_fake("densecnn::conv2d_backward")
    def _(grad_output, input, weight, dilation, groups, output_mask):
        return (
            _empty(input, input.shape, _layout(input)) if output_mask[0] else input.new_empty(0),
            weight.new_empty(weight.shape) if output_mask[1] else input.new_empty(0),
            weight.new_empty(weight.shape[0]) if output_mask[2] else input.new_empty(0),
        )

    def max_setup(ctx, inputs, output):
        _, ctx.kernel, ctx.dilation, ctx.activation, ctx.with_taps = inputs
        y, row_tap, col_tap = output
        ctx.save_for_backward(y if ctx.activation != "none" else None, row_tap, col_tap)

    def max_backward(ctx, grad_y, _grad_row_tap, _grad_col_tap):
        if not ctx.with_taps:
            raise RuntimeError(
                "densecnn::max_pool2d ran with with_taps=False, so it kept no argmax for backward; "
                "call densecnn.ops.ext.max_pool2d, which keeps it whenever the input requires grad"
            )
        y, row_tap, col_tap = ctx.saved_tensors
        grad_x = ops.max_pool2d_backward(
            grad_y, y, row_tap, col_tap, ctx.kernel, ctx.dilation, ctx.activation
        )
        return grad_x, None, None, None, None

    torch.library.register_autograd("densecnn::max_pool2d", max_backward, setup_context=max_setup)

    def avg_setup(ctx, inputs, output):
        _, ctx.kernel, ctx.dilation, ctx.divisor, ctx.activation = inputs
        ctx.save_for_backward(output if ctx.activation != "none" else None)

    def avg_backward(ctx, grad_y):
        (y,) = ctx.saved_tensors
        grad_x = ops.avg_pool2d_backward(grad_y, y, ctx.kernel, ctx.dilation, ctx.divisor, ctx.activation)
        return grad_x, None, None, None, None

    torch.library.register_autograd("densecnn::avg_pool2d", avg_backward, setup_context=avg_setup)

    def conv_setup(ctx, inputs, output):
        input, weight, bias, ctx.dilation, ctx.groups = inputs
        ctx.has_bias = bias is not None
        ctx.save_for_backward(input, weight)

    def conv_backward(ctx, grad_y):
        input, weight = ctx.saved_tensors
        mask = [ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.has_bias and ctx.needs_input_grad[2]]
        grads = ops.conv2d_backward(grad_y, input, weight, ctx.dilation, ctx.groups, mask)
        return *(grad if needed else None for grad, needed in zip(grads, mask, strict=True)), None, None

    torch.library.register_autograd("densecnn::conv2d", conv_backward, setup_context=conv_setup)

    # The backward ops are linear in grad_output; their own gradients make double backward work.
    def max_backward_setup(ctx, inputs, output):
        grad_y, y, row_tap, col_tap, _, ctx.dilation, ctx.activation = inputs
        ctx.save_for_backward(grad_y, y, row_tap, col_tap)

    def max_backward_backward(ctx, grad_grad_x):
        grad_y, y, row_tap, col_tap = ctx.saved_tensors
        gathered = _gather_argmax(grad_grad_x, row_tap, col_tap, ctx.dilation)  # (N, C, H', W')
        local = _activation_grad(y, ctx.activation) if y is not None else None
        grad_grad_y = gathered if local is None else gathered * local
        grad_out = gathered * grad_y * (-2 * y) if ctx.activation == "tanh" else None  # relu'' = 0
        return grad_grad_y, grad_out, None, None, None, None, None

    torch.library.register_autograd(
        "densecnn::max_pool2d_backward", max_backward_backward, setup_context=max_backward_setup
    )

    def avg_backward_setup(ctx, inputs, output):
        grad_y, y, ctx.kernel, ctx.dilation, ctx.divisor, ctx.activation = inputs
        ctx.save_for_backward(grad_y, y)

    def avg_backward_backward(ctx, grad_grad_x):
        grad_y, y = ctx.saved_tensors
        pooled = ops.avg_pool2d(grad_grad_x, ctx.kernel, ctx.dilation, ctx.divisor, "none")  # (N, C, H', W')
        local = _activation_grad(y, ctx.activation) if y is not None else None
        grad_grad_y = pooled if local is None else pooled * local
        grad_out = pooled * grad_y * (-2 * y) if ctx.activation == "tanh" else None
        return grad_grad_y, grad_out, None, None, None, None

    torch.library.register_autograd(
        "densecnn::avg_pool2d_backward", avg_backward_backward, setup_context=avg_backward_setup
    )


if available():
    _register()
