"""Memory-format helpers: a channels-last tensor's conversion to NC* memory (densecnn's transposition kernel)."""

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
