"""The direct convolution for few input channels (solver "direct", cuda_ext/direct_conv*): against a literal loop
over the window taps, against patch scanning in whole signal, image and volume nets, with gradients (gradcheck and
the native ops' gradients), the CUDA per-element body on the CPU, and opcheck."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from torch import nn

import densecnn
from densecnn.ops import ext, solvers
from densecnn.ops.solvers import ConvOp, PoolOp
from tests.naive import literal_scan
from tests.tolerances import assert_close_relative, assert_equal_to_rounding

pytestmark = [
    pytest.mark.skipif(not ext.available(), reason="densecnn's kernels are not built"),
    pytest.mark.filterwarnings("ignore::densecnn.PatchSizeWarning"),
]
ops = torch.ops.densecnn


def _literal_conv(x, weight, bias, dilation):
    """(N, C, *S) -> (N, K, *S'): an explicit sum over input channels and window taps."""
    kernel = weight.shape[2:]
    out = [s - (k - 1) * d for s, k, d in zip(x.shape[2:], kernel, dilation)]
    y = torch.zeros(x.shape[0], weight.shape[0], *out, dtype=x.dtype)
    for c in range(x.shape[1]):
        for tap in itertools.product(*(range(k) for k in kernel)):
            window = tuple(slice(t * d, t * d + o) for t, d, o in zip(tap, dilation, out))
            source = x[(slice(None), slice(c, c + 1), *window)]  # (N, 1, *S')
            y += source * weight[(slice(None), c, *tap)].view(1, -1, *([1] * len(out)))
    return y + (0 if bias is None else bias.view(1, -1, *([1] * len(out))))


# (input shape, weight shape, dilation): 1-3 axes, output rows shorter and longer than a vector and than a run of
# columns, channel counts that do not fill a register block, dilations along one axis only.
CASES = [
    ((2, 1, 40), (5, 1, 3), (2,)),
    ((1, 2, 2600), (9, 2, 5), (3,)),  # rows split into runs of columns for the threads
    ((1, 3, 9, 37), (11, 3, 2, 3), (1, 3)),
    ((2, 2, 13, 5), (8, 2, 3, 3), (2, 1)),
    ((1, 1, 7, 9, 21), (16, 1, 3, 3, 3), (1, 1, 1)),
    ((1, 4, 9, 6, 19), (3, 4, 2, 1, 3), (3, 2, 4)),
    ((1, 16, 5, 6, 20), (3, 16, 1, 1, 1), (1, 1, 1)),  # a pointwise head: many input channels, one tap
    ((1, 3, 8, 31), (40, 3, 3, 3), (2, 2)),  # channels-last: two whole vectors of channels and half of one
]


def _channels_last(x: torch.Tensor) -> torch.Tensor:
    """x with a channel stride of 1 (what the kernels take as channels-last, signals included)."""
    return torch.empty_like(x.movedim(1, -1), memory_format=torch.contiguous_format).movedim(-1, 1).copy_(x)


@pytest.mark.parametrize("loops", ["cpu", "gpu"])
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("case", CASES)
def test_direct_conv_matches_a_literal_loop(case, dtype, channels_last, loops):
    """Both the vectorised CPU loops (their NC* and channels-last blockings: output channels in blocks of whole and
    half vectors, rows in blocks of pixels and what is left) and the CUDA kernel's per-element body (on the CPU)."""
    shape, weight_shape, dilation = case
    torch.manual_seed(0)
    x, w = torch.randn(shape, dtype=torch.float64), torch.randn(weight_shape, dtype=torch.float64)
    b = torch.randn(weight_shape[0], dtype=torch.float64)
    layout = _channels_last if channels_last else torch.Tensor.contiguous
    previous = ops._use_gpu_loops_on_cpu(loops == "gpu")
    try:
        for bias in (b, None):
            y = ext.direct_conv(
                layout(x.to(dtype)), w.to(dtype), None if bias is None else bias.to(dtype), dilation
            )
            expected = _literal_conv(x, w, bias, dilation)
            assert y.dtype == dtype and (y.stride(1) == 1) == channels_last
            assert_close_relative(y.double(), expected, 1e-12 if dtype == torch.float64 else 1e-5, 1.0)
    finally:
        ops._use_gpu_loops_on_cpu(previous)


@pytest.mark.parametrize("loops", ["cpu", "gpu"])
@pytest.mark.parametrize("channels", [1, 3])
def test_direct_conv_writes_channels_last_inputs_channels_last(channels, loops):
    """The output takes the input's layout: channels-last for a channel stride of 1, which a one-channel input has
    once made channels-last with ``.to(memory_format=...)`` (as a channels-last plan makes its input)."""
    torch.manual_seed(3)
    for shape, layout in (
        ((2, channels, 10, 21), torch.channels_last),
        ((1, channels, 6, 7, 19), torch.channels_last_3d),
    ):
        x = torch.randn(shape, dtype=torch.float64)
        w = torch.randn(12, channels, *([3] * (len(shape) - 2)), dtype=torch.float64)
        b = torch.randn(12, dtype=torch.float64)
        dilation = (2,) + (1,) * (len(shape) - 3)
        previous = ops._use_gpu_loops_on_cpu(loops == "gpu")
        try:
            y = ext.direct_conv(x.to(memory_format=layout), w, b, dilation)
        finally:
            ops._use_gpu_loops_on_cpu(previous)
        assert y.stride(1) == 1 and y.is_contiguous(memory_format=layout)
        assert_equal_to_rounding(y, _literal_conv(x, w, b, dilation))
        assert ext.direct_conv(x, w, b, dilation).is_contiguous()  # NC* in, NC* out


@pytest.mark.parametrize("case", CASES[:1] + CASES[2:3] + CASES[4:])
def test_direct_conv_gradients(case):
    shape, weight_shape, dilation = case
    torch.manual_seed(1)
    x = torch.randn(shape, dtype=torch.float64, requires_grad=True)
    w = torch.randn(weight_shape, dtype=torch.float64, requires_grad=True)
    b = torch.randn(weight_shape[0], dtype=torch.float64, requires_grad=True)
    small = (x[..., :9].detach().clone().requires_grad_(), w, b)  # keeps gradcheck quick
    assert torch.autograd.gradcheck(lambda *a: ext.direct_conv(*a, dilation), small)
    assert torch.autograd.gradcheck(lambda x_, w_: ext.direct_conv(x_, w_, None, dilation), small[:2])


def test_opcheck():
    x = torch.randn(1, 2, 5, 6, 9, dtype=torch.float64, requires_grad=True)
    w = torch.randn(3, 2, 2, 2, 3, dtype=torch.float64, requires_grad=True)
    torch.library.opcheck(ops.direct_conv.default, (x, w, torch.randn(3, dtype=torch.float64), [1, 2, 2]))
    torch.library.opcheck(ops.direct_conv.default, (x[:, :, 0], w[:, :, 0], None, [2, 1]))


def test_direct_applies_to_ungrouped_convs_with_few_input_channels_or_one_tap():
    def conv(c_in, groups=1, axes=3, kernel=3):
        return ConvOp(torch.empty(8, c_in // groups, *([kernel] * axes)), None, (1,) * axes, groups)

    assert solvers.SOLVERS["direct"].applies(conv(1)) and solvers.SOLVERS["direct"].applies(conv(3, axes=2))
    assert not solvers.SOLVERS["direct"].applies(conv(solvers.DIRECT_MAX_CHANNELS + 1))
    assert not solvers.SOLVERS["direct"].applies(conv(4, groups=2))
    assert solvers.SOLVERS["direct"].applies(conv(64, kernel=1))
    assert not solvers.SOLVERS["direct"].applies(PoolOp("max_pool3d", (2, 2, 2), (1, 1, 1)))


def _net(dims: int, in_channels: int) -> tuple[nn.Module, tuple[int, ...]]:
    """A patch net whose first conv has few input channels and whose later layers pool and convolve."""
    conv, pool = getattr(nn, f"Conv{dims}d"), getattr(nn, f"MaxPool{dims}d")
    model = nn.Sequential(
        conv(in_channels, 5, 3), nn.ReLU(), pool(2), conv(5, 3, 2, dilation=1), nn.Tanh(), conv(3, 2, 2)
    )
    return model.double().eval(), (8,) * dims


@pytest.mark.parametrize(("dims", "in_channels"), [(1, 1), (2, 3), (3, 1)])
def test_nets_with_the_direct_first_conv_equal_patch_scanning(dims, in_channels):
    torch.manual_seed(dims)
    model, patch = _net(dims, in_channels)
    size = {1: (23,), 2: (9, 11), 3: (5, 7, 6)}[dims]
    x = torch.rand(2, in_channels, *size, dtype=torch.float64)
    dense = densecnn.convert(model, patch, padding_mode="reflect")
    dense.solver, dense.memory_format = "direct", "nchw"
    with torch.no_grad():
        scores = dense(x)
        used = [step.solver for step in dense.plan(dense.pad(x)).steps]
    assert used[0] == "direct", used
    assert_close_relative(scores, literal_scan(model, x, patch, "reflect"), 1e-10, 1.0)
    # gradients through the whole dense net equal those through the native ops
    grads = []
    for forced in ("direct", "native"):
        dense.solver = forced
        model.zero_grad()
        xg = x.clone().requires_grad_()
        dense(xg).square().sum().backward()
        grads.append([xg.grad] + [p.grad.clone() for p in model.parameters()])
    for direct_grad, native_grad in zip(*grads, strict=True):
        assert_close_relative(direct_grad, native_grad, 1e-10, 1.0)
    assert math.isfinite(float(scores.sum()))


def test_large_outputs_on_huge_pages_are_exact():
    """Outputs of several MB are allocated on huge pages where the system allows (cuda_ext/output_buffers.h): the
    direct conv and a fused pool still equal literal references there."""
    torch.manual_seed(2)
    x = torch.randn(1, 1, 40, 60, 70)
    w, b = torch.randn(16, 1, 3, 3, 3), torch.randn(16)
    y = ext.direct_conv(x, w, b, (1, 2, 1))  # (1, 16, 38, 56, 68): 9 MB
    assert y.nbytes > 8 << 20
    assert_close_relative(y.double(), _literal_conv(x.double(), w.double(), b.double(), (1, 2, 1)), 1e-5, 1.0)
    v = torch.randn(1, 16, 40, 60, 70)
    pooled = ext.pool_activation(v, (2, 2, 2), (1, 2, 2), "max", "relu", None)  # (1, 16, 39, 58, 68): 9 MB
    assert pooled.nbytes > 8 << 20
    taps = [v[:, :, a : a + 39, c : c + 58, e : e + 68] for a in (0, 1) for c in (0, 2) for e in (0, 2)]
    assert_equal_to_rounding(pooled, torch.stack(taps).amax(0).relu())
