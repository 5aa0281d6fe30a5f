"""Tuning (as in MIOpen): time every candidate solver of a dense op once, cache the times on disk.

For one op (a :class:`~densecnn.ops.solvers.ConvOp` or ``PoolOp``), input shape, dtype, device and direction
(inference, or training = forward + backward), :func:`tuned_times` runs each applicable solver in both memory formats on
random data of that shape and returns ``{memory_format: {solver: milliseconds}}``; for a conv whose gradients a
training plan chooses apart from its forward, :func:`tuned_gradient_times` times the gradient solvers
(:mod:`densecnn.ops.gradients`) the same way. The table is stored as one JSON
file per problem under ``cache_dir / "solvers"`` (the config's ``cache_dir``, :mod:`densecnn.ops.config`), keyed by
(op, shapes, dtype, device, threads, torch and densecnn versions, which build of the kernels is loaded, if any), and
reused by every later process.

Spatial sizes are bucketed (next power of two, at most :data:`MAX_SIDE` plus the op's reach) so a new image size
reuses its bucket's timings instead of timing again; the ranking of solvers depends on channels, kernel and dilation
far more than on the exact size.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from pathlib import Path

import torch

from .._version import __version__
from ..atomic import atomic_write
from ..geometry import reach
from . import gradients, layout, solvers
from .backends import ext_build
from .solvers import ConvOp, DenseOp, PoolOp

MAX_SIDE = 256  # timing inputs are at most this many pixels per side beyond the op's reach
# Volumes are timed at up to 96³ voxels beyond the reach: at 40³ (an image's 256² pixels) or 64³, a dilated
# layer's partial tiles (Winograd's, space-to-batch's) weighed far more than on a real volume and ranked its solvers
# wrongly; the shipped cost model has measurements at 96³.
MAX_VOLUME_SIDE = 96
# A strongly dilated image layer is timed with at least this many outputs per sub-grid and axis (up to its real
# size): plain_133's 7×7 dilation-16 conv at 256 + 96 px has 16 per sub-grid, where the overlap-save tiles of `fft`
# waste so much that it tied torch's conv in training, while on the real 512² image it is 1.2× faster per step.
MIN_SUBGRID_SIDE = 32
REPEATS = (
    3  # timed runs per candidate after one warm-up (fewer once they add up to BUDGET_MS); the minimum is kept
)
BUDGET_MS = 300.0
GIVE_UP = 2.0  # a candidate whose warm-up is this many times slower than the best so far is not timed further


def timing_shape(op: DenseOp, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The bucketed (1, C, *S) the candidates are timed on, for an input of ``shape``: per side the next power of two,
    at most MAX_SIDE beyond the reach for images (or :data:`MIN_SUBGRID_SIDE` outputs per sub-grid, if more),
    :data:`MAX_VOLUME_SIDE` for volumes, MAX_SIDE² for signals."""
    reaches = reach(op.kernel, op.dilation)
    dims = len(shape) - 2
    max_side = {1: MAX_SIDE**2, 2: MAX_SIDE, 3: MAX_VOLUME_SIDE}[dims]
    caps = [max(max_side, MIN_SUBGRID_SIDE * d if dims == 2 else 0) + r for r, d in zip(reaches, op.dilation)]
    sides = [min(2 ** math.ceil(math.log2(side)), cap) for side, cap in zip(shape[2:], caps)]
    return (1, shape[1], *(max(side, r + 1) for side, r in zip(sides, reaches)))


def problem_key(
    op: DenseOp,
    shape,
    dtype: torch.dtype,
    device: torch.device,
    *,
    train: bool,
    ext: bool,
    input_grad: bool = True,
) -> dict:
    """Everything a solver's speed depends on, as a JSON-able dict."""
    key = {"op": op.name, "input": list(timing_shape(op, shape)), "kernel": list(op.kernel)}
    key["dilation"] = list(op.dilation)
    if isinstance(op, ConvOp):
        key.update(weight=list(op.weight.shape), bias=op.bias is not None, groups=op.groups)
    else:
        key.update(divisor=op.divisor, activation=op.activation)
    key.update(
        dtype=str(dtype).removeprefix("torch."),
        device=torch.device(device).type,
        threads=torch.get_num_threads(),
        direction=("train" if input_grad else "train_params_only") if train else "infer",
        ext=ext_build() if ext else None,
        torch=torch.__version__,
        densecnn=__version__,
    )
    return key


def _cache_file(key: dict, cache_dir: Path) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]
    return cache_dir / "solvers" / f"{digest}.json"


def load_times(key: dict, cache_dir: Path, valid=None) -> dict[str, dict[str, float | None]] | None:
    """The table cached under ``cache_dir`` for ``key``, or None (missing, unreadable, for another key, or, where
    ``valid`` is given, a table it rejects: a cache file of another shape counts as absent)."""
    try:
        entry = json.loads(_cache_file(key, cache_dir).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(entry, dict) or entry.get("key") != key:
        return None
    times = entry.get("times_ms")
    return times if valid is None or valid(times) else None


def _is_ms(value) -> bool:
    """Whether ``value`` (read from JSON) is a time a timing records: a finite, non-negative number."""
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value >= 0
    )


def _solver_times_ok(table, names) -> bool:
    """Whether ``table`` is ``{solver: ms or None}`` of solvers among ``names``, at least one of them timed."""
    return (
        isinstance(table, dict)
        and set(table) <= set(names)
        and all(ms is None or _is_ms(ms) for ms in table.values())
        and any(ms is not None for ms in table.values())
    )


def _formats_ok(times, shape, entry_ok) -> bool:
    """Whether ``times`` is ``{memory_format: entry}`` over memory formats of inputs of ``shape``, each entry as
    ``entry_ok`` accepts."""
    return (
        isinstance(times, dict)
        and bool(times)
        and set(times) <= set(layout.names_for(len(shape)))
        and all(entry_ok(entry) for entry in times.values())
    )


# the last OSError that kept :func:`store_times` from caching a table, with the file it was for; ``densecnn tune``,
# whose whole point is the cache, reports it (set it to None first), where a plan just goes on without the cache
store_error: tuple[Path, OSError] | None = None


def store_times(key: dict, times: dict, cache_dir: Path) -> None:
    global store_error
    path = _cache_file(key, cache_dir)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps({"key": key, "times_ms": times}, indent=1, sort_keys=True)
        atomic_write(path, lambda tmp: tmp.write_text(text))  # concurrent tuners never see half a file
    except OSError as exc:
        store_error = (path, exc)  # a read-only cache only costs a tuning per process


def tuned_times(
    op: DenseOp,
    shape,
    dtype: torch.dtype,
    device,
    *,
    train: bool,
    ext: bool,
    cache_dir: Path,
    input_grad=True,
    time_missing: bool = True,
) -> dict[str, dict[str, float | None]] | None:
    """``{memory_format: {solver: ms}}`` for ``op`` on inputs of ``shape``, from the cache under ``cache_dir`` or
    timed now (and cached there); with ``time_missing`` False, None when not cached (nothing is timed).

    ``input_grad``: in training, whether the input needs a gradient (not for the first layer's image), which both
    changes the work and must be supported. A solver that fails on this problem (e.g. an unsupported dtype) is
    recorded as None and never chosen. A cached table that names a solver which does not run ``op`` here, or that
    is not a table of times, is timed anew (or, with ``time_missing`` False, None).
    """
    key = problem_key(op, shape, dtype, device, train=train, ext=ext, input_grad=input_grad)
    names = solvers.candidates(op, ext_available=ext, dtype=dtype)
    times = load_times(
        key, cache_dir, lambda t: _formats_ok(t, key["input"], lambda e: _solver_times_ok(e, names))
    )
    if times is None and time_missing:
        times = time_candidates(op, key["input"], dtype, device, train=train, ext=ext, input_grad=input_grad)
        store_times(key, times, cache_dir)
    return times


def time_candidates(
    op: DenseOp, shape, dtype, device, *, train: bool, ext: bool, input_grad: bool, every: bool = False
) -> dict[str, dict[str, float | None]]:
    """``{memory_format: {solver: ms}}``: every candidate timed now on random data of exactly ``shape``.

    ``every``: time each candidate fully (as the cost model's measurements need), instead of giving up on one whose
    warm-up is already :data:`GIVE_UP` times slower than the best so far (then its warm-up time is recorded).
    """
    return {
        fmt: _time_candidates(
            op, shape, fmt, dtype, device, train=train, ext=ext, input_grad=input_grad, every=every
        )
        for fmt in layout.names_for(len(shape))
    }


def _time_candidates(
    op: DenseOp,
    shape,
    fmt: str,
    dtype,
    device,
    *,
    train: bool,
    ext: bool,
    input_grad: bool,
    every: bool = False,
) -> dict:
    generator = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(list(shape), generator=generator, dtype=dtype).to(device)
    memory_format = layout.memory_format(fmt, x.dim())
    x = layout.to_format(x, fmt).requires_grad_(train and input_grad)
    op = _synthetic(op, generator, dtype, device, train)
    times: dict[str, float | None] = {}
    for name in solvers.candidates(op, ext_available=ext, dtype=dtype):
        best = None if every else min((t for t in times.values() if t), default=None)
        times[name] = _time_one(name, op, x, memory_format, train=train, best=best)
    return times


def tuned_gradient_times(
    op: ConvOp,
    shape,
    dtype: torch.dtype,
    device,
    *,
    ext: bool,
    cache_dir: Path,
    input_grad: bool,
    time_missing: bool = True,
) -> dict[str, dict[str, dict[str, float | None]]] | None:
    """``{memory_format: {"grad_input" | "grad_weight": {gradient solver: ms}}}`` for a conv on inputs of
    ``shape`` (:mod:`densecnn.ops.gradients`), cached like :func:`tuned_times`'s tables; "grad_input" only when the input
    needs a gradient. With ``time_missing`` False, None when not cached (or cached in another shape)."""
    key = problem_key(op, shape, dtype, device, train=True, ext=ext, input_grad=input_grad)
    key["direction"] = "gradients" if input_grad else "weight_gradient"
    names = [name for name in gradients.SOLVERS if gradients.applies(name, op)]
    directions = {"grad_weight", "grad_input"} if input_grad else {"grad_weight"}

    def directions_ok(entry) -> bool:
        return (
            isinstance(entry, dict)
            and set(entry) == directions
            and all(_solver_times_ok(table, names) for table in entry.values())
        )

    times = load_times(key, cache_dir, lambda t: _formats_ok(t, key["input"], directions_ok))
    if times is None and time_missing:
        times = time_gradients(op, key["input"], dtype, device, input_grad=input_grad)
        store_times(key, times, cache_dir)
    return times


def time_gradients(op: ConvOp, shape, dtype, device, *, input_grad: bool) -> dict:
    """Every gradient solver of ``op`` timed now, on random data of exactly ``shape``, in each memory format."""
    return {
        fmt: _time_gradients(op, shape, fmt, dtype, device, input_grad=input_grad)
        for fmt in layout.names_for(len(shape))
    }


def _time_gradients(op: ConvOp, shape, fmt: str, dtype, device, *, input_grad: bool) -> dict:
    generator = torch.Generator(device="cpu").manual_seed(0)
    x = layout.to_format(torch.randn(list(shape), generator=generator, dtype=dtype).to(device), fmt)
    conv = _synthetic(op, generator, dtype, device, train=False)
    out = [s - (k - 1) * d for s, k, d in zip(shape[2:], op.kernel, op.dilation)]
    grad_y = torch.randn([shape[0], op.weight.shape[0], *out], generator=generator, dtype=dtype)
    grad_y = layout.to_format(grad_y.to(device), fmt)
    directions = {"grad_weight": gradients.weight_gradient}
    if input_grad:
        directions["grad_input"] = gradients.input_gradient
    with torch.no_grad():
        return {
            direction: {
                name: _time_call(lambda: run(name, grad_y, x, conv))  # noqa: B023
                for name in gradients.SOLVERS
                if gradients.applies(name, op)
            }
            for direction, run in directions.items()
        }


def _time_call(step, best: float | None = None) -> float | None:
    """The minimum of a few timed runs of ``step`` after a warm-up, in ms; None if it fails; the warm-up's time if
    that is already :data:`GIVE_UP` times ``best``."""
    try:
        warmup = _elapsed_ms(step)
    except (RuntimeError, ValueError, TypeError, NotImplementedError):
        return None
    if best is not None and warmup > GIVE_UP * best:
        return warmup
    runs = [_elapsed_ms(step)]
    while len(runs) < REPEATS and sum(runs) < BUDGET_MS:
        runs.append(_elapsed_ms(step))
    return min(runs)


def _synthetic(op: DenseOp, generator, dtype, device, train: bool) -> DenseOp:
    """The same op with random parameters: timing never touches the model's own tensors."""
    if isinstance(op, PoolOp):
        return op

    def like(t):
        return (
            None
            if t is None
            else torch.randn(t.shape, generator=generator, dtype=dtype).to(device).requires_grad_(train)
        )

    return ConvOp(like(op.weight), like(op.bias), op.dilation, op.groups)


def _time_one(
    name: str, op: DenseOp, x: torch.Tensor, memory_format, *, train: bool, best: float | None
) -> float | None:
    def step():
        with torch.set_grad_enabled(train):
            y = solvers.run(name, op, x, memory_format)
            if y.requires_grad:
                y.backward(torch.ones_like(y))

    return _time_call(step, best)


def _elapsed_ms(fn) -> float:
    """Wall-clock ms of ``fn()``; with the GPU in use, its queued work finished before and after (kernels run
    asynchronously: without that, the clock times their launches)."""
    sync = torch.cuda.synchronize if torch.cuda.is_initialized() else _no_sync
    sync()
    start = time.perf_counter()
    fn()
    sync()
    return (time.perf_counter() - start) * 1e3


def _no_sync() -> None:
    """Nothing to wait for: no GPU is in use."""
