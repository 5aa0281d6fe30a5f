"""Tuning cache entries of the wrong shape count as absent (the timings taken anew or predicted; a calibration file of
the wrong shape: tests/ops/test_calibration.py), a cached solver that does not run the layer is never chosen, and
``backend="ext"`` on a dtype its kernels do not run names the layer, the dtype and the fix."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

import densecnn
from densecnn import ops
from densecnn.errors import InvalidTypeError
from densecnn.ops import solvers, tune
from densecnn.ops.solvers import ConvOp


@pytest.fixture(autouse=True)
def cache(tmp_path, ops_config):
    """A private cache and no forcing or tuning from the environment."""
    ops_config(cache_dir=tmp_path / "cache", solver=None, memory_format=None, tune=False)
    return tmp_path / "cache"


def _skip_without_ext() -> None:
    if not ops.ext_available():
        pytest.skip(f"densecnn's kernels are not built ({ops.ext.load_error()})")


OP = ConvOp(torch.randn(2, 2, 2, 4), None, (2, 2), 1)  # a 2×4 kernel: no winograd
SHAPE = (1, 2, 12, 12)

BAD_TIMES = {
    "a string": lambda times: "oops",
    "null": lambda times: None,
    "numbers per format": lambda times: {fmt: 3 for fmt in times},
    "an unknown solver": lambda times: {fmt: {"bogus": 0.001} for fmt in times},
    "a solver that does not run the op": lambda times: {
        fmt: t | {"winograd": 1e-6} for fmt, t in times.items()
    },
    "times as strings": lambda times: {fmt: {n: "1.0" for n in t} for fmt, t in times.items()},
    "negative times": lambda times: {fmt: {n: -1 for n in t} for fmt, t in times.items()},
    "an unknown format": lambda times: {"ncwh": next(iter(times.values()))},
}


def _tuned(cache, **kwargs):
    return tune.tuned_times(
        OP, SHAPE, torch.float32, "cpu", train=False, ext=ops.ext_available(), cache_dir=cache, **kwargs
    )


def _cache_file(cache):
    (path,) = (cache / "solvers").iterdir()
    return path


@pytest.mark.parametrize("corrupt", BAD_TIMES.values(), ids=BAD_TIMES.keys())
def test_tuned_times_of_another_shape_count_as_absent(cache, corrupt):
    first = _tuned(cache)
    path = _cache_file(cache)
    entry = json.loads(path.read_text())
    path.write_text(json.dumps(entry | {"times_ms": corrupt(entry["times_ms"])}))
    assert _tuned(cache, time_missing=False) is None  # immediate mode: predicted instead
    again = _tuned(cache)  # tuning: timed anew and cached again
    assert set(again) == set(first)
    names = set(solvers.candidates(OP, ext_available=ops.ext_available(), dtype=torch.float32))
    assert all(set(table) == names for table in again.values())
    assert _tuned(cache, time_missing=False) == again


def test_a_tuning_file_that_is_a_list_counts_as_absent(cache):
    _tuned(cache)
    _cache_file(cache).write_text("[1, 2]")
    assert _tuned(cache, time_missing=False) is None


@pytest.mark.parametrize("corrupt", ["no input gradient", "a string", "an unknown solver"])
def test_gradient_times_of_another_shape_count_as_absent(cache, corrupt):
    def tuned(**kwargs):
        return tune.tuned_gradient_times(
            OP,
            SHAPE,
            torch.float32,
            "cpu",
            ext=ops.ext_available(),
            cache_dir=cache,
            input_grad=True,
            **kwargs,
        )

    tuned()
    path = _cache_file(cache)
    entry = json.loads(path.read_text())
    times = entry["times_ms"]
    times = {
        "no input gradient": {fmt: {"grad_weight": t["grad_weight"]} for fmt, t in times.items()},
        "a string": {fmt: {"grad_input": "oops", "grad_weight": "oops"} for fmt in times},
        "an unknown solver": {fmt: {d: {"bogus": 0.1} for d in t} for fmt, t in times.items()},
    }[corrupt]
    path.write_text(json.dumps(entry | {"times_ms": times}))
    assert tuned(time_missing=False) is None


def test_a_cached_solver_that_does_not_run_a_layer_is_never_chosen(cache, ops_config):
    """winograd on a 2×4 conv, ext_fused and winograd on a pool, each cached as the fastest by far."""
    _skip_without_ext()
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(1, 4, (2, 4)), nn.MaxPool2d(2), nn.Conv2d(4, 2, 3)).eval()
    x = torch.rand(1, 1, 20, 22)
    with torch.no_grad():
        expected = densecnn.scan_patches(net, x, (7, 9))
        ops_config(tune=True)
        densecnn.convert(net, (7, 9))(x)  # tunes every layer
        ops_config(tune=False)
        for path in (cache / "solvers").iterdir():
            entry = json.loads(path.read_text())
            if entry["key"]["kernel"] == [2, 4] or "pool" in entry["key"]["op"]:
                entry["times_ms"] = {
                    fmt: t | {"winograd": 1e-6, "ext_fused": 1e-6} for fmt, t in entry["times_ms"].items()
                }
                path.write_text(json.dumps(entry))
        dense = densecnn.convert(net, (7, 9))
        torch.testing.assert_close(dense(x), expected)
    padded = torch.zeros(1, 1, 20 + 6, 22 + 8)
    assert not {"winograd", "ext_fused"} & {row["solver"] for row in dense.plan(padded).describe()[:2]}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_ext_on_a_dtype_its_kernels_do_not_run_names_the_layer_and_the_fix(dtype):
    _skip_without_ext()
    net = nn.Sequential(nn.Conv2d(1, 2, 3), nn.ReLU(), nn.Conv2d(2, 3, 1)).eval()
    dense = densecnn.convert(net, 3, backend="ext")
    x = torch.rand(1, 1, 16, 16)
    with torch.no_grad():
        assert dense(x).shape == (1, 3, 16, 16)
        with pytest.raises(InvalidTypeError) as error:
            dense(x.to(dtype))
    message = str(error.value)
    assert "features[2]" in message and "Conv2d" in message
    assert str(dtype).removeprefix("torch.") in message
    assert "backend='auto'" in message and "float32" in message
