#!/usr/bin/env python
"""How soon napari's Train panel shows a useful model: in a real viewer (Xvfb), on 512² images with a dense ground
truth and strokes drawn on them (``scripts/stroke_sets.py``, as ``scripts/compare_strokes.py`` draws them).

    xvfb-run -a -s "-screen 0 1600x1000x24" .venv/bin/python scripts/bench_napari_training.py \
        --out docs/benchmarks/napari_training.json

For each image and seed:

- **first useful prediction**: wall seconds from Train to the first live labels of the whole image whose mean IoU on
  the unlabelled pixels reaches the ilastik-style random forest's on the same strokes (``compare_strokes.py``'s
  forest; its own CPU seconds are reported beside);
- **stroke to retrained labels**: once that run has ended, strokes are added (a second stroke set of the same kind)
  and Train pressed again, and, during a run, strokes added while it trains: wall seconds from the strokes layer's
  data being set to the live layer's first labels by weights trained on them (a step after the run took them up).

Times are wall clock on the machine it runs on (the Qt event loop turns meanwhile, as in a session), so they grow
with whatever else runs there: each result records the 1-minute load average at its end, and the CPU seconds of this
process over the same spans (all its threads; an upper bound of the wall time on an otherwise idle machine while the
work keeps at least one core busy). The panel's defaults (time
budget aside) are used.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import napari  # noqa: E402
from compare_strokes import mean_iou, run_forest  # noqa: E402
from qtpy.QtWidgets import QApplication  # noqa: E402
from stroke_sets import UNLABELLED, make_image, strokes  # noqa: E402

from densecnn.bench import machine  # noqa: E402
from densecnn.napari.train_panel import TrainPanel  # noqa: E402
from densecnn.napari.training import LivePrediction  # noqa: E402


def wait(predicate, timeout: float) -> bool:
    """Turn the Qt event loop until ``predicate()`` or ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        QApplication.processEvents()
        time.sleep(0.01)
    return True


def stroke_values(labels: np.ndarray) -> np.ndarray:
    """A stroke set (class ids, UNLABELLED elsewhere) as a Labels layer's values (class + 1, 0 elsewhere)."""
    return np.where(labels == UNLABELLED, 0, labels + 1).astype(np.uint8)


def layer_of(image: np.ndarray) -> tuple[np.ndarray, bool]:
    """(C, H, W) in [0, 1] -> napari's (H, W) gray or (H, W, 3) RGB pixels."""
    return (image[0], False) if len(image) == 1 else (np.moveaxis(image, 0, -1), True)


class Recorder:
    """Every live prediction a run yields: (wall time, CPU time of this process, the weights' step, the labels when
    they cover the whole image)."""

    def __init__(self, shape: tuple[int, ...]):
        self.shape, self.seen = shape, []

    def follow(self, worker) -> None:
        worker.yielded.connect(self._keep)

    def _keep(self, update) -> None:
        if isinstance(update, LivePrediction):
            whole = update.labels.copy() if update.labels.shape == self.shape else None
            self.seen.append((time.perf_counter(), time.process_time(), update.step, whole))

    def first_after(self, index: int, step: int, wall: float, cpu: float) -> tuple[float, float] | None:
        """(wall, CPU) seconds from (``wall``, ``cpu``) to the first live prediction from ``index`` on by weights
        after ``step``."""
        return next(((w - wall, c - cpu) for w, c, s, _ in self.seen[index:] if s > step), None)


def now() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def one_case(name: str, seed: int, args) -> dict:
    image, truth, names = make_image(name, seed, args.size)
    labels = strokes(truth, args.kind, args.share, seed)
    scored = labels == UNLABELLED
    forest = run_forest(image, labels, truth, scored, len(names), seed)

    viewer = napari.Viewer(show=False)
    panel = TrainPanel(viewer)
    viewer.window.add_dock_widget(panel)
    pixels, rgb = layer_of(image)
    image_layer = viewer.add_image(pixels, rgb=rgb, name=name)
    strokes_layer = viewer.add_labels(stroke_values(labels), name="strokes")
    panel._image.reset_choices()
    panel._strokes.reset_choices()
    panel._image.value, panel._strokes.value = image_layer, strokes_layer
    recorder = Recorder(truth.shape)

    def train(budget: int):
        panel._max_seconds.value = budget
        worker = panel.train()
        recorder.follow(worker)
        return worker

    wall, cpu = now()
    train(args.budget)
    wait(lambda: panel.worker is None, args.budget + 300)
    curve = [
        (w - wall, c - cpu, mean_iou(whole, truth, scored, len(names)))
        for w, c, _, whole in recorder.seen
        if whole is not None
    ]
    reached = next(((w, c) for w, c, m in curve if m >= forest["miou"]), (None, None))

    # strokes added after the run, then Train
    index, step = len(recorder.seen), panel.session.trainer.step
    wall, cpu = now()
    strokes_layer.data = np.maximum(
        strokes_layer.data, stroke_values(strokes(truth, args.kind, args.share, seed + 1))
    )
    train(args.retrain_budget)
    wait(lambda: panel.worker is None, args.retrain_budget + 300)
    after_run = recorder.first_after(index, step, wall, cpu) or (None, None)

    # strokes added while a run trains: the run takes them up after its step under way
    train(args.retrain_budget)
    trainer = panel.session.trainer
    wait(lambda: trainer.step > trainer.start_step + 2 or panel.worker is None, 300)
    during = (None, None)
    if panel.worker is not None:
        index, taken = len(recorder.seen), trainer.start_step
        wall, cpu = now()
        strokes_layer.data = np.maximum(
            strokes_layer.data, stroke_values(strokes(truth, args.kind, args.share, seed + 2))
        )
        wait(lambda: trainer.start_step != taken or panel.worker is None, 300)
        taken = trainer.start_step
        wait(lambda: recorder.first_after(index, taken, wall, cpu) is not None or panel.worker is None, 300)
        during = recorder.first_after(index, taken, wall, cpu) or (None, None)
        panel.cancel()
        wait(lambda: panel.worker is None, 300)
    viewer.close()
    result = {
        "image": name, "seed": seed, "kind": args.kind, "size": args.size,
        "labelled_share": float(np.mean(labels != UNLABELLED)),
        "forest_miou": forest["miou"], "forest_cpu_seconds": forest["seconds"],
        "first_useful_seconds": reached[0], "first_useful_cpu_seconds": reached[1], "curve": curve,
        "best_miou": max((m for _, _, m in curve), default=None),
        "stroke_to_live_seconds_after_run": after_run[0], "stroke_to_live_cpu_seconds_after_run": after_run[1],
        "stroke_to_live_seconds_during_run": during[0], "stroke_to_live_cpu_seconds_during_run": during[1],
        "load_average_1min": os.getloadavg()[0],
    }  # fmt: skip
    print(json.dumps({k: v for k, v in result.items() if k != "curve"}), flush=True)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--images", nargs="+", default=["grey", "rgb", "fluorescence"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--size", type=int, default=512)
    parser.add_argument("--kind", default="walks", help="stroke kind of scripts/stroke_sets.py")
    parser.add_argument("--share", type=float, default=0.03, help="share of the pixels the strokes label")
    parser.add_argument("--budget", type=int, default=60, help="the first run's time budget (s)")
    parser.add_argument(
        "--retrain-budget", type=int, default=15, help="the runs' after strokes are added (s)"
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    results = [one_case(name, seed, args) for name in args.images for seed in args.seeds]
    summary: dict = {"machine": machine.description()}
    for key in [k for k in results[0] if k.startswith(("first_useful", "stroke_to_live"))]:
        values = [r[key] for r in results if r[key] is not None]
        summary[key] = {
            "median": statistics.median(values) if values else None,
            "max": max(values) if values else None,
            "missing": sum(r[key] is None for r in results),
        }
    print(json.dumps(summary))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"summary": summary, "results": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
