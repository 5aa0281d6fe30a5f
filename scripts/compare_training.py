#!/usr/bin/env python
"""Reproducible training comparisons on the nuclei data (``scripts/fetch_data.py nuclei --out data/nuclei`` first).

    python scripts/compare_training.py time-to-accuracy --out runs/compare
    python scripts/compare_training.py masks --out runs/compare
    python scripts/compare_training.py step-cost
    python scripts/compare_training.py inference --model models/nuclei

- ``time-to-accuracy``: dense whole-crop training (``--mask all``) vs the classical patch-minibatch baseline
  (``--method patches --mask random:K``), same model, optimiser and seed; reports the seconds of training steps
  (validation excluded) each needs to first reach a validation foreground IoU.
- ``masks``: dense training with ``hard:K`` vs ``random:K`` masks for the same number of steps (and seeds);
  reports the final validation IoUs.
- ``step-cost``: the time of one dense training step (forward, masked loss, backward) as the number of selected
  pixels grows: flat, since every pixel is scored either way. Runs interleaved, reports medians.
- ``inference``: how long a model takes to label one 512×512 image.

Every run is an ordinary ``densecnn train`` run; its directory under ``--out`` keeps metrics.jsonl, plots and the
model card. Timings share the machine with whatever else runs: read them as ratios, not absolutes.
"""

from __future__ import annotations

import argparse
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
    schedule = dict(crops_per_image=32, val_every=args.val_every)
    names = ("dense-all", f"patches-random{args.patches_k}")
    runs = {
        names[0]: dict(mask="all", epochs=args.epochs, **schedule),
        names[1]: dict(
            method="patches", mask=f"random:{args.patches_k}", epochs=args.patches_epochs, **schedule
        ),
    }
    results = run_all(args.out, runs, args.parallel)
    dense, patches = results[names[0]], results[names[1]]
    targets = args.targets
    lines = [
        "### Time to reach a validation foreground IoU: dense whole-crop training vs patch minibatches",
        "",
        f"Same model (`nuclei`), AdamW lr {COMMON['lr']} (cosine over each run), {COMMON['batch']} crops of "
        f"{COMMON['crop']}² per step, seed 0; dense {args.epochs * 8} steps, patches {args.patches_epochs * 8} steps"
        f"{', both runs at once, one thread each' if args.parallel else ''}; validation every {args.val_every} "
        "steps. Cells: training seconds (validation excluded) and step when the foreground IoU first reached the "
        "target.",
        "",
        "| method | pixels per step | "
        + " | ".join(f"fg IoU ≥ {t}" for t in targets)
        + " | best fg IoU (step) |",
        "|---|---|" + "---|" * len(targets) + "---|",
    ]
    for label, records, pixels in (
        ("dense, `--mask all`", dense, f"{COMMON['batch']}×{COMMON['crop']}²"),
        (
            f"patches, `--mask random:{args.patches_k}`",
            patches,
            f"{COMMON['batch']}×{args.patches_k} patches",
        ),
    ):
        cells = []
        for target in targets:
            hit = first_reaching(records, target)
            cells.append(f"{hit['train_seconds']:.0f} s (step {hit['step']})" if hit else "not reached")
        best = max(records, key=lambda r: r["foreground_iou"] or 0)
        lines.append(
            f"| {label} | {pixels} | {' | '.join(cells)} | {best['foreground_iou']:.3f} ({best['step']}) |"
        )
    return "\n".join(lines)


def masks(args) -> str:
    runs = {
        f"mask-{mask.replace(':', '-')}-seed{seed}": dict(
            mask=mask, seed=seed, epochs=args.epochs, crops_per_image=32
        )
        for seed in args.seeds
        for mask in (f"random:{args.k}", f"hard:{args.k}:{args.mix}")
    }
    results = run_all(args.out, runs, args.parallel)
    rows = [(options["mask"], options["seed"], results[name][-1]) for name, options in runs.items()]
    lines = [
        f"### `hard:{args.k}:{args.mix}` vs `random:{args.k}` masks at equal steps ({args.epochs * 8} steps)",
        "",
        "| mask | seed | fg IoU | background | nucleus | boundary | mean IoU | train s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for mask, seed, r in rows:
        iou = " | ".join(f"{v:.3f}" for v in r["iou"])
        lines.append(
            f"| `{mask}` | {seed} | {r['foreground_iou']:.3f} | {iou} | {r['mean_iou']:.3f} | {r['train_seconds']:.0f} |"
        )
    return "\n".join(lines)


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
    mk = sub.add_parser("masks")
    mk.add_argument("--k", type=int, default=256, help="pixels per crop")
    mk.add_argument("--mix", type=float, default=0.5, help="random share of the hard mask")
    mk.add_argument("--epochs", type=int, default=15, help="epochs of 8 steps")
    mk.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    sc = sub.add_parser("step-cost")
    sc.add_argument("--rounds", type=int, default=11)
    inf = sub.add_parser("inference")
    inf.add_argument("--model", default="models/nuclei")
    inf.add_argument("--threads", type=int, default=2)
    inf.add_argument("--rounds", type=int, default=9)
    for p in (tta, mk):
        p.add_argument("--parallel", action="store_true", help="train the runs at once, one thread each")
    for p in (tta, mk, sc, inf):
        p.add_argument("--out", type=Path, default=Path("runs/compare"))
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore", category=UserWarning)
    args.out.mkdir(parents=True, exist_ok=True)
    commands = {
        "time-to-accuracy": time_to_accuracy,
        "masks": masks,
        "step-cost": step_cost,
        "inference": inference,
    }
    report = commands[args.what](args)
    print(report)
    (args.out / f"{args.what}.md").write_text(report + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
