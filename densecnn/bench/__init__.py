"""densecnn's benchmark suite: ``densecnn bench`` / ``make bench`` (docs/performance.md says what the numbers mean).

>>> from densecnn.bench import run
>>> results = run(Path("docs/benchmarks"), quick=True)   # JSON + Markdown + PNG plots in that folder
>>> results = run(Path("/tmp/b"), only=["first_call"])     # some items only
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from ..atomic import atomic_write
from ..errors import InvalidInputError
from . import firstcall, machine, memory, report, suite, third_party
from .suite import Config
from .workloads import Workload

__all__ = ["ITEMS", "Config", "run"]

ITEMS = (
    "memory",
    "per_layer",
    "max_pool",
    "conv_limit",
    "first_call",
    "immediate_vs_tuned",
    "vs_image_size",
    "vs_patch_size",
    "masked_backward",
    "bfloat16",
    "monai",
)


def run(out: Path, *, quick: bool = False, only: list[str] | None = None, log=print) -> dict:
    """Run the benchmark items (all, or those in ``only``), write ``results.json``, ``results.md`` and the plots into
    ``out``; return the results.

    ``quick``: tiny sizes, seconds in all, for smoke tests; its numbers say nothing about speed.
    """
    unknown = set(only or ()) - set(ITEMS)
    if unknown:
        raise InvalidInputError(f"unknown benchmark items {sorted(unknown)}; choose from {', '.join(ITEMS)}")
    config = Config.quick() if quick else Config()
    out.mkdir(parents=True, exist_ok=True)
    results: dict = {
        "mode": "quick" if quick else "full",
        "repeats": config.repeats,
        "command": "densecnn bench"
        + (" --quick" if quick else "")
        + (f" --only {','.join(only)}" if only else ""),
        "environment": suite.environment(),
        "config": vars(config),
    }
    log(f"densecnn bench on {machine.description()}")
    start = time.perf_counter()
    items = {
        "memory": lambda: memory.tiled_predict_peak(config.model, config.memory_image, config.memory_cap),
        "per_layer": lambda: [suite.per_layer(name, config) for name in config.models],
        "max_pool": lambda: [suite.max_pool(k, d, config) for k, d in ((2, 2), (8, 1))],
        "conv_limit": lambda: [suite.conv_limit(name, config) for name in config.models],
        "first_call": lambda: [firstcall.cold_start(n, config.size, config.cold_runs) for n in config.models],
        "immediate_vs_tuned": lambda: [
            firstcall.immediate_vs_tuned(name, config.size, config.repeats) for name in config.models
        ],
        "vs_image_size": lambda: suite.vs_image_size(config, results.get("per_layer", [])),
        "vs_patch_size": lambda: suite.vs_patch_size(config),
        "masked_backward": lambda: suite.masked_backward(config),
        "bfloat16": lambda: [suite.bfloat16(name, config) for name in config.models],
        "monai": lambda: [
            third_party.monai_baseline(
                Workload.zoo(name, config.size),
                crop=config.monai_crop,
                window_batch=config.patch_batch,
                repeats=config.repeats,
            )
            for name in config.models
        ],
    }
    for key in ITEMS:
        if only is None or key in only:
            log(f"[{time.perf_counter() - start:6.1f}s] {key} ...")
            results[key] = items[key]()
    results["seconds"] = time.perf_counter() - start
    results["summary"] = [
        dict(zip(("measurement", "value", "baseline"), row)) for row in report.summary(results)
    ]
    results["plots"] = report.plots(results, out)
    # each replaced whole: a write that fails (a full disk, Ctrl-C) leaves the previous run's file as it was
    atomic_write(out / "results.json", lambda tmp: tmp.write_text(json.dumps(results, indent=1) + "\n"))
    atomic_write(out / "results.md", lambda tmp: tmp.write_text(report.markdown(results)))
    log(
        f"[{results['seconds']:6.1f}s] wrote {', '.join([f'{out}/results.json', 'results.md', *results['plots']])}"
    )
    return results
