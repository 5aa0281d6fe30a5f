#!/usr/bin/env python
"""What a masked training step costs, by mask size, against the patch minibatch and the dense step; and the fit of
``densecnn.masked.DENSE_MAC_COST``.

    python scripts/bench_masked.py --rounds 7 --size 256

For each reference net (float32, eval mode, one SIZE² image): in interleaved rounds, forward + masked loss + backward
by ``dense.masked_loss`` with 64 selected pixels ("auto": it picks), the classical 64-patch minibatch through the
patch model itself, ``masked_loss`` with every pixel selected ("auto") and the dense step (``method="dense"``).
Reported: medians as ratios (sparse auto / patch minibatch, full auto / dense step), the methods "auto" chose, and the
seconds per multiply-add of the dense and the patch pass (``method="patches"`` with 64 pixels), whose ratio is what
``DENSE_MAC_COST`` should be.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import densecnn  # noqa: E402
from densecnn import masked  # noqa: E402
from densecnn.bench import machine  # noqa: E402

NETS = {"plain_133": 3, "stages_46": 3, "nuclei": 1}


def _timed(step) -> float:
    start = time.perf_counter()
    step()
    return time.perf_counter() - start


def measure(name: str, channels: int, size: int, rounds: int, pixels: int) -> dict:
    torch.manual_seed(0)
    model, patch = densecnn.zoo.create(name, in_channels=channels, num_classes=3)
    model.eval()
    dense = densecnn.convert(model, patch)
    images = torch.rand(1, channels, size, size)
    labels = torch.randint(0, 3, (1, size, size))
    sparse = torch.zeros(1, size, size, dtype=torch.bool)
    sparse.view(-1)[torch.randperm(size * size)[:pixels]] = True
    windows = dense.pad(images)
    before = tuple((p - 1) // 2 for p in dense.patch_size)
    padded_patch = F.pad(
        images, [w for b, p in zip(before[::-1], dense.patch_size[::-1]) for w in (b, p - 1 - b)]
    )
    rows, cols = sparse[0].nonzero(as_tuple=True)
    patches = torch.stack(
        [padded_patch[0, :, r : r + patch, c : c + patch] for r, c in zip(rows.tolist(), cols.tolist())]
    )
    patch_targets = labels[0, rows, cols]

    def step(method, mask):
        model.zero_grad(set_to_none=True)
        dense.masked_loss(images, labels, mask, method=method).backward()

    def patch_minibatch():
        model.zero_grad(set_to_none=True)
        F.cross_entropy(model(patches).flatten(1), patch_targets).backward()

    steps = {
        "sparse auto": lambda: step("auto", sparse),
        "patch minibatch": patch_minibatch,
        "full auto": lambda: step("auto", None),
        "dense step": lambda: step("dense", None),
        "sparse patches": lambda: step("patches", sparse),
    }
    for run in steps.values():  # plans and buffers first
        run()
    times = {key: [] for key in steps}
    for _ in range(rounds):
        for key, run in steps.items():
            times[key].append(_timed(run))
    medians = {key: statistics.median(values) for key, values in times.items()}
    chosen = masked.selected(labels, sparse)
    estimate = masked.costs(dense, tuple(windows.shape), chosen)
    full = masked.costs(dense, tuple(windows.shape), masked.selected(labels, None))
    dense_per_mac = medians["dense step"] / (full["dense"] / masked.DENSE_MAC_COST)
    patch_per_mac = medians["sparse patches"] / estimate["patches"]
    picks = (
        min(masked.METHODS, key=estimate.__getitem__),
        min(masked.METHODS, key=full.__getitem__),
    )
    return {**medians, "fit": dense_per_mac / patch_per_mac, "picks": picks}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--pixels", type=int, default=64)
    parser.add_argument("--nets", nargs="*", default=list(NETS))
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    print(f"torch {torch.__version__}, {machine.description()}, {args.rounds} interleaved rounds, medians,")
    print(f"{args.size}² image, {args.pixels} selected pixels; DENSE_MAC_COST = {masked.DENSE_MAC_COST}")
    print(
        "| net | 64 pixels: auto / patch minibatch | all pixels: auto / dense step | auto picks (64, all) | fitted DENSE_MAC_COST |"
    )
    print("|---|---|---|---|---|")
    for name in args.nets:
        m = measure(name, NETS[name], args.size, args.rounds, args.pixels)
        print(
            f"| {name} | {m['sparse auto'] / m['patch minibatch']:.2f}x | {m['full auto'] / m['dense step']:.2f}x "
            f"| {', '.join(m['picks'])} | {m['fit']:.2f} |"
        )


if __name__ == "__main__":
    main()
