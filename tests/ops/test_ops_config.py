"""The ops settings: one OpsConfig, read from the environment once (at import; an invalid value is raised at first
use), overridable in code (the process's config, then a net's own attributes), invalid values refused naming the
variable, and the kernels' output buffers following it."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

import densecnn
from densecnn.ops import OpsConfig, ext, get_config, plan, tune, use_config
from densecnn.ops import config as ops_config_module
from densecnn.ops.config import DEPRECATED_NAMES, ENVIRONMENT
from densecnn.ops.solvers import SOLVERS


def _solvers_used(dense, x) -> set[str]:
    with torch.no_grad():
        return {step.solver for step in dense.plan(dense.pad(x)).steps if step.solver}


def _tiny():
    torch.manual_seed(0)
    model, patch = densecnn.zoo.create("tiny", in_channels=1, num_classes=3)
    return densecnn.convert(model.eval(), patch), torch.rand(1, 1, 10, 10)


def _run(code: str, **environment: str) -> subprocess.CompletedProcess:
    ours = {*ENVIRONMENT.values(), *DEPRECATED_NAMES.values()}
    env = {key: value for key, value in os.environ.items() if key not in ours}
    return subprocess.run(
        [sys.executable, "-c", code], env={**env, **environment}, capture_output=True, text=True, timeout=120
    )


def test_every_setting_has_its_environment_variable_and_default():
    config = OpsConfig.from_environ({"XDG_CACHE_HOME": "/tmp/xdg"})
    assert config == OpsConfig(cache_dir=Path("/tmp/xdg/densecnn"))
    assert (config.solver, config.memory_format, config.tune) == (None, None, False)
    assert (config.output_cache_mb, config.huge_pages) == (1024, False)
    environment = {
        "DENSECNN_SOLVER": "s2b",
        "DENSECNN_MEMORY_FORMAT": "nhwc",
        "DENSECNN_TUNE": "1",
        "DENSECNN_CACHE_DIR": "/tmp/solver-cache",
        "DENSECNN_OUTPUT_CACHE_MB": "0",
        "DENSECNN_HUGE_PAGES": "1",
        "XDG_CACHE_HOME": "/tmp/xdg",
    }
    assert OpsConfig.from_environ(environment) == OpsConfig(
        solver="s2b", memory_format="nhwc", tune=True, cache_dir=Path("/tmp/solver-cache"), output_cache_mb=0,
        huge_pages=True,
    )  # fmt: skip
    assert set(ENVIRONMENT) == {field for field in OpsConfig.__dataclass_fields__}
    empty = dict.fromkeys(ENVIRONMENT.values(), "")  # empty means unset
    assert OpsConfig.from_environ({**empty, "XDG_CACHE_HOME": "/tmp/xdg"}) == config


def test_the_old_name_of_the_tune_variable_is_read_with_one_warning(monkeypatch):
    monkeypatch.setattr(ops_config_module, "_warned_deprecated", set())
    with pytest.warns(FutureWarning, match="DENSECNN_FIND is deprecated; set DENSECNN_TUNE instead"):
        assert OpsConfig.from_environ({"DENSECNN_FIND": "1"}).tune is True
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per process
        assert OpsConfig.from_environ({"DENSECNN_FIND": "1"}).tune is True
        # the new name wins where both are set, and is read without a warning
        assert OpsConfig.from_environ({"DENSECNN_FIND": "1", "DENSECNN_TUNE": "0"}).tune is False
    monkeypatch.setattr(ops_config_module, "_warned_deprecated", set())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert OpsConfig.from_environ({"DENSECNN_FIND": "1", "DENSECNN_TUNE": "0"}).tune is False


def test_the_environment_is_read_once_at_import(monkeypatch):
    code = """
import os, torch, densecnn
from densecnn.ops import OpsConfig, get_config
config = get_config()
os.environ["DENSECNN_SOLVER"] = "native"                  # too late: read once, at import
OpsConfig.from_environ = None                              # and never again
model, patch = densecnn.zoo.create("tiny", in_channels=1, num_classes=3)
dense = densecnn.convert(model.eval(), patch)
with torch.no_grad():
    plan = dense.plan(dense.pad(torch.rand(1, 1, 10, 10)))
assert get_config() is config and config.solver == "s2b", config
print(sorted({step.solver for step in plan.steps if step.solver}))
"""
    result = _run(code, DENSECNN_SOLVER="s2b", DENSECNN_MEMORY_FORMAT="nchw")
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split("\n")[-2] == "['native', 's2b']"  # s2b wherever it applies, native elsewhere


def test_code_overrides_the_environment_and_a_net_overrides_the_process():
    code = """
import torch, densecnn
from densecnn.ops import get_config, set_config, use_config
model, patch = densecnn.zoo.create("tiny", in_channels=1, num_classes=3)
dense = densecnn.convert(model.eval(), patch)
x = torch.rand(1, 1, 10, 10)
def used():
    with torch.no_grad():
        return sorted({step.solver for step in dense.plan(dense.pad(x)).steps if step.solver})
print(used())                                              # the environment's s2b
with use_config(solver="native"):
    print(used())                                          # the code's, for the block
print(used())                                              # the environment's again
set_config(get_config().replace(solver="native"))
dense.solver = "s2b"
print(used())                                              # the net's own, over the process's
"""
    result = _run(code, DENSECNN_SOLVER="s2b", DENSECNN_MEMORY_FORMAT="nchw")
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split("\n")[:4] == [
        "['native', 's2b']",
        "['native']",
        "['native', 's2b']",
        "['native', 's2b']",
    ]


def test_a_net_plans_anew_when_the_config_changes(ops_config, tmp_path):
    ops_config(cache_dir=tmp_path, solver=None, memory_format="nchw")
    dense, x = _tiny()
    assert _solvers_used(dense, x) != {"native"}
    with use_config(solver="native"):
        assert _solvers_used(dense, x) == {"native"}
    assert _solvers_used(dense, x) != {"native"}
    dense.tune = True  # the net's tune, or the process's, times the candidates into the config's cache
    _solvers_used(dense, x)
    assert dense.ops_config().tune and list((tmp_path / "solvers").glob("*.json"))


@pytest.mark.parametrize(
    ("variable", "value", "allowed"),
    [
        ("DENSECNN_SOLVER", "fastest", f"one of {', '.join(SOLVERS)}, or leave it unset"),
        ("DENSECNN_MEMORY_FORMAT", "nwhc", "one of nchw, nhwc, or leave it unset"),
        ("DENSECNN_TUNE", "yes", "1 or 0"),
        ("DENSECNN_FIND", "yes", "1 or 0"),
        ("DENSECNN_HUGE_PAGES", "2", "1 or 0"),
        ("DENSECNN_OUTPUT_CACHE_MB", "1GB", "a whole number of megabytes, 0 or more"),
        ("DENSECNN_OUTPUT_CACHE_MB", "-1", "a whole number of megabytes, 0 or more"),
    ],
)
@pytest.mark.filterwarnings("ignore:DENSECNN_FIND is deprecated:FutureWarning")
def test_an_invalid_environment_value_is_refused_naming_the_variable(variable, value, allowed):
    with pytest.raises(ValueError) as error:
        OpsConfig.from_environ({variable: value})
    assert f"{value!r}" in str(error.value) and f"; use {allowed}" in str(error.value)
    assert str(error.value).endswith(f"({variable})")


def test_an_invalid_environment_value_stops_the_first_use_with_the_fix():
    code = """
import densecnn
print("imported")
model, patch = densecnn.zoo.create("tiny", in_channels=1, num_classes=3)
densecnn.convert(model.eval(), patch)
"""
    result = _run(code, DENSECNN_SOLVER="fastest")
    assert result.returncode != 0 and result.stdout == "imported\n"
    assert "InvalidInputError: solver 'fastest' is unknown; use one of native" in result.stderr
    assert "(DENSECNN_SOLVER)" in result.stderr


def test_an_invalid_value_in_code_is_refused_naming_the_setting():
    with pytest.raises(ValueError, match=r"output cache size -5 is invalid.*\(OpsConfig.output_cache_mb\)"):
        OpsConfig(output_cache_mb=-5)
    with pytest.raises(ValueError, match=r"memory format 'NCHW' is unknown; use one of nchw, nhwc"):
        get_config().replace(memory_format="NCHW")
    with pytest.raises(ValueError, match=r"tune 1 is not a flag; use True or False"):
        OpsConfig(tune=1)
    with pytest.raises(TypeError, match="expected an OpsConfig"):
        densecnn.ops.set_config({"solver": "native"})
    dense, x = _tiny()
    dense.solver = "fastest"
    with pytest.raises(ValueError, match="solver 'fastest' is unknown"):
        dense(x)


def test_the_plan_is_handed_the_config_and_the_activations():
    dense, x = _tiny()
    padded = dense.pad(x)
    steps = dense.steps()
    assert [s.activation for s in steps if len(s.layers) == 2]  # tiny's pools absorb their activation
    config = OpsConfig(solver="native", memory_format="nchw")
    made = plan.make_plan(steps, tuple(padded.shape), padded.dtype, padded.device, backend=dense.backend,
                          train=False, config=config)  # fmt: skip
    assert {step.solver for step in made.steps if step.solver} == {"native"}
    torch.testing.assert_close(made(padded), dense(x))
    with pytest.raises(ValueError, match="2 layers but 1 activation names"):
        plan.group_steps(list(dense.features)[:2], [None])


def test_on_a_gpu_an_untuned_plan_runs_torchs_own_ops(tmp_path):
    """The cost model measured CPUs: for a GPU it predicts nothing, and a plan runs torch's ops (cuDNN) until tuned."""
    dense, x = _tiny()
    padded = dense.pad(x)
    config = OpsConfig(cache_dir=tmp_path)  # no tuned timings
    for train in (False, True):
        made = plan.make_plan(dense.steps(), tuple(padded.shape), padded.dtype, "cuda", backend=dense.backend,
                              train=train, config=config, input_grad=train)  # fmt: skip
        windowed = [step for step in made.steps if step.solver]
        assert windowed and {(s.solver, s.source) for s in windowed} == {("native", plan.GPU_DEFAULT)}
        assert made.memory_format == "nchw"
        assert all(s.gradients in (None, ("native", "native")) for s in windowed)
    cpu = plan.make_plan(dense.steps(), tuple(padded.shape), padded.dtype, "cpu", backend=dense.backend,
                         train=False, config=config)  # fmt: skip
    assert {s.source for s in cpu.steps if s.solver} == {"predicted"}


def test_tuning_on_a_gpu_waits_for_its_kernels(monkeypatch):
    """GPU kernels run asynchronously: a timing that did not wait for them before and after would time launches."""
    events = []
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: events.append("wait"))
    tune._elapsed_ms(lambda: events.append("run"))
    assert events == ["wait", "run", "wait"]


@pytest.mark.skipif(not ext.available(), reason="densecnn's kernels are not built")
def test_the_kernels_output_cache_follows_the_config():
    def pool():
        return ext.pool_activation(
            torch.randn(1, 16, 130, 130), (2, 2), (2, 2), "max", "relu", None
        )  # 1 MB out

    ext.release_output_buffers()
    with use_config(output_cache_mb=0):
        out = pool()
        del out
        assert ext.release_output_buffers() == 0  # no reuse: the buffer went back to the system
    with use_config(output_cache_mb=64):
        out = pool()
        size = out.untyped_storage().nbytes()
        del out
        assert ext.release_output_buffers() == size  # kept for reuse, then released here
        out = pool()
        del out  # free and cached ...
        with use_config(output_cache_mb=0):  # ... until the limit drops, which releases it at once
            assert ext.release_output_buffers() == 0


def test_a_net_keeps_at_most_plan_cache_size_plans_least_recently_used_first():
    dense, _ = _tiny()
    padded = [
        size + dense.receptive_field[-1] - 1 for size in range(13)
    ]  # the padded width of each image size
    with use_config(plan_cache_size=2), torch.no_grad():
        for size in (9, 10, 11, 10, 12):  # 10 is used again before 12 comes: 11 is then the least recent
            dense(torch.rand(1, 1, size, size))
    assert [key[0][-1] for key in dense._plans] == [padded[10], padded[12]]
    with pytest.raises(
        ValueError, match=r"plan cache size 0 is invalid; use a whole number of plans, 1 or more"
    ):
        OpsConfig(plan_cache_size=0)
