"""torch's own ops as densecnn runs them: a volume's depthwise conv along one axis, run as a 2-D conv of a view,
equals the tap-by-tap sum and differentiates as torch's 3-D conv does."""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from densecnn.ops import native
from tests.tolerances import assert_close_relative


def _taps(x: torch.Tensor, weight: torch.Tensor, bias, dilation, groups: int) -> torch.Tensor:
    """Independent reference: each output channel an explicit sum over its group's input channels and the dilated
    window's taps."""
    k, per_group, *kernel = weight.shape
    out = [s - (t - 1) * d for s, t, d in zip(x.shape[2:], kernel, dilation, strict=True)]
    y = torch.zeros(x.shape[0], k, *out, dtype=x.dtype)
    outputs_per_group = k // groups
    for channel in range(k):
        first = channel // outputs_per_group * per_group
        for c, tap in itertools.product(range(per_group), itertools.product(*(range(t) for t in kernel))):
            window = x[
                (slice(None), first + c, *(slice(t * d, t * d + o) for t, d, o in zip(tap, dilation, out)))
            ]
            y[:, channel] += weight[(channel, c, *tap)] * window
    return y if bias is None else y + bias.view(1, -1, 1, 1, 1)


@st.composite
def depthwise_problems(draw):
    """A depthwise conv of a volume along one axis (or a 1×1×1 one), 1-2 outputs per channel, dilations 1-3."""
    seed = draw(st.integers(0, 2**31 - 1))
    generator = torch.Generator().manual_seed(seed)
    channels, multiplier = draw(st.integers(1, 4)), draw(st.integers(1, 2))
    axis, taps = draw(st.integers(0, 2)), draw(st.integers(1, 6))
    dilation = tuple(draw(st.integers(1, 3)) for _ in range(3))
    kernel = [1, 1, 1]
    kernel[axis] = taps
    size = [(t - 1) * d + draw(st.integers(1, 6)) for t, d in zip(kernel, dilation, strict=True)]
    x = torch.randn(draw(st.integers(1, 2)), channels, *size, generator=generator, dtype=torch.float64)
    weight = torch.randn(channels * multiplier, 1, *kernel, generator=generator, dtype=torch.float64)
    bias = (
        torch.randn(channels * multiplier, generator=generator, dtype=torch.float64)
        if draw(st.booleans())
        else None
    )
    return x, weight, bias, dilation, channels


@settings(max_examples=80, deadline=None)
@given(problem=depthwise_problems())
def test_a_depthwise_conv_along_one_axis_equals_the_tap_sum(problem):
    x, weight, bias, dilation, groups = problem
    if groups > 1:
        assert native._depthwise_along_one_axis(x, weight, groups)  # the path under test
    y = native.conv(x, weight, bias, dilation, groups)
    assert y.is_contiguous()
    assert_close_relative(y, _taps(x, weight, bias, dilation, groups), 1e-12, floor=1.0)


def test_its_gradients_are_torchs():
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(2, 3, 5, 9, 7, dtype=torch.float64, generator=generator, requires_grad=True)
    weight = torch.randn(6, 1, 1, 4, 1, dtype=torch.float64, generator=generator, requires_grad=True)
    bias = torch.randn(6, dtype=torch.float64, generator=generator, requires_grad=True)
    assert torch.autograd.gradcheck(lambda *a: native.conv(*a, (1, 2, 1), 3), (x, weight, bias))
    grad_y = torch.randn(2, 6, 5, 3, 7, dtype=torch.float64, generator=generator)
    ours = torch.autograd.grad(native.conv(x, weight, bias, (1, 2, 1), 3), (x, weight, bias), grad_y)
    theirs = torch.autograd.grad(
        F.conv3d(x, weight, bias, dilation=(1, 2, 1), groups=3), (x, weight, bias), grad_y
    )
    for a, b in zip(ours, theirs, strict=True):
        assert_close_relative(a, b, 1e-12, floor=1.0)


def test_channels_last_volumes_and_wider_kernels_take_torchs_3d_conv():
    weight = torch.randn(4, 1, 3, 3, 1)
    x = torch.randn(1, 4, 6, 6, 6)
    assert not native._depthwise_along_one_axis(x, weight, 4)  # two axes spanned
    assert not native._depthwise_along_one_axis(
        x.contiguous(memory_format=torch.channels_last_3d), torch.randn(4, 1, 3, 1, 1), 4
    )
