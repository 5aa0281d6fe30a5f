"""The cost model fitted to this CPU: a few timings of each solver family correct the shipped predictions.

The shipped measurements (:mod:`densecnn.ops.costmodel`) come from one machine. On another CPU the solvers keep
their shapes of cost (time still grows with pixels, channels, taps) but not their speeds relative to each other:
torch's convolutions (oneDNN) gain more from wide vector units than the transform solvers (``fft``, ``winograd``),
which move more memory per multiplication. So on first use, :func:`current` times every solver on a handful of small
problems (:data:`PROBLEMS`: inference, both memory formats, interleaved rounds, the minimum of each kept; about a
second, more rounds only while within :data:`BUDGET_S`) and compares them with the same timings taken where the
shipped model was measured (``cost_model.json``'s ``calibration``, by ``scripts/fit_cost_model.py``). Per solver
family (:func:`family`: a pool solver, or a conv solver on many or on few input channels, whatever the number of
axes) it fits one factor, in log space over the problems and formats:

    log factor(s) = median over i of [log(tᵢ(s) / refᵢ(s)) − log(tᵢ(native) / refᵢ(native))] · n / (n + PRIOR)

where tᵢ is the time here and refᵢ the shipped one, for problem and format i (n of them). Each solver is taken
against torch's own op on the same problem, so a CPU that is simply faster changes nothing; the median (a
least-absolute-deviations fit) ignores one odd timing, and PRIOR pseudo-observations of "no change" keep a family
measured on few problems from moving far. Factors are clamped to [1/:data:`MAX_FACTOR`, :data:`MAX_FACTOR`];
``native`` keeps 1. Every prediction of a solver is multiplied by its family's factor
(:func:`densecnn.ops.costmodel.estimate`).

The timings run on one thread and count the CPU time of the calling thread: on a machine other processes share,
wall-clock times of multi-threaded ops mostly measure the other load (a thread descheduled at a barrier holds up
the op), while one thread's CPU time barely moves with it (ten calibrations in a row under a load of 4 on 2 cores
kept every factor within 0.87–1.18, where two-thread wall-clock ones scattered by up to 4×). How each solver scales
with threads is therefore not calibrated.

The factors are cached as one JSON file per machine under ``cache_dir / "calibration"`` (the config's ``cache_dir``,
beside the tuning step's ``solvers/``), keyed by :func:`machine_key`: CPU model, the instruction set the kernels
dispatched to and torch's, torch's version, the kernels' build, densecnn's version and the shipped reference
timings. ``DENSECNN_CALIBRATE=0`` switches calibration off (the shipped predictions as they are); ``densecnn
calibrate`` redoes it.

>>> calibration = current()  # doctest: +SKIP
>>> calibration.factors  # doctest: +SKIP
{'conv/direct': 0.98, 'conv/fft': 0.66, 'conv/fft/few-channels': 1.1, ..., 'pool/ext': 0.9}
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import math
import os
import platform
import statistics
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .._version import __version__
from ..atomic import atomic_write
from ..errors import InvalidInputError
from . import costmodel, ext, layout, solvers
from .backends import ext_available, ext_build
from .config import get_config

ENVIRONMENT = "DENSECNN_CALIBRATE"  # "0": off; "1" or unset: on


def _problem(op: str, input: list[int], kernel: int, dilation: int, *, out: int = 0, activation=None) -> dict:
    """A problem row (:func:`densecnn.ops.costmodel.problem`) of a square kernel and dilation, batch 1."""
    dims = len(input) - 2
    conv = op.startswith("conv")
    return {
        "op": op,
        "input": input,
        "kernel": [kernel] * dims,
        "dilation": [dilation] * dims,
        "out_channels": out if conv else input[1],
        "groups": 1 if conv else input[1],
        "activation": activation,
    }


# A few milliseconds each for all their solvers on one thread (cheap rounds), between them running every solver
# family: dilated 3×3 and 7×7 convs (native, s2b, ext, fft, winograd) and a 1×1 head (direct) on many channels,
# first layers with one or three input channels (their own families: torch's convs on so few channels change
# differently from CPU to CPU), a 3-D 3×3×3 conv and a dilated max pool with its activation (the pool solvers).
PROBLEMS = (
    _problem("conv2d", [1, 50, 64, 64], 3, 8, out=50),
    _problem("conv2d", [1, 32, 56, 56], 3, 2, out=32),
    _problem("conv2d", [1, 32, 72, 72], 7, 4, out=16),
    _problem("conv2d", [1, 64, 96, 96], 1, 1, out=8),
    _problem("conv2d", [1, 1, 258, 258], 3, 1, out=8),
    _problem("conv2d", [1, 3, 96, 96], 7, 8, out=8),
    _problem("conv3d", [1, 1, 32, 32, 32], 3, 8, out=64),
    _problem("max_pool2d", [1, 4, 264, 264], 2, 8, activation="relu"),
)
FEW_CHANNELS = 4  # convs with at most this many input channels per group are a family of their own
ROUNDS = 3  # timed rounds after the warm-up; fewer (at least MIN_ROUNDS) once BUDGET_S is spent
MIN_ROUNDS = 2
BUDGET_S = 2.0
PRIOR = 1.0  # pseudo-observations of factor 1 in each family's fit
MAX_FACTOR = 4.0


@dataclass(frozen=True)
class Calibration:
    """Per solver family (:func:`family`), the factor its predicted times are multiplied by on this machine.

    >>> conv = {"op": "conv2d", "input": [1, 32, 96, 96], "groups": 1}
    >>> Calibration({"conv/fft": 1.5}).factor(conv, "fft")
    1.5
    >>> Calibration({"conv/fft": 1.5}).factor(conv, "s2b")  # a family without a factor keeps 1
    1.0
    """

    factors: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0  # what the timings took
    rounds: int = 0

    def factor(self, problem: dict, solver: str) -> float:
        """The factor of ``solver`` on ``problem`` (a :func:`densecnn.ops.costmodel.problem` row)."""
        return self.factors.get(family(problem, solver), 1.0)


def family(problem: dict, solver: str) -> str:
    """The solver family of ``solver`` on ``problem`` (a :func:`densecnn.ops.costmodel.problem` row): the solver on
    pools, or on convs, those with at most :data:`FEW_CHANNELS` input channels per group apart, whatever the
    number of axes; grouped and 1-D-kernel convs (:func:`densecnn.ops.costmodel.separable`) are a family of their
    own, which no calibration problem times (factor 1: torch runs them by other kernels than the full convs
    whose factors are fitted).

    >>> family({"op": "conv3d", "input": [1, 1, 40, 40, 40], "kernel": [3, 3, 3], "groups": 1}, "winograd")
    'conv/winograd/few-channels'
    >>> family({"op": "conv2d", "input": [1, 9, 60, 60], "kernel": [1, 31], "groups": 3}, "ext")
    'conv/ext/separable'
    >>> family({"op": "avg_pool2d", "input": [1, 8, 60, 60], "groups": 8}, "s2b")
    'pool/s2b'
    """
    if not problem["op"].startswith("conv"):
        return f"pool/{solver}"
    if costmodel.separable(problem):
        return f"conv/{solver}/separable"
    few = problem["input"][1] // problem["groups"] <= FEW_CHANNELS
    return f"conv/{solver}{'/few-channels' if few else ''}"


@functools.cache
def cpu_model() -> str:
    """The CPU's model name (Linux's /proc/cpuinfo), else what the platform module says."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


@functools.cache
def kernel_isa() -> str:
    """The instruction set densecnn's CPU loops run here ("x86-64-v4": AVX-512, "x86-64-v3": AVX2, both with FMA;
    "x86-64"), or why none run."""
    if not ext.available():
        return "kernels not built"
    if not hasattr(torch.ops.densecnn, "cpu_isa"):
        return "kernels built before they reported their instruction set"
    return torch.ops.densecnn.cpu_isa()


@functools.cache
def machine_key() -> dict:
    """Everything the solvers' relative speeds on one thread depend on here, as a JSON-able dict (the same for the
    whole process: its kernels and torch are loaded once)."""
    return {
        "cpu": cpu_model(),
        "isa": kernel_isa(),
        "torch_isa": torch.backends.cpu.get_cpu_capability(),  # the instruction set torch's own kernels run
        "torch": torch.__version__,
        "ext": ext_build(),
        "densecnn": __version__,
        "reference": _digest(costmodel.shipped_calibration()),  # a refitted cost model calibrates anew
    }


def enabled(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the cost model is calibrated (``DENSECNN_CALIBRATE``: "1" or unset yes, "0" no).

    >>> enabled({"DENSECNN_CALIBRATE": "0"})
    False
    """
    raw = environ.get(ENVIRONMENT, "")
    if raw not in ("", "0", "1"):
        raise InvalidInputError(f"{ENVIRONMENT}={raw!r} is not a flag; use 1 or 0, or leave it unset")
    return raw != "0"


_lock = threading.Lock()
_known: dict[Path, Calibration] = {}  # this process's calibrations, by cache directory


def current() -> Calibration:
    """The calibration in effect: none (factors 1) when switched off, else this machine's, from this process, the
    cache, or timed now (about a second) and cached."""
    if not enabled():
        return Calibration()
    cache_dir = get_config().cache_dir
    if cache_dir not in _known:
        with _lock:  # concurrent first plans time once
            if cache_dir not in _known:
                key = machine_key()
                path = cache_file(key, cache_dir)
                _known[cache_dir] = load(key, path) or store(calibrate(), key, path)
    return _known[cache_dir]


def recalibrate() -> Calibration:
    """Time now, cache the factors (replacing this machine's) and use them from now on in this process."""
    cache_dir = get_config().cache_dir
    calibration = calibrate()
    with _lock:
        _known[cache_dir] = store(calibration, machine_key(), cache_file(machine_key(), cache_dir))
    return calibration


def cache_file(key: dict, cache_dir: Path) -> Path:
    """Where the calibration for ``key`` is cached under ``cache_dir``."""
    return cache_dir / "calibration" / f"{_digest(key)}.json"


def _digest(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:32]


def load(key: dict, path: Path) -> Calibration | None:
    """The calibration cached in ``path`` for ``key``, or None (missing, unreadable, another machine's, or not what
    :func:`store` writes: a file of another shape counts as absent, and the next :func:`current` calibrates anew).
    """
    try:
        entry = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(entry, dict) or entry.get("key") != key:
        return None
    factors, seconds, rounds = entry.get("factors"), entry.get("seconds"), entry.get("rounds")
    if not (_factors_ok(factors) and _number(seconds) and seconds >= 0):
        return None
    if not (isinstance(rounds, int) and not isinstance(rounds, bool) and rounds >= 0):
        return None
    return Calibration(factors, seconds, rounds)


def _number(value) -> bool:
    """Whether ``value`` (read from JSON) is a finite number (not a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _factors_ok(factors) -> bool:
    """Whether ``factors`` is what :func:`fit_factors` makes: family names to factors within the clamp."""
    return isinstance(factors, dict) and all(
        isinstance(name, str) and _number(value) and 1 / MAX_FACTOR <= value <= MAX_FACTOR
        for name, value in factors.items()
    )


def store(calibration: Calibration, key: dict, path: Path) -> Calibration:
    """Cache ``calibration`` for ``key`` in ``path`` (a read-only cache only costs a calibration per process)."""
    entry = {"key": key, "factors": calibration.factors, "seconds": calibration.seconds}
    entry["rounds"] = calibration.rounds
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps(entry, indent=1, sort_keys=True)
        atomic_write(path, lambda tmp: tmp.write_text(text))
    except OSError:
        pass
    return calibration


def calibrate(*, problems=PROBLEMS, rounds: int = ROUNDS, budget_s: float = BUDGET_S) -> Calibration:
    """Time the solvers on ``problems`` and fit the factors against the shipped timings of the same problems
    (nothing is cached; problems without shipped timings are skipped).

    >>> calibrate(problems=PROBLEMS[5:6], rounds=1).factors  # doctest: +SKIP
    {"conv/direct/few-channels": 0.93, "conv/ext/few-channels": 1.12, ...}
    """
    start = time.perf_counter()
    shipped = {_row_key(r): r["ms"] for r in costmodel.shipped_calibration()}
    referenced = {_problem_key(r["problem"]) for r in costmodel.shipped_calibration()}
    problems = [p for p in problems if _problem_key(p) in referenced]
    measured, done = measure(problems, rounds=rounds, deadline=start + budget_s)
    rows = [r | {"reference_ms": shipped[_row_key(r)]} for r in measured if shipped.get(_row_key(r))]
    return Calibration(fit_factors(rows), round(time.perf_counter() - start, 3), done)


def _problem_key(problem: dict) -> str:
    return json.dumps(problem, sort_keys=True)


def _row_key(row: dict) -> str:
    return f"{_problem_key(row['problem'])}/{row['format']}/{row['solver']}"


def measure(problems: list[dict], *, rounds: int, deadline: float) -> tuple[list[dict], int]:
    """(rows ``{"problem", "op", "format", "solver", "ms"}``, rounds done): every solver that runs each of
    ``problems`` (:func:`densecnn.ops.costmodel.problem` rows) in each memory format, timed now on random data in
    inference, on one thread in the thread's CPU milliseconds; one call per round, every solver of every problem in
    each round, the minimum over rounds kept. At least :data:`MIN_ROUNDS` rounds (or ``rounds``, if fewer), more
    until ``rounds`` or ``deadline`` (a ``time.perf_counter()``)."""
    generator = torch.Generator().manual_seed(0)
    calls = []  # (problem index, format, solver, run)
    for index, problem in enumerate(problems):
        op = costmodel.operation(problem, generator)
        x = torch.randn(problem["input"], generator=generator)  # (N, C, *S)
        for fmt in layout.names_for(x.dim()):
            x_fmt, memory_format = layout.to_format(x, fmt), layout.memory_format(fmt, x.dim())
            for solver in solvers.candidates(op, ext_available=ext_available(), dtype=torch.float32):
                calls.append((index, fmt, solver, _runner(solver, op, x_fmt, memory_format)))
    best: dict[tuple, float] = {}
    done = 0
    with torch.no_grad(), _one_thread():
        calls = [call for call in calls if _warm(call[3])]
        while done < rounds and (done < MIN_ROUNDS or time.perf_counter() < deadline):
            for index, fmt, solver, run in calls:
                start = time.thread_time()
                run()
                ms = (time.thread_time() - start) * 1e3
                best[index, fmt, solver] = min(ms, best.get((index, fmt, solver), math.inf))
            done += 1
    rows = [
        {"problem": problems[index], "op": problems[index]["op"], "format": fmt, "solver": solver, "ms": ms}
        for (index, fmt, solver), ms in best.items()
    ]
    return rows, done


@contextlib.contextmanager
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _runner(solver: str, op, x: torch.Tensor, memory_format: torch.memory_format):
    return lambda: solvers.run(solver, op, x, memory_format)


def _warm(run) -> bool:
    """Run once (first-call work: buffers, kernel transforms); False if the solver fails here."""
    try:
        run()
    except (RuntimeError, ValueError, TypeError, NotImplementedError):
        return False
    return True


def fit_factors(rows: list[dict]) -> dict[str, float]:
    """Per solver family, the factor fitted to ``rows`` (:func:`measure`'s, each with the shipped ``reference_ms``
    of its problem, format and solver), relative to ``native`` on the same problem and format (see the module's
    docstring); families without measurements are left out.

    >>> conv = {"op": "conv2d", "input": [1, 32, 96, 96], "groups": 1}
    >>> rows = [{"problem": conv, "op": "conv2d", "format": "nchw", "solver": s, "ms": ms, "reference_ms": 1.0}
    ...         for s, ms in (("native", 2.0), ("fft", 8.0))]
    >>> fit_factors(rows)  # fft 4x slower than native here, on 1 observation and 1 of "no change": 2x
    {'conv/fft': 2.0}
    """
    native = {
        (_problem_key(r["problem"]), r["format"]): math.log(r["ms"] / r["reference_ms"])
        for r in rows
        if r["solver"] == "native"
    }
    logs: dict[str, list[float]] = {}
    for r in rows:
        reference = native.get((_problem_key(r["problem"]), r["format"]))
        if r["solver"] != "native" and reference is not None:
            relative = math.log(r["ms"] / r["reference_ms"]) - reference
            logs.setdefault(family(r["problem"], r["solver"]), []).append(relative)
    limit = math.log(MAX_FACTOR)
    factors = {}
    for name, values in sorted(logs.items()):
        shrunk = statistics.median(values) * len(values) / (len(values) + PRIOR)
        factors[name] = round(math.exp(max(-limit, min(limit, shrunk))), 4)
    return factors
