"""A conv's input and weight gradients by their own solvers: every combination of forward, input-gradient and
weight-gradient solver gives torch's gradients to rounding, a training plan chooses them apart from the forward (from
timings or the cost model), and the automatic choice gives the same gradients as each method."""

from __future__ import annotations

import itertools

import pytest
import torch

import densecnn
from densecnn.ops import costmodel, fft_conv, gradients, plan, solvers, tune
from densecnn.ops.solvers import ConvOp
from tests.tolerances import assert_close_relative

pytestmark = pytest.mark.skipif(
    not fft_conv.built(), reason="densecnn's kernels (with fft_conv2d) are not built"
)

FORMATS = {"nchw": torch.contiguous_format, "nhwc": torch.channels_last}


@pytest.fixture(autouse=True)
def solver_cache(tmp_path, ops_config):
    ops_config(cache_dir=tmp_path / "cache", solver=None, memory_format=None, tune=False)
    return tmp_path / "cache"


def _problem(memory_format: str, seed: int = 0, kernel=(5, 3)):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 3, 29, 26, dtype=torch.float64, generator=generator)
    weight = torch.randn(4, 3, *kernel, dtype=torch.float64, generator=generator)
    bias = torch.randn(4, dtype=torch.float64, generator=generator)
    out = (29 - (kernel[0] - 1) * 3, 26 - (kernel[1] - 1) * 2)
    upstream = torch.randn(2, 4, *out, dtype=torch.float64, generator=generator)
    return x.contiguous(memory_format=FORMATS[memory_format]), weight, bias, upstream


def _torch_gradients(x, weight, bias, upstream):
    leaves = [t.clone().requires_grad_() for t in (x, weight, bias)]
    y = torch.nn.functional.conv2d(leaves[0], leaves[1], leaves[2], dilation=(3, 2))
    (y * upstream).sum().backward()
    return [leaf.grad for leaf in leaves]


@pytest.mark.parametrize("memory_format", list(FORMATS))
@pytest.mark.parametrize(
    "forward, input_solver, weight_solver",
    list(
        itertools.product(["native", "fft", "s2b", "ext", "winograd"], gradients.SOLVERS, gradients.SOLVERS)
    ),
)
def test_every_combination_gives_torchs_gradients(memory_format, forward, input_solver, weight_solver):
    """On a 3×3 conv at dilation (3, 2) every solver applies: each forward with each input and weight gradient."""
    x, weight, bias, upstream = _problem(memory_format, kernel=(3, 3))
    expected = _torch_gradients(x, weight, bias, upstream)
    leaves = [t.clone().requires_grad_() for t in (x, weight, bias)]
    op = ConvOp(leaves[1], leaves[2], (3, 2), 1)
    y = gradients.conv(op, leaves[0], forward, input_solver=input_solver, weight_solver=weight_solver)
    assert_close_relative(y, torch.nn.functional.conv2d(x, weight, bias, dilation=(3, 2)), 1e-10, floor=1.0)
    assert y.is_contiguous(memory_format=FORMATS[memory_format])
    (y * upstream).sum().backward()
    for got, want in zip((leaf.grad for leaf in leaves), expected, strict=True):
        assert_close_relative(got, want, 1e-10, floor=1.0)


@pytest.mark.parametrize("memory_format", list(FORMATS))
def test_the_winograd_weight_gradient_gives_the_bias_gradient_too(memory_format, monkeypatch):
    """The Winograd weight gradient reads the bias's gradient off the output gradient's transformed tiles: the
    output gradient is not summed again, and the result is torch's."""
    monkeypatch.setattr(gradients, "bias_gradient", None)  # not called
    x, weight, bias, upstream = _problem(memory_format, kernel=(3, 3))
    expected = _torch_gradients(x, weight, bias, upstream)
    leaves = [t.clone().requires_grad_() for t in (x, weight, bias)]
    y = gradients.conv(
        ConvOp(leaves[1], leaves[2], (3, 2), 1),
        leaves[0],
        "winograd",
        input_solver="native",
        weight_solver="winograd",
    )
    (y * upstream).sum().backward()
    for got, want in zip((leaf.grad for leaf in leaves), expected, strict=True):
        assert_close_relative(got, want, 1e-10, floor=1.0)


def test_a_double_backward_through_the_fft_gradients_equals_torchs():
    x, weight, _, _ = _problem("nchw", seed=1)
    results = []
    for route in ("torch", "fft"):
        xs, ws = x.clone().requires_grad_(), weight.clone().requires_grad_()
        if route == "torch":
            y = torch.nn.functional.conv2d(xs, ws, dilation=(3, 2))
        else:
            y = gradients.conv(
                ConvOp(ws, None, (3, 2), 1), xs, "fft", input_solver="fft", weight_solver="fft"
            )
        grad_x, grad_w = torch.autograd.grad(y.pow(2).sum(), (xs, ws), create_graph=True)
        results.append(torch.autograd.grad(grad_x.pow(2).sum() + grad_w.pow(2).sum(), (xs, ws)))
    for got, want in zip(results[1], results[0], strict=True):
        assert_close_relative(got, want, 1e-10, floor=1.0)


def test_a_training_forward_caches_no_kernel_spectrum():
    """The weights change every step: their spectra must not pile up in the inference cache."""
    x = torch.randn(1, 3, 40, 40)
    weight = torch.randn(4, 3, 5, 5, requires_grad=True)
    before = len(fft_conv._spectra)
    y = gradients.conv(ConvOp(weight, None, (2, 2), 1), x, "fft", input_solver=None, weight_solver="fft")
    y.sum().backward()
    assert len(fft_conv._spectra) == before and weight.grad is not None


def _fake_gradient_times(input_solver: str, weight_solver: str):
    def fake(op, shape, dtype, device, *, ext, cache_dir, input_grad, time_missing):
        wanted = {"grad_weight": weight_solver, "grad_input": input_solver}
        table = {
            direction: {
                s: 1.0 if s == wanted[direction] else 5.0
                for s in gradients.SOLVERS
                if gradients.applies(s, op)
            }
            for direction in (gradients.DIRECTIONS if input_grad else ("grad_weight",))
        }
        return {"nchw": table, "nhwc": table}

    return fake


@pytest.mark.parametrize("net", ["stages_46", "tiny"])
@pytest.mark.parametrize("input_solver, weight_solver", list(itertools.product(gradients.SOLVERS, repeat=2)))
def test_the_plans_choice_follows_the_times_and_every_choice_gives_the_same_gradients(
    monkeypatch, net, input_solver, weight_solver
):
    """Each (input, weight) gradient solver pair made fastest in turn: the plan picks it for every conv it runs
    (the others take the next fastest, native; none for the image's input gradient), and the net's gradients equal
    those of the native backend."""
    monkeypatch.setattr(plan, "tuned_gradient_times", _fake_gradient_times(input_solver, weight_solver))
    torch.manual_seed(0)
    model, patch = densecnn.zoo.create(net, in_channels=2, num_classes=3)
    model = model.double()
    x = torch.rand(1, 2, 14, 13, dtype=torch.float64)
    grads = {}
    for backend in ("native", "auto"):
        dense = densecnn.convert(model, patch, backend=backend)
        model.zero_grad()
        dense(x).square().sum().backward()
        grads[backend] = [p.grad.clone() for p in model.parameters()]
        if backend == "auto":
            with torch.enable_grad():
                steps = dense.plan(dense.pad(x)).steps
    convs = [step for step in steps if step.gradients is not None]  # a 1×1 conv has only torch's gradients
    assert convs[0] is steps[0] and len(convs) >= 2

    def expected(step, solver):
        return solver if gradients.applies(solver, step.dense_op()) else "native"

    assert [step.gradients for step in convs] == [(None, expected(convs[0], weight_solver))] + [
        (expected(step, input_solver), expected(step, weight_solver)) for step in convs[1:]
    ]
    assert all(step.gradient_source == "tuned" for step in convs)
    for got, want in zip(grads["auto"], grads["native"], strict=True):
        assert_close_relative(got, want, 1e-10, floor=1.0)


def test_inference_plans_choose_no_gradients():
    torch.manual_seed(0)
    model, patch = densecnn.zoo.create("stages_46", in_channels=2, num_classes=3)
    dense = densecnn.convert(model.eval(), patch)
    with torch.no_grad():
        steps = dense.plan(torch.zeros(1, 2, 60, 60)).steps
    assert all(step.gradients is None and step.gradient_times is None for step in steps)


def test_immediate_mode_predicts_the_gradient_solvers_from_the_shipped_model(monkeypatch):
    """No timing: the cost model has fits for both gradient solvers, and for plain_133's last conv (7×7 at dilation
    16 on a 256² image) it puts the frequency domain ahead for the weight gradient."""
    monkeypatch.setattr(tune, "time_gradients", lambda *a, **k: pytest.fail("immediate mode timed gradients"))
    op = ConvOp(torch.zeros(32, 50, 7, 7), None, (16, 16), 1)
    shape = tune.timing_shape(op, (1, 50, 256 + 96, 256 + 96))
    table = costmodel.estimate_gradients(op, shape, torch.float32, list(gradients.SOLVERS), input_grad=True)
    for fmt in ("nchw", "nhwc"):
        for direction in gradients.DIRECTIONS:
            assert all(ms is not None and ms > 0 for ms in table[fmt][direction].values())
        assert table[fmt]["grad_weight"]["fft"] < table[fmt]["grad_weight"]["native"]
    torch.manual_seed(0)
    model, patch = densecnn.zoo.create("plain_133", in_channels=3, num_classes=32)
    dense = densecnn.convert(model, patch)
    with torch.enable_grad():
        last = dense.plan(torch.zeros(1, 3, 256 + 95, 256 + 95)).steps[-1]
    assert last.gradient_source == "predicted" and last.gradients[1] == "fft"


def test_find_times_the_gradient_solvers_once_and_caches_them(solver_cache):
    op = ConvOp(torch.randn(4, 3, 3, 3), None, (2, 2), 1)
    first = tune.tuned_gradient_times(
        op, (1, 3, 30, 30), torch.float32, "cpu", ext=True, cache_dir=solver_cache, input_grad=True
    )
    assert set(first) == {"nchw", "nhwc"}
    for tables in first.values():
        assert set(tables) == set(gradients.DIRECTIONS)
        assert all(ms is not None and ms > 0 for table in tables.values() for ms in table.values())
    again = tune.tuned_gradient_times(
        op, (1, 3, 30, 30), torch.float32, "cpu", ext=True, cache_dir=solver_cache, input_grad=True,
        time_missing=False,
    )  # fmt: skip
    assert again == first
    weight_only = tune.tuned_gradient_times(
        op, (1, 3, 30, 30), torch.float32, "cpu", ext=True, cache_dir=solver_cache, input_grad=False,
        time_missing=False,
    )  # fmt: skip
    assert weight_only is None  # another problem: not timed yet


def test_which_gradient_solvers_apply():
    """fft: ungrouped 2-D convs larger than 1×1; winograd: ungrouped 3×3 and 3×3×3 convs."""
    everything = set(solvers.SOLVERS)
    conv3x3 = ConvOp(torch.zeros(4, 3, 3, 3), None, (2, 2), 1)
    assert gradients.candidates(conv3x3, everything) == ["native", "fft", "winograd"]
    assert gradients.candidates(ConvOp(torch.zeros(4, 3, 5, 5), None, (2, 2), 1), everything) == [
        "native",
        "fft",
    ]
    assert gradients.candidates(conv3x3, {"native"}) == ["native"]
    assert gradients.candidates(ConvOp(torch.zeros(4, 1, 3, 3), None, (2, 2), 4), everything) == ["native"]
    volume = ConvOp(torch.zeros(4, 3, 3, 3, 3), None, (1, 1, 1), 1)
    assert gradients.candidates(volume, everything) == ["native", "winograd"]
    assert gradients.candidates(ConvOp(torch.zeros(4, 3, 2, 2, 2), None, (1, 1, 1), 1), everything) == [
        "native"
    ]
    assert gradients.candidates(solvers.PoolOp("max_pool2d", (2, 2), (1, 1)), everything) == []


@pytest.mark.parametrize("forced", ["native", "fft"])
def test_a_forced_gradient_solver_runs_every_conv_it_can(forced, ops_config):
    ops_config(gradient_solver=forced)
    torch.manual_seed(0)
    model, patch = densecnn.zoo.create("stages_46", in_channels=2, num_classes=3)
    dense = densecnn.convert(model.double(), patch)
    x = torch.rand(1, 2, 14, 13, dtype=torch.float64)
    with torch.enable_grad():
        steps = dense.plan(dense.pad(x)).steps
    convs = [step for step in steps if step.gradients is not None]
    assert len(convs) == 4
    assert [step.gradients for step in convs] == [(None, forced)] + [(forced, forced)] * 3
    assert {step.gradient_source for step in convs} == {"forced"}


def test_an_unknown_gradient_solver_is_refused_with_the_choices():
    with pytest.raises(
        ValueError, match="gradient solver 'direct' is unknown; use one of native, fft, winograd"
    ):
        densecnn.ops.OpsConfig(gradient_solver="direct")


@pytest.mark.parametrize(
    ("shape", "layout"),
    [
        ((8, 50, 36, 36), torch.channels_last),  # wide rows of several pixels
        ((1, 7, 13, 1), torch.channels_last),  # 13 pixels: fewer than a row holds
        ((1, 50, 23, 23), torch.channels_last),  # 529 pixels: rows of 10 and 9 left over
        ((2, 600, 3, 4), torch.channels_last),  # more channels than a row holds
        ((2, 16, 5, 6, 7), torch.channels_last_3d),
        ((2, 5, 9, 10), torch.contiguous_format),
        ((3, 4, 11), torch.contiguous_format),
    ],
)
def test_the_bias_gradient_sums_every_axis_but_the_channels(shape, layout):
    grad_y = torch.randn(shape, dtype=torch.float64).contiguous(memory_format=layout)
    expected = torch.stack([grad_y[:, k].sum() for k in range(shape[1])])  # channel by channel
    assert_close_relative(gradients.bias_gradient(grad_y), expected, 1e-12, floor=1.0)
