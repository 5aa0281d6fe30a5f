"""The transform-domain solver ``fft``: exact to rounding against independent references (its vectorised CPU loops
and the CUDA kernels' per-element bodies run on the CPU), differentiable, and its kernel-spectrum cache follows the
weights."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import densecnn
from densecnn.ops import ext, fft_conv, solvers
from densecnn.ops.solvers import ConvOp
from tests.core.test_equivalence import _valid, patch_nets
from tests.tolerances import assert_close_relative

FORMATS = {"nchw": torch.contiguous_format, "nhwc": torch.channels_last}

pytestmark = pytest.mark.skipif(
    not fft_conv.built(), reason="densecnn's kernels (with fft_conv2d) are not built"
)


@pytest.fixture(autouse=True)
def solver_cache(tmp_path, ops_config):
    ops_config(cache_dir=tmp_path / "cache", solver=None, memory_format=None)


def _taps(x: torch.Tensor, op: ConvOp) -> torch.Tensor:
    """Independent reference: every output is an explicit sum over the dilated window's taps."""
    (kh, kw), (dh, dw) = op.kernel, op.dilation
    ho, wo = x.shape[2] - (kh - 1) * dh, x.shape[3] - (kw - 1) * dw
    out = torch.zeros(x.shape[0], op.weight.shape[0], ho, wo, dtype=x.dtype)
    for a in range(kh):
        for b in range(kw):
            tap = x[:, :, a * dh : a * dh + ho, b * dw : b * dw + wo]  # (N, C, ho, wo)
            out += torch.einsum("nchw,kc->nkhw", tap, op.weight[:, :, a, b])
    return out if op.bias is None else out + op.bias.view(1, -1, 1, 1)


@st.composite
def conv_problems(draw, dtype=torch.float64):
    """(op, x): a random ungrouped conv, dilation and image size (possibly smaller than one tile)."""
    seed = draw(st.integers(0, 2**31 - 1), label="seed")
    generator = torch.Generator().manual_seed(seed)
    kernel = (draw(st.integers(1, 8)), draw(st.integers(1, 8)))
    dilation = (draw(st.integers(1, 5)), draw(st.integers(1, 5)))
    channels, classes, batch = draw(st.integers(1, 6)), draw(st.integers(1, 6)), draw(st.integers(1, 2))
    size = [(k - 1) * d + draw(st.integers(1, 40)) for k, d in zip(kernel, dilation)]
    weight = torch.randn(classes, channels, *kernel, generator=generator, dtype=dtype)
    bias = torch.randn(classes, generator=generator, dtype=dtype) if draw(st.booleans()) else None
    x = torch.randn(batch, channels, *size, generator=generator, dtype=dtype)
    x = x.contiguous(memory_format=FORMATS[draw(st.sampled_from(list(FORMATS)))])
    return ConvOp(weight, bias, dilation, 1), x


@settings(max_examples=150, deadline=None)
@given(problem=conv_problems())
def test_fft_conv_equals_the_tap_sum_float64(problem):
    op, x = problem
    if not fft_conv.applies(op):
        assert op.kernel == (1, 1)
        return
    y = solvers.run("fft", op, x)
    assert_close_relative(y, _taps(x, op), 1e-10, floor=1.0)
    channels_last = not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last)
    assert y.is_contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)


@settings(max_examples=60, deadline=None)
@given(problem=conv_problems(dtype=torch.float32))
def test_fft_conv_equals_the_tap_sum_float32(problem):
    op, x = problem
    if fft_conv.applies(op):
        expected = _taps(x.double(), ConvOp(op.weight.double(), None, op.dilation, 1))
        if op.bias is not None:
            expected += op.bias.double().view(1, -1, 1, 1)
        assert_close_relative(solvers.run("fft", op, x).double(), expected, 1e-5, floor=1.0)


def _check_net(net, data, dtype, rel):
    model, patch = net
    model = model.to(dtype)
    n = data.draw(st.integers(1, 2), label="batch")
    height = data.draw(st.integers(1, patch[0] + 6), label="height")
    width = data.draw(st.integers(1, patch[1] + 6), label="width")
    mode = data.draw(st.sampled_from(["zeros", "reflect", "replicate"]), label="padding_mode")
    seed = data.draw(st.integers(0, 2**31 - 1), label="image seed")
    x = torch.randn(
        n, model.in_channels, height, width, dtype=dtype, generator=torch.Generator().manual_seed(seed)
    )
    expected = densecnn.scan_patches(model, x, patch, padding_mode=mode)
    dense = densecnn.convert(model, patch, padding_mode=mode)
    dense.solver = "fft"
    dense.memory_format = data.draw(st.sampled_from(list(FORMATS)), label="memory format")
    with torch.no_grad():
        assert_close_relative(dense(x), expected, rel, floor=1.0)


@settings(max_examples=60, deadline=None)
@given(net=patch_nets().filter(_valid), data=st.data())
def test_dense_nets_through_fft_equal_patch_scanning_float64(net, data):
    _check_net(net, data, torch.float64, 1e-10)


@settings(max_examples=40, deadline=None)
@given(net=patch_nets().filter(_valid), data=st.data())
def test_dense_nets_through_fft_equal_patch_scanning_float32(net, data):
    _check_net(net, data, torch.float32, 1e-5)


@pytest.mark.parametrize("memory_format", list(FORMATS))
def test_fft_gradients_equal_native_gradients(memory_format):
    """Input, weight and bias gradients through the frequency domain equal those of the direct conv (float64)."""
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(2, 3, 23, 19, dtype=torch.float64, generator=generator)
    x = x.contiguous(memory_format=FORMATS[memory_format])
    weight = torch.randn(4, 3, 5, 3, dtype=torch.float64, generator=generator)
    bias = torch.randn(4, dtype=torch.float64, generator=generator)
    upstream = torch.randn(2, 4, 23 - 4 * 3, 19 - 2 * 2, dtype=torch.float64, generator=generator)
    grads = {}
    for solver in ("native", "fft"):
        leaves = [t.clone().requires_grad_() for t in (x, weight, bias)]
        y = solvers.run(solver, ConvOp(leaves[1], leaves[2], (3, 2), 1), leaves[0])
        (y * upstream).sum().backward()
        grads[solver] = [leaf.grad for leaf in leaves]
    for native, fft in zip(grads["native"], grads["fft"]):
        assert_close_relative(fft, native, 1e-10, floor=1.0)


def test_fft_conv_passes_gradcheck_and_gradgradcheck():
    """First and second derivatives (the input gradient is the op again, itself differentiable)."""
    generator = torch.Generator().manual_seed(4)
    x = torch.randn(1, 2, 9, 8, dtype=torch.float64, generator=generator, requires_grad=True)
    weight = torch.randn(3, 2, 3, 2, dtype=torch.float64, generator=generator, requires_grad=True)
    bias = torch.randn(3, dtype=torch.float64, generator=generator, requires_grad=True)

    def conv(*t):
        return fft_conv.conv2d(ConvOp(t[1], t[2], (2, 3), 1), t[0])

    assert torch.autograd.gradcheck(conv, (x, weight, bias))
    assert torch.autograd.gradgradcheck(conv, (x, weight, bias))


def test_kernel_spectrum_is_reused_until_the_weight_changes():
    weight = torch.randn(4, 3, 5, 5)
    x = torch.randn(1, 3, 30, 30)
    op = ConvOp(weight, None, (2, 2), 1)
    with torch.no_grad():
        first = fft_conv.kernel_spectrum(weight, (12, 12), torch.float32)
        assert first.shape == (12 * 7, 3, 4) and first.dtype == torch.complex64
        assert not first.is_conj()  # a conjugate view would be resolved (copied) by every call's GEMM
        assert fft_conv.kernel_spectrum(weight, (12, 12), torch.float32) is first
        weight.mul_(-2.0)  # an optimiser step: in place, bumps the version
        assert fft_conv.kernel_spectrum(weight, (12, 12), torch.float32) is not first
        assert_close_relative(fft_conv.conv2d(op, x), _taps(x, op), 1e-5, floor=1.0)


@settings(max_examples=40, deadline=None)
@given(problem=conv_problems())
def test_the_cuda_per_element_bodies_equal_the_tap_sum(problem):
    """The CUDA kernels' per-element bodies (run on the CPU by the test switch) compute the same conv."""
    op, x = problem
    if not fft_conv.applies(op):
        return
    previous = torch.ops.densecnn._use_gpu_loops_on_cpu(True)
    try:
        y = solvers.run("fft", op, x)
    finally:
        torch.ops.densecnn._use_gpu_loops_on_cpu(previous)
    assert_close_relative(y, _taps(x, op), 1e-10, floor=1.0)


@pytest.mark.parametrize("gpu_loops", [False, True])
def test_tiles_in_several_groups_equal_the_tap_sum(gpu_loops):
    """Enough tiles for the op to run them in several groups (a group holds at least 32 tiles), the last one partial
    and reaching past the image."""
    generator = torch.Generator().manual_seed(8)
    x = torch.randn(1, 3, 215, 243, dtype=torch.float64, generator=generator)
    op = ConvOp(torch.randn(64, 3, 3, 3, dtype=torch.float64, generator=generator), None, (1, 1), 1)
    spectrum = fft_conv.kernel_spectrum(op.weight, (32, 32), torch.float64)
    previous = torch.ops.densecnn._use_gpu_loops_on_cpu(gpu_loops)
    try:
        y = torch.ops.densecnn.fft_conv2d(
            x, op.weight, spectrum, None, [32, 32], [30, 30], [1, 1]
        )  # 8 x 9 tiles
    finally:
        torch.ops.densecnn._use_gpu_loops_on_cpu(previous)
    assert_close_relative(y, _taps(x, op), 1e-10, floor=1.0)


@pytest.mark.parametrize("side", range(2, 65))
def test_every_tile_side_transforms_exactly(side):
    """The tile transforms on every side the planner may pick, up to 64, by themselves: each side's FFT stages
    (radix 4, 2, any odd prime up to 61) along h, and along w the packed real FFT (even widths) or the matrix (odd
    ones), in the forward, the input gradient's adjoint and the weight gradient, against independent references."""
    tile = (side, 2 + side * 37 % 63)  # widths run through odd and even, small and large
    kernel, dilation = (2, 2), (1, 2)
    valid = [t - k + 1 for t, k in zip(tile, kernel)]
    generator = torch.Generator().manual_seed(side)
    x = torch.randn(1, 3, tile[0] + 5, 2 * tile[1] + 3, dtype=torch.float64, generator=generator)
    op = ConvOp(torch.randn(4, 3, *kernel, dtype=torch.float64, generator=generator), None, dilation, 1)
    spectrum = fft_conv._spectrum(op.weight, tile, torch.float64)
    y = torch.ops.densecnn.fft_conv2d(x, op.weight, spectrum, None, list(tile), valid, list(dilation))
    assert_close_relative(y, _taps(x, op), 1e-10, floor=1.0)
    grad_y = torch.randn(y.shape, dtype=torch.float64, generator=generator)
    grad_x = torch.ops.densecnn.fft_conv2d_input_grad(
        grad_y, spectrum, list(x.shape[2:]), list(tile), valid, list(dilation), [0, 0]
    )
    x_ = x.clone().requires_grad_()
    (expected,) = torch.autograd.grad(
        torch.nn.functional.conv2d(x_, op.weight, dilation=dilation), x_, grad_y
    )
    assert_close_relative(grad_x, expected, 1e-10, floor=1.0)
    weight_spectrum = torch.ops.densecnn.fft_conv2d_weight_spectrum(
        x, grad_y, list(tile), valid, list(dilation)
    )
    grad_w = fft_conv._taps(weight_spectrum, tile, kernel)
    assert_close_relative(grad_w, _tap_weight_gradient(grad_y, x, kernel, dilation), 1e-10, floor=1.0)


def _tap_weight_gradient(grad_y: torch.Tensor, x: torch.Tensor, kernel, dilation) -> torch.Tensor:
    """Independent reference: each tap's weight gradient is the sum of the output gradient times the input it read."""
    (kh, kw), (dh, dw) = kernel, dilation
    ho, wo = grad_y.shape[2:]
    grad = torch.zeros(grad_y.shape[1], x.shape[1], kh, kw, dtype=x.dtype)
    for a in range(kh):
        for b in range(kw):
            tap = x[:, :, a * dh : a * dh + ho, b * dw : b * dw + wo]  # (N, C, ho, wo)
            grad[:, :, a, b] = torch.einsum("nkhw,nchw->kc", grad_y, tap)
    return grad


@settings(max_examples=100, deadline=None)
@given(problem=conv_problems(), gpu_loops=st.booleans(), grad_format=st.sampled_from(list(FORMATS)))
def test_fft_weight_gradient_equals_the_tap_sum(problem, gpu_loops, grad_format):
    """The weight gradient in the frequency domain (the CPU loops, or the CUDA kernels' per-element bodies) equals
    the tap-by-tap sum, for any kernel, dilation, image size and memory formats (float64)."""
    op, x = problem
    if not fft_conv.applies(op):
        return
    out = [s - (k - 1) * d for s, k, d in zip(x.shape[2:], op.kernel, op.dilation)]
    generator = torch.Generator().manual_seed(int(x.shape[2]) * 131 + int(x.shape[3]))
    grad_y = torch.randn(x.shape[0], op.weight.shape[0], *out, dtype=x.dtype, generator=generator)
    grad_y = grad_y.contiguous(memory_format=FORMATS[grad_format])
    previous = torch.ops.densecnn._use_gpu_loops_on_cpu(gpu_loops)
    try:
        grad = fft_conv.weight_gradient(grad_y, x, op.kernel, op.dilation)
    finally:
        torch.ops.densecnn._use_gpu_loops_on_cpu(previous)
    assert_close_relative(grad, _tap_weight_gradient(grad_y, x, op.kernel, op.dilation), 1e-10, floor=1.0)


@pytest.mark.parametrize("gpu_loops", [False, True])
def test_fft_weight_gradient_over_several_groups_of_tiles(gpu_loops, monkeypatch):
    """Enough tiles for several groups (a gradient's group holds at least 128), summed into one spectrum; the last
    tiles reach past the output (float32, to its rounding bound)."""
    monkeypatch.setattr(fft_conv, "MAX_TILE", 12)  # about 1,000 tiles
    generator = torch.Generator().manual_seed(9)
    x = torch.randn(2, 5, 150, 171, generator=generator)
    grad_y = torch.randn(2, 40, 150 - 4 * 2, 171 - 4 * 3, generator=generator)
    previous = torch.ops.densecnn._use_gpu_loops_on_cpu(gpu_loops)
    try:
        grad = fft_conv.weight_gradient(grad_y, x, (5, 5), (2, 3))
    finally:
        torch.ops.densecnn._use_gpu_loops_on_cpu(previous)
    expected = _tap_weight_gradient(grad_y.double(), x.double(), (5, 5), (2, 3))
    assert_close_relative(grad.double(), expected, 1e-5, floor=1.0)


def test_fft_double_backward_equals_the_direct_convs():
    """A gradient of a gradient (a gradient penalty) through the fft solver equals the direct conv's: the weight
    gradient of a double backward is taken by torch's differentiable formula."""
    generator = torch.Generator().manual_seed(5)
    x0 = torch.randn(1, 2, 12, 11, dtype=torch.float64, generator=generator)
    w0 = torch.randn(3, 2, 3, 2, dtype=torch.float64, generator=generator)
    results = {}
    for solver in ("native", "fft"):
        x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
        y = solvers.run(solver, ConvOp(w, None, (2, 3), 1), x)
        grad_w, grad_x = torch.autograd.grad(y.pow(2).sum(), (w, x), create_graph=True)
        results[solver] = torch.autograd.grad(grad_w.pow(2).sum() + grad_x.pow(2).sum(), (x, w))
    for fft, native in zip(results["fft"], results["native"]):
        assert_close_relative(fft, native, 1e-10, floor=1.0)


@pytest.mark.parametrize("memory_format", list(FORMATS))
def test_fft_conv2d_weight_spectrum_op_passes_opcheck(memory_format):
    generator = torch.Generator().manual_seed(7)
    x = torch.randn(2, 3, 17, 14, generator=generator).contiguous(memory_format=FORMATS[memory_format])
    grad_y = torch.randn(2, 5, 17 - 2 * 2, 14 - 3 * 3, generator=generator)
    torch.library.opcheck(torch.ops.densecnn.fft_conv2d_weight_spectrum, (x, grad_y, [8, 9], [6, 6], [2, 3]))


@pytest.mark.parametrize("padding", [[0, 0], [2, 5], [9, 1]])
def test_padded_fft_conv2d_passes_gradcheck(padding):
    """The padding is read as zeros; the input gradient of a padding narrower or wider than the kernel's reach
    (here 4×6) crops or pads accordingly."""
    generator = torch.Generator().manual_seed(10)
    x = torch.randn(1, 2, 9, 8, dtype=torch.float64, generator=generator, requires_grad=True)
    weight = torch.randn(3, 2, 3, 4, dtype=torch.float64, generator=generator)

    def conv(x):
        spectrum = fft_conv._spectrum(weight, (6, 7), x.dtype)
        return torch.ops.densecnn.fft_conv2d(x, weight, spectrum, None, [6, 7], [4, 4], [2, 2], padding)

    assert torch.autograd.gradcheck(conv, (x,))


def test_fft_conv2d_weight_spectrum_refuses_a_mismatched_output_gradient():
    x = torch.randn(1, 3, 17, 14)
    with pytest.raises(RuntimeError, match=r"output gradient must be \(1, K, 13, 5\)"):
        torch.ops.densecnn.fft_conv2d_weight_spectrum(x, torch.randn(1, 5, 12, 5), [8, 9], [6, 6], [2, 3])


@pytest.mark.parametrize("memory_format", list(FORMATS))
def test_fft_conv2d_op_passes_opcheck(memory_format):
    generator = torch.Generator().manual_seed(6)
    x = torch.randn(2, 3, 17, 14, generator=generator).contiguous(memory_format=FORMATS[memory_format])
    weight = torch.randn(5, 3, 3, 4, generator=generator)
    spectrum = fft_conv.kernel_spectrum(weight, (8, 9), torch.float32)
    bias = torch.randn(5, generator=generator)
    for grad in (False, True):  # the fake kernel alone, then with the autograd formula
        args = [t.detach().requires_grad_(grad) for t in (x, weight)]
        torch.library.opcheck(
            torch.ops.densecnn.fft_conv2d,
            (*args, spectrum, bias.requires_grad_(grad), [8, 9], [6, 6], [2, 3]),
        )


def test_fft_conv2d_refuses_a_weight_its_spectrum_was_not_made_from():
    x = torch.randn(1, 3, 17, 14)
    weight = torch.randn(5, 3, 3, 4)
    spectrum = fft_conv.kernel_spectrum(weight, (8, 9), torch.float32)
    with pytest.raises(RuntimeError, match=r"weight must be the \[5, 3, 3, 4\] weight"):
        torch.ops.densecnn.fft_conv2d(x, weight[:, :2], spectrum, None, [8, 9], [6, 6], [1, 1])


def test_training_steps_follow_the_weights():
    """Each optimiser step changes the weight in place; the next forward uses the new spectrum, and the gradients
    through the frequency domain equal the direct conv's at every step (float64)."""
    generator = torch.Generator().manual_seed(7)
    x = torch.randn(1, 3, 30, 26, dtype=torch.float64, generator=generator)
    weight = torch.randn(4, 3, 5, 5, dtype=torch.float64, generator=generator, requires_grad=True)
    optimiser = torch.optim.SGD([weight], lr=0.1)
    for _ in range(3):
        optimiser.zero_grad()
        y = solvers.run("fft", ConvOp(weight, None, (2, 3), 1), x)
        expected = _taps(x, ConvOp(weight.detach(), None, (2, 3), 1))
        assert_close_relative(y.detach(), expected, 1e-10, floor=1.0)
        (y * y).sum().backward()
        reference = weight.detach().clone().requires_grad_()
        (torch.nn.functional.conv2d(x, reference, dilation=(2, 3)) ** 2).sum().backward()
        assert_close_relative(weight.grad, reference.grad, 1e-10, floor=1.0)
        optimiser.step()


def test_bfloat16_input_is_computed_in_float32_and_rounded_back():
    generator = torch.Generator().manual_seed(5)
    x = torch.randn(1, 4, 40, 40, generator=generator)
    op = ConvOp(torch.randn(3, 4, 7, 7, generator=generator), None, (4, 4), 1)
    y = solvers.run("fft", op, x.bfloat16())
    assert y.dtype == torch.bfloat16
    expected = _taps(x.bfloat16().double(), ConvOp(op.weight.bfloat16().double(), None, (4, 4), 1))
    assert_close_relative(y.double(), expected, 2e-2, floor=1.0)


def test_fft_is_a_candidate_only_with_the_kernels():
    op = ConvOp(torch.zeros(4, 2, 5, 5), None, (2, 2), 1)
    assert "fft" in solvers.candidates(op, ext_available=ext.available())
    assert "fft" not in solvers.candidates(op, ext_available=False)


def test_fft_applies_to_ungrouped_convs_larger_than_one_pixel():
    weight = torch.zeros(4, 2, 3, 3)
    assert fft_conv.applies(ConvOp(weight, None, (2, 2), 1))
    assert not fft_conv.applies(ConvOp(weight, None, (2, 2), 2))  # grouped
    assert not fft_conv.applies(ConvOp(torch.zeros(4, 2, 1, 1), None, (1, 1), 1))
    assert not fft_conv.applies(solvers.PoolOp("max_pool2d", (2, 2), (1, 1)))


@pytest.mark.parametrize(
    ("sub_out", "kernel"), [((32, 32), (7, 7)), ((77, 77), (3, 3)), ((1, 1), (6, 6)), ((5, 300), (2, 9))]
)
def test_tile_sizes_cover_each_sub_grid_with_valid_tiles(sub_out, kernel):
    tile = fft_conv.tile_sizes(sub_out, kernel, 50, 32, 4)
    for t, k, s in zip(tile, kernel, sub_out):
        assert k < t <= max(fft_conv.MAX_TILE, k + 1)
        assert t <= max(k + 1, s + k - 1)  # never a tile larger than the sub-grid needs


def test_an_input_smaller_than_the_kernel_reach_is_a_clear_error():
    op = ConvOp(torch.zeros(2, 1, 3, 3), None, (4, 4), 1)
    with pytest.raises(ValueError, match="smaller than the 3x3 kernel at dilation"):
        fft_conv.conv2d(op, torch.zeros(1, 1, 8, 20))
