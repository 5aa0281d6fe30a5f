"""Solver choice: every candidate solver is exact, immediate mode chooses without timing, the tuning step caches
and reuses its choice, forcing works, and a missing extension falls back to torch-only solvers with one warning."""

from __future__ import annotations

import functools
import json
import warnings

import pytest
import torch

import densecnn
from densecnn import ops
from densecnn.errors import ExtensionUnavailableWarning
from densecnn.ops import backends, calibration, costmodel, ext, gradients, layout, plan, solvers, tune
from densecnn.ops.solvers import ConvOp, PoolOp

EXT_SOLVERS = [name for name, s in solvers.SOLVERS.items() if s.needs_ext]
ALL_SOLVERS = list(solvers.SOLVERS)


@pytest.fixture(autouse=True)
def solver_cache(tmp_path, ops_config):
    """A private solver cache and no forcing or tuning from the environment."""
    ops_config(cache_dir=tmp_path / "cache", solver=None, memory_format=None, tune=False)
    return tmp_path / "cache"


def _skip_without_ext(solver: str) -> None:
    if solvers.SOLVERS[solver].needs_ext and not ops.ext_available():
        pytest.skip(f"densecnn's kernels are not built ({ext.load_error()})")


def _net(name: str):
    kwargs = {"tiny": dict(in_channels=1, num_classes=3)}.get(name, dict(in_channels=2, num_classes=3))
    torch.manual_seed(0)
    model, patch = densecnn.zoo.create(name, **kwargs)
    return model.double().eval(), patch, kwargs["in_channels"]


@functools.cache
def _scanned(name: str):
    """(model, patch, x, patch-by-patch scores), computed once per net: the scan is the slow part."""
    model, patch, channels = _net(name)
    x = torch.rand(2, channels, 11, 14, dtype=torch.float64)
    return model, patch, x, densecnn.scan_patches(model, x, patch, padding_mode="reflect")


@pytest.mark.parametrize("memory_format", ["nchw", "nhwc"])
@pytest.mark.parametrize("solver", ALL_SOLVERS)
@pytest.mark.parametrize("name", ["tiny", "stages_46", "plain_133"])
def test_every_solver_matches_patch_scanning(name, solver, memory_format):
    _skip_without_ext(solver)
    model, patch, x, reference = _scanned(name)
    dense = densecnn.convert(model, patch, padding_mode="reflect")
    dense_ops = [step.dense_op() for step in dense.steps() if hasattr(step.layers[0], "dense_op")]
    if not any(solvers.SOLVERS[solver].applies(op) for op in dense_ops):
        pytest.skip(f"{name} has no layer {solver} runs (winograd: no 3x3 conv)")
    dense.solver, dense.memory_format = solver, memory_format
    with torch.no_grad():
        scores = dense(x)
        used = {step.solver for step in dense.plan(dense.pad(x)).steps}
    torch.testing.assert_close(scores, reference)
    assert solver in used, f"{solver} ran no layer of {name}: {used}"


def _random_ops():
    torch.manual_seed(1)
    weight = torch.randn(6, 4, 3, 2, dtype=torch.float64)
    yield ConvOp(weight, torch.randn(6, dtype=torch.float64), (3, 2), 1)
    yield ConvOp(torch.randn(4, 2, 2, 3, dtype=torch.float64), None, (2, 5), 2)  # grouped, no bias
    # 1×1, one input channel per group, three outputs each (direct's broadcast product)
    yield ConvOp(
        torch.randn(12, 1, 1, 1, dtype=torch.float64), torch.randn(12, dtype=torch.float64), (1, 1), 4
    )
    yield PoolOp("max_pool2d", (3, 2), (2, 3))
    yield PoolOp("max_pool2d", (2, 2), (4, 4), activation="tanh")
    yield PoolOp("avg_pool2d", (2, 3), (3, 1), divisor=5, activation="relu")
    yield PoolOp("avg_pool2d", (3, 3), (1, 1))


def _literal(op, x):
    """Independent reference: every output is an explicit loop over the dilated window taps."""
    kh, kw = op.kernel
    dh, dw = op.dilation
    ho, wo = x.shape[2] - (kh - 1) * dh, x.shape[3] - (kw - 1) * dw
    taps = [x[:, :, a * dh : a * dh + ho, b * dw : b * dw + wo] for a in range(kh) for b in range(kw)]
    if isinstance(op, ConvOp):
        groups, (k, cg) = op.groups, op.weight.shape[:2]
        out = torch.zeros(x.shape[0], k, ho, wo, dtype=x.dtype)
        for o in range(k):
            g = o // (k // groups)
            for t, tap in enumerate(taps):
                w = op.weight[o, :, t // kw, t % kw].view(1, cg, 1, 1)
                out[:, o] += (tap[:, g * cg : (g + 1) * cg] * w).sum(1)
        return out + (op.bias.view(1, -1, 1, 1) if op.bias is not None else 0)
    stacked = torch.stack(taps)
    y = stacked.amax(0) if op.name == "max_pool2d" else stacked.sum(0) / (op.divisor or kh * kw)
    return {"tanh": torch.tanh, "relu": torch.relu, None: lambda v: v}[op.activation](y)


@pytest.mark.parametrize("memory_format", [torch.contiguous_format, torch.channels_last])
@pytest.mark.parametrize("solver", ALL_SOLVERS)
def test_solver_ops_match_literal_loops_and_keep_the_memory_format(solver, memory_format):
    _skip_without_ext(solver)
    for op in _random_ops():
        if solver not in solvers.candidates(op, ext_available=True):
            continue
        channels = op.weight.shape[1] * op.groups if isinstance(op, ConvOp) else 4
        x = torch.randn(2, channels, 13, 17, dtype=torch.float64).contiguous(memory_format=memory_format)
        y = solvers.run(solver, op, x)
        torch.testing.assert_close(y, _literal(op, x), msg=f"{solver} on {op}")
        assert y.is_contiguous(memory_format=memory_format)


@pytest.mark.parametrize("memory_format", [torch.contiguous_format, torch.channels_last])
def test_grouped_pointwise_convs_run_directly_with_their_gradients(memory_format):
    _skip_without_ext("direct")
    op = ConvOp(torch.randn(6, 1, 1, 1, dtype=torch.float64), torch.randn(6, dtype=torch.float64), (1, 1), 3)
    assert "direct" in solvers.candidates(op, ext_available=True)
    assert "direct" not in solvers.candidates(
        ConvOp(torch.empty(6, 2, 1, 1), None, (1, 1), 3), ext_available=True
    )
    x = torch.randn(1, 3, 5, 4, dtype=torch.float64).contiguous(memory_format=memory_format).requires_grad_()
    weight, bias = op.weight.clone().requires_grad_(), op.bias.clone().requires_grad_()
    torch.autograd.gradcheck(
        lambda x, w, b: solvers.run("direct", ConvOp(w, b, (1, 1), 3), x), (x, weight, bias)
    )


@pytest.mark.parametrize("solver", ALL_SOLVERS)
def test_gradients_flow_through_every_solver(solver):
    """Parameter and input gradients equal those of the native dilated ops (float64)."""
    _skip_without_ext(solver)
    model, patch, channels = _net("stages_46")
    x = torch.rand(1, channels, 9, 10, dtype=torch.float64)
    grads = {}
    for backend, forced in (("native", None), ("auto", solver)):
        dense = densecnn.convert(model, patch, backend=backend)
        dense.solver, dense.memory_format = forced, "nhwc" if forced else None
        model.zero_grad()
        xg = x.clone().requires_grad_()
        dense(xg).square().sum().backward()
        grads[backend] = [xg.grad] + [p.grad.clone() for p in model.parameters()]
    for native_grad, solver_grad in zip(grads["native"], grads["auto"]):
        torch.testing.assert_close(solver_grad, native_grad)


def test_find_picks_a_candidate_caches_it_and_reuses_it(solver_cache, monkeypatch):
    model, patch, channels = _net("stages_46")
    x = torch.rand(1, channels, 20, 20, dtype=torch.float64)
    with torch.no_grad():
        first = densecnn.convert(model, patch, tune=True)(x)
    files = list((solver_cache / "solvers").glob("*.json"))
    assert len(files) == 7  # one problem per windowed layer of stages_46
    entry = json.loads(files[0].read_text())
    assert entry["key"]["dtype"] == "float64" and entry["key"]["direction"] == "infer"
    assert any(ms is not None for table in entry["times_ms"].values() for ms in table.values())

    def no_timing(*args, **kwargs):
        raise AssertionError("the tuning step timed again instead of using the cache")

    monkeypatch.setattr(tune, "_time_candidates", no_timing)
    for tuned in (True, False):  # tuning again and immediate mode both use the cached timings
        dense = densecnn.convert(model, patch, tune=tuned)
        with torch.no_grad():
            torch.testing.assert_close(dense(x), first)
            chosen = dense.plan(dense.pad(x))
        assert chosen.memory_format in layout.NAMES
        windowed = [step for step in chosen.steps if hasattr(step.layers[0], "dense_op")]
        assert all(step.solver in solvers.SOLVERS and step.source == "tuned" for step in windowed)


def test_the_fastest_timed_solver_and_format_win(monkeypatch, ops_config):
    def fake_times(op, shape, dtype, device, *, train, ext, cache_dir, input_grad, time_missing):
        table = {name: 10.0 for name in solvers.candidates(op, ext_available=ext)}
        if "s2b" in table:
            table["s2b"] = 1.0
        return {"nchw": table, "nhwc": {name: ms * 2 for name, ms in table.items()}}

    monkeypatch.setattr(plan, "tuned_times", fake_times)
    ops_config(tune=True)
    model, patch, channels = _net("stages_46")
    dense = densecnn.convert(model, patch)
    chosen = dense.plan(torch.zeros(1, channels, 60, 60, dtype=torch.float64))
    assert chosen.memory_format == "nchw"
    pool_after_stride = chosen.steps[3]  # MaxPool at dilation 2 (+Tanh): s2b applies
    assert pool_after_stride.solver == "s2b"
    assert chosen.steps[0].solver == "native"  # undilated first conv: only native (and ext) apply


def test_solver_and_memory_format_forced_by_environment(monkeypatch, ops_config):
    forced = ops.OpsConfig.from_environ({"DENSECNN_SOLVER": "s2b", "DENSECNN_MEMORY_FORMAT": "nhwc"})
    ops_config(solver=forced.solver, memory_format=forced.memory_format)
    monkeypatch.setattr(plan, "tuned_times", None)  # forcing both needs no timing and no prediction
    monkeypatch.setattr(costmodel, "estimate", None)
    model, patch, channels = _net("stages_46")
    dense = densecnn.convert(model, patch)
    x = torch.rand(1, channels, 8, 8, dtype=torch.float64)
    chosen = dense.plan(dense.pad(x))
    assert chosen.memory_format == "nhwc"
    # the undilated first conv and pool cannot use space-to-batch
    assert [s.solver for s in chosen.steps if hasattr(s.layers[0], "dense_op")] == ["native"] * 2 + [
        "s2b"
    ] * 5
    with pytest.raises(ValueError, match="solver 'fastest' is unknown"):
        ops.OpsConfig.from_environ({"DENSECNN_SOLVER": "fastest"})
    dense.solver = "fastest"
    with pytest.raises(ValueError, match="solver 'fastest' is unknown"):
        dense(x)


def test_missing_extension_warns_once_and_falls_back(monkeypatch):
    monkeypatch.setattr(ext, "available", lambda: False)
    monkeypatch.setattr(backends, "_warned", False)
    model, patch, channels = _net("tiny")
    x = torch.rand(1, channels, 9, 9, dtype=torch.float64)
    reference = densecnn.scan_patches(model, x, patch)
    with pytest.warns(ExtensionUnavailableWarning, match="not available.*falls back to torch-only solvers"):
        dense = densecnn.convert(model, patch)
        torch.testing.assert_close(dense(x), reference)
    assert not any(step.solver in ("ext", "ext_fused") for step in dense.plan(dense.pad(x)).steps)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        densecnn.convert(model, patch)(x)  # no second warning
    with pytest.raises(RuntimeError, match="backend='ext' needs densecnn's compiled kernels"):
        densecnn.convert(model, patch, backend="ext")(x)


def test_native_backend_runs_torch_ops_in_nchw_without_choosing(monkeypatch):
    monkeypatch.setattr(plan, "tuned_times", None)
    monkeypatch.setattr(costmodel, "estimate", None)
    model, patch, channels = _net("tiny")
    x = torch.rand(1, channels, 7, 9, dtype=torch.float64)
    dense = densecnn.convert(model, patch, backend="native")
    torch.testing.assert_close(dense(x), densecnn.scan_patches(model, x, patch))
    chosen = dense.plan(dense.pad(x))
    assert chosen.memory_format == "nchw"
    assert {step.solver for step in chosen.steps if hasattr(step.layers[0], "dense_op")} == {"native"}


def test_backend_is_one_vocabulary():
    assert ops.check_backend("ext") is ops.Backend.EXT
    assert densecnn.convert(*_net("tiny")[:2], backend="native").backend is ops.Backend.NATIVE
    with pytest.raises(ValueError, match="use one of auto, native, ext"):
        ops.check_backend("cuda")
    assert backends.allowed_solvers(ops.Backend.NATIVE, None) == {"native"}
    assert backends.allowed_solvers(ops.Backend.AUTO, "s2b") == {"s2b", "native"}


def test_immediate_mode_times_nothing_and_is_deterministic(monkeypatch, solver_cache):
    def no_timing(*args, **kwargs):
        raise AssertionError("immediate mode timed a candidate")

    monkeypatch.setattr(tune, "_time_candidates", no_timing)
    model, patch, channels = _net("stages_46")
    x = torch.rand(1, channels, 30, 30, dtype=torch.float64)
    plans = []
    for _ in range(2):
        dense = densecnn.convert(model, patch)
        with torch.no_grad():
            torch.testing.assert_close(dense(x), densecnn.scan_patches(model, x, patch))
            plans.append(dense.plan(dense.pad(x)))
    assert not solver_cache.exists()  # nothing timed, nothing cached
    windowed = [step for step in plans[0].steps if hasattr(step.layers[0], "dense_op")]
    assert {step.source for step in windowed} == {"predicted"}
    assert [s.solver for s in plans[0].steps] == [s.solver for s in plans[1].steps]
    assert plans[0].memory_format == plans[1].memory_format


def test_cost_model_predicts_every_fitted_candidate_in_both_formats():
    op = PoolOp("max_pool2d", (2, 2), (8, 8), activation="tanh")
    names = solvers.candidates(op, ext_available=ops.ext_available())
    table = costmodel.estimate(op, (1, 50, 300, 300), torch.float32, train=False, candidates=names)
    assert set(table) == {"nchw", "nhwc"}
    assert all(ms is not None and ms > 0 for fmt in table.values() for ms in fmt.values())
    larger = costmodel.estimate(op, (1, 50, 600, 600), torch.float32, train=False, candidates=names)
    assert larger["nchw"]["native"] > table["nchw"]["native"]  # more pixels cost more


@pytest.mark.skipif(not ops.ext_available(), reason="the ext solver is what must not be chosen")
def test_immediate_plans_run_the_filter_banks_1d_grouped_convs_with_torch(monkeypatch):
    """The filter bank's k×1 and 1×k grouped convs: the ext solver's per-group GEMMs are 1.1–20× slower than torch's
    depthwise kernels in the measured format (nhwc), and the shipped model knows it (no timing: the prediction
    is the same on every CPU, which calibrates no grouped conv)."""
    monkeypatch.setenv(calibration.ENVIRONMENT, "0")
    model, patch = densecnn.zoo.create("filter_bank", in_channels=3, num_classes=4)
    dense = densecnn.convert(model.eval(), patch, padding_mode="reflect")
    with torch.no_grad():
        planned = dense.plan(dense.pad(torch.empty(1, 3, 512, 512)))
    thin = [
        s for s in planned.steps if s.solver and 1 in s.dense_op().kernel and max(s.dense_op().kernel) > 1
    ]
    assert len(thin) == 4
    assert {(s.source, s.solver) for s in thin} == {("predicted", "native")}


def test_subnormal_weights_count_as_zero_at_inference_only():
    """A subnormal weight (the far tail of a Gaussian) runs as zero at inference, once per weight version; in
    training the weight is used as it is."""
    weight = torch.randn(4, 2, 1, 5, generator=torch.Generator().manual_seed(0))
    weight[0] = 0.0
    weight[0, 0, 0, 0] = 1e-42  # output channel 0: that tap alone
    x = torch.rand(1, 2, 9, 9) + 1.0
    assert torch.nn.functional.conv2d(x, weight)[0, 0].abs().min() > 0  # products kept as subnormals here
    flushed = weight.clone()
    flushed[0, 0, 0, 0] = 0.0
    with torch.no_grad():
        y = solvers.run("native", ConvOp(weight, None, (1, 2), 1), x)
        assert solvers.normal_weight(weight, torch.float32) is solvers.normal_weight(weight, torch.float32)
        assert solvers.normal_weight(flushed, torch.float32) is flushed  # nothing to flush: the weight itself
    assert torch.equal(y, torch.nn.functional.conv2d(x, flushed, dilation=(1, 2)))
    assert not y[0, 0].any()
    weight.requires_grad_(True)
    assert solvers.normal_weight(weight, torch.float32) is weight


def test_timing_shapes_are_bucketed_per_number_of_axes():
    """Images are timed at most 256 px beyond the reach per side, volumes 96³, signals as many points as an image."""
    conv = {dims: ConvOp(torch.empty(4, 4, *(3,) * dims), None, (2,) * dims, 1) for dims in (1, 2, 3)}
    assert tune.timing_shape(conv[2], (1, 4, 1000, 100)) == (1, 4, 260, 128)
    wide = ConvOp(torch.empty(4, 4, 7, 7), None, (16, 16), 1)  # 32 outputs per sub-grid: 512 beyond the reach
    assert tune.timing_shape(wide, (1, 4, 2000, 608)) == (1, 4, 608, 608)
    assert tune.timing_shape(conv[3], (1, 4, 300, 113, 40)) == (1, 4, 100, 100, 64)
    assert tune.timing_shape(conv[1], (1, 4, 10**6)) == (1, 4, 256**2 + 4)
    # volumes and images have a channels-last format to choose, signals none
    assert layout.names_for(5) == layout.names_for(4) == ["nchw", "nhwc"]
    assert layout.names_for(3) == ["nchw"]


def test_cost_model_fit_recovers_a_known_law():
    """Times made up from a known log-linear law (independent of any solver) are fitted back to it, the groups' and
    the kernel aspect's terms included."""
    true_beta = [-3.0, 1.0, 0.8, 0.5, 1.1, 0.2, 0.3, 0.4, -0.6]
    rows = []
    for c_in, groups in ((2, 1), (8, 1), (32, 1), (8, 8), (32, 4)):
        for c_out in (16, 32):
            for kernel, d in (((1, 1), 1), ((3, 3), 2), ((5, 1), 4), ((1, 7), 8), ((9, 1), 1)):
                for side in (40, 90):
                    op = ConvOp(torch.empty(c_out, c_in // groups, *kernel), None, (d, d), groups)
                    row = costmodel.problem(op, (1, c_in, side + (kernel[0] - 1) * d, side + kernel[1] * d))
                    row["activation"] = "tanh" if (side == 40) != (c_out == 16) else None
                    ms = torch.tensor(costmodel.features(row)).double() @ torch.tensor(true_beta).double()
                    rows.append({**row, "solver": "native", "format": "nchw", "direction": "infer"})
                    rows[-1].update(dtype="float32", ms=ms.exp().item())
    fitted = costmodel.fit([r for r in rows if costmodel.separable(r)])
    (beta,) = fitted.values()
    assert list(fitted) == [
        "conv2d_separable/native/nchw/infer/float32"
    ]  # grouped and 1-D kernels: a family apart
    torch.testing.assert_close(torch.tensor(beta), torch.tensor(true_beta), atol=1e-3, rtol=1e-3)


def test_warm_makes_the_plans_of_the_first_call(monkeypatch):
    model, patch, channels = _net("tiny")
    dense = densecnn.convert(model.float(), patch)
    dense.warm((1, channels, 12, 12))
    dense.warm((1, channels, 12, 12), train=True)
    assert all(p.grad is None for p in model.parameters())  # gradients untouched
    monkeypatch.setattr(plan, "make_plan", None)
    monkeypatch.setattr(densecnn.dense, "make_plan", None)
    x = torch.rand(1, channels, 12, 12)
    with torch.no_grad():
        dense(x)
    dense(x).sum().backward()  # the training plan is there too


def test_tune_command_fills_the_cache_ahead_of_time(tmp_path, solver_cache, capsys):
    from densecnn.cli import main

    model, patch, _ = _net("tiny")
    densecnn.save(model.float(), tmp_path / "model", patch_size=patch)
    assert main(["tune", str(tmp_path / "model"), "--size", "20", "24", "--train"]) == 0
    printed = capsys.readouterr().out
    assert "inference plan for 1x20x24" in printed and "training plan" in printed and "tuned" in printed
    assert len(list((solver_cache / "solvers").glob("*.json"))) == 2 * 6  # 6 windowed layers, both directions
    assert main(["tune", str(tmp_path / "model"), "--size", "0", "24"]) == 2


def test_training_plans_time_the_first_layer_without_an_input_gradient(monkeypatch):
    """The image needs no gradient, so the first layer's training problem is timed (and must run) without one; a
    conv whose gradients are chosen apart from its forward has its forward timed for inference and its gradient
    solvers timed apart."""
    seen = []

    def fake_times(op, shape, dtype, device, *, train, ext, cache_dir, input_grad, time_missing):
        if time_missing:  # what would be timed (the conversion's verification pass plans without tuning)
            seen.append(("forward+backward" if train else "forward", input_grad))
        return {"nchw": {"native": 1.0}, "nhwc": {"native": 2.0}}

    def fake_gradient_times(op, shape, dtype, device, *, ext, cache_dir, input_grad, time_missing):
        seen.append(("gradients", input_grad))
        return {"nchw": {"grad_weight": {"native": 1.0}}}

    monkeypatch.setattr(plan, "tuned_times", fake_times)
    monkeypatch.setattr(plan, "tuned_gradient_times", fake_gradient_times)
    model, patch, channels = _net("stages_46")
    dense = densecnn.convert(model, patch, tune=True)
    choice = gradients.candidates(ConvOp(torch.zeros(8, 2, 3, 3), None, (1, 1), 1), set(solvers.SOLVERS))
    chosen_apart = (
        len(choice) > 1
    )  # with the kernels built, a conv's gradients are chosen apart (fft or native)
    for image_grad in (False, True):
        seen.clear()
        dense.plan(torch.zeros(1, channels, 60, 60, dtype=torch.float64, requires_grad=image_grad))
        expected = []
        for i, kind in enumerate(["conv", "pool", "conv", "pool", "conv", "pool", "conv"]):
            needs = image_grad or i > 0
            if kind == "conv" and chosen_apart:
                expected += [("forward", needs), ("gradients", needs)]
            else:
                expected.append(("forward+backward", needs))
        assert seen == expected


def test_activations_after_windowed_steps_run_in_place_only_without_autograd():
    """Inference overwrites a conv's or pool's fresh output with its tanh/ReLU; the caller's input (here fed to a
    leading ReLU) is never touched, and under autograd nothing runs in place (the gradients stay exact)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.ReLU(), torch.nn.Conv2d(2, 4, 3), torch.nn.ReLU(), torch.nn.MaxPool2d(2), torch.nn.Tanh(),
        torch.nn.Conv2d(4, 3, 2), torch.nn.ReLU(), torch.nn.Conv2d(3, 2, 1),
    ).double().eval()  # fmt: skip
    dense = densecnn.convert(model, 6, padding_mode="reflect")
    x = torch.randn(1, 2, 9, 8, dtype=torch.float64)
    padded = dense.pad(x)
    before = padded.clone()
    with torch.no_grad():
        steps = dense.plan(padded).steps
        scores = plan.run_steps(steps, padded)
    assert torch.equal(padded, before)
    reference = densecnn.scan_patches(model, x, 6, padding_mode="reflect")
    torch.testing.assert_close(scores, reference)
    xg = x.clone().requires_grad_()
    dense(xg).sum().backward()
    xr = x.clone().requires_grad_()
    densecnn.convert(model, 6, padding_mode="reflect", backend="native")(xr).sum().backward()
    torch.testing.assert_close(xg.grad, xr.grad)
