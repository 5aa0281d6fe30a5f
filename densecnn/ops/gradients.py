"""A conv's input and weight gradients, each by its own solver, chosen per layer separately from the forward's.

The gradients of a stride-1 dilated conv y = x ⋆ w are two more convolutions: the input gradient is the output
gradient, zero-padded, correlated with the flipped, transposed kernel; the weight gradient correlates the input with
the output gradient. Which algorithm computes each fastest is a question of its own: the plain conv that wins a
layer's forward may lose its weight gradient to the frequency domain, whose cost does not grow with the kernel. A
training plan (:mod:`densecnn.ops.plan`) therefore picks, per conv, a forward solver (:mod:`densecnn.ops.solvers`),
an input-gradient solver and a weight-gradient solver, each from its own times (the cost model's predictions, or
the tuning step's timings when tuning).

Gradient solvers:
- ``native``: torch's convolution backward (any conv, 1-3 spatial axes), both gradients;
- ``fft``: the frequency domain on overlap-save tiles (:mod:`densecnn.ops.fft_conv`: the input gradient is the
  adjoint of overlap-save on the forward's tiles with the forward's kernel spectrum, the weight gradient Σ over the
  tiles of X · conj(G)), both gradients, where the ``fft`` solver applies;
- ``winograd``: 3×3 and 3×3×3 convs: the input gradient as the Winograd conv of the output gradient (its padding
  read as zeros) with the flipped, transposed kernel, the weight gradient as Gᵀ·(Σ over tiles of V[ξ]ᵀ z[ξ])·G
  (:func:`densecnn.ops.winograd.input_gradient`, :func:`~densecnn.ops.winograd.weight_gradient`).

Every combination gives the same gradients to rounding. A double backward (a gradient of the gradients, with
``create_graph=True``) runs torch's differentiable formula.

>>> from densecnn.ops.solvers import ConvOp
>>> w = torch.randn(8, 4, 7, 7, requires_grad=True)
>>> x = torch.randn(1, 4, 60, 60)
>>> y = conv(ConvOp(w, None, (4, 4), 1), x, "native", input_solver=None, weight_solver="fft")
>>> y.sum().backward()  # w.grad == that of F.conv2d(x, w, dilation=4) to rounding
"""

from __future__ import annotations

import torch

from . import ext, fft_conv, native, solvers, weight_cache, winograd
from .layout import layout_of
from .solvers import ConvOp

SOLVERS = ("native", "fft", "winograd")  # the gradient solvers, native first
DIRECTIONS = ("grad_input", "grad_weight")  # their names in timing tables (find step, cost model)


def applies(name: str, op) -> bool:
    """Whether gradient solver ``name`` can compute ``op``'s gradients."""
    if name == "native":
        return True
    if name == "fft":
        return fft_conv.applies(op)
    return winograd.applies(op) and ext.available()


def candidates(op, allowed: set[str]) -> list[str]:
    """The gradient solvers that can run ``op`` among the ``allowed`` solver names; a choice only for a conv that
    has more than one (else its forward solver's own backward runs)."""
    if not isinstance(op, ConvOp):
        return []
    return [name for name in SOLVERS if name in allowed | {"native"} and applies(name, op)]


def bias_gradient(grad_y: torch.Tensor) -> torch.Tensor:
    """(K,) the bias's gradient: ∂L/∂y (N, K, *S) summed over every axis but the channels.

    A channels-last ∂L/∂y is one (pixels, K) matrix in memory, and torch sums its rows 3-4× slower than those of the
    same values read as wider rows: it is summed as rows of d pixels' channels (d = 512 // K), then the d partial
    sums of each channel, and the pixels that do not fill a last row of d (a 383² map has no divisor but 383) are
    summed apart. The same sum to rounding.

    >>> grad_y = torch.randn(2, 8, 30, 30).contiguous(memory_format=torch.channels_last)
    >>> bias_gradient(grad_y).shape  # == grad_y.sum((0, 2, 3)) to rounding
    torch.Size([8])
    """
    k = grad_y.shape[1]
    pixels_last = grad_y.movedim(1, -1)  # (N, *S, K)
    if grad_y.dim() < 3 or k == 0 or not pixels_last.is_contiguous():
        return grad_y.sum([0, *range(2, grad_y.dim())])
    rows = pixels_last.reshape(-1, k)  # (pixels, K)
    width = max(1, 512 // k)
    whole = rows.shape[0] // width * width  # the pixels in rows of `width`
    grad_b = rows[:whole].reshape(-1, width * k).sum(0).view(width, k).sum(0)
    return grad_b + rows[whole:].sum(0) if whole < rows.shape[0] else grad_b


def input_gradient(name: str, grad_y: torch.Tensor, x: torch.Tensor, op: ConvOp) -> torch.Tensor:
    """∂L/∂x (N, C, *S) from ∂L/∂y (N, K, *S') by gradient solver ``name``."""
    if name == "fft" and not torch.is_grad_enabled():
        return fft_conv.input_gradient(grad_y, op.weight, op.dilation).contiguous(memory_format=layout_of(x))
    if name == "winograd" and not torch.is_grad_enabled():
        return winograd.input_gradient(grad_y, op.weight, op.dilation).contiguous(memory_format=layout_of(x))
    grad_x, _, _ = native.conv_backward(grad_y, x, op.weight, op.dilation, (True, False, False))
    return grad_x


def weight_gradient(
    name: str, grad_y: torch.Tensor, x: torch.Tensor, op: ConvOp
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """∂L/∂w (K, C/groups, *k) from ∂L/∂y and the input x, by gradient solver ``name``; and ∂L/∂b (K,) where the
    solver has it on the way (None: sum ∂L/∂y, :func:`bias_gradient`)."""
    if name == "fft" and not torch.is_grad_enabled():
        return fft_conv.weight_gradient(grad_y, x, op.kernel, op.dilation), None
    if name == "winograd" and not torch.is_grad_enabled():
        return winograd.weight_gradient(grad_y, x, op.dilation)
    _, grad_w, _ = native.conv_backward(grad_y, x, op.weight, op.dilation, (False, True, False))
    return grad_w, None


def _both_by_fft(input_solver: str, weight_solver: str, needs) -> bool:
    """Whether both gradients are wanted of the ``fft`` solver, which computes them in one pass over the tiles
    (:func:`densecnn.ops.fft_conv.gradients`; not in a double backward, which takes torch's formulas)."""
    return (
        input_solver == weight_solver == "fft"
        and needs[0]
        and needs[1]
        and not torch.is_grad_enabled()
        and fft_conv.backward_built()
    )


class _Conv(torch.autograd.Function):
    """The forward by one solver, the input and weight gradients by others."""

    @staticmethod
    def forward(
        ctx, x, weight, bias, dilation, groups, forward_solver, input_solver, weight_solver, memory_format
    ):
        op = ConvOp(weight, bias, dilation, groups)
        ctx.save_for_backward(x, weight)
        ctx.dilation, ctx.groups, ctx.has_bias = dilation, groups, bias is not None
        ctx.input_solver, ctx.weight_solver = input_solver or "native", weight_solver
        ctx.spectra = {}  # the fft kernel spectra of this step, computed once for the forward and input gradient
        # the input's tile spectra, kept by an fft forward for an fft weight gradient
        ctx.input_spectra = None
        with weight_cache.training_forward(), fft_conv.shared_spectra(ctx.spectra):
            if forward_solver == "fft" and _both_by_fft(
                input_solver, weight_solver, (x.requires_grad, weight.requires_grad)
            ):
                y, ctx.input_spectra = fft_conv.conv2d_keeping_spectra(op, x)
                return y.contiguous(memory_format=memory_format or layout_of(x))
            return solvers.run(forward_solver, op, x, memory_format)

    @staticmethod
    def backward(ctx, grad_y):
        x, weight = ctx.saved_tensors
        op = ConvOp(weight, None, ctx.dilation, ctx.groups)
        needs = ctx.needs_input_grad
        # In the input's layout, where the forward ran: the transform solvers read it faster there and write the
        # input gradient in it (the score map's gradient arrives NC*, converting the larger input gradient costs more)
        grad_y = grad_y.contiguous(memory_format=layout_of(x))
        together = _both_by_fft(ctx.input_solver, ctx.weight_solver, needs)
        wants_bias = ctx.has_bias and needs[2]
        with fft_conv.shared_spectra(ctx.spectra):
            if together:  # the bias's gradient too, from the output gradient's transformed tiles
                grad_x, grad_w, grad_b = fft_conv.gradients(
                    grad_y, x, op.weight, op.dilation, input_spectra=ctx.input_spectra
                )
            else:
                grad_x = input_gradient(ctx.input_solver, grad_y, x, op) if needs[0] else None
        ctx.spectra.clear()  # the spectrum's buffer free for the weight gradient's
        ctx.input_spectra = None
        if not together:
            grad_w, grad_b = weight_gradient(ctx.weight_solver, grad_y, x, op) if needs[1] else (None, None)
            if wants_bias and grad_b is None:
                grad_b = bias_gradient(grad_y)
        return grad_x, grad_w, grad_b if wants_bias else None, None, None, None, None, None, None


def conv(
    op: ConvOp,
    x: torch.Tensor,
    forward_solver: str,
    *,
    input_solver: str | None,
    weight_solver: str,
    memory_format: torch.memory_format | None = None,
) -> torch.Tensor:
    """``op`` on x by ``forward_solver``, differentiable with its input gradient by ``input_solver`` (None: the
    input needs none) and its weight gradient by ``weight_solver``; the output in ``memory_format`` (default x's)."""
    if x.dtype != op.weight.dtype:  # the input's dtype is the compute dtype (as solvers.run casts)
        bias = None if op.bias is None else op.bias.to(x.dtype)
        op = ConvOp(op.weight.to(x.dtype), bias, op.dilation, op.groups)
    return _Conv.apply(
        x,
        op.weight,
        op.bias,
        tuple(op.dilation),
        op.groups,
        forward_solver,
        input_solver,
        weight_solver,
        memory_format,
    )
