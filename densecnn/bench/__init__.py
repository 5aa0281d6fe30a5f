"""densecnn's benchmark suite: ``densecnn bench`` / ``make bench`` (see README "Benchmarks").

>>> from densecnn.bench import run
>>> results = run(Path("docs/benchmarks"), quick=True)   # JSON + Markdown + PNG plots in that folder
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from . import memory, report, suite
from .suite import Config

__all__ = ["Config", "run"]


def run(out: Path, *, quick: bool = False, log=print) -> dict:
    """Run every benchmark item, write ``results.json``, ``results.md`` and the plots into ``out``; return the results.

    ``quick``: tiny sizes, seconds in all, for smoke tests; its numbers say nothing about speed.
    """
    config = Config.quick() if quick else Config()
    out.mkdir(parents=True, exist_ok=True)
    results: dict = {
        "mode": "quick" if quick else "full",
        "repeats": config.repeats,
        "command": "densecnn bench" + (" --quick" if quick else ""),
        "environment": suite.environment(),
        "config": vars(config),
    }
    start = time.perf_counter()
    items = [
        ("memory", lambda: memory.tiled_predict_peak(config.model, config.memory_image, config.memory_cap)),
        ("per_layer", lambda: [suite.per_layer(name, config) for name in config.models]),
        ("max_pool", lambda: [suite.max_pool(k, d, config) for k, d in ((2, 2), (8, 1))]),
        ("conv_limit", lambda: [suite.conv_limit(name, config) for name in config.models]),
        ("vs_image_size", lambda: suite.vs_image_size(config, results["per_layer"])),
        ("vs_patch_size", lambda: suite.vs_patch_size(config)),
        ("masked_backward", lambda: suite.masked_backward(config)),
        ("bfloat16", lambda: [suite.bfloat16(name, config) for name in config.models]),
    ]
    for key, item in items:
        log(f"[{time.perf_counter() - start:6.1f}s] {key} ...")
        results[key] = item()
    results["seconds"] = time.perf_counter() - start
    results["goals"] = [
        dict(zip(("goal", "target", "achieved", "baseline", "met"), row)) for row in report.goals(results)
    ]
    results["plots"] = report.plots(results, out)
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    (out / "results.md").write_text(report.markdown(results))
    log(f"[{results['seconds']:6.1f}s] wrote {out}/results.json, results.md, {', '.join(results['plots'])}")
    return results
