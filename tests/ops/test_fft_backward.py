"""The fft solver's two gradients (and the bias's) in one pass over the tiles (``fft_conv2d_backward``,
:func:`fft_conv.gradients`) against torch's conv gradients and against the two ops that compute them apart, with and
without the input's tile spectra kept by the forward; the training step takes them when both gradients of a conv are
the fft solver's."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tolerances import RELATIVE, assert_close_relative

from densecnn.ops import fft_conv, gradients
from densecnn.ops.solvers import ConvOp

pytestmark = pytest.mark.skipif(not fft_conv.backward_built(), reason="densecnn's kernels are not built")

PROBLEMS = [  # (C, K, kernel, dilation, input H×W, channels_last, batch)
    (5, 7, (3, 3), (2, 2), (30, 27), False, 2),
    (20, 18, (5, 5), (4, 4), (50, 41), True, 1),
    (17, 33, (4, 2), (1, 3), (19, 23), True, 1),
    (3, 4, (7, 7), (3, 3), (40, 40), False, 2),
]


def _problem(problem, dtype):
    c, k, kernel, dilation, size, channels_last, batch = problem
    generator = torch.Generator().manual_seed(sum(size))
    layout = torch.channels_last if channels_last else torch.contiguous_format
    x = torch.randn(batch, c, *size, dtype=dtype, generator=generator).contiguous(memory_format=layout)
    weight = torch.randn(k, c, *kernel, dtype=dtype, generator=generator)
    out = [s - (kk - 1) * d for s, kk, d in zip(size, kernel, dilation)]
    grad_y = torch.randn(batch, k, *out, dtype=dtype, generator=generator).contiguous(memory_format=layout)
    return x, weight, grad_y, dilation


def _torch_gradients(x, weight, grad_y, dilation):
    """torch's (∂L/∂x, ∂L/∂w, ∂L/∂b) of a conv with a bias."""
    bias = torch.zeros(weight.shape[0], dtype=weight.dtype, requires_grad=True)
    x, weight = x.detach().requires_grad_(), weight.detach().requires_grad_()
    return torch.autograd.grad(F.conv2d(x, weight, bias, dilation=dilation), (x, weight, bias), grad_y)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("gpu_loops", [False, True])
@pytest.mark.parametrize("problem", PROBLEMS)
def test_both_gradients_equal_torchs(problem, gpu_loops, dtype):
    x, weight, grad_y, dilation = _problem(problem, dtype)
    expected = _torch_gradients(x, weight, grad_y, dilation)
    previous = torch.ops.densecnn._use_gpu_loops_on_cpu(gpu_loops)
    try:
        got = fft_conv.gradients(grad_y, x, weight, dilation)
    finally:
        torch.ops.densecnn._use_gpu_loops_on_cpu(previous)
    assert got[0].is_contiguous(memory_format=_layout(grad_y))  # written in the output gradient's layout
    for grad, torchs in zip(got, expected, strict=True):  # ∂L/∂x, ∂L/∂w, ∂L/∂b
        assert_close_relative(grad, torchs, RELATIVE[dtype], floor=1.0)


@pytest.mark.parametrize("problem", PROBLEMS)
def test_equal_to_the_two_ops_apart(problem):
    """The same transforms and products as fft_conv2d_input_grad and fft_conv2d_weight_spectrum, the output
    gradient's transformed once: equal to rounding (float64)."""
    x, weight, grad_y, dilation = _problem(problem, torch.float64)
    grad_x, grad_w, grad_b = fft_conv.gradients(grad_y, x, weight, dilation)
    apart_x = fft_conv.input_gradient(grad_y, weight, dilation)
    apart_w = fft_conv.weight_gradient(grad_y, x, tuple(weight.shape[2:]), dilation)
    assert_close_relative(grad_x, apart_x, 1e-13, floor=1.0)
    assert_close_relative(grad_w, apart_w, 1e-13, floor=1.0)
    assert_close_relative(grad_b, grad_y.sum((0, 2, 3)), 1e-13, floor=1.0)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("problem", PROBLEMS)
def test_the_forwards_input_spectra_spare_the_input_transform(problem, dtype):
    """The forward that keeps its input's tile spectra gives the forward's output, and the gradients that take them
    the gradients that transform the input again."""
    x, weight, grad_y, dilation = _problem(problem, dtype)
    bias = torch.randn(weight.shape[0], dtype=dtype)
    op = ConvOp(weight, bias, dilation, 1)
    y, spectra = fft_conv.conv2d_keeping_spectra(op, x)
    assert spectra is not None
    assert_close_relative(y, fft_conv.conv2d(op, x), 1e-13 if dtype == torch.float64 else 1e-6, floor=1.0)
    kept = fft_conv.gradients(grad_y, x, weight, dilation, input_spectra=spectra)
    for got, transformed in zip(kept, fft_conv.gradients(grad_y, x, weight, dilation), strict=True):
        assert_close_relative(got, transformed, 1e-13 if dtype == torch.float64 else 1e-6, floor=1.0)


def test_spectra_past_the_limit_are_not_kept(monkeypatch):
    x, weight, _, dilation = _problem(PROBLEMS[0], torch.float32)
    monkeypatch.setattr(fft_conv, "KEPT_SPECTRA_BYTES", 1000)
    y, spectra = fft_conv.conv2d_keeping_spectra(ConvOp(weight, None, dilation, 1), x)
    assert spectra is None
    assert_close_relative(y, F.conv2d(x, weight, dilation=dilation), RELATIVE[torch.float32], floor=1.0)


def test_tiles_in_several_groups(monkeypatch):
    """Hundreds of tiles over several groups of the kernels: the overlap-add across group borders, and the weight
    spectrum and the bias's gradient summed over the groups."""
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(2, 16, 120, 110, dtype=torch.float64, generator=generator)
    weight = torch.randn(8, 16, 5, 5, dtype=torch.float64, generator=generator)
    grad_y = torch.randn(2, 8, 104, 94, dtype=torch.float64, generator=generator)
    monkeypatch.setattr(fft_conv, "MAX_TILE", 9)  # small tiles
    expected = _torch_gradients(x, weight, grad_y, (4, 4))
    _, spectra = fft_conv.conv2d_keeping_spectra(ConvOp(weight, None, (4, 4), 1), x)
    for input_spectra in (None, spectra):
        got = fft_conv.gradients(grad_y, x, weight, (4, 4), input_spectra=input_spectra)
        for grad, torchs in zip(got, expected, strict=True):
            assert_close_relative(grad, torchs, 1e-12, floor=1.0)


@pytest.mark.parametrize("channels_last", [False, True])
def test_the_ops_pass_opcheck(channels_last):
    x, weight, grad_y, dilation = _problem(PROBLEMS[0][:5] + (channels_last, 2), torch.float32)
    spectrum = fft_conv._spectrum(weight, (8, 9), x.dtype).clone()
    tile, valid, bias = [8, 9], [8 - 3 + 1, 9 - 3 + 1], torch.randn(weight.shape[0])
    forward = (x, weight, spectrum, bias, tile, valid, list(dilation))
    torch.library.opcheck(torch.ops.densecnn.fft_conv2d_with_input_spectra, forward)
    _, spectra = torch.ops.densecnn.fft_conv2d_with_input_spectra(*forward)
    for input_spectra in (None, spectra):
        arguments = (x, grad_y, spectrum, tile, valid, list(dilation), input_spectra)
        torch.library.opcheck(torch.ops.densecnn.fft_conv2d_backward, arguments)


def test_the_op_checks_its_arguments():
    x = torch.randn(1, 3, 20, 20)
    spectrum = torch.zeros(12 * 7, 3, 4, dtype=torch.complex64)
    with pytest.raises(RuntimeError, match=r"output gradient must be \(1, K, 18, 18\)"):
        torch.ops.densecnn.fft_conv2d_backward(
            x, torch.zeros(1, 4, 9, 9), spectrum, [12, 12], [10, 10], [1, 1]
        )
    with pytest.raises(RuntimeError, match="K = its channels"):
        torch.ops.densecnn.fft_conv2d_backward(
            x, torch.zeros(1, 5, 18, 18), spectrum, [12, 12], [10, 10], [1, 1]
        )
    with pytest.raises(RuntimeError, match="input_spectra must be the 2016 values"):  # 4 tiles · 84 · 3 · 2
        torch.ops.densecnn.fft_conv2d_backward(
            x, torch.zeros(1, 4, 18, 18), spectrum, [12, 12], [10, 10], [1, 1], torch.zeros(100)
        )


@pytest.mark.parametrize("channels_last", [False, True])
def test_a_training_step_takes_both_gradients_in_one_pass(channels_last, monkeypatch):
    """A conv whose input and weight gradients are both the fft solver's gets them and its bias's from the one-pass
    op, equal to torch's."""
    x, weight, grad_y, dilation = _problem(PROBLEMS[1][:5] + (channels_last, 1), torch.float64)
    calls = []
    monkeypatch.setattr(fft_conv, "gradients", _counting(fft_conv.gradients, calls))
    monkeypatch.setattr(gradients, "bias_gradient", None)  # not called: the one-pass op gives the bias's
    x, w = x.detach().requires_grad_(), weight.detach().requires_grad_()
    b = torch.zeros(weight.shape[0], dtype=weight.dtype, requires_grad=True)
    y = gradients.conv(ConvOp(w, b, dilation, 1), x, "fft", input_solver="fft", weight_solver="fft")
    got = torch.autograd.grad(y, (x, w, b), grad_y)
    assert len(calls) == 1 and calls[0][1]["input_spectra"] is not None  # the forward's, kept
    for grad, torchs in zip(got, _torch_gradients(x, weight, grad_y, dilation), strict=True):
        assert_close_relative(grad, torchs, 1e-10, floor=1.0)


def _counting(function, calls):
    def counted(*args, **kwargs):
        calls.append((args, kwargs))
        return function(*args, **kwargs)

    return counted


def _layout(t: torch.Tensor) -> torch.memory_format:
    return (
        torch.channels_last if t.is_contiguous(memory_format=torch.channels_last) else torch.contiguous_format
    )
