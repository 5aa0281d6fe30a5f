#!/usr/bin/env python
"""What the verification pass costs: ``convert(verify=True)`` against ``convert(verify=False)`` and one warm forward.

    python scripts/bench_verify.py --rounds 9 --size 512

For each reference net (float32, eval mode, 3 input channels for the 2-D nets): in interleaved rounds, a conversion
without the pass, one with it, and one warm forward of the dense net on a SIZE² image (SIZE³ / 8 for 3-D nets: the
volume of the 3-D benchmark). The pass's cost is the difference of the two conversions' medians, reported as a
fraction of the forward's median; every conversion pays the pass's own first call on its small input (its plan and
its buffers), as a user's does.
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
from densecnn.bench.timing import CLOCKS, add_clock_argument, elapsed  # noqa: E402

NETS = {"plain_133": 3, "stages_46": 3, "nuclei": 1, "znni_3d": 1}  # name -> input channels


def measure(name: str, channels: int, size: int, rounds: int, clock) -> dict[str, float]:
    model, patch = densecnn.zoo.create(name, in_channels=channels, num_classes=3)
    model.eval()
    dense = densecnn.convert(model, patch)
    shape = (1, channels, *((size // 4,) * 3 if dense.dims == 3 else (size, size)))
    images = torch.rand(shape)
    with torch.no_grad():
        dense(images)  # plan and buffers: the forward is timed warm
    times: dict[str, list[float]] = {"convert": [], "convert+verify": [], "forward": []}
    for _ in range(rounds):
        times["convert"].append(elapsed(lambda: densecnn.convert(model, patch, verify=False), clock))
        times["convert+verify"].append(elapsed(lambda: densecnn.convert(model, patch), clock))
        with torch.no_grad():
            times["forward"].append(elapsed(lambda: dense(images), clock))
    medians = {key: statistics.median(values) for key, values in times.items()}
    medians["verify"] = medians["convert+verify"] - medians["convert"]
    medians["shape"] = "x".join(map(str, shape[2:]))
    return medians


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
        f"{args.clock} seconds"
    )
    print("| net | forward input | verification / one warm forward | verification / conversion without it |")
    print("|---|---|---|---|")
    for name in args.nets:
        m = measure(name, NETS[name], args.size, args.rounds, CLOCKS[args.clock])
        print(
            f"| {name} | {m['shape']} | {m['verify'] / m['forward']:.3f}x | "
            f"{m['verify'] / m['convert']:.1f}x |"
        )


if __name__ == "__main__":
    main()
