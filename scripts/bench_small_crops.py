#!/usr/bin/env python
"""A training step on a batch of small crops (8 crops of 64² or 128², the training that sparse labels run most):
forward, masked cross-entropy over the labelled pixels, backward. densecnn against the same dense net on torch's
dilated ops (the faster memory format) and against the patch minibatch of the same labelled pixels (one batch of
patches timed and scaled to their number, the faster memory format). Interleaved rounds, medians of per-round ratios.

    PYTHONPATH=. python scripts/bench_small_crops.py --sizes 64 128 --rounds 7
"""

from __future__ import annotations

import argparse
import statistics

import torch

import densecnn
from densecnn.bench import machine
from densecnn.bench.timing import interleave
from densecnn.bench.workloads import LAYOUTS, Workload

PATCH_BATCH = 64  # patches per timed batch of the patch minibatch


def crops_step(name: str, size: int, crops: int, fractions: list[float], rounds: int) -> list[str]:
    torch.manual_seed(0)
    model, patch = densecnn.zoo.create(name, in_channels=3, num_classes=8)
    work = Workload(name, model.eval(), patch, torch.rand(crops, 3, size, size))
    generator = torch.Generator().manual_seed(0)
    labels = torch.randint(0, work.dense.num_classes, (crops, size, size), generator=generator)
    random = torch.rand(crops, size, size, generator=generator)
    contenders = {}
    for fraction in fractions:
        mask = random < fraction
        contenders[f"densecnn {fraction:.0%}"] = work.masked_step("densecnn", labels, mask)
        for fmt in LAYOUTS:
            contenders[f"patch {fraction:.0%}/{fmt}"] = work.patch_train(PATCH_BATCH, int(mask.sum()), fmt)
    half = random < 0.5
    contenders.update({f"native/{fmt}": work.masked_step(f"native/{fmt}", labels, half) for fmt in LAYOUTS})
    samples = interleave(contenders, rounds, warm_up=tuple(contenders))

    def best(prefix):
        runs = [samples[f"{prefix}/{fmt}"] for fmt in LAYOUTS]
        return [min(values) for values in zip(*runs, strict=True)]

    def ratio(slow, fast):
        return statistics.median(s / f for s, f in zip(slow, fast, strict=True))

    native = best("native")
    lines = [f"## {name}, {crops} crops of {size}², training step ({rounds} interleaved rounds, medians)", ""]
    lines += [
        "| labelled | densecnn | best native (50% labelled) | native / densecnn | patch minibatch | densecnn / patch |",
        "|---|---|---|---|---|---|",
    ]
    for fraction in fractions:
        dense, patches = samples[f"densecnn {fraction:.0%}"], best(f"patch {fraction:.0%}")
        lines.append(
            f"| {fraction:.0%} | {statistics.median(dense) * 1e3:.0f} ms | {statistics.median(native) * 1e3:.0f} ms "
            f"| {ratio(native, dense):.2f}× | {statistics.median(patches) * 1e3:.0f} ms | "
            f"{ratio(dense, patches):.2f} |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["stages_46", "plain_133"])
    parser.add_argument("--sizes", nargs="+", type=int, default=[64, 128])
    parser.add_argument("--crops", type=int, default=8)
    parser.add_argument("--fractions", nargs="+", type=float, default=[0.01, 0.1, 0.5])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    print(f"torch {torch.__version__}, densecnn {densecnn.__version__}, {machine.description()}\n")
    for name in args.models:
        for size in args.sizes:
            print("\n".join(crops_step(name, size, args.crops, args.fractions, args.rounds)) + "\n")


if __name__ == "__main__":
    main()
