#!/usr/bin/env python
"""Reproducible training comparisons on the nuclei data (``scripts/fetch_data.py nuclei --out data/nuclei`` first).

    python scripts/compare_training.py time-to-accuracy --parallel --plot docs/images/time_to_accuracy.png
    python scripts/compare_training.py masks --parallel
    python scripts/compare_training.py step-cost
    python scripts/compare_training.py inference --model models/nuclei

- ``time-to-accuracy``: dense whole-crop training (``--mask all``) vs the classical patch-minibatch baseline
  (``--method patches --mask random:K``), same model and optimiser, for each of ``--seeds``; reports the seconds of
  training steps (validation excluded) each needs to first reach a validation foreground IoU, per seed and the
  median, and plots the IoU against seconds.
- ``recipe``: dense and patch training recipes (crops per step and crop side, learning rate, mask, patches per
  crop) for the same steps and seeds: median seconds to each target and final foreground IoU.
- ``masks``: dense training with each pixel selection (all, random, per class, online hard example mining with a
  random share, loss-proportional sampling) and focal weighting, for the same steps and seeds: median seconds to
  each target and final foreground IoU.
- ``step-cost``: the time of one dense training step (forward, masked loss, backward) as the number of selected
  pixels grows: flat, since every pixel is scored either way. Runs interleaved, reports medians.
- ``inference``: how long a model takes to label one 512×512 image.

Every run is an ordinary ``densecnn train`` run; its directory under ``--out`` keeps metrics.jsonl, plots and the
model card. Timings share the machine with whatever else runs: read them as ratios, not absolutes.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import time
import warnings
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import torch

from densecnn.train import TrainConfig, train
from densecnn.train.metrics import read_metrics

COMMON = dict(model="nuclei", data="data/nuclei/train", val="data/nuclei/val", batch=4, crop=128, lr=3e-3)
# the 3-D comparison (--volumes): the nuclei stack (scripts/fetch_data.py nuclei3d --out data/nuclei3d), the
# shipped 3-D model's recipe (2 crops of 16×40×40 voxels per step, boundary weighted 2)
VOLUMES = dict(
    model="nuclei3d",
    data="data/nuclei3d/train",
    val="data/nuclei3d/val",
    batch=2,
    crop=[16, 40, 40],
    class_weights=[1.0, 1.0, 2.0],
    intensity="percentiles:1,99.8",  # 16-bit values 104..375: scaled by their own range, not uint16's
)


def run(out: Path, name: str, **options) -> list[dict]:
    """Train one configuration (or reuse a finished run) and return its validation records."""
    run_dir = out / name
    if not (run_dir / "model" / "model.json").is_file():
        if run_dir.exists():
            sys.exit(f"{run_dir} holds an unfinished run; delete it and rerun")
        config = TrainConfig(**{**COMMON, **options, "out": str(run_dir)})
        config.command = config.command_line()
        print(f"== {name}: {config.command}", flush=True)
        train(config)
    return [r for r in read_metrics(run_dir / "metrics.jsonl") if r["kind"] == "val"]


def _one_thread():
    warnings.filterwarnings("ignore", category=UserWarning)
    torch.set_num_threads(1)


def run_all(out: Path, runs: dict[str, dict], parallel: bool) -> dict[str, list[dict]]:
    """Train every run; with ``parallel``, all at once, one thread each, so they share the machine's load alike."""
    if not parallel:
        return {name: run(out, name, **options) for name, options in runs.items()}
    with ProcessPoolExecutor(len(runs), mp_context=get_context("spawn"), initializer=_one_thread) as pool:
        futures = {name: pool.submit(run, out, name, **options) for name, options in runs.items()}
        return {name: future.result() for name, future in futures.items()}


def first_reaching(records: list[dict], target: float) -> dict | None:
    return next((r for r in records if (r["foreground_iou"] or 0) >= target), None)


def time_to_accuracy(args) -> str:
    """Both methods per seed (with ``--parallel`` the two runs of a seed at once, one thread each, so they share
    the machine's load alike); per target, each seed's seconds and the median over seeds; a plot of the
    validation foreground IoU against training seconds."""
    schedule = dict(crops_per_image=32, val_every=args.val_every)
    if args.volumes:
        schedule.update(VOLUMES, crops_per_image=8 * VOLUMES["batch"])
    methods = {
        "dense": ("dense, `--mask all`", dict(mask="all", epochs=args.epochs, **schedule)),
        "patches": (
            f"patches, `--mask random:{args.patches_k}`",
            dict(method="patches", mask=f"random:{args.patches_k}", epochs=args.patches_epochs, **schedule),
        ),
    }
    records = {method: {} for method in methods}  # method -> seed -> validation records
    prefix = "volumes-" if args.volumes else ""
    for seed in args.seeds:
        runs = {
            f"{prefix}{method}-seed{seed}": dict(options, seed=seed)
            for method, (_, options) in methods.items()
        }
        results = run_all(args.out, runs, args.parallel)
        for method in methods:
            records[method][seed] = results[f"{prefix}{method}-seed{seed}"]
    setup = {**COMMON, **schedule}
    if args.plot:
        plot_time_to_accuracy(records, args.targets, args.plot, setup["model"])
    crop = "×".join(map(str, setup["crop"])) if args.volumes else f"{setup['crop']}²"
    lines = [
        "### Time to reach a validation foreground IoU: dense whole-crop training vs patch minibatches",
        "",
        f"Same model (`{setup['model']}`), AdamW lr {setup['lr']} (cosine over each run), {setup['batch']} crops "
        f"of {crop} per step; dense {args.epochs * 8} steps, patches {args.patches_epochs * 8} steps; seeds "
        f"{', '.join(map(str, args.seeds))}{', the two runs of a seed at once, one thread each' if args.parallel else ''}; "
        f"validation every {args.val_every} steps. Cells: training seconds (validation excluded) when the "
        "foreground IoU first reached the target, per seed, then the median over seeds.",
        "",
        "| method | " + " | ".join(f"fg IoU ≥ {t}" for t in args.targets) + " | best fg IoU per seed |",
        "|---|" + "---|" * len(args.targets) + "---|",
    ]
    medians = {}
    for method, (label, _) in methods.items():
        cells = []
        for target in args.targets:
            seconds = [reached_seconds(records[method][seed], target) for seed in args.seeds]
            medians[method, target] = statistics.median(seconds)  # inf: not reached
            per_seed = " / ".join("—" if math.isinf(s) else f"{s:.0f}" for s in seconds)
            cells.append(f"{per_seed} → **{_seconds(medians[method, target])}**")
        best = " / ".join(
            f"{max(r['foreground_iou'] or 0 for r in records[method][seed]):.3f}" for seed in args.seeds
        )
        lines.append(f"| {label} | {' | '.join(cells)} | {best} |")
    ratios = [
        f"≥ {t}: {medians['dense', t] / medians['patches', t]:.2f}×"
        for t in args.targets
        if math.isfinite(medians["dense", t]) and math.isfinite(medians["patches", t])
    ]
    lines += [
        "",
        f"Dense seconds / patch seconds (medians): {', '.join(ratios) or 'no target reached by both'}.",
    ]
    equal = []
    for seed in args.seeds:
        dense_end = records["dense"][seed][-1]
        patches_then = [
            r for r in records["patches"][seed] if r["train_seconds"] <= dense_end["train_seconds"]
        ]
        then = f"{patches_then[-1]['foreground_iou']:.3f}" if patches_then else "no validation yet"
        equal.append(f"seed {seed}: dense {dense_end['foreground_iou']:.3f} at {dense_end['train_seconds']:.0f} s, "
                     f"patches {then}")  # fmt: skip
    lines += ["", f"Within the dense run's training seconds: {'; '.join(equal)}."]
    return "\n".join(lines)


def reached_seconds(records: list[dict], target: float) -> float:
    hit = first_reaching(records, target)
    return hit["train_seconds"] if hit else math.inf


def _seconds(value: float) -> str:
    return "not reached" if math.isinf(value) else f"{value:.0f} s"


def plot_time_to_accuracy(
    records: dict[str, dict[int, list[dict]]], targets: list[float], path: Path, title: str = "nuclei"
) -> None:
    """Validation foreground IoU against training seconds, one line per run, a colour per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.2), dpi=120)
    for (method, runs), colour in zip(records.items(), ("tab:blue", "tab:orange")):
        for index, run_records in enumerate(runs.values()):
            axes.plot([r["train_seconds"] for r in run_records], [r["foreground_iou"] or 0 for r in run_records],
                      color=colour, alpha=0.85, linewidth=1.4,
                      label=f"{method} (seeds {', '.join(map(str, runs))})" if index == 0 else None)  # fmt: skip
    for target in targets:
        axes.axhline(target, color="0.8", linewidth=0.8, zorder=0)
    axes.set_xlabel("training seconds (validation excluded)")
    axes.set_ylabel("validation foreground IoU")
    axes.set_ylim(0.3, 0.9)  # the climb and the plateau; the first validations start lower
    axes.legend(loc="lower right")
    axes.set_title(f"{title}: dense whole-crop training vs patch minibatches")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path)
    plt.close(figure)


PLAIN = dict(focal_gamma=0.0)  # plain cross-entropy, as the recipes were measured (before the focal default)
RECIPES = {  # name -> train options changed from COMMON: crops per step, crop side, learning rate, mask, method
    "dense 4x128² lr 3e-3": dict(PLAIN, mask="all"),
    "dense 16x64² lr 3e-3": dict(PLAIN, mask="all", batch=16, crop=64),
    "dense 16x64² lr 6e-3": dict(PLAIN, mask="all", batch=16, crop=64, lr=6e-3),
    "dense 4x128² lr 6e-3": dict(PLAIN, mask="all", lr=6e-3),
    "dense 4x128² random:1024": dict(PLAIN, mask="random:1024"),
    "patches 4x64 lr 3e-3": dict(PLAIN, method="patches", mask="random:64"),
    "patches 4x64 lr 6e-3": dict(PLAIN, method="patches", mask="random:64", lr=6e-3),
    "patches 4x256 lr 3e-3": dict(PLAIN, method="patches", mask="random:256"),
}


# name -> train options changed from COMMON, dense 4 crops of 128²: which pixels' errors a step counts and how
SELECTIONS = {
    "all": dict(PLAIN, mask="all"),
    "random:1024": dict(PLAIN, mask="random:1024"),
    "balanced:512 (per class)": dict(PLAIN, mask="balanced:512"),
    "hard:1024:0.5 (OHEM, half random)": dict(PLAIN, mask="hard:1024:0.5"),
    "hard:1024:0.75 (OHEM, a quarter hard)": dict(PLAIN, mask="hard:1024:0.75"),
    "proportional:1024 (loss-proportional)": dict(PLAIN, mask="proportional:1024"),
    "random:1024, focal γ 2": dict(mask="random:1024", focal_gamma=2.0),
    "all, focal γ 2": dict(mask="all", focal_gamma=2.0),
}


def recipe(args) -> str:
    return _compare(args, RECIPES, "recipe", "Recipes")


def masks(args) -> str:
    return _compare(
        args, SELECTIONS, "selection", "Pixel selection and weighting (dense, 4 crops of 128², lr 3e-3)"
    )


def _compare(args, table: dict[str, dict], prefix: str, title: str) -> str:
    """Each entry of ``table`` for the same number of steps and seeds (two runs at a time, one thread each):
    median seconds to each target and the median final foreground IoU."""
    names = {(name, seed): f"{prefix}-{_slug(name)}-seed{seed}" for name in table for seed in args.seeds}
    runs = {
        run_name: dict(  # epochs of 8 steps whatever the crops per step
            table[name],
            crops_per_image=8 * table[name].get("batch", COMMON["batch"]),
            seed=seed,
            val_every=args.val_every,
            epochs=args.epochs,
        )  # fmt: skip
        for (name, seed), run_name in names.items()
    }
    items = list(runs.items())
    results = {}
    for i in range(0, len(items), 2):  # in pairs: each shares the machine with one other run
        results.update(run_all(args.out, dict(items[i : i + 2]), args.parallel))
    lines = [
        f"### {title}: {args.epochs * 8} steps each, seeds {', '.join(map(str, args.seeds))}, medians over seeds",
        "",
        "| run | " + " | ".join(f"s to fg IoU ≥ {t}" for t in args.targets) + " | final fg IoU | train s |",
        "|---|" + "---|" * len(args.targets) + "---|---|",
    ]
    for name in table:
        records = [results[names[name, seed]] for seed in args.seeds]
        reach = [_seconds(statistics.median(reached_seconds(r, t) for r in records)) for t in args.targets]
        final = statistics.median(r[-1]["foreground_iou"] for r in records)
        seconds = statistics.median(r[-1]["train_seconds"] for r in records)
        lines.append(f"| {name} | {' | '.join(reach)} | {final:.3f} | {seconds:.0f} |")
    return "\n".join(lines)


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text).replace("²", "")


def step_cost(args) -> str:
    """Median time of a dense step per mask size, the sizes interleaved round by round."""
    import densecnn
    from densecnn import masks as masks_module
    from densecnn.losses import pixel_cross_entropy

    torch.manual_seed(0)
    model, patch = densecnn.zoo.create("nuclei", in_channels=1, num_classes=3)
    dense = densecnn.convert(model.eval(), patch, padding_mode="reflect")
    crop = COMMON["crop"]
    images = torch.randn(COMMON["batch"], 1, crop, crop)
    labels = torch.randint(0, 3, (COMMON["batch"], crop, crop))
    specs = ["random:1", "random:64", "random:1024", "hard:1024:0.5", "all"]
    times = {spec: [] for spec in specs}
    order = random.Random(0)
    for _ in range(args.rounds):
        for spec in order.sample(specs, len(specs)):  # a fresh order every round, so drift hits all alike
            strategy = masks_module.parse(spec)
            started = time.perf_counter()
            scores = dense(images)  # (B, K, c, c)
            loss = pixel_cross_entropy(scores, labels) if strategy.needs_loss else None
            mask = strategy(labels, pixel_loss=loss, generator=torch.Generator().manual_seed(0))
            model.zero_grad()
            densecnn.masked_cross_entropy(scores, labels, mask).backward()
            times[spec].append(time.perf_counter() - started)
    base = statistics.median(times["all"])
    lines = [
        f"### Cost of one dense training step vs selected pixels ({COMMON['batch']} crops of {crop}², "
        f"{args.rounds} rounds in shuffled order, medians)",
        "",
        "| mask | selected pixels per step | median step (s) | relative to `all` |",
        "|---|---|---|---|",
    ]
    for spec in specs:
        selected = (
            COMMON["batch"] * crop * crop if spec == "all" else COMMON["batch"] * int(spec.split(":")[1])
        )
        median = statistics.median(times[spec])
        lines.append(f"| `{spec}` | {selected} | {median:.3f} | {median / base:.2f} |")
    return "\n".join(lines)


def inference(args) -> str:
    """Median time for the shipped model to label one 512×512 image (normalise + dense forward + argmax)."""
    import densecnn

    torch.set_num_threads(args.threads)
    loaded = densecnn.load(args.model)
    dense = loaded.dense()
    image = torch.rand(1, loaded.in_channels, 512, 512)
    dense.predict(loaded.normalize(image))  # warm-up
    times = []
    for _ in range(args.rounds):
        started = time.perf_counter()
        dense.predict(loaded.normalize(image))
        times.append(time.perf_counter() - started)
    return (
        f"### Inference: `{args.model}` on a 512×512 image, {args.threads} threads, backend `{dense.backend}`\n\n"
        f"median {statistics.median(times):.3f} s, min {min(times):.3f} s, max {max(times):.3f} s "
        f"over {args.rounds} runs"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    tta = sub.add_parser("time-to-accuracy")
    tta.add_argument("--targets", type=float, nargs="+", default=[0.7, 0.75, 0.8], help="fg IoUs to reach")
    tta.add_argument("--epochs", type=int, default=25, help="epochs of 8 steps, dense run")
    tta.add_argument("--patches-epochs", type=int, default=75, help="epochs of 8 steps, patches run")
    tta.add_argument("--patches-k", type=int, default=64, help="patches per crop for the baseline")
    tta.add_argument("--val-every", type=int, default=20)
    tta.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    tta.add_argument("--plot", type=Path, help="write the IoU-against-seconds plot here (PNG)")
    tta.add_argument("--volumes", action="store_true", help="the 3-D nuclei stack and the nuclei3d net")
    rc = sub.add_parser("recipe")
    mk = sub.add_parser("masks")
    for p in (rc, mk):
        p.add_argument("--targets", type=float, nargs="+", default=[0.75, 0.8])
        p.add_argument("--epochs", type=int, default=25, help="epochs of 8 steps, every run")
        p.add_argument("--val-every", type=int, default=20)
        p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    sc = sub.add_parser("step-cost")
    sc.add_argument("--rounds", type=int, default=11)
    inf = sub.add_parser("inference")
    inf.add_argument("--model", default="models/nuclei")
    inf.add_argument("--threads", type=int, default=2)
    inf.add_argument("--rounds", type=int, default=9)
    for p in (tta, mk, rc):
        p.add_argument("--parallel", action="store_true", help="train the runs at once, one thread each")
    for p in (tta, mk, rc, sc, inf):
        p.add_argument("--out", type=Path, default=Path("runs/compare"))
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore", category=UserWarning)
    args.out.mkdir(parents=True, exist_ok=True)
    commands = {
        "time-to-accuracy": time_to_accuracy,
        "masks": masks,
        "recipe": recipe,
        "step-cost": step_cost,
        "inference": inference,
    }
    report = commands[args.what](args)
    print(report)
    (args.out / f"{args.what}.md").write_text(report + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
