#!/usr/bin/env python
"""How often the cost model picks the solver timing picks, per layer of the zoo nets, before and after calibration.

    python scripts/bench_cost_model.py --size 256 --calibrations 2 --tunings 2 --threads 1 [--train]

For each windowed layer of plain_133, stages_46, nuclei, multichannel_40, filter_bank (SIZE² images) and znni_3d
(SIZE/4 cubed volumes), at the bucketed shape the tuning step times: the tuning step's table (every candidate in both
memory formats, timed here; ``--tunings 2`` times it twice to show how far timing agrees with itself on this
machine) against the cost model's predictions, shipped as they are and after each of ``--calibrations`` fresh
calibrations (:mod:`densecnn.ops.calibration`). Per layer and format: whether the predicted fastest is the timed fastest, and the
timed ms of the predicted choice over the timed best (what a wrong choice costs). Per net: the timed ms of the
predicted plan (its format and solvers) over the timed best plan's. Torch's fresh buffers (charged equally to both
sources by a plan) are left out. Nothing is read from or written to the user's caches. On a machine other processes
share, ``--threads 1``: two-thread timings there measure the load more than the solvers (see docs/performance.md).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import warnings
from pathlib import Path

import torch

import densecnn
from densecnn.bench import machine
from densecnn.ops import calibration, costmodel, solvers
from densecnn.ops.backends import ext_available
from densecnn.ops.config import use_config
from densecnn.ops.plan import next_shape
from densecnn.ops.tune import timing_shape, tuned_times

NETS = {
    "plain_133": 3,
    "stages_46": 3,
    "nuclei": 1,
    "multichannel_40": 3,
    "filter_bank": 3,
    "znni_3d": 1,
}  # name -> channels


def layers(name: str, size: int) -> list[tuple]:
    """(op, input shape) of each windowed step of the net ``name`` on a SIZE² image (SIZE/4 cubed volume)."""
    model, patch = densecnn.zoo.create(name, in_channels=NETS[name], num_classes=3)
    dense = densecnn.convert(model.eval(), patch, verify=False)
    sides = (size // 4,) * 3 if dense.dims == 3 else (size, size)
    shape = (1, NETS[name], *(s + r - 1 for s, r in zip(sides, dense.receptive_field, strict=True)))
    found = []
    for step in dense.steps():
        if hasattr(step.layers[0], "dense_op"):
            found.append((step.dense_op(), shape))
        shape = next_shape(step, shape)
    return found


def timed_tables(net_layers: list[tuple], *, train: bool, cache_dir: Path) -> list[dict]:
    """The tuning step's {format: {solver: ms}} of each layer, timed now into ``cache_dir``."""
    return [
        tuned_times(
            op,
            shape,
            torch.float32,
            "cpu",
            train=train,
            ext=ext_available(),
            cache_dir=cache_dir,
            input_grad=i > 0,
        )
        for i, (op, shape) in enumerate(net_layers)
    ]


def predicted_tables(net_layers: list[tuple], *, train: bool) -> list[dict]:
    """The cost model's {format: {solver: ms}} of each layer, with the calibration in effect."""
    tables = []
    for op, shape in net_layers:
        names = solvers.candidates(op, ext_available=ext_available(), dtype=torch.float32)
        tables.append(
            costmodel.estimate(op, timing_shape(op, shape), torch.float32, train=train, candidates=names)
        )
    return tables


def _fastest(table: dict) -> str:
    return min((s for s, ms in table.items() if ms is not None), key=table.get)


def compare(predicted: list[dict], timed: list[dict]) -> dict:
    """Agreement of ``predicted`` with ``timed`` per layer and format, and the predicted plan's timed cost."""
    agree, regrets = [], []
    for p, t in zip(predicted, timed, strict=True):
        for fmt in t:
            if fmt in p:
                choice, best = _fastest(p[fmt]), _fastest(t[fmt])
                agree.append(choice == best)
                regrets.append((t[fmt].get(choice) or float("inf")) / t[fmt][best])
    formats = [fmt for fmt in timed[0] if all(fmt in p for p in predicted)]
    planned = min(formats, key=lambda fmt: sum(p[fmt][_fastest(p[fmt])] for p in predicted))
    plan_ms = sum(t[planned].get(_fastest(p[planned])) or float("inf") for p, t in zip(predicted, timed))
    best_ms = min(sum(t[fmt][_fastest(t[fmt])] for t in timed) for fmt in timed[0])
    return {
        "agree": sum(agree),
        "of": len(agree),
        "regret": statistics.median(regrets),
        "plan": plan_ms / best_ms,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=256)
    parser.add_argument(
        "--calibrations", type=int, default=3, help="fresh calibrations to compare (default 3)"
    )
    parser.add_argument("--tunings", type=int, default=1, help="times to time every layer (default 1)")
    parser.add_argument("--train", action="store_true", help="the training direction (forward + backward)")
    parser.add_argument("--nets", nargs="*", default=list(NETS))
    parser.add_argument(
        "--threads", type=int, default=None, help="torch threads while tuning (default: torch's default)"
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    warnings.simplefilter("ignore")
    print(f"torch {torch.__version__}, densecnn {densecnn.__version__}, {machine.description()}")
    direction = "training" if args.train else "inference"
    with tempfile.TemporaryDirectory() as tmp, use_config(cache_dir=Path(tmp) / "calibrated"):
        net_layers = {name: layers(name, args.size) for name in args.nets}
        timed = [
            {
                name: timed_tables(net, train=args.train, cache_dir=Path(tmp) / f"tuning{i}")
                for name, net in net_layers.items()
            }  # fmt: skip
            for i in range(args.tunings)
        ]
        variants = {}
        os.environ[calibration.ENVIRONMENT] = "0"
        variants["shipped"] = {n: predicted_tables(net, train=args.train) for n, net in net_layers.items()}
        os.environ[calibration.ENVIRONMENT] = "1"
        for i in range(args.calibrations):
            factors = calibration.recalibrate()
            print(f"calibration {i + 1}: {factors.seconds:.2f} s, {factors.rounds} rounds, {factors.factors}")
            variants[f"calibrated {i + 1}"] = {n: predicted_tables(net, train=args.train) for n, net in
                                               net_layers.items()}  # fmt: skip
        for i in range(1, args.tunings):
            variants[f"tuning {i + 1}"] = timed[i]
    print(
        f"\n{direction}, {args.size}² images, {args.size // 4}³ volumes; against the tuning step's choice:\n"
    )
    print("| net | layers × formats | " + " | ".join(variants) + " |")
    print("|---|---|" + "---|" * len(variants))
    totals = {v: [0, 0] for v in variants}
    for name in net_layers:
        cells = []
        for variant, tables in variants.items():
            c = compare(tables[name], timed[0][name])
            totals[variant][0] += c["agree"]
            totals[variant][1] += c["of"]
            cells.append(f"{c['agree']}/{c['of']} (plan {c['plan']:.2f}×, median pick {c['regret']:.2f}×)")
        print(f"| {name} | {c['of']} | " + " | ".join(cells) + " |")
    print("| all | | " + " | ".join(f"{a}/{n} = {a / n:.0%}" for a, n in totals.values()) + " |")


if __name__ == "__main__":
    main()
