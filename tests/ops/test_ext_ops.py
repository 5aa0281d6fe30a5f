"""densecnn's compiled kernels (densecnn/ops/ext.py, cuda_ext/) against independent naive references.

The pooling references slice the input once per window tap and combine the slices with plain torch ops, scanning
taps in row-major window order — they share no code with the kernels nor with densecnn.ops.native. The pooling
ops are checked on signals (N, C, L), images (N, C, H, W) and volumes (N, C, D, H, W), in the contiguous and the
channels-last layout.
"""

from __future__ import annotations

import contextlib
import itertools
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from densecnn.geometry import ntuple
from densecnn.ops import ext

DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU")),
]
ops = torch.ops.densecnn
NATIVE_MAX_POOL = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}


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


def window_taps(x, kernel, dilation):
    """The shifted views of x, one per window tap in row-major window order: tap (a, b, ...) is
    x[..., i + a·d0, j + b·d1, ...]."""
    out = [s - (k - 1) * d for s, k, d in zip(x.shape[2:], kernel, dilation, strict=True)]
    views = []
    for offsets in itertools.product(*(range(k) for k in kernel)):
        index = tuple(slice(o * d, o * d + n) for o, d, n in zip(offsets, dilation, out, strict=True))
        views.append(x[(slice(None), slice(None), *index)])
    return views


def max_reference(x, kernel, dilation):
    """(max, argmax tap) by scanning taps with torch's rule: replace when larger or NaN."""
    views = window_taps(x, kernel, dilation)
    best, arg = views[0].clone(), torch.zeros(views[0].shape, dtype=torch.long)
    for t, view in enumerate(views[1:], start=1):
        take = (view > best) | view.isnan()
        best, arg = torch.where(take, view, best), torch.where(take, t, arg)
    return best, arg


def max_grad_reference(x, kernel, dilation, grad_y):
    """Gradient of max pooling: each output's gradient lands on its argmax input element."""
    _, arg = max_reference(x, kernel, dilation)
    n, c, *out = arg.shape
    flat = torch.zeros_like(arg)  # the argmax's flat index in the (spatial...) input
    for axis, (k, d, size) in enumerate(zip(kernel, dilation, out, strict=True)):
        tap = arg // math.prod(kernel[axis + 1 :]) % k
        coordinate = torch.arange(size).view([size if b == axis else 1 for b in range(len(out))]) + tap * d
        flat = flat * x.shape[2 + axis] + coordinate
    grad = torch.zeros(n, c, math.prod(x.shape[2:]), dtype=grad_y.dtype)
    grad.scatter_add_(2, flat.flatten(2), grad_y.flatten(2))
    return grad.view(x.shape)


def avg_reference(x, kernel, dilation, divisor=None):
    return sum(window_taps(x, kernel, dilation)) / (divisor or math.prod(kernel))


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
LOCAL_GRAD = {"none": torch.ones_like, "relu": lambda y: (y > 0).to(y.dtype), "tanh": lambda y: 1 - y * y}


def in_layout(x, layout):
    """x as a contiguous, channels-last ((N, ..., C) in memory, any rank) or non-contiguous strided tensor."""
    if layout == "channels_last":
        return x.movedim(1, -1).contiguous().movedim(-1, 1)
    if (
        layout == "strided"
    ):  # a non-contiguous view: every other element along the last axis of a wider tensor
        wide = torch.empty(*x.shape[:-1], 2 * x.shape[-1], dtype=x.dtype)
        wide[..., ::2] = x
        return wide[..., ::2]
    return x.contiguous()


def has_layout_of(y, x):
    """Whether y is compact in x's layout: channels-last when x's channel stride is 1 (and the layouts differ)."""
    channels_last = x.stride(1) == 1 and x.shape[1] > 1 and x[0, 0].numel() > 1
    return y.movedim(1, -1).is_contiguous() if channels_last else y.is_contiguous()


@st.composite
def pool_cases(draw):
    axes = draw(st.integers(1, 3))
    max_kernel = {1: 5, 2: 4, 3: 3}[axes]
    kernel = tuple(draw(st.integers(1, max_kernel)) for _ in range(axes))
    dilation = tuple(draw(st.integers(1, 3)) for _ in range(axes))
    spatial = tuple(
        (k - 1) * d + draw(st.integers(1, 5 if axes < 3 else 3)) for k, d in zip(kernel, dilation)
    )
    shape = (draw(st.integers(1, 2)), draw(st.integers(1, 3)), *spatial)
    layout = draw(st.sampled_from(["contiguous", "channels_last", "strided"]))
    seed = draw(st.integers(0, 2**16))
    return kernel, dilation, shape, layout, seed


def tied_input(shape, seed, dtype=torch.float64):
    """Few distinct values, so windows have ties (the argmax rule matters)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(-3, 4, shape, generator=generator).to(dtype)


def distinct_input(shape, layout="contiguous", dtype=torch.float64):
    """Distinct values 0.02 apart (no ties: finite differences never flip an argmax), offset so that no window mean
    is within 0.002 of relu's kink at 0."""
    x = (
        torch.randperm(math.prod(shape), dtype=dtype, generator=torch.Generator().manual_seed(0)) / 50
        - 2
        + 0.00731
    )
    return in_layout(x.view(shape), layout)


# ---- equality with the references ----


@LOOPS
@settings(max_examples=60, deadline=None)
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
    y = ext.pool_activation(x, kernel, dilation, "max", activation)
    best, _ = max_reference(x.detach(), kernel, dilation)
    # max values are exact; tanh is the kernels' own (libm / rational), torch.tanh is Sleef's: a few ulp apart
    tolerance = 0.0 if activation in ("none", "relu") else 4 * torch.finfo(y.dtype).eps
    torch.testing.assert_close(y, ACTIVATE[activation](best), rtol=tolerance, atol=tolerance, equal_nan=True)
    assert has_layout_of(y, x)
    grad_y = tied_input(y.shape, seed + 1)
    (grad_x,) = torch.autograd.grad(y, x, grad_y)
    expected = max_grad_reference(x.detach(), kernel, dilation, grad_y * LOCAL_GRAD[activation](y.detach()))
    torch.testing.assert_close(grad_x, expected, rtol=1e-12, atol=1e-12, equal_nan=True)


@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize(
    "kernel, dilation, shape",
    [
        ((8, 8), (1, 1), (1, 3, 30, 2100)),  # rows of several backward work items
        ((2, 3), (40, 2), (1, 2, 45, 2100)),  # windows 41 rows tall
    ],
)
def test_max_pool_backward_over_row_chunks_and_wide_dilations(kernel, dilation, shape, layout):
    """The fused backward (tanh's gradient and both gathers) on maps whose rows span several of its work items and
    on windows many rows tall, which the drawn cases' small maps never reach."""
    check_max_pool((kernel, dilation, shape, layout, 3), "tanh", with_nan=False)


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
    y = ext.pool_activation(x, kernel, dilation, "avg", activation, divisor)
    x_ref = x.detach().clone().requires_grad_()
    y_ref = ACTIVATE[activation](avg_reference(x_ref, kernel, dilation, divisor))
    torch.testing.assert_close(y, y_ref, rtol=1e-12, atol=1e-12)
    grad_y = torch.randn_like(y_ref)
    (grad_x,) = torch.autograd.grad(y, x, grad_y)
    y_ref.backward(grad_y)
    torch.testing.assert_close(grad_x, x_ref.grad, rtol=1e-12, atol=1e-12)


@LOOPS
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize(
    ("shape", "windows"),
    [
        ((1, 4, 20000), [(8, 1), (2, 8), (3, 5)]),
        ((1, 16, 200, 1200), [((8, 8), (1, 1)), ((2, 2), (8, 8)), ((3, 2), (2, 5))]),
        ((1, 8, 60, 60, 60), [(2, 1), (2, 4), ((3, 2, 2), (2, 1, 5))]),
        ((1, 8, 40, 48, 300), [(2, 1), ((3, 2, 2), (2, 1, 5))]),
    ],
    ids=["1d", "2d", "3d-short-rows", "3d-long-rows"],
)
def test_max_pool_float32_equals_torch(loops, layout, shape, windows):
    # Larger shapes than the hypothesis cases: several boxes per plane whatever the L2 cache their budget comes
    # from (rows longer than the longest chunk; several blocks of rows and planes), rows pooled one by one (long
    # rows) as well as in runs of whole short rows (volumes). A max is a selection, so the result is bitwise
    # torch's; averages agree to float32 rounding.
    x = in_layout(torch.randn(shape, generator=torch.Generator().manual_seed(0)), layout)
    for kernel, dilation in windows:
        with kernel_loops(loops):
            y = ext.max_pool(x, kernel, dilation)
            y_avg = ext.avg_pool(x, kernel, dilation)
        assert torch.equal(y, NATIVE_MAX_POOL[x.dim() - 2](x, kernel, 1, 0, dilation))
        assert has_layout_of(y, x) and x.is_contiguous() == (layout == "contiguous")
        axes = x.dim() - 2
        expected = avg_reference(x, ntuple(kernel, axes), ntuple(dilation, axes))
        torch.testing.assert_close(y_avg, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(
    ("shape", "kernel", "dilation"),
    [
        ((1, 16, 40, 36, 106), 2, 2),  # a 3-D net's second pool, channels-last: rows of 1,696 values
        ((2, 8, 31, 20, 300), (3, 2, 2), (3, 1, 4)),
        ((1, 16, 60, 700), (2, 3), (8, 1)),
        ((1, 4, 30, 12, 400), (1, 2, 3), (1, 2, 1)),  # nothing to pool along the streamed axis
        ((1, 50, 70, 639), 8, 1),  # a doubling of three steps along the streamed axis
        ((1, 8, 44, 20, 300), (5, 2, 2), (2, 1, 3)),  # and of two steps and a remainder
    ],
)
def test_streamed_pools_equal_torch(threads, shape, kernel, dilation):
    # Channels-last maps with long rows, pooled without taps (inference): the forward streams the outermost axis
    # slice by slice through rings of slices (a max's doubling steps, an average's fold), in segments that depend
    # on the threads. A NaN wins its windows; bfloat16 is widened and rounded once; an activation is applied once.
    generator = torch.Generator().manual_seed(2)
    x = torch.randn(shape, generator=generator)
    x.view(-1)[:: x.numel() // 7] = float("nan")
    x = in_layout(x, "channels_last")
    axes = x.dim() - 2
    native = NATIVE_MAX_POOL[axes](x, kernel, 1, 0, dilation)
    threads_before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        y = ext.pool_activation(x, kernel, dilation, "max", "relu")
        y_bf16 = ext.pool_activation(x.bfloat16(), kernel, dilation, "max", "none")
        finite = torch.nan_to_num(x)
        y_avg = ext.pool_activation(finite, kernel, dilation, "avg", "tanh")
    finally:
        torch.set_num_threads(threads_before)
    assert torch.equal(y.isnan(), native.isnan()) and native.isnan().any()
    assert torch.equal(y.nan_to_num(), torch.relu(native).nan_to_num()) and has_layout_of(y, x)
    assert torch.equal(
        y_bf16.nan_to_num(),
        NATIVE_MAX_POOL[axes](x.bfloat16().float(), kernel, 1, 0, dilation).bfloat16().nan_to_num(),
    )
    expected = torch.tanh(avg_reference(finite, ntuple(kernel, axes), ntuple(dilation, axes)))
    torch.testing.assert_close(y_avg, expected, rtol=1e-5, atol=1e-6)


@LOOPS
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
@pytest.mark.parametrize("shape", [(2, 3, 40), (2, 3, 17, 19), (1, 4, 9, 10, 11)], ids=["1d", "2d", "3d"])
def test_reduced_precision_within_one_rounding(loops, dtype, layout, shape):
    # Reduced precision is widened to float32 inside the kernels and rounded once at the end: max (a selection)
    # equals the float32 result rounded, and a float32-accumulated average or activation is within one rounding
    # (half an ulp of the dtype, relative) of the float32 reference. The gradients too.
    generator = torch.Generator().manual_seed(1)
    x = in_layout(torch.randn(shape, generator=generator).to(dtype), layout).requires_grad_()
    kernel, dilation = (3, 2, 2)[: len(shape) - 2], (2, 1, 3)[: len(shape) - 2]
    ulp = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}[dtype]
    for mode, activation in [("max", "none"), ("max", "tanh"), ("avg", "none"), ("avg", "relu")]:
        with kernel_loops(loops):
            y = ext.pool_activation(x, kernel, dilation, mode, activation)
            grad_y = torch.randn(y.shape, generator=generator).to(dtype)
            (grad_x,) = torch.autograd.grad(y, x, grad_y)
        assert y.dtype == dtype and grad_x.dtype == dtype
        x32 = x.detach().float().requires_grad_()
        pooled = (
            max_reference(x32, kernel, dilation)[0] if mode == "max" else avg_reference(x32, kernel, dilation)
        )
        y32 = ACTIVATE[activation](pooled)
        if mode == "max" and activation == "none":
            assert torch.equal(y, y32.to(dtype))
        torch.testing.assert_close(y.float(), y32, rtol=ulp, atol=1e-6)
        (grad32,) = torch.autograd.grad(y32, x32, grad_y.float())
        # Each gradient element is a sum of a few rounded products, so a few ulps of its largest term.
        torch.testing.assert_close(
            grad_x.float(), grad32, rtol=4 * ulp, atol=4 * ulp * grad32.abs().max().item()
        )


def test_tanh_float32_is_close_to_torch():
    # The fused float32 tanh is a rational approximation: a few ulp from torch.tanh over the whole range.
    x = torch.linspace(-12, 12, 100_001).view(1, 1, -1)
    y = ext.pool_activation(x, 1, 1, "max", "tanh")
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
    st.sampled_from(["contiguous", "channels_last"]),
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


@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
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
    x_cl = in_layout(torch.randn(1, 4, 9, 10, dtype=torch.float64), "channels_last").requires_grad_()
    signal = torch.randn(2, 3, 20, dtype=torch.float64, requires_grad=True)
    volume_cl = in_layout(torch.randn(1, 3, 7, 8, 9, dtype=torch.float64), "channels_last").requires_grad_()
    y, taps = ops.max_pool(x.detach(), [2, 3], [3, 2], "tanh", True)
    y3, taps3 = ops.max_pool(volume_cl.detach(), [2, 2, 3], [2, 3, 1], "relu", True)
    g, g3 = torch.randn_like(y), torch.randn_like(y3)
    w = torch.randn(6, 3, 2, 3, dtype=torch.float64, requires_grad=True)
    b = torch.randn(6, dtype=torch.float64, requires_grad=True)
    gy_conv = torch.randn(2, 6, 10, 8, dtype=torch.float64)  # x (11, 12), 2x3 kernel, dilation (1, 2)
    return [
        (ops.max_pool.default, (x, [2, 3], [3, 2], "none", True)),
        (ops.max_pool.default, (x_cl, [3, 3], [2, 1], "relu", True)),
        (ops.max_pool.default, (x.detach(), [4, 4], [1, 2], "tanh", False)),
        (ops.max_pool.default, (signal, [3], [4], "none", True)),
        (ops.max_pool.default, (volume_cl, [2, 2, 3], [2, 3, 1], "tanh", True)),
        (ops.max_pool_backward.default, (g, y, taps, [2, 3], [3, 2], "tanh")),
        (ops.max_pool_backward.default, (g, None, taps, [2, 3], [3, 2], "none")),
        (ops.max_pool_backward.default, (g3, y3, taps3, [2, 2, 3], [2, 3, 1], "relu")),
        (ops.avg_pool.default, (x, [2, 3], [3, 2], 6, "none")),
        (ops.avg_pool.default, (x_cl, [2, 2], [2, 3], 3, "tanh")),
        (ops.avg_pool.default, (signal, [5], [2], 5, "relu")),
        (ops.avg_pool.default, (volume_cl, [2, 3, 2], [3, 1, 2], 12, "none")),
        (ops.avg_pool_backward.default, (g, y, [2, 3], [3, 2], 6, "relu")),
        (ops.avg_pool_backward.default, (g3, y3, [2, 2, 3], [2, 3, 1], 12, "tanh")),
        (ops.conv2d.default, (x, w, b, [1, 2], 1)),
        (ops.conv2d.default, (x_cl, torch.randn(4, 2, 3, 3, dtype=torch.float64), None, [2, 2], 2)),
        (ops.conv2d_backward.default, (gy_conv, x.detach(), w.detach(), [1, 2], 1, [True, True, True])),
        (ops.conv2d_backward.default, (gy_conv, x.detach(), w.detach(), [1, 2], 1, [False, True, False])),
    ]


@pytest.mark.parametrize("index", range(len(op_samples())))
def test_opcheck(index):
    op, args = op_samples()[index]
    torch.library.opcheck(op, args)


POOL_SHAPES = {1: (2, 3, 14), 2: (1, 2, 8, 9), 3: (1, 2, 6, 5, 5)}


@pytest.mark.parametrize(
    ("axes", "fn"),
    [
        (2, lambda x: ext.max_pool(x, (3, 2), (2, 3))),
        (2, lambda x: ext.avg_pool(x, (2, 3), (3, 1), divisor=4)),
        (2, lambda x: ext.pool_activation(x, (2, 2), (2, 2), "max", "tanh")),
        (1, lambda x: ext.pool_activation(x, 3, 2, "max", "relu")),
        (1, lambda x: ext.pool_activation(x, 4, 3, "avg", "tanh")),
        (3, lambda x: ext.max_pool(x, (2, 3, 2), (2, 1, 2))),
        (3, lambda x: ext.pool_activation(x, 2, (1, 2, 1), "avg", "relu")),
        (3, lambda x: ext.max_pool(in_layout(x, "channels_last"), (2, 2, 2), (3, 2, 1))),
    ],
    ids=["max2d", "avg2d", "max_tanh2d", "max_relu1d", "avg_tanh1d", "max3d", "avg_relu3d", "max3d_cl"],
)
def test_gradcheck_pools(axes, fn):
    x = distinct_input(POOL_SHAPES[axes]).requires_grad_()
    assert torch.autograd.gradcheck(fn, (x,), eps=1e-6, atol=1e-6)


@pytest.mark.parametrize("activation", ext.ACTIVATIONS)
@pytest.mark.parametrize(
    ("layout", "axes"), [("contiguous", 2), ("channels_last", 2), ("contiguous", 3), ("channels_last", 1)]
)
def test_gradcheck_backward_ops(activation, layout, axes):
    # The backward ops as functions of (grad_output, output), checked directly and through double backward.
    x = distinct_input(POOL_SHAPES[axes], layout)
    kernel, dilation = [2, 3, 2][:axes], [3, 2, 1][:axes]
    y, taps = ops.max_pool(x, kernel, dilation, activation, True)
    y_avg = ops.avg_pool(x, kernel, dilation, 4, activation)
    grad_y = torch.randn(
        y.shape, dtype=y.dtype, generator=torch.Generator().manual_seed(1), requires_grad=True
    )
    # The saved output is an input of the backward ops when the activation needs it; differentiate w.r.t. it for
    # tanh only: relu's derivative (y > 0) has its kink at y = 0, which relu outputs hit exactly.
    outputs = [None, None] if activation == "none" else [y, y_avg]
    if activation == "tanh":
        outputs = [t.detach().clone().requires_grad_() for t in outputs]

    def max_backward(g, out):
        return ops.max_pool_backward(g, out, taps, kernel, dilation, activation)

    def avg_backward(g, out):
        return ops.avg_pool_backward(g, out, kernel, dilation, 4, activation)

    if activation == "tanh":
        assert torch.autograd.gradcheck(max_backward, (grad_y, outputs[0]))
        assert torch.autograd.gradcheck(avg_backward, (grad_y, outputs[1]))
    else:
        assert torch.autograd.gradcheck(lambda g: max_backward(g, outputs[0]), (grad_y,))
        assert torch.autograd.gradcheck(lambda g: avg_backward(g, outputs[1]), (grad_y,))
    leaf = x.detach().clone().requires_grad_()
    assert torch.autograd.gradgradcheck(
        lambda t: ext.pool_activation(t, kernel, dilation, "max", activation), leaf
    )
    assert torch.autograd.gradgradcheck(
        lambda t: ext.pool_activation(t, kernel, dilation, "avg", activation), leaf
    )


@pytest.mark.parametrize("groups", [1, 2])
def test_gradcheck_conv2d(groups):
    x = torch.randn(2, 4, 8, 9, dtype=torch.float64, requires_grad=True)
    w = torch.randn(6, 4 // groups, 2, 3, dtype=torch.float64, requires_grad=True)
    b = torch.randn(6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda *t: ext.conv2d(*t, (2, 1), groups), (x, w, b))


# ---- edge cases and errors ----


@pytest.mark.parametrize("shape", [(0, 3, 6, 6), (2, 0, 6, 6), (0, 2, 6), (1, 0, 6, 6, 6)])
@pytest.mark.parametrize(
    "fn",
    [
        lambda x: ext.max_pool(x, 2, 2),
        lambda x: ext.pool_activation(x, 2, 2, "avg", "tanh"),
        lambda x: (
            ext.conv2d(x, torch.ones(2, x.shape[1], 2, 2), None, (2, 2))
            if x.dim() == 4
            else ext.max_pool(x, 2, 2)
        ),
    ],
    ids=["max", "avg_tanh", "conv"],
)
def test_empty_batches(shape, fn):
    x = torch.randn(shape, requires_grad=True)
    y = fn(x)
    assert y.shape[0] == shape[0] and y.shape[2:] == (4,) * (len(shape) - 2)
    (grad,) = torch.autograd.grad(y.sum(), x)
    assert grad.shape == x.shape


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: ext.max_pool(torch.randn(8, 8), 2, 1), "expected a 3-D"),
        (lambda: ext.max_pool(torch.randn(1, 1, 4, 8), (3, 3), (2, 2)), "spans 5x5 pixels"),
        (lambda: ext.max_pool(torch.randn(1, 1, 4, 8, 9), 3, 2), "spans 5x5x5 pixels"),
        (lambda: ext.max_pool(torch.randn(1, 1, 8, 8), (0, 2), (1, 1)), "kernel must be a positive int"),
        (
            lambda: ext.max_pool(torch.randn(1, 1, 8, 8, 8), (2, 2), 1),
            r"one positive int per spatial axis \(3\)",
        ),
        (lambda: ext.max_pool(torch.randn(1, 1, 8, 8), (2, 2), (1, -1)), "dilation must be a positive int"),
        (lambda: ext.max_pool(torch.ones(1, 1, 8, 8, dtype=torch.int32), 2, 1), "float32, float64, bfloat16"),
        (lambda: ext.max_pool(torch.randn(1, 1, 300), 256, 1), "at most 255 taps"),
        (lambda: ext.avg_pool(torch.randn(1, 1, 8, 8), 2, 1, divisor=0), "divisor must be a positive int"),
        (lambda: ext.pool_activation(torch.randn(1, 1, 8, 8), 2, 1, "max", "gelu"), "activation='gelu'"),
        (lambda: ext.pool_activation(torch.randn(1, 1, 8, 8), 2, 1, "min", "none"), "mode='min'"),
        (
            lambda: ops.max_pool(torch.randn(1, 1, 8, 8), [2], [1], "none", False),
            "one entry per spatial axis",
        ),
        (lambda: ext.conv2d(torch.randn(1, 3, 8, 8), torch.randn(4, 2, 3, 3), None, 1), "3 channels"),
        (
            lambda: ext.conv2d(torch.randn(1, 3, 8, 8), torch.randn(4, 3, 3, 3), torch.randn(3), 1),
            "bias must",
        ),
        (
            lambda: ext.conv2d(torch.randn(1, 3, 8, 8), torch.randn(4, 3, 3, 3).double(), None, 1),
            "must match",
        ),
        (lambda: ops.max_pool(torch.randn(1, 1, 8, 8), [2, 2], [1, 1], "none", False)[0].sum(), None),
    ],
)
def test_argument_errors(call, message):
    if message is None:  # a valid call: the list's control case
        call()
        return
    with pytest.raises((ValueError, RuntimeError), match=message):
        call()


def test_backward_with_foreign_taps_says_what_to_do():
    x = torch.randn(1, 2, 8, 8)
    _, taps = ops.max_pool(x, [2, 2], [1, 1], "none", True)
    grad_y = torch.randn(1, 2, 6, 6)
    with pytest.raises(RuntimeError, match="does not belong to grad_output"):
        ops.max_pool_backward(grad_y, None, taps, [2, 2], [2, 2], "none")


def test_backward_without_taps_says_what_to_do():
    x = torch.randn(1, 1, 8, 8, requires_grad=True)
    y = ops.max_pool(x, [2, 2], [1, 1], "none", False)[0]
    with pytest.raises(RuntimeError, match="with_taps=False"):
        y.sum().backward()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(1, 4, 40), (1, 4, 20, 20), (1, 4, 9, 10, 11)], ids=["1d", "2d", "3d"])
def test_devices(device, shape):
    x = torch.randn(shape, device=device)
    native = NATIVE_MAX_POOL[x.dim() - 2]
    torch.testing.assert_close(ext.max_pool(x, 2, 3).cpu(), native(x.cpu(), 2, 1, 0, 3))
    for dtype in (torch.float32, torch.bfloat16):
        y = ext.avg_pool(x.to(dtype), 2, 2)
        torch.testing.assert_close(
            y.float().cpu(),
            avg_reference(x.to(dtype).float().cpu(), (2,) * (x.dim() - 2), (2,) * (x.dim() - 2)),
            rtol=2**-8,
            atol=1e-6,
        )
