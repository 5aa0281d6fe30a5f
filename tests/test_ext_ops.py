"""densecnn's compiled kernels (densecnn/ops/ext.py, cuda_ext/) against independent naive references.

The references below slice the input once per tap and combine the slices with plain torch ops, scanning taps in
row-major window order — they share no code with the kernels nor with densecnn.ops.native.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from densecnn.ops import ext

DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU")),
]
ops = torch.ops.densecnn


@contextlib.contextmanager
def kernel_loops(loops: str):
    """Run the CPU ops with their vectorised CPU loops ("cpu") or with the CUDA kernels' per-element bodies
    ("gpu", cuda_ext/elements.h) — the latter is how the CUDA kernels' logic is tested without a GPU."""
    previous = ops._use_gpu_loops_on_cpu(loops == "gpu")
    try:
        yield
    finally:
        ops._use_gpu_loops_on_cpu(previous)


LOOPS = pytest.mark.parametrize("loops", ["cpu", "gpu"])


def test_extension_is_built():
    # setup.py always builds the CPU extension: if this fails, the build or the import is broken.
    assert ext.available(), ext.load_error()
    assert ext.load_error() is None


# ---- naive references ----


def taps(x, kernel, dilation):
    """The kh·kw shifted views of x, in row-major window order: tap (a, b) is x[..., i + a·dh, j + b·dw]."""
    (kh, kw), (dh, dw) = kernel, dilation
    oh, ow = x.shape[2] - (kh - 1) * dh, x.shape[3] - (kw - 1) * dw
    return [x[:, :, a * dh : a * dh + oh, b * dw : b * dw + ow] for a in range(kh) for b in range(kw)]


def max_reference(x, kernel, dilation):
    """(max, argmax tap) by scanning taps with torch's rule: replace when larger or NaN."""
    views = taps(x, kernel, dilation)
    best, arg = views[0].clone(), torch.zeros(views[0].shape, dtype=torch.long)
    for t, view in enumerate(views[1:], start=1):
        take = (view > best) | view.isnan()
        best, arg = torch.where(take, view, best), torch.where(take, t, arg)
    return best, arg


def max_grad_reference(x, kernel, dilation, grad_y):
    """Gradient of max pooling: each output's gradient lands on its argmax input pixel."""
    _, arg = max_reference(x, kernel, dilation)
    kw, (dh, dw) = kernel[1], dilation
    n, c, oh, ow = arg.shape
    rows = torch.arange(oh).view(1, 1, oh, 1) + arg // kw * dh
    cols = torch.arange(ow).view(1, 1, 1, ow) + arg % kw * dw
    flat = (rows * x.shape[3] + cols).flatten(2)  # (N, C, H'·W') input pixel of each output
    grad = torch.zeros(n, c, x.shape[2] * x.shape[3], dtype=x.dtype)
    grad.scatter_add_(2, flat, grad_y.flatten(2))
    return grad.view_as(x)


def avg_reference(x, kernel, dilation, divisor=None):
    return sum(taps(x, kernel, dilation)) / (divisor or kernel[0] * kernel[1])


def conv_reference(x, weight, bias, dilation, groups):
    """Convolution as unfold + matmul, one group at a time."""
    k, cg, kh, kw = weight.shape
    n, _, h, w = x.shape
    oh, ow = h - (kh - 1) * dilation[0], w - (kw - 1) * dilation[1]
    cols = F.unfold(x, (kh, kw), dilation=dilation)  # (N, C·kh·kw, H'·W')
    outs = []
    for g in range(groups):
        cols_g = cols[:, g * cg * kh * kw : (g + 1) * cg * kh * kw]
        weight_g = weight[g * (k // groups) : (g + 1) * (k // groups)].reshape(k // groups, -1)
        outs.append(weight_g @ cols_g)
    y = torch.cat(outs, 1).view(n, k, oh, ow)
    return y if bias is None else y + bias.view(1, -1, 1, 1)


ACTIVATE = {"none": lambda v: v, "relu": torch.relu, "tanh": torch.tanh}


def in_layout(x, layout):
    if layout == "channels_last":
        return x.contiguous(memory_format=torch.channels_last)
    if layout == "strided":  # a non-contiguous view: every other column of a wider tensor
        wide = torch.empty(*x.shape[:3], 2 * x.shape[3], dtype=x.dtype)
        wide[..., ::2] = x
        return wide[..., ::2]
    return x.contiguous()


@st.composite
def pool_cases(draw):
    kernel = (draw(st.integers(1, 4)), draw(st.integers(1, 4)))
    dilation = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    shape = (
        draw(st.integers(1, 2)),
        draw(st.integers(1, 3)),
        (kernel[0] - 1) * dilation[0] + draw(st.integers(1, 6)),
        (kernel[1] - 1) * dilation[1] + draw(st.integers(1, 6)),
    )
    layout = draw(st.sampled_from(["nchw", "channels_last", "strided"]))
    seed = draw(st.integers(0, 2**16))
    return kernel, dilation, shape, layout, seed


def tied_input(shape, seed, dtype=torch.float64):
    """Few distinct values, so windows have ties (the argmax rule matters)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(-3, 4, shape, generator=generator).to(dtype)


# ---- equality with the references ----


@LOOPS
@settings(max_examples=50, deadline=None)
@given(pool_cases(), st.sampled_from(ext.ACTIVATIONS), st.booleans())
def test_max_pool_matches_reference(loops, case, activation, with_nan):
    with kernel_loops(loops):
        check_max_pool(case, activation, with_nan)


def check_max_pool(case, activation, with_nan):
    kernel, dilation, shape, layout, seed = case
    x = tied_input(shape, seed)
    if with_nan:
        x.view(-1)[seed % x.numel()] = float("nan")
        x.view(-1)[(seed * 7) % x.numel()] = float("nan")
    x = in_layout(x, layout).requires_grad_()
    y = ext.pool2d_activation(x, kernel, dilation, "max", activation)
    best, _ = max_reference(x.detach(), kernel, dilation)
    torch.testing.assert_close(y, ACTIVATE[activation](best), rtol=0, atol=0, equal_nan=True)
    grad_y = tied_input(y.shape, seed + 1)
    (grad_x,) = torch.autograd.grad(y, x, grad_y)
    local_grad = {"none": torch.ones_like(y), "relu": (y > 0).double(), "tanh": 1 - y.detach() ** 2}[
        activation
    ]
    expected = max_grad_reference(x.detach(), kernel, dilation, grad_y * local_grad)
    torch.testing.assert_close(grad_x, expected, rtol=1e-12, atol=1e-12, equal_nan=True)


@LOOPS
@settings(max_examples=40, deadline=None)
@given(pool_cases(), st.sampled_from(ext.ACTIVATIONS), st.sampled_from([None, 1, 5]))
def test_avg_pool_matches_reference(loops, case, activation, divisor):
    with kernel_loops(loops):
        check_avg_pool(case, activation, divisor)


def check_avg_pool(case, activation, divisor):
    kernel, dilation, shape, layout, seed = case
    x = in_layout(
        torch.randn(shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed)), layout
    )
    x.requires_grad_()
    y = ext.pool2d_activation(x, kernel, dilation, "avg", activation, divisor)
    x_ref = x.detach().clone().requires_grad_()
    y_ref = ACTIVATE[activation](avg_reference(x_ref, kernel, dilation, divisor))
    torch.testing.assert_close(y, y_ref, rtol=1e-12, atol=1e-12)
    grad_y = torch.randn_like(y_ref)
    (grad_x,) = torch.autograd.grad(y, x, grad_y)
    y_ref.backward(grad_y)
    torch.testing.assert_close(grad_x, x_ref.grad, rtol=1e-12, atol=1e-12)


@LOOPS
@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
def test_max_pool_float32_equals_torch(loops, layout):
    # The benchmark shapes' little brother: k=8/d=1 and k=2/d=8 windows, bitwise equal to F.max_pool2d.
    x = in_layout(torch.randn(2, 16, 70, 75), layout)
    for kernel, dilation in [((8, 8), (1, 1)), ((2, 2), (8, 8)), ((3, 2), (2, 5))]:
        with kernel_loops(loops):
            y = ext.max_pool2d(x, kernel, dilation)
        assert torch.equal(y, F.max_pool2d(x, kernel, 1, 0, dilation))
        assert y.is_contiguous(memory_format=torch.channels_last) == (layout == "channels_last")


def test_tanh_float32_is_close_to_torch():
    # The fused float32 tanh is a rational approximation: a few ulp from torch.tanh over the whole range.
    x = torch.linspace(-12, 12, 100_001).view(1, 1, 1, -1)
    y = ext.pool2d_activation(x, (1, 1), (1, 1), "max", "tanh")
    torch.testing.assert_close(y, torch.tanh(x), rtol=0, atol=5e-7)


@LOOPS
@settings(max_examples=25, deadline=None)
@given(
    st.integers(1, 2),
    st.sampled_from([(1, 2, 3), (2, 4, 2), (3, 3, 1), (4, 2, 4)]),  # (C/groups, K/groups, groups)
    st.integers(1, 3),
    st.integers(1, 3),
    st.integers(1, 3),
    st.integers(1, 2),
    st.booleans(),
    st.sampled_from(["nchw", "channels_last"]),
)
def test_conv2d_matches_reference(loops, n, channels, kh, kw, dh, dw, with_bias, layout):
    with kernel_loops(loops):
        check_conv2d(n, channels, (kh, kw), (dh, dw), with_bias, layout)


def check_conv2d(n, channels, kernel, dilation, with_bias, layout):
    cg, kg, groups = channels
    kh, kw = kernel
    dh, dw = dilation
    x = in_layout(
        torch.randn(n, cg * groups, (kh - 1) * dh + 3, (kw - 1) * dw + 4, dtype=torch.float64), layout
    )
    weight = torch.randn(kg * groups, cg, kh, kw, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(kg * groups, dtype=torch.float64, requires_grad=True) if with_bias else None
    x.requires_grad_()
    y = ext.conv2d(x, weight, bias, dilation, groups)
    leaves = [x, weight] + ([bias] if with_bias else [])
    refs = [leaf.detach().clone().requires_grad_() for leaf in leaves]
    y_ref = conv_reference(refs[0], refs[1], refs[2] if with_bias else None, dilation, groups)
    torch.testing.assert_close(y, y_ref, rtol=1e-12, atol=1e-12)
    assert y.is_contiguous(memory_format=torch.channels_last) == (
        layout == "channels_last" and groups * kg > 1
    )
    grad_y = torch.randn_like(y_ref)
    grads = torch.autograd.grad(y, leaves, grad_y)
    y_ref.backward(grad_y)
    for grad, ref in zip(grads, refs, strict=True):
        torch.testing.assert_close(grad, ref.grad, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
def test_conv2d_backward_without_input_gradient(layout):
    # The first conv of a training step: the image needs no gradient, only the weights do.
    x = in_layout(torch.randn(2, 3, 9, 10, dtype=torch.float64), layout)
    weight = torch.randn(4, 3, 3, 2, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(4, dtype=torch.float64, requires_grad=True)
    grads = torch.autograd.grad(ext.conv2d(x, weight, bias, (2, 3)).sum(), [weight, bias])
    expected = torch.autograd.grad(conv_reference(x, weight, bias, (2, 3), 1).sum(), [weight, bias])
    for grad, ref in zip(grads, expected, strict=True):
        torch.testing.assert_close(grad, ref, rtol=1e-10, atol=1e-10)


@LOOPS
def test_conv2d_float32_in_bands_matches_torch(loops):
    # A 7×7 kernel over 50 channels on a 1100-pixel-wide image: the unrolled matrix (64 MiB at most) is built in
    # several bands of output rows, forward and backward. Outputs are sums of 2450 float32 products (~50 in size),
    # so the tolerances are float32 rounding of sums in a different order.
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(1, 50, 60, 1100, generator=generator, requires_grad=True)
    weight = torch.randn(4, 50, 7, 7, generator=generator, requires_grad=True)
    bias = torch.randn(4, generator=generator)
    with kernel_loops(loops):
        y = ext.conv2d(x, weight, bias, (4, 4))
        grad_x, grad_w = torch.autograd.grad(y.sum(), [x, weight])
    y_ref = F.conv2d(x, weight, bias, dilation=4)
    torch.testing.assert_close(y, y_ref, rtol=1e-4, atol=2e-3)
    expected = torch.autograd.grad(y_ref.sum(), [x, weight])
    torch.testing.assert_close(grad_x, expected[0], rtol=1e-4, atol=5e-4)
    torch.testing.assert_close(grad_w, expected[1], rtol=1e-4, atol=2e-2)


# ---- torch.library checks ----


def op_samples():
    x = torch.randn(2, 3, 11, 12, dtype=torch.float64, requires_grad=True)
    x_cl = torch.randn(1, 4, 9, 10, dtype=torch.float64).contiguous(memory_format=torch.channels_last)
    x_cl.requires_grad_()
    y, row_tap, col_tap = ops.max_pool2d(x.detach(), [2, 3], [3, 2], "tanh", True)
    g = torch.randn_like(y)
    w = torch.randn(6, 3, 2, 3, dtype=torch.float64, requires_grad=True)
    b = torch.randn(6, dtype=torch.float64, requires_grad=True)
    gy_conv = torch.randn(2, 6, 10, 8, dtype=torch.float64)  # x (11, 12), 2x3 kernel, dilation (1, 2)
    return [
        (ops.max_pool2d.default, (x, [2, 3], [3, 2], "none", True)),
        (ops.max_pool2d.default, (x_cl, [3, 3], [2, 1], "relu", True)),
        (ops.max_pool2d.default, (x.detach(), [4, 4], [1, 2], "tanh", False)),
        (ops.max_pool2d_backward.default, (g, y, row_tap, col_tap, [2, 3], [3, 2], "tanh")),
        (ops.max_pool2d_backward.default, (g, None, row_tap, col_tap, [2, 3], [3, 2], "none")),
        (ops.avg_pool2d.default, (x, [2, 3], [3, 2], 6, "none")),
        (ops.avg_pool2d.default, (x_cl, [2, 2], [2, 3], 3, "tanh")),
        (ops.avg_pool2d_backward.default, (g, y, [2, 3], [3, 2], 6, "relu")),
        (ops.conv2d.default, (x, w, b, [1, 2], 1)),
        (ops.conv2d.default, (x_cl, torch.randn(4, 2, 3, 3, dtype=torch.float64), None, [2, 2], 2)),
        (ops.conv2d_backward.default, (gy_conv, x.detach(), w.detach(), [1, 2], 1, [True, True, True])),
        (ops.conv2d_backward.default, (gy_conv, x.detach(), w.detach(), [1, 2], 1, [False, True, False])),
    ]


@pytest.mark.parametrize("index", range(len(op_samples())))
def test_opcheck(index):
    op, args = op_samples()[index]
    torch.library.opcheck(op, args)


@pytest.mark.parametrize(
    "fn",
    [
        lambda x: ext.max_pool2d(x, (3, 2), (2, 3)),
        lambda x: ext.avg_pool2d(x, (2, 3), (3, 1), divisor=4),
        lambda x: ext.pool2d_activation(x, (2, 2), (2, 2), "max", "tanh"),
        lambda x: ext.pool2d_activation(x, (2, 2), (1, 3), "max", "relu"),
        lambda x: ext.pool2d_activation(x, (3, 2), (1, 2), "avg", "tanh"),
        lambda x: ext.pool2d_activation(x, (2, 2), (2, 1), "avg", "relu"),
        lambda x: ext.max_pool2d(x.contiguous(memory_format=torch.channels_last), (2, 3), (2, 2)),
    ],
    ids=["max", "avg", "max_tanh", "max_relu", "avg_tanh", "avg_relu", "max_channels_last"],
)
def test_gradcheck_pools(fn):
    # Distinct values (no ties) 0.02 apart, so finite differences never flip an argmax, and offset so that no
    # window mean is within 0.002 of relu's kink at 0.
    x = torch.randperm(2 * 3 * 9 * 10, dtype=torch.float64) / 50 - 2 + 0.00731
    x = x.view(2, 3, 9, 10).requires_grad_()
    assert torch.autograd.gradcheck(fn, (x,), eps=1e-6, atol=1e-6)


@pytest.mark.parametrize("activation", ext.ACTIVATIONS)
@pytest.mark.parametrize("layout", ["nchw", "channels_last"])
def test_gradcheck_backward_ops(activation, layout):
    # The backward ops as functions of (grad_output, output), checked directly and through double backward.
    x = in_layout(
        torch.randperm(2 * 3 * 9 * 10, dtype=torch.float64).view(2, 3, 9, 10) / 50 - 2 + 0.00731, layout
    )
    kernel, dilation = [2, 3], [3, 2]
    y, row_tap, col_tap = ops.max_pool2d(x, kernel, dilation, activation, True)
    y_avg = ops.avg_pool2d(x, kernel, dilation, 4, activation)
    grad_y = torch.randn(
        y.shape, dtype=y.dtype, generator=torch.Generator().manual_seed(1), requires_grad=True
    )
    # The saved output is an input of the backward ops when the activation needs it; differentiate w.r.t. it for
    # tanh only: relu's derivative (y > 0) has its kink at y = 0, which relu outputs hit exactly.
    outputs = [None, None] if activation == "none" else [y, y_avg]
    if activation == "tanh":
        outputs = [t.detach().clone().requires_grad_() for t in outputs]

    def max_backward(g, out):
        return ops.max_pool2d_backward(g, out, row_tap, col_tap, kernel, dilation, activation)

    def avg_backward(g, out):
        return ops.avg_pool2d_backward(g, out, kernel, dilation, 4, activation)

    if activation == "tanh":
        assert torch.autograd.gradcheck(max_backward, (grad_y, outputs[0]))
        assert torch.autograd.gradcheck(avg_backward, (grad_y, outputs[1]))
    else:
        assert torch.autograd.gradcheck(lambda g: max_backward(g, outputs[0]), (grad_y,))
        assert torch.autograd.gradcheck(lambda g: avg_backward(g, outputs[1]), (grad_y,))
    leaf = x.detach().clone().requires_grad_()
    assert torch.autograd.gradgradcheck(
        lambda t: ext.pool2d_activation(t, kernel, dilation, "max", activation), leaf
    )
    assert torch.autograd.gradgradcheck(
        lambda t: ext.pool2d_activation(t, kernel, dilation, "avg", activation), leaf
    )


@pytest.mark.parametrize("groups", [1, 2])
def test_gradcheck_conv2d(groups):
    x = torch.randn(2, 4, 8, 9, dtype=torch.float64, requires_grad=True)
    w = torch.randn(6, 4 // groups, 2, 3, dtype=torch.float64, requires_grad=True)
    b = torch.randn(6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda *t: ext.conv2d(*t, (2, 1), groups), (x, w, b))


# ---- edge cases and errors ----


@pytest.mark.parametrize("shape", [(0, 3, 6, 6), (2, 0, 6, 6)])
@pytest.mark.parametrize(
    "fn",
    [
        lambda x: ext.max_pool2d(x, (2, 2), (2, 2)),
        lambda x: ext.pool2d_activation(x, (2, 2), (2, 2), "avg", "tanh"),
        lambda x: ext.conv2d(x, torch.ones(2, x.shape[1], 2, 2), None, (2, 2)),
    ],
    ids=["max", "avg_tanh", "conv"],
)
def test_empty_batches(shape, fn):
    x = torch.randn(shape, requires_grad=True)
    y = fn(x)
    assert y.shape[0] == shape[0] and y.shape[2:] == (4, 4)
    (grad,) = torch.autograd.grad(y.sum(), x)
    assert grad.shape == x.shape


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: ext.max_pool2d(torch.randn(3, 8, 8), (2, 2), (1, 1)), "expected a 4-D"),
        (lambda: ext.max_pool2d(torch.randn(1, 1, 4, 8), (3, 3), (2, 2)), "spans 5x5 pixels"),
        (lambda: ext.max_pool2d(torch.randn(1, 1, 8, 8), (0, 2), (1, 1)), "kernel must be a positive int"),
        (lambda: ext.max_pool2d(torch.randn(1, 1, 8, 8), (2, 2), (1, -1)), "dilation must be a positive int"),
        (lambda: ext.max_pool2d(torch.ones(1, 1, 8, 8, dtype=torch.int32), 2, 1), "float32 or float64"),
        (lambda: ext.avg_pool2d(torch.randn(1, 1, 8, 8), 2, 1, divisor=0), "divisor must be a positive int"),
        (lambda: ext.pool2d_activation(torch.randn(1, 1, 8, 8), 2, 1, "max", "gelu"), "activation='gelu'"),
        (lambda: ext.pool2d_activation(torch.randn(1, 1, 8, 8), 2, 1, "min", "none"), "mode='min'"),
        (lambda: ext.conv2d(torch.randn(1, 3, 8, 8), torch.randn(4, 2, 3, 3), None, 1), "3 channels"),
        (
            lambda: ext.conv2d(torch.randn(1, 3, 8, 8), torch.randn(4, 3, 3, 3), torch.randn(3), 1),
            "bias must",
        ),
        (
            lambda: ext.conv2d(torch.randn(1, 3, 8, 8), torch.randn(4, 3, 3, 3).double(), None, 1),
            "must match",
        ),
        (lambda: ops.max_pool2d(torch.randn(1, 1, 8, 8), [2, 2], [1, 1], "none", False)[0].sum(), None),
    ],
)
def test_argument_errors(call, message):
    if message is None:  # a valid call: the list's control case
        call()
        return
    with pytest.raises((ValueError, RuntimeError), match=message):
        call()


def test_backward_without_taps_says_what_to_do():
    x = torch.randn(1, 1, 8, 8, requires_grad=True)
    y = ops.max_pool2d(x, [2, 2], [1, 1], "none", False)[0]
    with pytest.raises(RuntimeError, match="with_taps=False"):
        y.sum().backward()


@pytest.mark.parametrize("device", DEVICES)
def test_devices(device):
    x = torch.randn(1, 4, 20, 20, device=device)
    torch.testing.assert_close(ext.max_pool2d(x, 2, 3).cpu(), F.max_pool2d(x.cpu(), 2, 1, 0, 3))
