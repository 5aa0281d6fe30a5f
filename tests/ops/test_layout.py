"""Memory-format helpers: conversions between channels-last and NC* memory (densecnn's transposition kernels)."""

from __future__ import annotations

import pytest
import torch

from densecnn.ops import ext, layout


@pytest.mark.parametrize(
    ("shape", "fmt"),
    [
        ((2, 20, 100, 93), torch.channels_last),  # pixels not a multiple of the block
        ((1, 32, 160, 160), torch.channels_last),
        ((2, 17, 20, 30, 40), torch.channels_last_3d),
        ((2, 3, 20, 30, 40), torch.channels_last_3d),
        ((1, 1, 300, 300), torch.channels_last),  # one channel: already NC*
        ((1, 4, 8, 8), torch.channels_last),  # small: torch's copy
    ],
)
def test_contiguous_gives_the_same_values_in_nc_memory(shape, fmt):
    x = torch.randn(shape).contiguous(memory_format=fmt)
    y = layout.contiguous(x)
    assert y.is_contiguous()
    assert torch.equal(y, x)


@pytest.mark.skipif(not ext.available(), reason="the compiled kernels are not built")
@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, torch.uint8, torch.int64])
def test_the_transposition_kernel_moves_every_element_size(dtype):
    # Element sizes 8, 2, 1 and 8 bytes: the kernel moves bits, so any dtype is exactly the strided copy's.
    x = (torch.randn(2, 9, 70, 90) * 50).to(dtype).contiguous(memory_format=torch.channels_last)
    y = torch.ops.densecnn.channels_first(x)
    assert y.is_contiguous() and y.dtype == dtype
    assert torch.equal(y, x.contiguous())


@pytest.mark.skipif(not ext.available(), reason="the compiled kernels are not built")
def test_the_transposition_kernel_passes_torchs_op_checks():
    x = torch.randn(2, 5, 70, 80).contiguous(memory_format=torch.channels_last)
    torch.library.opcheck(torch.ops.densecnn.channels_first.default, (x,))


def test_contiguous_keeps_the_autograd_graph():
    x = torch.randn(1, 6, 100, 100).contiguous(memory_format=torch.channels_last).requires_grad_()
    y = layout.contiguous(x)
    (y * torch.arange(6.0).view(1, 6, 1, 1)).sum().backward()
    assert torch.equal(x.grad, torch.arange(6.0).view(1, 6, 1, 1).expand(1, 6, 100, 100))


@pytest.mark.parametrize(
    "shape",
    [
        (2, 20, 100, 93),  # pixels not a multiple of the block
        (8, 32, 64, 64),
        (2, 17, 20, 30, 40),
        (2, 5, 3000),  # a signal: channels last in memory, though torch names no such format
        (1, 4, 8, 8),
    ],
)
def test_channels_last_gives_the_same_values_with_channels_last_in_memory(shape):
    x = torch.randn(shape)
    y = layout.channels_last(x)
    assert y.movedim(1, -1).is_contiguous()
    assert torch.equal(y, x)
    assert layout.channels_last(y) is y  # already so


@pytest.mark.skipif(not ext.available(), reason="the compiled kernels are not built")
@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, torch.uint8, torch.int64])
def test_the_kernel_to_channels_last_moves_every_element_size(dtype):
    x = (torch.randn(2, 9, 70, 90) * 50).to(dtype)
    y = torch.ops.densecnn.channels_last(x)
    assert y.is_contiguous(memory_format=torch.channels_last) and y.dtype == dtype
    assert torch.equal(y, x)
    torch.library.opcheck(torch.ops.densecnn.channels_last.default, (x.double(),))


def test_the_score_gradient_goes_back_channels_last():
    """The NC* gradient of channels-last scores made NC* (:func:`layout.contiguous`) returns channels-last, equal."""
    x = torch.randn(2, 32, 70, 70).contiguous(memory_format=torch.channels_last).requires_grad_()
    weights = torch.randn(2, 32, 70, 70)
    (layout.contiguous(x) * weights).sum().backward()
    assert x.grad.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(x.grad, weights)
