#!/usr/bin/env python
"""What a call's own checks cost next to one warm forward: the non-finite check, the no-data pass, the structure check.

    python scripts/bench_nonfinite.py --rounds 9 --size 512

For each reference net (float32, eval mode, 3 input channels for plain_133 and stages_46), in interleaved rounds on a
SIZE² image: one warm forward (``nonfinite="refuse"``, the default, which includes the check), the ``isfinite`` check
alone (:func:`densecnn.nonfinite.check_finite`), the structure and hook check alone (``dense.check_model()``), and a
forward with ``nonfinite="propagate"`` on the image with one NaN pixel (zero-filling, the footprint's max-pool chain,
the NaN fill). Medians; the checks as fractions of the forward and in microseconds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import densecnn  # noqa: E402
from densecnn.bench import machine  # noqa: E402
from densecnn.bench.timing import CLOCKS, add_clock_argument, elapsed, per_call  # noqa: E402
from densecnn.nonfinite import check_finite  # noqa: E402

NETS = {"plain_133": 3, "stages_46": 3, "nuclei": 1}  # name -> input channels


def measure(name: str, channels: int, size: int, rounds: int, clock) -> dict[str, float]:
    model, patch = densecnn.zoo.create(name, in_channels=channels, num_classes=3)
    dense = densecnn.convert(model.eval(), patch)
    images = torch.rand(1, channels, size, size)
    holed = images.clone()
    holed[0, 0, size // 2, size // 3] = float("nan")
    times: dict[str, list[float]] = {"forward": [], "isfinite": [], "structure": [], "propagate": []}
    with torch.no_grad():
        dense(images)  # plans and buffers: every call is timed warm
        dense(holed, nonfinite="propagate")
        for _ in range(rounds):
            times["forward"].append(elapsed(lambda: dense(images), clock))
            times["isfinite"].append(per_call(lambda: check_finite(images), 20, clock))
            times["structure"].append(per_call(dense.check_model, 200, clock))
            times["propagate"].append(elapsed(lambda: dense(holed, nonfinite="propagate"), clock))
    return {key: statistics.median(values) for key, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--size", type=int, default=512)
    parser.add_argument("--nets", nargs="*", default=list(NETS))
    add_clock_argument(parser)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    print(
        f"torch {torch.__version__}, {machine.description()}, {args.rounds} interleaved rounds, medians of "
        f"{args.clock} seconds, "
        f"{args.size}² images"
    )
    print(
        "| net | isfinite check / warm forward | structure check per call | "
        "propagate with one NaN pixel / warm forward |"
    )
    print("|---|---|---|---|")
    for name in args.nets:
        m = measure(name, NETS[name], args.size, args.rounds, CLOCKS[args.clock])
        print(
            f"| {name} | {m['isfinite'] / m['forward']:.4f}x ({m['isfinite'] * 1e6:,.0f} µs) | "
            f"{m['structure'] * 1e6:.0f} µs | {m['propagate'] / m['forward']:.3f}x |"
        )


if __name__ == "__main__":
    main()
