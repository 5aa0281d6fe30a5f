"""The fake (shape) kernels and autograd formulas of every op in ``torch.ops.densecnn`` — the ops' one Python face.

``densecnn._C`` defines the ops' schemas and their CPU and CUDA kernels (``cuda_ext/ops.cpp``); this module registers,
for each, a fake kernel (``torch.library.register_fake``: shapes, dtypes and memory formats without computing, for
``torch.compile`` and ``opcheck``) and its gradients (``torch.library.register_autograd``), as torchvision's and
extension-cpp's ops do. The typed wrappers that call the ops are :mod:`~densecnn.ops.ext` (pools, im2col and direct
convs), :mod:`~densecnn.ops.fft_conv` and :mod:`~densecnn.ops.winograd`.

The transform-domain convs take the conv's weight beside its transform (the FFT's spectrum, Winograd's U): the
kernels compute with the transform, the gradients are taken for the weight, so a weight that requires grad trains
through them like through ``F.conv2d``. Importing :mod:`densecnn.ops` registers everything (once, when the compiled
kernels are loaded).
"""

from __future__ import annotations

import math

import torch

from ..geometry import output_size, reach
from . import ext, fft_conv, layout, native, weight_cache
from .gradients import bias_gradient

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


# ---- per op: the fake kernel and the autograd formula ----


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
        # The taps (uint8 argmax) have no gradient: left unmaterialised, autograd would fill a zero tensor of each
        # tap's shape on every backward (a page-faulting fill of MBs per pool in a training step)
        ctx.set_materialize_grads(False)

    def backward(ctx, grad_y, _grad_taps):
        if grad_y is None:  # only the taps were used downstream: no gradient reaches the input
            return None, None, None, None, None
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


def _register_fft_conv2d(ops) -> None:
    @torch.library.register_fake("densecnn::fft_conv2d")
    def _(input, weight, spectrum, bias, tile, valid, dilation, padding=(0, 0)):
        padded = tuple(s + 2 * p for s, p in zip(input.shape[2:], padding))
        out = output_size(padded, tuple(weight.shape[2:]), tuple(dilation))
        return _empty(input, (input.shape[0], weight.shape[0], *out), _is_channels_last(input))

    def setup(ctx, inputs, output):
        input, weight, spectrum, bias, tile, _valid, ctx.dilation, *padding = inputs
        ctx.padding = tuple(padding[0]) if padding else (0, 0)
        # the input gradient reuses the forward's kernel spectrum (on the same tile)
        eager = weight_cache.eager(weight) and weight_cache.eager(spectrum)
        ctx.spectra = {fft_conv.spectrum_key(weight, tile, input.dtype): spectrum} if eager else {}
        ctx.has_bias = bias is not None
        ctx.save_for_backward(input, weight)

    def backward(ctx, grad_y):
        input, weight = ctx.saved_tensors
        needs = ctx.needs_input_grad
        grad_x = grad_w = grad_b = None
        if needs[0] and torch.is_grad_enabled():  # a double backward: torch's differentiable formula
            grad_x, _, _ = native.conv_backward(
                grad_y, input, weight, ctx.dilation, (True, False, False), ctx.padding
            )
        elif needs[0]:
            with fft_conv.shared_spectra(ctx.spectra):
                grad_x = fft_conv.input_gradient(grad_y, weight, ctx.dilation, ctx.padding)
        if needs[1] and (torch.is_grad_enabled() or any(ctx.padding)):
            # a double backward (or the input gradient's own weight gradient): torch's differentiable formula
            _, grad_w, _ = native.conv_backward(
                grad_y, input, weight, ctx.dilation, (False, True, False), ctx.padding
            )
        elif needs[1]:
            grad_w = fft_conv.weight_gradient(grad_y, input, weight.shape[2:], ctx.dilation)
        if ctx.has_bias and needs[3]:
            grad_b = bias_gradient(grad_y)
        return grad_x, grad_w, None, grad_b, None, None, None, None

    torch.library.register_autograd("densecnn::fft_conv2d", backward, setup_context=setup)


def _register_fft_conv2d_input_grad(ops) -> None:
    @torch.library.register_fake("densecnn::fft_conv2d_input_grad")
    def _(grad_output, spectrum, input_size, tile, valid, dilation, padding=(0, 0)):
        shape = (grad_output.shape[0], spectrum.shape[1], *input_size)
        return _empty(grad_output, shape, _is_channels_last(grad_output))


def _register_fft_conv2d_weight_spectrum(ops) -> None:
    @torch.library.register_fake("densecnn::fft_conv2d_weight_spectrum")
    def _(input, grad_output, tile, valid, dilation):
        complex_dtype = torch.complex64 if input.dtype == torch.float32 else torch.complex128
        points = tile[0] * (tile[1] // 2 + 1)
        return input.new_empty((points, input.shape[1], grad_output.shape[1]), dtype=complex_dtype)


def _register_fft_conv2d_backward(ops) -> None:
    if not fft_conv.backward_built():
        return  # kernels built before the op

    @torch.library.register_fake("densecnn::fft_conv2d_backward")
    def _(input, grad_output, spectrum, tile, valid, dilation, input_spectra=None):
        grad_input = _empty(grad_output, input.shape, _is_channels_last(grad_output))
        points = tile[0] * (tile[1] // 2 + 1)
        weight_spectrum = input.new_empty(
            (points, input.shape[1], grad_output.shape[1]), dtype=spectrum.dtype
        )
        return grad_input, weight_spectrum, grad_output.new_empty((grad_output.shape[1],))


def _register_fft_conv2d_with_input_spectra(ops) -> None:
    if not fft_conv.backward_built():
        return  # kernels built before the op

    @torch.library.register_fake("densecnn::fft_conv2d_with_input_spectra")
    def _(input, weight, spectrum, bias, tile, valid, dilation):
        out = output_size(tuple(input.shape[2:]), tuple(weight.shape[2:]), tuple(dilation))
        y = _empty(input, (input.shape[0], weight.shape[0], *out), _is_channels_last(input))
        kernel = tuple(weight.shape[2:])
        tiles = fft_conv._tiles(input.shape, tuple(tile), tuple(valid), kernel, tuple(dilation))
        points = tile[0] * (tile[1] // 2 + 1)
        return y, input.new_empty((tiles * points * input.shape[1] * 2,))


def _register_winograd_conv(ops) -> None:
    @torch.library.register_fake("densecnn::winograd_conv")
    def _(input, weight, kernel, bias, dilation, m, padding=()):
        pads = padding or [0] * len(dilation)
        out = (s + 2 * p - 2 * d for s, p, d in zip(input.shape[2:], pads, dilation))
        return _empty(input, (input.shape[0], weight.shape[0], *out), _is_channels_last(input))

    def setup(ctx, inputs, output):
        input, weight, _kernel, bias, ctx.dilation, _m, *padding = inputs
        ctx.padding = tuple(padding[0]) if padding and padding[0] else None
        ctx.has_bias = bias is not None
        ctx.save_for_backward(input, weight)

    def backward(ctx, grad_y):
        # The direct conv's gradients (torch's convolution backward); a training plan picks a conv's gradient
        # solvers apart (densecnn.ops.gradients), this is the op's own formula (and its double backward).
        input, weight = ctx.saved_tensors
        needs = ctx.needs_input_grad
        grad_x, grad_w, grad_b = native.conv_backward(
            grad_y.contiguous(memory_format=layout.layout_of(input)),
            input,
            weight,
            ctx.dilation,
            (needs[0], needs[1], ctx.has_bias and needs[3]),
            ctx.padding,
        )
        return grad_x, grad_w, None, grad_b, None, None, None

    torch.library.register_autograd("densecnn::winograd_conv", backward, setup_context=setup)


def _register_winograd_conv_weight_grad(ops) -> None:
    @torch.library.register_fake("densecnn::winograd_conv_weight_grad")
    def _(input, grad_output, dilation, m):
        points = (m + 2) ** (input.dim() - 2)
        k = grad_output.shape[1]
        return input.new_empty((points, input.shape[1], k)), input.new_empty((k,))


def _register_channels_first(ops) -> None:
    @torch.library.register_fake("densecnn::channels_first")
    def _(x):
        return torch.empty(x.shape, dtype=x.dtype, device=x.device)

    def backward(ctx, grad):
        # the same values, laid out as the input was: the gradient flows on through channels-last layers, whose
        # backward kernels read it without a conversion of their own
        return layout.channels_last(grad)

    torch.library.register_autograd("densecnn::channels_first", backward)


def _register_channels_last(ops) -> None:
    @torch.library.register_fake("densecnn::channels_last")
    def _(x):
        return _empty(x, x.shape, True)

    def backward(ctx, grad):
        return layout.contiguous(grad)

    torch.library.register_autograd("densecnn::channels_last", backward)


if ext.available():
    for _register in (
        _register_max_pool,
        _register_max_pool_backward,
        _register_avg_pool,
        _register_avg_pool_backward,
        _register_conv2d,
        _register_conv2d_backward,
        _register_direct_conv,
        _register_fft_conv2d,
        _register_fft_conv2d_input_grad,
        _register_fft_conv2d_weight_spectrum,
        _register_fft_conv2d_backward,
        _register_fft_conv2d_with_input_spectra,
        _register_winograd_conv,
        _register_winograd_conv_weight_grad,
        _register_channels_first,
        _register_channels_last,
    ):
        _register(torch.ops.densecnn)
