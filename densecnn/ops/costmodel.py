"""Immediate mode: each candidate solver's time predicted from measurements shipped with the package, no timing.

``cost_model.json`` (next to this module) holds measurements of every solver in both memory formats on a grid of
dense ops (convs and pools of various kernels, dilations, channels and map sizes), taken on one machine by
``scripts/fit_cost_model.py``, and per (op, solver, memory format, direction, dtype) a least-squares fit of

    log(ms) ≈ β · features(op, input shape)

over the log of the output pixels, channels, kernel taps and dilation (:func:`features`); grouped and 1-D-kernel
convs, the pieces of separable filters, have models of their own (:func:`fitted_op`). A prediction is that fit
plus the residuals of the nearest measured problems (weighted by their closeness in feature space, fading to none
far from any measurement): solver speeds have steps a global fit smooths over (a format that wins at 64 channels
and loses at 3), and the measured grid includes the layers of common nets. The plan ranks candidates by these
predictions, so the first call on a new machine or image size runs at once; the tuning step
(:mod:`densecnn.ops.tune`, ``densecnn tune``) replaces them by real timings when asked. The absolute numbers are the
shipping machine's; the plan uses them to compare candidates and memory formats. On another CPU the solvers' speeds
relative to each other shift: :mod:`densecnn.ops.calibration` times each solver family on a few small problems
once per machine, against the same timings shipped in the file, and scales its inference predictions by the
factor it fits.

>>> from densecnn.ops.solvers import PoolOp
>>> table = estimate(PoolOp("max_pool2d", (2, 2), (8, 8)), (1, 50, 300, 300), torch.float32, train=False,
...                  candidates=["native", "s2b"])
>>> sorted(table)
['nchw', 'nhwc']
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..geometry import output_size
from . import calibration, layout
from .solvers import ConvOp, DenseOp, PoolOp

MODEL_FILE = Path(__file__).with_name("cost_model.json")
FEATURES = ("bias", "log_out_pixels", "log_out_channels", "log_in_channels_per_group", "log_taps")
FEATURES += ("log_dilation", "activation", "log_groups", "kernel_aspect")
RIDGE = 1e-3  # keeps the fit well-posed when a feature barely varies within a group
NEIGHBOURS = 4  # measured problems whose residuals correct a prediction
BANDWIDTH = 0.5  # closeness scale of the correction, in standard deviations of each feature


def problem(op: DenseOp, shape) -> dict:
    """The op and its (N, C, H, W) input as the JSON row the cost model is fitted on."""
    row = {"op": op.name, "input": list(shape), "kernel": list(op.kernel), "dilation": list(op.dilation)}
    if isinstance(op, ConvOp):
        row.update(out_channels=op.weight.shape[0], groups=op.groups, activation=None)
    else:
        row.update(out_channels=shape[1], groups=shape[1], activation=op.activation)
    return row


def operation(row: dict, generator: torch.Generator | None = None) -> DenseOp:
    """The op of a problem row (:func:`problem`), a conv with random parameters drawn from ``generator`` (torch's
    default one if None).

    >>> operation(problem(PoolOp("max_pool2d", (2, 2), (4, 4)), (1, 8, 64, 64)), torch.Generator()).dilation
    (4, 4)
    """
    if not row["op"].startswith("conv"):
        return PoolOp(row["op"], tuple(row["kernel"]), tuple(row["dilation"]), activation=row["activation"])
    weight = torch.randn(
        row["out_channels"], row["input"][1] // row["groups"], *row["kernel"], generator=generator
    )
    bias = torch.randn(row["out_channels"], generator=generator)
    return ConvOp(weight, bias, tuple(row["dilation"]), row["groups"])


def features(row: dict) -> list[float]:
    """The fitted model's inputs for one problem row (see :data:`FEATURES`): with the output channels, input
    channels per group and taps, a conv's multiply-adds whatever its groups; a conv's groups (each one a loop of
    its own in some solvers) and its kernel's aspect, log(last extent / first), which tells a 1×k kernel (along the
    rows, contiguous in NCHW) from a k×1 one (across them)."""
    n, c, *size = row["input"]
    kernel = row["kernel"]
    out = output_size(tuple(size), tuple(kernel), tuple(row["dilation"]))
    conv = row["op"].startswith("conv")
    return [
        1.0,
        math.log(n * math.prod(max(s, 1) for s in out)),
        math.log(row["out_channels"]),
        math.log(max(c // row["groups"], 1)),
        math.log(math.prod(kernel)),
        math.log(math.prod(row["dilation"])),
        1.0 if row["activation"] else 0.0,
        # a pool's "groups" are its channels, not loops of their own; the volume pools' (1, k, k) windows keep
        # the fits they had without an aspect
        math.log(row["groups"]) if conv else 0.0,
        math.log(kernel[-1] / kernel[0]) if conv else 0.0,
    ]


def separable(row: dict) -> bool:
    """Whether the problem row is a grouped conv (depthwise included) or a conv with a 1-D kernel (k×1, 1×k): the
    pieces of separable filters, whose solvers' speeds follow other laws than full convs' (torch runs them by
    other kernels; the ext solver's GEMMs shrink to one group's channels), fitted apart (:func:`fitted_op`).

    >>> separable({"op": "conv2d", "kernel": [31, 1], "groups": 1})
    True
    >>> separable({"op": "conv2d", "kernel": [3, 3], "groups": 1})
    False
    """
    kernel = row.get("kernel", ())
    return row["op"].startswith("conv") and (row["groups"] > 1 or 1 in kernel and max(kernel) > 1)


def fitted_op(row: dict) -> str:
    """The op the problem row's models are fitted for: its own ("conv2d", "max_pool3d", ...), with "_separable"
    for :func:`separable` convs ("conv2d_separable")."""
    return f"{row['op']}_separable" if separable(row) else row["op"]


def group(op_name: str, solver: str, memory_format: str, direction: str, dtype: str) -> str:
    """The name of one fitted model: ``op/solver/format/direction/dtype`` (``op`` a :func:`fitted_op`)."""
    return f"{op_name}/{solver}/{memory_format}/{direction}/{dtype}"


def fit(measurements: list[dict]) -> dict[str, list[float]]:
    """Per group, the coefficients of the log-linear fit to measurement rows
    ``{**problem(op, shape), "solver", "format", "direction", "dtype", "ms"}`` (failed runs have ``ms`` None)."""
    by_group: dict[str, list[dict]] = {}
    for row in measurements:
        if row["ms"]:
            key = group(fitted_op(row), row["solver"], row["format"], row["direction"], row["dtype"])
            by_group.setdefault(key, []).append(row)
    models = {}
    for key, rows in sorted(by_group.items()):
        x = np.array([features(r) for r in rows])  # (rows, features)
        y = np.log([r["ms"] for r in rows])  # (rows,)
        ridge = RIDGE * np.eye(x.shape[1])
        ridge[0, 0] = 0.0  # the intercept is not shrunk
        beta = np.linalg.solve(x.T @ x + ridge, x.T @ y)
        models[key] = [round(float(b), 6) for b in beta]
    return models


@dataclass(frozen=True)
class _Group:
    beta: np.ndarray  # (features,)
    points: np.ndarray  # (problems, features): the measured problems' features, scaled
    residuals: np.ndarray  # (problems,): log(measured ms) - the fit's log prediction


class CostModel:
    """Fitted models plus the measurements behind them; :meth:`time_ms` predicts one candidate's time."""

    def __init__(self, models: dict[str, list[float]], problems: list[dict]):
        # A first call waits on this: features once per problem (each has dozens of measurements), each group's
        # arrays only when a prediction needs them, and numpy rather than torch for these small arrays (a torch op
        # costs microseconds of dispatch each).
        rows: dict[str, list[tuple[list[float], float]]] = {}
        for p in problems:
            x = features(p)
            for direction, fmt, solver, ms in _measurements(p):
                if ms:
                    key = group(fitted_op(p), solver, fmt, direction, p["dtype"])
                    rows.setdefault(key, []).append((x, math.log(ms)))
        every = np.array([f for r in rows.values() for f, _ in r] or [[0.0] * len(FEATURES)])
        spread = every.std(0, ddof=1) if len(every) > 1 else np.zeros(len(FEATURES))
        self.scale = np.where(spread > 1e-9, 1 / np.maximum(spread, 1e-9), 0.0)  # bias: 0
        self._models, self._rows, self._groups = models, rows, {}
        self._ops = {key.split("/", 1)[0] for key in models}

    def _group(self, key: str) -> _Group | None:
        if key not in self._models:
            return None
        if key not in self._groups:
            beta = np.array(self._models[key])
            rows = self._rows.get(key, [])
            x = np.array([f for f, _ in rows]).reshape(-1, len(FEATURES))
            y = np.array([t for _, t in rows])
            self._groups[key] = _Group(beta, x * self.scale, y - x @ beta)
        return self._groups[key]

    @classmethod
    def fitted(cls, problems: list[dict]) -> CostModel:
        """Fit to measured problems (as ``cost_model.json`` stores them)."""
        return cls(fit(measurement_rows(problems)), problems)

    def fits(self, op_name: str) -> bool:
        """Whether any model was fitted for the op ``op_name`` ("conv3d", "max_pool1d", ...)."""
        return op_name in self._ops

    def time_ms(self, row: dict, solver: str, memory_format: str, direction: str, dtype: str) -> float | None:
        """Predicted ms of ``solver`` on the problem ``row`` (:func:`problem`); None without a model for it (the
        float32 models stand in for other dtypes, the op's own for a :func:`fitted_op` without measurements)."""
        op = fitted_op(row) if self.fits(fitted_op(row)) else row["op"]
        g = self._group(group(op, solver, memory_format, direction, dtype))
        g = g or self._group(group(op, solver, memory_format, direction, "float32"))
        if g is None:
            return None
        x = np.array(features(row))
        log_ms = float(g.beta @ x)
        if len(g.residuals):
            distances = np.sqrt(((g.points - x * self.scale) ** 2).sum(1))  # (problems,)
            near = np.argsort(distances, kind="stable")[:NEIGHBOURS]
            weights = np.exp(-((distances[near] / BANDWIDTH) ** 2))
            log_ms += float((weights * g.residuals[near]).sum() / (weights.sum() + math.exp(-1.0)))
        return math.exp(log_ms)


@functools.cache
def _document() -> dict:
    """``cost_model.json`` (no models and no problems if the file is missing or unreadable)."""
    try:
        document = json.loads(MODEL_FILE.read_text())
        return {
            "models": dict(document["models"]),
            "problems": list(document["problems"]),
            "calibration": list(document.get("calibration", [])),
        }
    except (OSError, ValueError, KeyError, TypeError):
        return {"models": {}, "problems": [], "calibration": []}


@functools.cache
def shipped() -> CostModel:
    """The model in ``cost_model.json`` (an empty one if the file is missing or unreadable)."""
    return CostModel(_document()["models"], _document()["problems"])


def shipped_calibration() -> list[dict]:
    """The calibration problems' timings on the machine the shipped measurements come from (``cost_model.json``'s
    ``calibration``): rows ``{"problem", "op", "format", "solver", "ms"}`` (:mod:`densecnn.ops.calibration`)."""
    return _document()["calibration"]


def measurement_rows(problems: list[dict]) -> list[dict]:
    """One row per (problem, direction, memory format, solver) of the file's problems, as :func:`fit` takes them."""
    rows = []
    for p in problems:
        base = {k: v for k, v in p.items() if k != "times_ms"}
        for direction, fmt, solver, ms in _measurements(p):
            rows.append({**base, "direction": direction, "format": fmt, "solver": solver, "ms": ms})
    return rows


def _measurements(problem: dict):
    """(direction, memory format, solver, ms) for each time of one problem (``ms`` None for a failed run)."""
    for direction, table in problem["times_ms"].items():
        for fmt, times in table.items():
            for solver, ms in times.items():
                yield direction, fmt, solver, ms


def estimate(
    op: DenseOp, shape, dtype: torch.dtype, *, train: bool, candidates: list[str]
) -> dict[str, dict[str, float | None]]:
    """``{memory_format: {solver: predicted ms}}`` for ``op`` on an input of ``shape`` — the tuning step's table,
    predicted, each solver's inference time scaled by this machine's calibration (:mod:`densecnn.ops.calibration`).
    A solver without a fitted model for this op gets None (not chosen), except ``native``, which gets a neutral 1.0
    so that a net always has a plan. Dtypes not in the file use the float32 models."""
    model, row = shipped(), problem(op, shape)
    if isinstance(op, PoolOp) and len(op.kernel) != 2 and not model.fits(op.name):
        # Without measurements of their own, signals' and volumes' pools borrow the image pools' fits: a pool's
        # cost follows its output elements, taps and dilation (the features), whatever the number of axes, and
        # torch's dilated pooling is slower still in 3-D.
        row["op"] = f"{op.mode}_pool2d"
    direction, dtype_name = "train" if train else "infer", str(dtype).removeprefix("torch.")
    # Only inference is calibrated, as the calibration times it: scaling the training direction by the same factors
    # made fewer of its choices agree with tuning, not more (docs/performance.md, "The cost model on your CPU").
    scale = calibration.Calibration() if train else calibration.current()
    table: dict[str, dict[str, float | None]] = {}
    for memory_format in layout.names_for(len(shape)):
        times = {s: model.time_ms(row, s, memory_format, direction, dtype_name) for s in candidates}
        times = _scaled(times, scale, row)
        if memory_format != "nchw" and all(ms is None for ms in times.values()):
            continue  # nothing measured in this format for this op: not a choice
        table[memory_format] = {s: 1.0 if ms is None and s == "native" else ms for s, ms in times.items()}
    return table


def estimate_gradients(
    op: ConvOp, shape, dtype: torch.dtype, candidates: list[str], *, input_grad: bool
) -> dict[str, dict[str, dict[str, float | None]]]:
    """``{memory_format: {"grad_input" | "grad_weight": {gradient solver: predicted ms}}}`` for a conv's gradient
    solvers (:mod:`densecnn.ops.gradients`) on an input of ``shape``, as
    :func:`~densecnn.ops.tune.tuned_gradient_times` times them (not calibrated: as shipped);
    "grad_input" only when the input needs a gradient. ``native`` without a fit gets a neutral 1.0, the others None
    (not chosen)."""
    model, row = shipped(), problem(op, shape)
    dtype_name = str(dtype).removeprefix("torch.")
    directions = ("grad_input", "grad_weight") if input_grad else ("grad_weight",)
    table: dict[str, dict[str, dict[str, float | None]]] = {}
    for memory_format in layout.names_for(len(shape)):
        table[memory_format] = {}
        for direction in directions:
            times = {s: model.time_ms(row, s, memory_format, direction, dtype_name) for s in candidates}
            table[memory_format][direction] = {
                s: 1.0 if ms is None and s == "native" else ms for s, ms in times.items()
            }
    return table


def _scaled(times: dict[str, float | None], scale: calibration.Calibration, row: dict) -> dict:
    """Predicted ``{solver: ms}`` on the problem ``row`` in this machine's proportions: each times its family's
    calibration factor."""
    return {s: None if ms is None else ms * scale.factor(row, s) for s, ms in times.items()}
