"""Immediate mode, measured: the first call in a fresh process with an empty solver cache vs the warm calls after it,
and the immediate (predicted) plan vs the tuned (timed) one.

The fresh processes find this machine's cost-model calibration already done (copied into their empty cache), as
every process after the machine's first does: the calibration's one-off seconds (:mod:`densecnn.ops.calibration`)
are not a first call's."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import torch

import densecnn
from densecnn.ops import calibration
from densecnn.ops.config import get_config, use_config

from .timing import interleave, median, ratio
from .workloads import Workload

SCRIPT = textwrap.dedent(
    """
    import json, statistics, sys, time, torch, densecnn

    name, size, direction, calls = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    torch.manual_seed(0)
    model, patch = densecnn.zoo.create(name, in_channels=3, num_classes=32 if name == "plain_133" else 8)
    dense = densecnn.convert(model.eval(), patch)
    x = torch.rand(1, 3, size, size)
    labels = torch.randint(0, dense.num_classes, (1, size, size))
    mask = torch.rand(1, size, size) < 0.5

    def call():
        if direction == "forward":
            with torch.no_grad():
                dense(x)
        else:
            model.zero_grad(set_to_none=True)
            densecnn.masked_cross_entropy(dense(x), labels, mask).backward()

    times = []
    for _ in range(calls):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    print(json.dumps({"first_s": times[0], "warm_s": statistics.median(times[1:])}))
    """
)


def _fresh_process(name: str, size: int, direction: str, calls: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="densecnn-cold-") as cache:
        _copy_calibration(Path(cache))
        env = {**os.environ, "DENSECNN_CACHE_DIR": cache}
        for variable in ("DENSECNN_TUNE", "DENSECNN_FIND"):  # the new name and its deprecated one
            env.pop(variable, None)
        result = subprocess.run(
            [sys.executable, "-c", SCRIPT, name, str(size), direction, str(calls)],
            capture_output=True,
            text=True,
            check=True,
            timeout=1800,
            env=env,
        )
    return json.loads(result.stdout.strip().splitlines()[-1])


def _copy_calibration(cache: Path) -> None:
    """This machine's calibration (done now, if it was not yet) into the fresh cache directory ``cache``."""
    if not calibration.enabled():
        return
    calibration.current()
    done = calibration.cache_file(calibration.machine_key(), get_config().cache_dir)
    if done.exists():  # not if the cache is read-only
        (cache / "calibration").mkdir()
        shutil.copy(done, cache / "calibration" / done.name)


def cold_start(name: str, size: int, runs: int, calls: int = 4) -> dict:
    """First call vs warm calls of a forward (no_grad) and of a training step (forward, masked cross-entropy over
    half the pixels, backward), each in ``runs`` fresh processes with an empty solver cache; medians over runs."""
    result = {"model": name, "image": [1, 3, size, size], "runs": runs}
    for direction in ("forward", "train"):
        measured = [_fresh_process(name, size, direction, calls) for _ in range(runs)]
        result[direction] = {
            "first_s": median([m["first_s"] for m in measured]),
            "warm_s": median([m["warm_s"] for m in measured]),
            "first_over_warm": median([m["first_s"] / m["warm_s"] for m in measured]),
        }
    return result


@contextlib.contextmanager
def _empty_cache():
    with tempfile.TemporaryDirectory(prefix="densecnn-cache-") as cache, use_config(cache_dir=cache):
        yield


def immediate_vs_tuned(name: str, size: int, repeats: int) -> dict:
    """Warm forward and training-step times of the immediate plan (cost model, nothing timed) vs the tuned plan
    (every candidate timed), interleaved; and how long tuning took."""
    result: dict = {"model": name, "image": [1, 3, size, size]}
    with _empty_cache():
        work = Workload.zoo(name, size)
        tuned = densecnn.convert(work.model, work.patch, tune=True)
        nets = {"immediate": work.dense, "tuned": tuned}
        for direction, train in (("forward", False), ("train", True)):
            steps = {which: _step(net, work, train) for which, net in nets.items()}
            steps["immediate"]()  # the immediate plan first, before any timing fills the cache
            start = time.perf_counter()
            steps["tuned"]()
            tune_s = time.perf_counter() - start
            samples = interleave(steps, repeats)
            with torch.set_grad_enabled(train):
                plans = {which: net.plan(net.pad(work.x)) for which, net in nets.items()}
            result[direction] = {
                "immediate_s": median(samples["immediate"]),
                "tuned_s": median(samples["tuned"]),
                "immediate_over_tuned": ratio(samples["immediate"], samples["tuned"]),
                "first_tuned_call_s": tune_s,
                "plans": {
                    which: {"format": p.memory_format, "solvers": [s.solver or "module" for s in p.steps]}
                    for which, p in plans.items()
                },
            }
    return result


def _step(net, work: Workload, train: bool):
    def run():
        if train:
            work.model.zero_grad(set_to_none=True)
            net(work.x).sum().backward()
        else:
            with torch.no_grad():
                net(work.x)

    return run
