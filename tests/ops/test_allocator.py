"""The page faults of torch's own buffers: which malloc serves them, and what plans add for solvers that run torch's
ops where the real layer's buffers are mapped afresh on every call but the bucketed timing shape's are not."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import densecnn
from densecnn.ops import allocator, costmodel, plan, solvers

MB = 1 << 20
TCMALLOC = sorted(Path("/usr/lib").glob("*/libtcmalloc_minimal.so.4"))


@pytest.mark.parametrize(
    "preload", [None, *TCMALLOC[:1]], ids=lambda p: "system" if p is None else "tcmalloc"
)
def test_the_malloc_serving_torch_is_named(preload):
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    if preload is not None:
        env["LD_PRELOAD"] = str(preload)
    code = "from densecnn.ops import allocator; print(allocator.name())"
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == ("system malloc" if preload is None else "tcmalloc")


def test_only_torch_buffers_above_the_mmap_threshold_cost_page_faults(monkeypatch):
    monkeypatch.setattr(allocator, "name", lambda: "system malloc")
    cost = allocator.fresh_buffers_ms
    per_mb = allocator.PAGE_FAULT_MS_PER_MB
    assert cost("native", real_bytes=40 * MB, timed_bytes=8 * MB, train=False) == pytest.approx(8 * per_mb)
    assert cost("native", real_bytes=40 * MB, timed_bytes=8 * MB, train=True) == pytest.approx(16 * per_mb)
    assert cost("s2b", real_bytes=40 * MB, timed_bytes=8 * MB, train=False) == pytest.approx(24 * per_mb)
    assert cost("native", real_bytes=32 * MB, timed_bytes=8 * MB, train=True) == 0.0  # reused from the heap
    assert cost("native", real_bytes=40 * MB, timed_bytes=36 * MB, train=True) == 0.0  # paid in the timing
    for own in ("fft", "winograd", "direct", "ext", "ext_fused"):  # densecnn's kernels reuse their buffers
        assert cost(own, real_bytes=400 * MB, timed_bytes=8 * MB, train=True) == 0.0
    monkeypatch.setattr(allocator, "name", lambda: "tcmalloc")
    assert cost("native", real_bytes=400 * MB, timed_bytes=8 * MB, train=True) == 0.0


@pytest.mark.parametrize("malloc", ["system malloc", "tcmalloc"])
def test_plans_charge_native_solvers_for_fresh_buffers_of_large_maps(
    monkeypatch, ops_config, tmp_path, malloc
):
    """Timed at the bucketed shape, native ties the others; on a map whose outputs pass 32 MB its fresh buffers make
    it lose under the system malloc, and not under a caching one."""

    def fake_times(spec, shape, dtype, device, *, train, ext, cache_dir, input_grad, time_missing):
        if not time_missing:  # the conversion's verification pass plans without timing
            return None
        table = {name: 10.0 for name in solvers.candidates(spec, ext_available=ext)}
        return {"nchw": {name: ms if name == "native" else ms + 0.5 for name, ms in table.items()}}

    ops_config(cache_dir=tmp_path)
    monkeypatch.setattr(plan, "tuned_times", fake_times)
    monkeypatch.setattr(allocator, "name", lambda: malloc)
    torch.manual_seed(0)
    model, patch = densecnn.zoo.create("stages_46", in_channels=2, num_classes=3)
    dense = densecnn.convert(model.double().eval(), patch, tune=True)
    for side, large in ((64, False), (1024, True)):  # 16-128 channels of float64: 0.5-1 GB at 1024²
        chosen = dense.plan(torch.zeros(1, 2, side, side, dtype=torch.float64))
        first_conv = chosen.steps[0]
        assert len(first_conv.times["nchw"]) > 1  # a choice to make
        charged = large and malloc == "system malloc"
        assert (first_conv.solver != "native") == charged
        assert (first_conv.times["nchw"]["native"] > 10.0) == charged


def test_torchs_input_gradient_costs_page_faults_above_the_mmap_threshold(monkeypatch):
    monkeypatch.setattr(allocator, "name", lambda: "system malloc")
    cost, per_mb = allocator.fresh_input_gradient_ms, allocator.PAGE_FAULT_MS_PER_MB
    assert cost("native", real_bytes=41 * MB, timed_bytes=13 * MB) == pytest.approx(13 * per_mb)
    assert cost("native", real_bytes=32 * MB, timed_bytes=13 * MB) == 0.0  # reused from the heap
    assert cost("native", real_bytes=36 * MB, timed_bytes=36 * MB) == 0.0  # the timing mapped it afresh too
    for own in ("fft", "winograd"):  # written into densecnn's reused buffers
        assert cost(own, real_bytes=400 * MB, timed_bytes=13 * MB) == 0.0
    monkeypatch.setattr(allocator, "name", lambda: "tcmalloc")
    assert cost("native", real_bytes=400 * MB, timed_bytes=13 * MB) == 0.0


@pytest.mark.parametrize("batch", [1, 8])
def test_training_plans_charge_torchs_input_gradient_on_large_maps(monkeypatch, ops_config, tmp_path, batch):
    """plain_133's last conv on 8 crops of 64² (an input of 41 MB): torch's input gradient is charged its fresh
    buffer at the bucketed shape's scale, densecnn's gradient solvers nothing; on one crop (5 MB) nothing is."""
    ops_config(cache_dir=tmp_path)
    monkeypatch.setattr(allocator, "name", lambda: "system malloc")
    op = solvers.ConvOp(torch.randn(8, 50, 7, 7), None, (16, 16), 1)
    shape, names = (batch, 50, 160, 160), ["native", "fft"]
    timed = plan.timing_shape(op, shape)
    _, times = plan._gradient_times(
        op, names, shape, torch.float32, "cpu", config=densecnn.ops.get_config(), input_grad=True
    )
    predicted = costmodel.estimate_gradients(op, timed, torch.float32, names, input_grad=True)
    charge = math.prod(timed) * 4 / MB * allocator.PAGE_FAULT_MS_PER_MB if batch == 8 else 0.0
    for fmt, tables in times.items():
        assert tables["grad_input"]["native"] == pytest.approx(
            predicted[fmt]["grad_input"]["native"] + charge
        )
        assert tables["grad_input"]["fft"] == pytest.approx(predicted[fmt]["grad_input"]["fft"])
        assert tables["grad_weight"] == pytest.approx(predicted[fmt]["grad_weight"])
