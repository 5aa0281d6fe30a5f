"""Solver choice: every candidate solver is exact, the find step caches and reuses its choice, forcing works,
and a missing extension falls back to native ops with one warning."""

from __future__ import annotations

import functools
import json
import warnings

import pytest
import torch
import torch.nn.functional as F

import densecnn
from densecnn import ops
from densecnn.ops import find, plan, solvers
from densecnn.ops.solvers import ConvSpec, PoolSpec

EXT_SOLVERS = [name for name, s in solvers.SOLVERS.items() if s.needs_ext]
ALL_SOLVERS = list(solvers.SOLVERS)


@pytest.fixture(autouse=True)
def solver_cache(tmp_path, monkeypatch):
    """A private solver cache and no forcing from the environment."""
    monkeypatch.setenv("DENSECNN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("DENSECNN_SOLVER", raising=False)
    monkeypatch.delenv("DENSECNN_MEMORY_FORMAT", raising=False)
    return tmp_path / "cache"


def _skip_without_ext(solver: str) -> None:
    if solvers.SOLVERS[solver].needs_ext and not ops.ext_available():
        pytest.skip(f"densecnn's kernels are not built ({ops.ext_load_error()})")


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
    dense.solver, dense.memory_format = solver, memory_format
    with torch.no_grad():
        scores = dense(x)
        used = {step.solver for step in dense.plan(dense.pad(x)).steps}
    torch.testing.assert_close(scores, reference)
    assert solver in used, f"{solver} ran no layer of {name}: {used}"


def _random_specs():
    torch.manual_seed(1)
    weight = torch.randn(6, 4, 3, 2, dtype=torch.float64)
    yield ConvSpec(weight, torch.randn(6, dtype=torch.float64), (3, 2), 1)
    yield ConvSpec(torch.randn(4, 2, 2, 3, dtype=torch.float64), None, (2, 5), 2)  # grouped, no bias
    yield PoolSpec("max_pool2d", (3, 2), (2, 3))
    yield PoolSpec("max_pool2d", (2, 2), (4, 4), activation="tanh")
    yield PoolSpec("avg_pool2d", (2, 3), (3, 1), divisor=5, activation="relu")
    yield PoolSpec("avg_pool2d", (3, 3), (1, 1))


def _literal(spec, x):
    """Independent reference: every output is an explicit loop over the dilated window taps."""
    kh, kw = spec.kernel
    dh, dw = spec.dilation
    ho, wo = x.shape[2] - (kh - 1) * dh, x.shape[3] - (kw - 1) * dw
    taps = [x[:, :, a * dh : a * dh + ho, b * dw : b * dw + wo] for a in range(kh) for b in range(kw)]
    if isinstance(spec, ConvSpec):
        groups, (k, cg) = spec.groups, spec.weight.shape[:2]
        out = torch.zeros(x.shape[0], k, ho, wo, dtype=x.dtype)
        for o in range(k):
            g = o // (k // groups)
            for t, tap in enumerate(taps):
                w = spec.weight[o, :, t // kw, t % kw].view(1, cg, 1, 1)
                out[:, o] += (tap[:, g * cg : (g + 1) * cg] * w).sum(1)
        return out + (spec.bias.view(1, -1, 1, 1) if spec.bias is not None else 0)
    stacked = torch.stack(taps)
    y = stacked.amax(0) if spec.op == "max_pool2d" else stacked.sum(0) / (spec.divisor or kh * kw)
    return {"tanh": torch.tanh, "relu": torch.relu, None: lambda v: v}[spec.activation](y)


@pytest.mark.parametrize("memory_format", [torch.contiguous_format, torch.channels_last])
@pytest.mark.parametrize("solver", ALL_SOLVERS)
def test_solver_ops_match_literal_loops_and_keep_the_memory_format(solver, memory_format):
    _skip_without_ext(solver)
    for spec in _random_specs():
        if solver not in solvers.candidates(spec, ext_available=True):
            continue
        channels = spec.weight.shape[1] * spec.groups if isinstance(spec, ConvSpec) else 4
        x = torch.randn(2, channels, 13, 17, dtype=torch.float64).contiguous(memory_format=memory_format)
        y = solvers.run(solver, spec, x)
        torch.testing.assert_close(y, _literal(spec, x), msg=f"{solver} on {spec}")
        assert y.is_contiguous(memory_format=memory_format)


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
        first = densecnn.convert(model, patch)(x)
    files = list((solver_cache / "solvers").glob("*.json"))
    assert len(files) == 7  # one problem per windowed layer of stages_46
    entry = json.loads(files[0].read_text())
    assert entry["key"]["dtype"] == "float64" and entry["key"]["direction"] == "infer"
    assert any(ms is not None for table in entry["times_ms"].values() for ms in table.values())

    def no_timing(*args, **kwargs):
        raise AssertionError("the find step timed again instead of using the cache")

    monkeypatch.setattr(find, "_time_candidates", no_timing)
    dense = densecnn.convert(model, patch)
    with torch.no_grad():
        torch.testing.assert_close(dense(x), first)
    with torch.no_grad():
        chosen = dense.plan(dense.pad(x))
    assert chosen.memory_format in find.MEMORY_FORMATS
    assert all(step.solver in solvers.SOLVERS for step in chosen.steps if hasattr(step.layers[0], "spec"))


def test_the_fastest_timed_solver_and_format_win(monkeypatch):
    def fake_find(spec, shape, dtype, device, *, train, ext, input_grad):
        table = {name: 10.0 for name in solvers.candidates(spec, ext_available=ext)}
        if "s2b" in table:
            table["s2b"] = 1.0
        return {"nchw": table, "nhwc": {name: ms * 2 for name, ms in table.items()}}

    monkeypatch.setattr(plan, "find", fake_find)
    model, patch, channels = _net("stages_46")
    dense = densecnn.convert(model, patch)
    chosen = dense.plan(torch.zeros(1, channels, 60, 60, dtype=torch.float64))
    assert chosen.memory_format == "nchw"
    pool_after_stride = chosen.steps[3]  # MaxPool at dilation 2 (+Tanh): s2b applies
    assert pool_after_stride.solver == "s2b"
    assert chosen.steps[0].solver == "native"  # undilated first conv: only native (and ext) apply


def test_solver_and_memory_format_forced_by_environment(monkeypatch):
    monkeypatch.setenv("DENSECNN_SOLVER", "s2b")
    monkeypatch.setenv("DENSECNN_MEMORY_FORMAT", "nhwc")
    monkeypatch.setattr(plan, "find", None)  # forcing both needs no timing
    model, patch, channels = _net("stages_46")
    dense = densecnn.convert(model, patch)
    x = torch.rand(1, channels, 8, 8, dtype=torch.float64)
    chosen = dense.plan(dense.pad(x))
    assert chosen.memory_format == "nhwc"
    # the undilated first conv and pool cannot use space-to-batch
    assert [s.solver for s in chosen.steps if hasattr(s.layers[0], "spec")] == ["native"] * 2 + ["s2b"] * 5
    monkeypatch.setenv("DENSECNN_SOLVER", "fastest")
    with pytest.raises(ValueError, match="solver 'fastest' is unknown"):
        dense(x)


def test_missing_extension_warns_once_and_falls_back(monkeypatch):
    monkeypatch.setattr(ops, "ext_module", lambda: None)
    monkeypatch.setattr(ops, "_warned", False)
    model, patch, channels = _net("tiny")
    x = torch.rand(1, channels, 9, 9, dtype=torch.float64)
    reference = densecnn.scan_patches(model, x, patch)
    with pytest.warns(ops.ExtensionUnavailableWarning, match="not available.*falls back to native"):
        torch.testing.assert_close(densecnn.convert(model, patch)(x), reference)
        torch.testing.assert_close(ops.max_pool2d(x, (2, 2), (1, 1)), F.max_pool2d(x, 2, 1))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        densecnn.convert(model, patch)(x)  # no second warning
    with pytest.raises(RuntimeError, match="backend='ext' needs densecnn's compiled kernels"):
        densecnn.convert(model, patch, backend="ext")(x)


def test_native_backend_never_plans(monkeypatch):
    monkeypatch.setattr(densecnn.dense, "make_plan", None)
    model, patch, channels = _net("tiny")
    x = torch.rand(1, channels, 7, 9, dtype=torch.float64)
    torch.testing.assert_close(
        densecnn.convert(model, patch, backend="native")(x), densecnn.scan_patches(model, x, patch)
    )


def test_tune_command_fills_the_cache_ahead_of_time(tmp_path, solver_cache, capsys):
    from densecnn.cli import main

    model, patch, _ = _net("tiny")
    densecnn.save(model.float(), tmp_path / "model", patch_size=patch)
    assert main(["tune", str(tmp_path / "model"), "--size", "20", "24", "--train"]) == 0
    printed = capsys.readouterr().out
    assert "inference plan for 1x20x24" in printed and "training plan" in printed
    assert len(list((solver_cache / "solvers").glob("*.json"))) == 2 * 6  # 6 windowed layers, both directions
    assert main(["tune", str(tmp_path / "model"), "--size", "0", "24"]) == 2


def test_training_plans_time_the_first_layer_without_an_input_gradient(monkeypatch):
    """The image needs no gradient, so the first layer's training problem is timed (and must run) without one."""
    seen = []

    def fake_find(spec, shape, dtype, device, *, train, ext, input_grad):
        seen.append((train, input_grad))
        return {"nchw": {"native": 1.0}, "nhwc": {"native": 2.0}}

    monkeypatch.setattr(plan, "find", fake_find)
    model, patch, channels = _net("stages_46")
    dense = densecnn.convert(model, patch)
    dense.plan(torch.zeros(1, channels, 60, 60, dtype=torch.float64))
    assert seen == [(True, False)] + [(True, True)] * 6
    seen.clear()
    dense.plan(torch.zeros(1, channels, 60, 60, dtype=torch.float64, requires_grad=True))
    assert seen == [(True, True)] * 7
