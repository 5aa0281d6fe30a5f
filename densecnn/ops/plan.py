"""Execution plans: which solver runs each layer of a dense net, and the memory format the whole net runs in.

A plan groups the net's layers into steps (a windowed layer, with the tanh/ReLU that follows a pool so fused solvers
can absorb it; or a pointwise layer on its own), picks a solver per step and one memory format for the whole net
(the one whose per-layer best times add up to the least), and converts the input once at entry and the output once
at exit.

Forcing (for experiments and benchmarks), strongest first:
- ``DenseCNN.solver`` / ``DenseCNN.memory_format`` attributes;
- environment ``DENSECNN_SOLVER`` (``native``, ``s2b``, ``ext``, ``ext_fused``; layers the solver cannot run use
  ``native``) and ``DENSECNN_MEMORY_FORMAT`` (``nchw`` or ``nhwc``).
"""

from __future__ import annotations

import dataclasses
import os
import threading
from dataclasses import dataclass

import torch
from torch import nn

from ..errors import Cancelled
from ..rules.registry import fused_activation
from . import ext_available, require_ext, solvers
from .find import MEMORY_FORMATS, find
from .solvers import SOLVERS, PoolSpec

Shape = tuple[int, int, int, int]


@dataclass
class Step:
    """One or two consecutive layers run as a unit; ``solver`` is None for a layer run as itself."""

    layers: tuple[nn.Module, ...]
    activation: str | None = None
    solver: str | None = None

    def spec(self):
        spec = self.layers[0].spec()
        return dataclasses.replace(spec, activation=self.activation) if self.activation else spec

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.solver is None:
            return self.layers[0](x)
        return solvers.run(self.solver, self.spec(), x)


@dataclass
class Plan:
    memory_format: str  # "nchw" or "nhwc"
    steps: list[Step]

    def __call__(self, x: torch.Tensor, *, cancel: threading.Event | None = None) -> torch.Tensor:
        x = x.contiguous(memory_format=MEMORY_FORMATS[self.memory_format])
        return run_steps(self.steps, x, cancel).contiguous()

    def describe(self) -> list[dict]:
        """One row per step: its layers, solver and memory format (for ``densecnn tune`` and the benchmarks)."""
        return [
            {
                "layers": [type(m).__name__ for m in step.layers],
                "solver": step.solver or "module",
                "format": self.memory_format,
            }
            for step in self.steps
        ]


def run_steps(steps, x: torch.Tensor, cancel: threading.Event | None = None) -> torch.Tensor:
    """``x`` through each step in turn; raises :class:`Cancelled` before a step once ``cancel`` is set."""
    for step in steps:
        if cancel is not None and cancel.is_set():
            raise Cancelled("the computation was cancelled")
        x = step(x)
    return x


def group_steps(features: nn.Sequential) -> list[Step]:
    """Steps of the net: each windowed layer (absorbing a following tanh/ReLU after a pool), each other layer alone."""
    layers, steps, i = list(features), [], 0
    while i < len(layers):
        layer = layers[i]
        if not hasattr(layer, "spec"):
            steps.append(Step((layer,)))
            i += 1
            continue
        follower = layers[i + 1] if i + 1 < len(layers) else None
        activation = fused_activation(follower)
        if isinstance(layer.spec(), PoolSpec) and activation:
            steps.append(Step((layer, follower), activation))
            i += 2
        else:
            steps.append(Step((layer,)))
            i += 1
    return steps


def layer_output_shape(layer: nn.Module, shape: Shape) -> Shape:
    """The (N, C, H, W) a dense layer outputs for an input of ``shape`` (pointwise layers keep it)."""
    if not hasattr(layer, "spec"):
        return shape
    spec = layer.spec()
    channels = spec.weight.shape[0] if isinstance(spec, solvers.ConvSpec) else shape[1]
    h, w = (shape[2 + a] - (spec.kernel[a] - 1) * spec.dilation[a] for a in (0, 1))
    return shape[0], channels, h, w


def next_shape(step: Step, shape: Shape) -> Shape:
    for layer in step.layers:
        shape = layer_output_shape(layer, shape)
    return shape


def forced_solver(attribute: str | None) -> str | None:
    name = attribute or os.environ.get("DENSECNN_SOLVER") or None
    if name is not None and name not in SOLVERS:
        raise ValueError(
            f"solver {name!r} is unknown; use one of {', '.join(SOLVERS)} (DENSECNN_SOLVER or .solver)"
        )
    return name


def forced_memory_format(attribute: str | None) -> str | None:
    fmt = attribute or os.environ.get("DENSECNN_MEMORY_FORMAT") or None
    if fmt is not None and fmt not in MEMORY_FORMATS:
        raise ValueError(
            f"memory format {fmt!r} is unknown; use one of {', '.join(MEMORY_FORMATS)} (DENSECNN_MEMORY_FORMAT)"
        )
    return fmt


def allowed_solvers(backend: str, forced: str | None, ext: bool) -> set[str]:
    """The solvers a plan may use: everything applicable for "auto", only the kernels for "ext"."""
    if forced is not None:
        if SOLVERS[forced].needs_ext:
            require_ext()
        return {forced, "native"}
    if backend == "ext":
        require_ext()
        return {"ext", "ext_fused"}
    return {name for name, s in SOLVERS.items() if ext or not s.needs_ext}


def make_plan(
    features: nn.Sequential,
    shape: Shape,
    dtype: torch.dtype,
    device,
    *,
    backend: str,
    train: bool,
    solver: str | None = None,
    memory_format: str | None = None,
    input_grad: bool = False,
) -> Plan:
    """The fastest plan for running ``features`` on a (N, C, H, W) input of ``shape`` (timing via :func:`find`).

    ``train``: plan for forward + backward; ``input_grad``: whether the input itself needs a gradient.
    """
    forced, fmt_forced = forced_solver(solver), forced_memory_format(memory_format)
    ext = ext_available()
    allowed = allowed_solvers(backend, forced, ext)
    steps, tables = group_steps(features), []
    for index, step in enumerate(steps):
        if not hasattr(step.layers[0], "spec"):
            tables.append(None)
        elif forced and fmt_forced:  # nothing to choose: no timing
            applies = forced in solvers.candidates(step.spec(), ext_available=ext)
            tables.append({fmt_forced: {forced if applies else "native": 0.0}})
        else:
            needs_grad = input_grad or index > 0  # every later layer's input comes from parameters
            tables.append(
                find(step.spec(), shape, dtype, device, train=train, ext=ext, input_grad=needs_grad)
            )
        shape = next_shape(step, shape)
    formats = [fmt_forced] if fmt_forced else list(MEMORY_FORMATS)
    best = {fmt: [_best(table, fmt, allowed, forced) for table in tables] for fmt in formats}
    chosen = min(formats, key=lambda fmt: sum(ms for _, ms in best[fmt]))
    for step, (name, _) in zip(steps, best[chosen]):
        step.solver = name
    return Plan(chosen, steps)


def _best(table, fmt: str, allowed: set[str], forced: str | None) -> tuple[str | None, float]:
    """(solver, ms) for one step: the forced solver when it applies, else the fastest allowed one."""
    if table is None:
        return None, 0.0
    timed = {name: ms for name, ms in table[fmt].items() if name in allowed and ms is not None}
    if forced in timed:
        return forced, timed[forced]
    if not timed:
        raise RuntimeError(
            f"no solver can run this layer with solvers {sorted(allowed)}; times: {table[fmt]}"
        )
    name = min(timed, key=timed.get)
    return name, timed[name]
