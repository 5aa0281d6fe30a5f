"""Interleaved timing: every contender runs once per round, rounds repeat, medians and per-round ratios are kept.

On a shared, noisy machine, absolute times drift; running the contenders back to back in each round and taking the
median over rounds of each *ratio* cancels most of that drift.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

# what a script's --clock measures; cpu: the process's CPU seconds, all threads (steadier on a shared machine)
CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time}


def elapsed(fn: Callable[[], object], clock: Callable[[], float] = time.perf_counter) -> float:
    """Seconds one call of ``fn`` takes, on ``clock`` (wall time by default; ``CLOCKS["cpu"]`` for CPU time).

    >>> elapsed(lambda: sum(range(1000)), CLOCKS["cpu"]) >= 0
    True
    """
    start = clock()
    fn()
    return clock() - start


def per_call(fn: Callable[[], object], repeat: int, clock: Callable[[], float] = time.perf_counter) -> float:
    """Seconds per call of a cheap ``fn``, from ``repeat`` calls in a row (one call is below the clock's grain)."""

    def calls():
        for _ in range(repeat):
            fn()

    return elapsed(calls, clock) / repeat


def add_clock_argument(parser: argparse.ArgumentParser) -> None:
    """A script's ``--clock wall|cpu`` option; ``CLOCKS[args.clock]`` is the clock it names."""
    parser.add_argument(
        "--clock",
        choices=sorted(CLOCKS),
        default="wall",
        help="cpu: CPU seconds, steadier on a shared machine",
    )


def interleave(
    contenders: dict[str, Callable[[], object]], repeats: int, *, warm_up: tuple[str, ...] | None = None
) -> dict[str, list]:
    """Warm the contenders named in ``warm_up`` (default: all) up once, then run ``repeats`` rounds of all in turn.

    Warm-up matters for densecnn (its first call per shape runs the tuning step); skipping it for slow baselines saves
    their longest runs and barely moves a median.

    A contender returns its own measurement (a float of seconds, or a dict, e.g. per-layer times) or anything else
    (then its call is timed here, in seconds). Returns ``{name: [measurement per round]}``.
    """
    for name, fn in contenders.items():
        if warm_up is None or name in warm_up:
            fn()
    samples: dict[str, list] = {name: [] for name in contenders}
    for _ in range(repeats):
        for name, fn in contenders.items():
            start = time.perf_counter()
            result = fn()
            measured = isinstance(result, (float, dict))
            samples[name].append(result if measured else time.perf_counter() - start)
    return samples


def median(values: list[float]) -> float:
    return statistics.median(values)


def ratio(slow: list[float], fast: list[float]) -> float:
    """Median over rounds of slow/fast (rounds paired)."""
    return statistics.median(s / f for s, f in zip(slow, fast))


def fastest(samples: dict[str, list], prefix: str) -> str:
    """The name, among those starting with ``prefix`` (one contender in several layouts), with the lowest median."""
    return min((name for name in samples if name.startswith(prefix)), key=lambda name: median(samples[name]))
