"""Immediate mode: each candidate solver's time predicted from measurements shipped with the package, no timing.

``cost_model.json`` (next to this module) holds measurements of every solver in both memory formats on a grid of
dense ops (convs and pools of various kernels, dilations, channels and map sizes), taken on one machine by
``scripts/fit_cost_model.py``, and per (op, solver, memory format, direction, dtype) a least-squares fit of

    log(ms) ≈ β · features(op, input shape)

over the log of the output pixels, channels, kernel taps and dilation (:func:`features`). The plan ranks candidates
by these predictions, so the first call on a new machine or image size runs at once; the find step
(:mod:`densecnn.ops.find`, ``densecnn tune``) replaces them by real timings when asked. The absolute numbers are the
shipping machine's; only their ranking is used.

>>> from densecnn.ops.solvers import PoolSpec
>>> table = predict(PoolSpec("max_pool2d", (2, 2), (8, 8)), (1, 50, 300, 300), torch.float32, train=False,
...                 candidates=["native", "s2b"])
>>> sorted(table)
['nchw', 'nhwc']
"""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path

import torch

from ..geometry import output_size
from .solvers import ConvSpec, Spec

MODEL_FILE = Path(__file__).with_name("cost_model.json")
FEATURES = (
    "bias",
    "log_out_pixels",
    "log_out_channels",
    "log_in_channels_per_group",
    "log_taps",
    "log_dilation",
)
FEATURES += ("activation",)
RIDGE = 1e-3  # keeps the fit well-posed when a feature barely varies within a group


def problem(spec: Spec, shape) -> dict:
    """The op and its (N, C, H, W) input as the JSON row the cost model is fitted on."""
    row = {"op": spec.op, "input": list(shape), "kernel": list(spec.kernel), "dilation": list(spec.dilation)}
    if isinstance(spec, ConvSpec):
        row.update(out_channels=spec.weight.shape[0], groups=spec.groups, activation=None)
    else:
        row.update(out_channels=shape[1], groups=shape[1], activation=spec.activation)
    return row


def features(row: dict) -> list[float]:
    """The fitted model's inputs for one problem row (see :data:`FEATURES`)."""
    n, c, *size = row["input"]
    out = output_size(tuple(size), tuple(row["kernel"]), tuple(row["dilation"]))
    return [
        1.0,
        math.log(n * math.prod(max(s, 1) for s in out)),
        math.log(row["out_channels"]),
        math.log(max(c // row["groups"], 1)),
        math.log(math.prod(row["kernel"])),
        math.log(math.prod(row["dilation"])),
        1.0 if row["activation"] else 0.0,
    ]


def group(op: str, solver: str, memory_format: str, direction: str, dtype: str) -> str:
    """The name of one fitted model: ``op/solver/format/direction/dtype``."""
    return f"{op}/{solver}/{memory_format}/{direction}/{dtype}"


def fit(measurements: list[dict]) -> dict[str, list[float]]:
    """Per group, the coefficients of the log-linear fit to measurement rows
    ``{**problem(spec, shape), "solver", "format", "direction", "dtype", "ms"}`` (failed runs have ``ms`` None)."""
    by_group: dict[str, list[dict]] = {}
    for row in measurements:
        if row["ms"]:
            key = group(row["op"], row["solver"], row["format"], row["direction"], row["dtype"])
            by_group.setdefault(key, []).append(row)
    models = {}
    for key, rows in sorted(by_group.items()):
        x = torch.tensor([features(r) for r in rows], dtype=torch.float64)  # (rows, features)
        y = torch.tensor([math.log(r["ms"]) for r in rows], dtype=torch.float64)  # (rows,)
        ridge = RIDGE * torch.eye(x.shape[1], dtype=torch.float64)
        ridge[0, 0] = 0.0  # the intercept is not shrunk
        beta = torch.linalg.solve(x.T @ x + ridge, x.T @ y)
        models[key] = [round(b, 6) for b in beta.tolist()]
    return models


@functools.cache
def _models() -> dict[str, list[float]]:
    try:
        return json.loads(MODEL_FILE.read_text())["models"]
    except (OSError, ValueError, KeyError):
        return {}


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def predict(
    spec: Spec, shape, dtype: torch.dtype, *, train: bool, candidates: list[str]
) -> dict[str, dict[str, float | None]]:
    """``{memory_format: {solver: predicted ms}}`` for ``spec`` on an input of ``shape`` — the find step's table,
    predicted. A solver without a fitted model for this op gets None (not chosen), except ``native``, which gets a
    neutral 1.0 so that a net always has a plan. Dtypes not in the file use the float32 models."""
    models, row = _models(), problem(spec, shape)
    direction = "train" if train else "infer"
    x = features(row)
    table: dict[str, dict[str, float | None]] = {}
    for memory_format in ("nchw", "nhwc"):
        table[memory_format] = {}
        for solver in candidates:
            beta = models.get(group(spec.op, solver, memory_format, direction, _dtype_name(dtype)))
            beta = beta or models.get(group(spec.op, solver, memory_format, direction, "float32"))
            if beta is not None:
                table[memory_format][solver] = math.exp(sum(b * f for b, f in zip(beta, x)))
            else:
                table[memory_format][solver] = 1.0 if solver == "native" else None
    return table
