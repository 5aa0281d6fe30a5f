"""The fft solver's input gradient, the adjoint of overlap-save on the forward's tiles, against torch's conv input
gradient; the kernel spectrum computed once per step for the forward and the input gradient."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tolerances import RELATIVE, assert_close_relative

from densecnn.ops import fft_conv, gradients
from densecnn.ops.solvers import ConvOp

pytestmark = pytest.mark.skipif(not fft_conv.built(), reason="densecnn's kernels are not built")

PROBLEMS = [  # (C, K, kernel, dilation, input H×W, padding, channels_last, batch)
    (5, 7, (3, 3), (2, 2), (30, 27), (0, 0), False, 2),
    (20, 18, (5, 5), (4, 4), (50, 41), (0, 0), True, 1),
    (3, 4, (7, 7), (3, 3), (40, 40), (2, 5), False, 2),
    (17, 33, (4, 2), (1, 3), (19, 23), (1, 0), True, 1),
    (9, 6, (2, 6), (5, 1), (31, 18), (6, 3), False, 1),  # a padding wider than the kernel's reach
]


def _torch_input_gradient(x, weight, grad_y, dilation, padding):
    x = x.detach().requires_grad_()
    (grad_x,) = torch.autograd.grad(F.conv2d(x, weight, dilation=dilation, padding=padding), x, grad_y)
    return grad_x


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("gpu_loops", [False, True])
@pytest.mark.parametrize("problem", PROBLEMS)
def test_input_gradient_equals_torchs(problem, gpu_loops, dtype):
    c, k, kernel, dilation, size, padding, channels_last, batch = problem
    generator = torch.Generator().manual_seed(sum(size))
    x = torch.randn(batch, c, *size, dtype=dtype, generator=generator)
    weight = torch.randn(k, c, *kernel, dtype=dtype, generator=generator)
    layout = torch.channels_last if channels_last else torch.contiguous_format
    out = [s + 2 * p - (kk - 1) * d for s, p, kk, d in zip(size, padding, kernel, dilation)]
    grad_y = torch.randn(batch, k, *out, dtype=dtype, generator=generator).contiguous(memory_format=layout)
    expected = _torch_input_gradient(x, weight, grad_y, dilation, padding)
    previous = torch.ops.densecnn._use_gpu_loops_on_cpu(gpu_loops)
    try:
        grad_x = fft_conv.input_gradient(grad_y, weight, dilation, padding)
    finally:
        torch.ops.densecnn._use_gpu_loops_on_cpu(previous)
    assert grad_x.is_contiguous(memory_format=layout)  # written in the output gradient's layout
    assert_close_relative(grad_x, expected, RELATIVE[dtype], floor=1.0)


def test_tiles_in_several_groups_overlap_add_into_one_gradient(monkeypatch):
    """Many tiles over several groups of the kernels: the overlap-add across group borders."""
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(2, 16, 120, 110, dtype=torch.float64, generator=generator)
    weight = torch.randn(8, 16, 5, 5, dtype=torch.float64, generator=generator)
    grad_y = torch.randn(2, 8, 104, 94, dtype=torch.float64, generator=generator)
    monkeypatch.setattr(fft_conv, "MAX_TILE", 9)  # small tiles: hundreds of them
    expected = _torch_input_gradient(x, weight, grad_y, (4, 4), (0, 0))
    assert_close_relative(fft_conv.input_gradient(grad_y, weight, (4, 4)), expected, 1e-12, floor=1.0)


@pytest.mark.parametrize("padding", [(0, 0), (1, 2), (4, 1)])
def test_the_padded_op_passes_gradcheck(padding):
    """Its input gradient is the adjoint on the forward's tiles, with the forward's spectrum (float64)."""
    generator = torch.Generator().manual_seed(5)
    x = torch.randn(1, 2, 9, 8, dtype=torch.float64, generator=generator, requires_grad=True)
    weight = torch.randn(3, 2, 3, 4, dtype=torch.float64, generator=generator)
    tile, dilation = (6, 7), (2, 1)
    spectrum = fft_conv._spectrum(weight, tile, torch.float64)
    valid = [t - k + 1 for t, k in zip(tile, weight.shape[2:])]

    def conv(x):
        return torch.ops.densecnn.fft_conv2d(x, weight, spectrum, None, tile, valid, dilation, padding)

    assert torch.autograd.gradcheck(conv, (x,))


def test_a_training_step_computes_each_kernel_spectrum_once(monkeypatch):
    calls = []
    spectrum = fft_conv._spectrum
    monkeypatch.setattr(fft_conv, "_spectrum", lambda *a: calls.append(a[1]) or spectrum(*a))
    weight = torch.randn(6, 4, 5, 5, dtype=torch.float64, requires_grad=True)
    x = torch.randn(1, 4, 40, 40, dtype=torch.float64, requires_grad=True)
    op = ConvOp(weight, None, (3, 3), 1)
    y = gradients.conv(op, x, "fft", input_solver="fft", weight_solver="fft")
    grad_y = torch.randn_like(y)
    y.backward(grad_y)
    assert len(calls) == 1  # the forward's, reused by the input gradient (the weight gradient needs none)
    x_ref, w_ref = x.detach().requires_grad_(), weight.detach().requires_grad_()
    F.conv2d(x_ref, w_ref, dilation=3).backward(grad_y)
    assert_close_relative(x.grad, x_ref.grad, 1e-12, floor=1.0)
    assert_close_relative(weight.grad, w_ref.grad, 1e-12, floor=1.0)


def test_the_next_step_takes_the_updated_weights_spectrum():
    """No spectrum outlives its step: after an in-place update, forward and gradient use the new weight."""
    weight = torch.randn(4, 3, 3, 3, dtype=torch.float64, requires_grad=True)
    x = torch.randn(1, 3, 20, 20, dtype=torch.float64, requires_grad=True)
    for _ in range(2):
        y = gradients.conv(
            ConvOp(weight, None, (2, 2), 1), x, "fft", input_solver="fft", weight_solver="native"
        )
        y.sum().backward()
        x_ref = x.detach().requires_grad_()
        expected = F.conv2d(x_ref, weight.detach(), dilation=2)
        assert_close_relative(y.detach(), expected, 1e-12, floor=1.0)
        expected.sum().backward()
        assert_close_relative(x.grad, x_ref.grad, 1e-12, floor=1.0)
        x.grad = None
        with torch.no_grad():
            weight.data.mul_(-1.5)  # through .data: no version bump


def test_the_op_checks_its_arguments():
    spectrum = torch.zeros(12 * 7, 3, 4, dtype=torch.complex64)
    with pytest.raises(RuntimeError, match="output gradient must be"):
        torch.ops.densecnn.fft_conv2d_input_grad(
            torch.zeros(1, 4, 9, 9), spectrum, [20, 20], [12, 12], [10, 10], [1, 1], [0, 0]
        )
    with pytest.raises(RuntimeError, match="K = its channels"):
        torch.ops.densecnn.fft_conv2d_input_grad(
            torch.zeros(1, 5, 18, 18), spectrum, [20, 20], [12, 12], [10, 10], [1, 1], [0, 0]
        )
