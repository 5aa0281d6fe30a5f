#!/usr/bin/env python
"""A training step (forward, masked cross-entropy over half the pixels, backward) of the reference nets: densecnn
against the same dense net on torch's dilated ops in each memory format, and against densecnn with every conv's
gradients forced to torch's convolution backward. Interleaved rounds in one process, medians of per-round ratios.

    PYTHONPATH=. python scripts/bench_training_step.py --size 256 --rounds 7

Then, per layer (``--layers``): forward and backward times of densecnn's training plan (its solvers, and for each
conv the input- and weight-gradient solvers) against torch's ops in the faster format for that layer.
"""

from __future__ import annotations

import argparse
import statistics

import torch

import densecnn
from densecnn.bench import machine
from densecnn.bench.timing import interleave
from densecnn.bench.workloads import LAYOUTS, Workload
from densecnn.ops.config import use_config

NATIVE_GRADIENTS = "densecnn, torch's gradients"


def _under(config: dict, step):
    def run():
        with use_config(**config):
            step()

    return run


def whole_steps(name: str, size: int, rounds: int) -> list[str]:
    work = Workload.zoo(name, size)
    generator = torch.Generator().manual_seed(0)
    labels = torch.randint(0, work.dense.num_classes, (1, size, size), generator=generator)
    mask = torch.rand(1, size, size, generator=generator) < 0.5
    densecnn_step = work.masked_step("densecnn", labels, mask)
    contenders = {"densecnn": densecnn_step}
    contenders[NATIVE_GRADIENTS] = _under({"gradient_solver": "native"}, densecnn_step)
    contenders.update({f"native/{fmt}": work.masked_step(f"native/{fmt}", labels, mask) for fmt in LAYOUTS})
    samples = interleave(contenders, rounds, warm_up=tuple(contenders))
    best_native = [min(a, b) for a, b in zip(samples["native/nchw"], samples["native/nhwc"], strict=True)]
    lines = [f"## {name}, {size}² RGB, training step ({rounds} interleaved rounds, medians)", ""]
    lines += ["| contender | step | best native / contender |", "|---|---|---|"]
    for contender, times in samples.items():
        ratio = statistics.median(n / t for n, t in zip(best_native, times, strict=True))
        lines.append(f"| {contender} | {statistics.median(times) * 1e3:.0f} ms | {ratio:.2f}× |")
    return lines


def per_layer(name: str, size: int, rounds: int) -> list[str]:
    work = Workload.zoo(name, size)
    contenders = {"densecnn": work.stepwise("densecnn", train=True)}
    contenders.update({f"native/{fmt}": work.stepwise(f"native/{fmt}", train=True) for fmt in LAYOUTS})
    samples = interleave(contenders, rounds, warm_up=("densecnn",))
    plan = work.plan(True)
    lines = [f"### {name} per layer ({size}²): forward / backward ms", ""]
    lines += [
        "| layer | densecnn solver | gradients (input, weight) | densecnn | best native |",
        "|---|---|---|---|---|",
    ]
    for i, layer in enumerate(work.step_names()):
        step = plan.steps[i]

        def med(which, part, i=i):  # ms
            return statistics.median(s[part][i] for s in samples[which]) * 1e3

        native = min(
            LAYOUTS, key=lambda fmt: med(f"native/{fmt}", "forward") + med(f"native/{fmt}", "backward")
        )
        gradients = ", ".join(g or "–" for g in step.gradients) if step.gradients else "the forward's"
        lines.append(
            f"| {layer} | {step.solver or 'module'} | {gradients} | {med('densecnn', 'forward'):.1f} / "
            f"{med('densecnn', 'backward'):.1f} | {med(f'native/{native}', 'forward'):.1f} / "
            f"{med(f'native/{native}', 'backward'):.1f} ({native}) |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["plain_133", "stages_46"])
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--layers", action="store_true", help="also time each layer's forward and backward")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, densecnn {densecnn.__version__}, {machine.description()}\n")
    for name in args.models:
        print("\n".join(whole_steps(name, args.size, args.rounds)) + "\n")
        if args.layers:
            print("\n".join(per_layer(name, args.size, args.rounds)) + "\n")


if __name__ == "__main__":
    main()
