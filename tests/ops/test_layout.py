"""Memory-format helpers: a channels-last tensor's conversion to NC* memory, block by block of pixels."""

from __future__ import annotations

import pytest
import torch

from densecnn.ops import layout


@pytest.mark.parametrize(
    ("shape", "fmt"),
    [
        ((2, 20, 100, 93), torch.channels_last),  # pixels not a multiple of the block
        ((1, 32, 160, 160), torch.channels_last),
        ((2, 17, 20, 30, 40), torch.channels_last_3d),
        ((2, 3, 20, 30, 40), torch.channels_last_3d),  # few channels: torch's copy
        ((1, 1, 300, 300), torch.channels_last),  # one channel: already NC*
        ((1, 4, 8, 8), torch.channels_last),  # small: torch's copy
    ],
)
def test_contiguous_gives_the_same_values_in_nc_memory(shape, fmt):
    x = torch.randn(shape).contiguous(memory_format=fmt)
    y = layout.contiguous(x)
    assert y.is_contiguous()
    assert torch.equal(y, x)


def test_contiguous_keeps_the_autograd_graph():
    x = torch.randn(1, 6, 100, 100).contiguous(memory_format=torch.channels_last).requires_grad_()
    y = layout.contiguous(x)
    (y * torch.arange(6.0).view(1, 6, 1, 1)).sum().backward()
    assert torch.equal(x.grad, torch.arange(6.0).view(1, 6, 1, 1).expand(1, 6, 100, 100))
