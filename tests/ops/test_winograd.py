"""The ``winograd`` solver: exact to rounding against independent references (a tap-by-tap sum, patch and window
scanning), differentiable, its C++ transforms pass opcheck and run the CUDA kernels' per-element bodies."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import densecnn
from densecnn.ops import ext, solvers, winograd
from densecnn.ops.solvers import ConvOp
from tests.core import test_equivalence, test_volumes
from tests.naive import literal_scan
from tests.tolerances import assert_close_relative, assert_within_rounding_of_terms

pytestmark = pytest.mark.skipif(not ext.available(), reason="densecnn's kernels are not built")

LAYOUTS = {2: torch.channels_last, 3: torch.channels_last_3d}


@pytest.fixture(autouse=True)
def solver_cache(tmp_path, ops_config):
    ops_config(cache_dir=tmp_path / "cache", solver=None, memory_format=None)


def _taps(x: torch.Tensor, op: ConvOp) -> torch.Tensor:
    """Independent reference: every output an explicit sum over the dilated window's taps, any number of axes."""
    out = [s - (k - 1) * d for s, k, d in zip(x.shape[2:], op.kernel, op.dilation)]
    y = torch.zeros(x.shape[0], op.weight.shape[0], *out, dtype=x.dtype)
    for tap in itertools.product(*(range(k) for k in op.kernel)):
        window = x[
            (slice(None), slice(None), *(slice(t * d, t * d + o) for t, d, o in zip(tap, op.dilation, out)))
        ]
        y += torch.einsum("nc...,kc->nk...", window, op.weight[(slice(None), slice(None), *tap)])
    return y if op.bias is None else y + op.bias.view(1, -1, *[1] * len(out))


@st.composite
def conv_problems(draw, dtype=torch.float64):
    """(op, x, m): a random 3-tap conv in 2 or 3 axes, dilations 1-8, maps from one output (smaller than a tile)
    to a few tiles per sub-grid (not multiples of m), 1-20 channels (every lane block size), either memory format."""
    seed = draw(st.integers(0, 2**31 - 1), label="seed")
    generator = torch.Generator().manual_seed(seed)
    axes = draw(st.sampled_from([2, 3]), label="axes")
    m = draw(st.sampled_from([2, 3, 4]), label="m")
    dilation = tuple(draw(st.integers(1, 8)) for _ in range(axes))
    most = 22 if axes == 2 else 9
    channels, classes, batch = draw(st.integers(1, 20)), draw(st.integers(1, 20)), draw(st.integers(1, 2))
    size = [2 * d + draw(st.integers(1, most)) for d in dilation]
    weight = torch.randn(classes, channels, *(3,) * axes, generator=generator, dtype=dtype)
    bias = torch.randn(classes, generator=generator, dtype=dtype) if draw(st.booleans()) else None
    x = torch.randn(batch, channels, *size, generator=generator, dtype=dtype)
    if draw(st.booleans(), label="channels last"):
        x = x.contiguous(memory_format=LAYOUTS[axes])
    return ConvOp(weight, bias, dilation, 1), x, m


def _is_channels_last(x: torch.Tensor) -> bool:
    return not x.is_contiguous() and x.is_contiguous(memory_format=LAYOUTS[x.dim() - 2])


@settings(max_examples=150, deadline=None)
@given(problem=conv_problems())
def test_winograd_equals_the_tap_sum_float64(problem):
    op, x, m = problem
    y = winograd.conv(op, x, m)
    assert_close_relative(y, _taps(x, op), 1e-10, floor=1.0)
    assert y.is_contiguous(
        memory_format=LAYOUTS[x.dim() - 2] if _is_channels_last(x) else torch.contiguous_format
    )


# Bᵀ (α × α) and Aᵀ (m × α) of F(m, 3) as cuda_ext/winograd.h applies them (input_transform_1d,
# output_transform_1d); G is winograd._KERNEL_TRANSFORMS.
_INPUT_TRANSFORMS = {
    2: [[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]],
    3: [
        [1 / 2, -1, -1 / 2, 1, 0],
        [0, -1 / 2, 1 / 2, 1, 0],
        [0, 1 / 2, -3 / 2, 1, 0],
        [0, -1, 0, 1, 0],
        [0, 1 / 2, -1, -1 / 2, 1],
    ],
    4: [
        [4, 0, -5, 0, 1, 0],
        [0, -4, -4, 1, 1, 0],
        [0, 4, -4, -1, 1, 0],
        [0, -2, -1, 2, 1, 0],
        [0, 2, -1, -2, 1, 0],
        [0, 4, 0, -5, 0, 1],
    ],
}
_OUTPUT_TRANSFORMS = {
    2: [[1, 1, 1, 0], [0, 1, -1, -1]],
    3: [[1, 1, 1, 1, 0], [0, 1, -1, 1 / 2, 0], [0, 1, 1, 1 / 4, 1]],
    4: [[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0], [0, 1, -1, 8, -8, 1]],
}


def _transforms(m: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Aᵀ (m, α), G (α, 3) and Bᵀ (α, α) of F(m, 3), in float64."""
    return tuple(
        torch.tensor(t[m], dtype=torch.float64)
        for t in (_OUTPUT_TRANSFORMS, winograd._KERNEL_TRANSFORMS, _INPUT_TRANSFORMS)
    )


def float32_rounding_bound(m: int, axes: int, channels: int) -> float:
    """The float32 error of F(m, 3) over ``axes`` axes and ``channels`` input channels, as a fraction of an output's
    terms (the sum of |w|·|x| over its window and channels, bias included), from the transforms' constants.

    Every stage rounds each value it computes, by at most u = 2⁻²⁴ relative: Bᵀ along each axis (at most k_B
    roundings on a term's way, k_B the most nonzeros in a row of Bᵀ), U = G g Gᵀ computed in float64 and rounded
    once, the products summed over the C channels (C), Aᵀ along each axis (k_A), the bias added (1). To first order
    the error is at most (n·(k_B + k_A) + C + 2)·u times the magnitude of the Winograd path, Σ_c |Aᵀ|[(|G| |g|) ⊙
    (|Bᵀ| |x|)] along every axis. Where |g| is one size over the kernel and |x| over the tile, that magnitude is at
    most ρⁿ times the terms, with ρ = max_i Σ_ξ |Aᵀ_iξ| ‖G_ξ‖₁ ‖Bᵀ_ξ‖₁ / 3 (the 3 taps an output sums along an
    axis): the growth of the transforms, 8/3 for F(2, 3), 73/9 for F(3, 3), 16 for F(4, 3). Random inputs scatter
    around that size, which the first-order count's worst case (every rounding at its largest, all of one sign)
    leaves ample room for.
    """
    output, kernel, input_ = (t.abs() for t in _transforms(m))
    growth = (output @ (kernel.sum(1) * input_.sum(1))).max().item() / 3
    roundings = axes * ((input_ > 0).sum(1).max().item() + (output > 0).sum(1).max().item()) + channels + 2
    return growth**axes * roundings * 2.0**-24


@pytest.mark.parametrize("m", [2, 3, 4])
def test_the_transform_constants_compute_the_three_tap_correlation(m):
    """The constants the rounding bound is derived from are F(m, 3)'s: Aᵀ[(G g) ⊙ (Bᵀ x)] is the 3-tap correlation
    of the α inputs, output by output (float64)."""
    output, kernel, input_ = _transforms(m)
    generator = torch.Generator().manual_seed(m)
    g = torch.randn(3, dtype=torch.float64, generator=generator)
    x = torch.randn(m + 2, dtype=torch.float64, generator=generator)
    correlation = torch.stack([x[i : i + 3] @ g for i in range(m)])  # (m,)
    assert_close_relative(output @ ((kernel @ g) * (input_ @ x)), correlation, 1e-14, floor=1.0)


@settings(max_examples=60, deadline=None)
@given(problem=conv_problems(dtype=torch.float32))
def test_winograd_equals_the_tap_sum_float32(problem):
    """The default tile's float32 result is within :func:`float32_rounding_bound` of its terms' magnitude."""
    op, x, _ = problem
    axes, channels = x.dim() - 2, x.shape[1]
    bias = None if op.bias is None else op.bias.double()
    expected = _taps(x.double(), ConvOp(op.weight.double(), bias, op.dilation, 1))
    magnitude = ConvOp(op.weight.double().abs(), None if bias is None else bias.abs(), op.dilation, 1)
    terms = _taps(x.double().abs(), magnitude)
    rel = float32_rounding_bound(winograd.tile_size(axes, channels), axes, channels)
    assert_within_rounding_of_terms(solvers.run("winograd", op, x).double(), expected, terms, rel)


@pytest.mark.parametrize(
    ("axes", "channels", "bound"), [(2, 50, 1e-5), (2, 128, 1e-5), (3, 16, 1e-5), (3, 64, 1e-5)]
)
def test_default_tile_size_keeps_float32_error_within_the_bound(axes, channels, bound):
    """All-positive inputs (as after a ReLU) are the hard case: the transforms subtract large equal values. The
    error is measured relative to the layer's largest output, a stricter scale than max(|score|, 1)."""
    generator = torch.Generator().manual_seed(7)
    weight = torch.randn(channels, channels, *(3,) * axes, generator=generator)
    x = torch.rand(1, channels, *(36 if axes == 2 else 20,) * axes, generator=generator)
    op = ConvOp(weight, None, (2,) * axes, 1)
    expected = _taps(x.double(), ConvOp(weight.double(), None, op.dilation, 1))
    error = (winograd.conv(op, x).double() - expected).abs().max() / expected.abs().max()
    assert error <= bound


def _gpu_loops(enable: bool) -> bool:
    return torch.ops.densecnn._use_gpu_loops_on_cpu(enable)


@pytest.mark.parametrize("axes", [2, 3])
@pytest.mark.parametrize("m", [2, 3, 4])
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("classes", [40, 42, 800])
def test_chunks_of_tiles_equal_the_tap_sum_on_cpu_and_gpu_loops(axes, m, channels_last, classes):
    """Enough tiles for several chunks (each at most 1 MB of transformed input and products), the last one partial:
    the conv equals the tap sum both with the CPU's vectorised loops and with the CUDA kernels' per-element bodies.
    40 output channels are five vectors of doubles (the CPU's own products of a chunk), 42 are padded with zero
    channels to 44 (the products' rows five vectors and, with AVX-512, a half one wide, the output transform reading
    the first 42), and 21 · 800 channel pairs are too many for the own products' kernel to stay in L1 (MKL's
    GEMM)."""
    generator = torch.Generator().manual_seed(axes * 10 + m)
    dilation = [3, 2, 1][:axes]
    x = torch.randn(
        2, 21, *((61, 59) if axes == 2 else (19, 17, 15)), dtype=torch.float64, generator=generator
    )
    x = x.contiguous(memory_format=LAYOUTS[axes]) if channels_last else x
    weight = torch.randn(classes, 21, *(3,) * axes, dtype=torch.float64, generator=generator)
    bias = torch.randn(classes, dtype=torch.float64, generator=generator)
    expected = _taps(x, ConvOp(weight, bias, tuple(dilation), 1))
    out = [s - 2 * d for s, d in zip(x.shape[2:], dilation)]
    tiles = x.shape[0] * math.prod(winograd.positions(o, d, m) for o, d in zip(out, dilation))
    chunk_bytes = (m + 2) ** axes * (21 + classes) * x.element_size() * tiles
    assert chunk_bytes > 2 * 2**20  # at least three chunks
    u = winograd.transformed_kernel(weight, m)
    for gpu_loops in (False, True):
        previous = _gpu_loops(gpu_loops)
        try:
            y = torch.ops.densecnn.winograd_conv(x, weight, u, bias, dilation, m)
        finally:
            _gpu_loops(previous)
        assert_close_relative(y, expected, 1e-10, floor=1.0)


def test_winograd_conv_refuses_a_weight_its_kernel_was_not_transformed_from():
    x = torch.randn(1, 4, 12, 12)
    weight = torch.randn(6, 4, 3, 3)
    u = winograd.transformed_kernel(weight, 2)
    with pytest.raises(RuntimeError, match=r"weight must be the \[6, 4, 3, 3\] weight"):
        torch.ops.densecnn.winograd_conv(x, weight[:5], u, None, [1, 1], 2)


def _check_net(model, patch, x, mode, rel, reference):
    dense = densecnn.convert(model, patch, padding_mode=mode)
    dense.solver = "winograd"
    with torch.no_grad():
        y = dense(x)
    assert_close_relative(y, reference(model, x, patch, mode), rel, floor=1.0)


def _scan_patches(model, x, patch, mode):
    return densecnn.scan_patches(model, x, patch, padding_mode=mode)


def _image_net_check(net, data, dtype, rel):
    model, patch = net
    model = model.to(dtype)
    n = data.draw(st.integers(1, 2), label="batch")
    size = [data.draw(st.integers(1, p + 6), label="side") for p in patch]
    mode = data.draw(st.sampled_from(["zeros", "reflect", "replicate"]), label="padding_mode")
    x = torch.randn(n, model.in_channels, *size, dtype=dtype, generator=torch.Generator().manual_seed(n))
    _check_net(model, patch, x, mode, rel, _scan_patches)


@settings(max_examples=40, deadline=None)
@given(net=test_equivalence.patch_nets().filter(test_equivalence._valid), data=st.data())
def test_image_nets_through_winograd_equal_patch_scanning(net, data):
    _image_net_check(net, data, torch.float64, 1e-10)


@settings(max_examples=30, deadline=None)
@given(net=test_equivalence.patch_nets().filter(test_equivalence._valid), data=st.data())
def test_image_nets_through_winograd_equal_patch_scanning_float32(net, data):
    _image_net_check(net, data, torch.float32, 1e-5)


@settings(max_examples=25, deadline=None)
@given(net=test_volumes.patch_nets(3).filter(test_volumes._valid), data=st.data())
def test_volume_nets_through_winograd_equal_window_scanning(net, data):
    model, patch = net
    dtype = data.draw(st.sampled_from([torch.float64, torch.float32]), label="dtype")
    model = model.to(dtype)
    x = test_volumes._input(data, model, patch, dtype, test_volumes.MAX_SIDE[3])
    mode = data.draw(st.sampled_from(["zeros", "reflect", "replicate"]), label="padding_mode")
    _check_net(model, patch, x, mode, 1e-10 if dtype == torch.float64 else 1e-5, literal_scan)


def test_the_zoo_nets_through_winograd_equal_native_float64():
    for name, shape in (("plain_133", (1, 3, 40, 40)), ("znni_3d", (1, 1, 12, 12, 12))):
        model, patch = densecnn.zoo.create(name, in_channels=shape[1], num_classes=3)
        model = model.double().eval()
        x = torch.rand(shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
        dense = densecnn.convert(model, patch)
        dense.solver = "winograd"
        with torch.no_grad():
            y = dense(x)
        assert any(step.solver == "winograd" for step in next(iter(dense._plans.values())).steps)
        with torch.no_grad():
            assert_close_relative(y, densecnn.convert(model, patch, backend="native")(x), 1e-10, floor=1.0)


@pytest.mark.parametrize("axes", [2, 3])
@pytest.mark.parametrize("channels_last", [False, True])
def test_winograd_gradients_equal_native_gradients(axes, channels_last):
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(2, 3, *[17, 15, 11][:axes], dtype=torch.float64, generator=generator)
    x = x.contiguous(memory_format=LAYOUTS[axes]) if channels_last else x
    weight = torch.randn(4, 3, *(3,) * axes, dtype=torch.float64, generator=generator)
    bias = torch.randn(4, dtype=torch.float64, generator=generator)
    dilation = (3, 2, 1)[:axes]
    out = [s - 2 * d for s, d in zip(x.shape[2:], dilation)]
    upstream = torch.randn(2, 4, *out, dtype=torch.float64, generator=generator)
    grads = {}
    for solver in ("native", "winograd"):
        leaves = [t.clone().requires_grad_() for t in (x, weight, bias)]
        y = solvers.run(solver, ConvOp(leaves[1], leaves[2], dilation, 1), leaves[0])
        (y * upstream).sum().backward()
        grads[solver] = [leaf.grad for leaf in leaves]
    for native, wino in zip(grads["native"], grads["winograd"]):
        assert_close_relative(wino, native, 1e-10, floor=1.0)


@settings(max_examples=80, deadline=None)
@given(problem=conv_problems(), gpu_loops=st.booleans())
def test_the_input_gradient_by_winograd_equals_the_tap_sum(problem, gpu_loops):
    """The input gradient as a Winograd conv of the output gradient, its 2·d padding read as zeros (the CPU loops
    or the CUDA kernels' per-element bodies), equals the full correlation of the zero-padded output gradient with
    the flipped kernel, tap by tap (float64, 2-D and 3-D, every m, either memory format)."""
    op, x, _ = problem
    out = [s - 2 * d for s, d in zip(x.shape[2:], op.dilation)]
    generator = torch.Generator().manual_seed(sum(x.shape))
    grad_y = torch.randn(x.shape[0], op.weight.shape[0], *out, dtype=x.dtype, generator=generator)
    if _is_channels_last(x):
        grad_y = grad_y.contiguous(memory_format=LAYOUTS[x.dim() - 2])
    previous = torch.ops.densecnn._use_gpu_loops_on_cpu(gpu_loops)
    try:
        got = winograd.input_gradient(grad_y, op.weight, op.dilation)
    finally:
        torch.ops.densecnn._use_gpu_loops_on_cpu(previous)
    padded = torch.nn.functional.pad(grad_y, [2 * d for d in reversed(op.dilation) for _ in range(2)])
    flipped = op.weight.flip(list(range(2, op.weight.dim()))).transpose(0, 1)
    assert got.shape == x.shape
    assert_close_relative(got, _taps(padded, ConvOp(flipped, None, op.dilation, 1)), 1e-10, floor=1.0)


def _tap_weight_gradient(grad_y: torch.Tensor, x: torch.Tensor, dilation) -> torch.Tensor:
    """Independent reference: each tap's weight gradient, the output gradient times the input that tap read."""
    out = grad_y.shape[2:]
    grad = torch.zeros(grad_y.shape[1], x.shape[1], *(3,) * len(out), dtype=x.dtype)
    for tap in itertools.product(range(3), repeat=len(out)):
        window = x[
            (slice(None), slice(None), *(slice(t * d, t * d + o) for t, d, o in zip(tap, dilation, out)))
        ]
        grad[(slice(None), slice(None), *tap)] = torch.einsum("nk...,nc...->kc", grad_y, window)
    return grad


def _bias_gradient(grad_y):
    """The output gradient summed over every axis but the channels, pixel by pixel in float64."""
    return grad_y.double().movedim(1, -1).reshape(-1, grad_y.shape[1]).sum(0)


@settings(max_examples=80, deadline=None)
@given(problem=conv_problems(), gpu_loops=st.booleans())
def test_the_weight_gradient_by_winograd_equals_the_tap_sum(problem, gpu_loops):
    """Σ over tiles of V[ξ]ᵀ z[ξ], then Gᵀ·G, equals the tap-by-tap weight gradient, and the sum of z at the point
    where A's row is all ones the output gradient's sum (the CPU loops or the CUDA kernels' per-element bodies;
    float64, 2-D and 3-D, every m, either memory format)."""
    op, x, m = problem
    out = [s - 2 * d for s, d in zip(x.shape[2:], op.dilation)]
    generator = torch.Generator().manual_seed(sum(x.shape) + 1)
    grad_y = torch.randn(x.shape[0], op.weight.shape[0], *out, dtype=x.dtype, generator=generator)
    if _is_channels_last(x):
        grad_y = grad_y.contiguous(memory_format=LAYOUTS[x.dim() - 2])
    previous = torch.ops.densecnn._use_gpu_loops_on_cpu(gpu_loops)
    try:
        got, got_bias = winograd.weight_gradient(grad_y, x, op.dilation, m)
    finally:
        torch.ops.densecnn._use_gpu_loops_on_cpu(previous)
    assert_close_relative(got, _tap_weight_gradient(grad_y, x, op.dilation), 1e-10, floor=1.0)
    assert_close_relative(got_bias, _bias_gradient(grad_y), 1e-10, floor=1.0)


@pytest.mark.parametrize("axes", [2, 3])
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("classes", [40, 42, 800])
def test_the_weight_gradient_over_chunks_of_tiles_equals_the_tap_sum(axes, channels_last, classes):
    """Enough tiles for several of the weight gradient's chunks, the last one partial, summed into one result: 40
    output channels are five vectors of doubles (the CPU's own products), 42 are padded with zero channels to 44
    (five vectors and, with AVX-512, a half one; the result's padding dropped), and 21 · 800 channel pairs take MKL's GEMM; the CPU loops and the CUDA kernels'
    per-element bodies alike."""
    generator = torch.Generator().manual_seed(axes * 100 + classes)
    dilation = [3, 2, 1][:axes]
    x = torch.randn(
        2, 21, *((100, 100) if axes == 2 else (19, 17, 15)), dtype=torch.float64, generator=generator
    )
    out = [s - 2 * d for s, d in zip(x.shape[2:], dilation)]
    grad_y = torch.randn(2, classes, *out, dtype=torch.float64, generator=generator)
    if channels_last:
        x, grad_y = (t.contiguous(memory_format=LAYOUTS[axes]) for t in (x, grad_y))
    m = winograd.tile_size(axes, 21)
    tiles = x.shape[0] * math.prod(winograd.positions(o, d, m) for o, d in zip(out, dilation))
    assert tiles * (m + 2) ** axes * (21 + classes) * x.element_size() > 16 * 2**20  # at least three chunks
    expected = _tap_weight_gradient(grad_y, x, dilation)
    for gpu_loops in (False, True):
        previous = _gpu_loops(gpu_loops)
        try:
            got, got_bias = winograd.weight_gradient(grad_y, x, dilation)
        finally:
            _gpu_loops(previous)
        assert_close_relative(got, expected, 1e-10, floor=1.0)
        assert_close_relative(got_bias, _bias_gradient(grad_y), 1e-10, floor=1.0)


@pytest.mark.parametrize("axes, channels", [(2, 50), (2, 130), (3, 16)])
def test_the_weight_gradients_float32_error_stays_within_the_bound(axes, channels):
    """The default tile of the weight gradient on a layer-sized problem with all-positive inputs (the hard case
    for cancellation), float32 against float64: within 1e-5 of the largest gradient entry."""
    generator = torch.Generator().manual_seed(7)
    size = [60, 64] if axes == 2 else [20, 22, 24]
    x = torch.rand(1, channels, *size, dtype=torch.float64, generator=generator)
    grad_y = torch.rand(1, 8, *[s - 2 * 2 for s in size], dtype=torch.float64, generator=generator)
    exact, exact_bias = winograd.weight_gradient(grad_y, x, [2] * axes)
    single, single_bias = winograd.weight_gradient(grad_y.float(), x.float(), [2] * axes)
    error = (single.double() - exact).abs().max() / exact.abs().max()
    assert error < 1e-5, f"float32 error {error:.2e} of the largest gradient"
    bias_error = (single_bias.double() - exact_bias).abs().max() / exact_bias.abs().max()
    assert bias_error < 1e-6, f"float32 error {bias_error:.2e} of the bias's largest gradient"


@pytest.mark.parametrize("axes", [2, 3])
def test_winograd_conv_weight_grad_passes_opcheck(axes):
    generator = torch.Generator().manual_seed(8)
    x = torch.randn(2, 3, *[9, 8, 7][:axes], generator=generator)
    grad_y = torch.randn(2, 4, *[9 - 4, 8 - 2, 7 - 4][:axes], generator=generator)
    torch.library.opcheck(torch.ops.densecnn.winograd_conv_weight_grad, (x, grad_y, [2, 1, 2][:axes], 3))


@pytest.mark.parametrize("axes", [2, 3])
def test_padded_winograd_conv_passes_opcheck_and_gradcheck(axes):
    generator = torch.Generator().manual_seed(6)
    x = torch.randn(1, 2, *[7, 6, 5][:axes], dtype=torch.float64, generator=generator, requires_grad=True)
    weight = torch.randn(3, 2, *(3,) * axes, dtype=torch.float64, generator=generator, requires_grad=True)
    dilation, padding = [2, 1, 2][:axes], [3, 2, 1][:axes]
    u = winograd._transform_kernel(weight, 2)
    torch.library.opcheck(torch.ops.densecnn.winograd_conv, (x, weight, u, None, dilation, 2, padding))
    assert torch.autograd.gradcheck(  # the kernel transformed afresh: gradcheck perturbs the weight's data in place
        lambda x, w: torch.ops.densecnn.winograd_conv(
            x, w, winograd._transform_kernel(w, 2), None, dilation, 2, padding
        ),
        (x, weight),
    )


@pytest.mark.parametrize("axes", [2, 3])
def test_winograd_passes_gradcheck(axes):
    generator = torch.Generator().manual_seed(4)
    x = torch.randn(1, 2, *[9, 8, 7][:axes], dtype=torch.float64, generator=generator, requires_grad=True)
    weight = torch.randn(3, 2, *(3,) * axes, dtype=torch.float64, generator=generator, requires_grad=True)
    bias = torch.randn(3, dtype=torch.float64, generator=generator, requires_grad=True)
    dilation = (2, 1, 2)[:axes]
    assert torch.autograd.gradcheck(
        lambda *t: winograd.conv(ConvOp(t[1], t[2], dilation, 1), t[0]), (x, weight, bias)
    )


def _op_samples():
    generator = torch.Generator().manual_seed(5)
    samples = []
    for axes, channels_last in itertools.product((2, 3), (False, True)):
        x = torch.randn(1, 5, *[10, 9, 8][:axes], generator=generator)
        x = x.contiguous(memory_format=LAYOUTS[axes]) if channels_last else x
        dilation = [2, 1, 2][:axes]
        weight = torch.randn(3, 5, *(3,) * axes, generator=generator)
        u = winograd.transformed_kernel(weight, 2)
        samples.append((torch.ops.densecnn.winograd_conv.default, (x, weight, u, None, dilation, 2)))
        grads = [t.detach().requires_grad_() for t in (x, weight)]
        samples.append((torch.ops.densecnn.winograd_conv.default, (*grads, u, torch.randn(3), dilation, 2)))
    return samples


@pytest.mark.parametrize("index", range(len(_op_samples())))
def test_opcheck(index):
    op, args = _op_samples()[index]
    torch.library.opcheck(op, args)


def test_transformed_kernel_is_reused_until_the_weight_changes():
    weight = torch.randn(4, 3, 3, 3)
    x = torch.randn(1, 3, 30, 30)
    op = ConvOp(weight, None, (2, 2), 1)
    first = winograd.transformed_kernel(weight, 4)
    assert winograd.transformed_kernel(weight, 4) is first
    with torch.no_grad():
        weight.mul_(-2.0)  # an optimiser step: in place, bumps the version
    assert winograd.transformed_kernel(weight, 4) is not first
    assert_close_relative(winograd.conv(op, x), _taps(x, op), 1e-5, floor=1.0)


def test_bfloat16_input_is_computed_in_float32_and_rounded_back():
    generator = torch.Generator().manual_seed(6)
    x = torch.randn(1, 4, 40, 40, generator=generator)
    op = ConvOp(torch.randn(3, 4, 3, 3, generator=generator), None, (4, 4), 1)
    y = solvers.run("winograd", op, x.bfloat16())
    assert y.dtype == torch.bfloat16
    expected = _taps(x.bfloat16().double(), ConvOp(op.weight.bfloat16().double(), None, (4, 4), 1))
    assert_close_relative(y.double(), expected, 2e-2, floor=1.0)


def test_winograd_applies_to_ungrouped_three_tap_convs_in_two_and_three_axes():
    assert winograd.applies(ConvOp(torch.zeros(4, 2, 3, 3), None, (8, 8), 1))
    assert winograd.applies(ConvOp(torch.zeros(4, 2, 3, 3, 3), None, (2, 4, 4), 1))
    assert not winograd.applies(ConvOp(torch.zeros(4, 1, 3, 3), None, (1, 1), 2))  # grouped
    assert not winograd.applies(ConvOp(torch.zeros(4, 2, 5, 5), None, (1, 1), 1))
    assert not winograd.applies(ConvOp(torch.zeros(4, 2, 3), None, (1,), 1))  # signals
    assert not winograd.applies(solvers.PoolOp("max_pool2d", (3, 3), (1, 1)))


def test_the_config_forces_winograd(ops_config):
    ops_config(solver="winograd")
    model, patch = densecnn.zoo.create("plain_133", in_channels=3, num_classes=3)
    dense = densecnn.convert(model.eval(), patch)
    with torch.no_grad():
        dense(torch.rand(1, 3, 20, 20))
    solvers_used = [step.solver for step in next(iter(dense._plans.values())).steps]
    assert solvers_used.count("winograd") == 1  # the one 3×3 conv; the others run natively


def test_an_input_smaller_than_the_kernel_reach_is_a_clear_error():
    op = ConvOp(torch.zeros(2, 1, 3, 3), None, (4, 4), 1)
    with pytest.raises(ValueError, match="smaller than the 3-tap kernel"):
        winograd.conv(op, torch.zeros(1, 1, 8, 20))
