"""Execution plans: which solver runs each layer of a dense net, and the memory format the whole net runs in.

A plan groups the net's layers into steps (a windowed layer, with the tanh/ReLU that follows a pool so fused solvers
can absorb it; or a pointwise layer on its own), picks a solver per step and one memory format for the whole net
(the one whose per-layer best times add up to the least), and converts the input once at entry and the output once
at exit. A plan is the only way a dense net runs its ops.

Where the per-layer times come from:
- immediate mode (the default): the tuning step's cached timings of the layer if there are any (from ``densecnn
  tune`` or an earlier tuned run), else the shipped cost model's predictions (:mod:`densecnn.ops.costmodel`):
  no candidate is timed, so the first call is as fast as the next. The cost model measured CPUs: on a GPU, until
  the tuning step has timed a layer there, it runs torch's own op (cuDNN) and its gradients (source
  ``"gpu-default"``), which ran whole nets 1.6-4.6x faster than the CPU model's picks on an H200 (docs/cuda.md);
- tuning (the config's ``tune``: ``tune=True`` on the net, ``DENSECNN_TUNE=1``, ``densecnn tune``): every candidate is
  timed once per problem and the times cached on disk (:mod:`densecnn.ops.tune`), which later immediate-mode plans
  reuse.

The backend restricts the candidates (:func:`densecnn.ops.backends.allowed_solvers`); ``native`` runs torch's ops
in NCHW and so has nothing to choose. The config's ``solver`` and ``memory_format`` force a solver (on the layers it
can run; the others use ``native``) and a memory format (:mod:`densecnn.ops.config`).

The plan knows nothing of the converter: its caller hands it the net's layers and, for each, the activation name a
pool step may absorb (:func:`group_steps`). A windowed layer is one with ``dense_op()`` (its
:class:`~densecnn.ops.solvers.ConvOp` or ``PoolOp``) and ``output_shape(shape)``; every other layer keeps the
shape.
"""

from __future__ import annotations

import dataclasses
import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from ..errors import Cancelled, InvalidTypeError
from ..geometry import output_size
from . import allocator, costmodel, gradients, solvers
from .backends import Backend, allowed_solvers, ext_available, no_ext_kernel
from .config import OpsConfig
from .layout import contiguous, names_for, to_format
from .layout import memory_format as torch_memory_format
from .solvers import PoolOp
from .tune import timing_shape, tuned_gradient_times, tuned_times

GPU_DEFAULT = "gpu-default"  # a step's time source on a GPU before tuning: torch's own op, nothing predicted

Shape = tuple[int, ...]  # (N, C, *spatial)


@dataclass
class Step:
    """One or two consecutive layers run as a unit; ``solver`` is None for a layer run as itself."""

    layers: tuple[nn.Module, ...]
    activation: str | None = None  # the tanh/ReLU a pool step absorbs
    pointwise: str | None = None  # the activation a pointwise step's layer is, which may run in place
    solver: str | None = None
    source: str | None = None  # "tuned", "predicted" or "forced": where the times behind the choice came from
    times: dict | None = None  # {memory_format: {solver: ms}} the choice was made on
    # A training plan's conv whose gradients are chosen apart from its forward (densecnn.ops.gradients): the
    # solvers of its input gradient (None: the input needs none) and weight gradient, the times they were chosen
    # on ({memory_format: {"grad_input" | "grad_weight": {solver: ms}}}) and where those came from.
    gradients: tuple[str | None, str] | None = None
    gradient_times: dict | None = None
    gradient_source: str | None = None

    def dense_op(self):
        op = self.layers[0].dense_op()
        return dataclasses.replace(op, activation=self.activation) if self.activation else op

    def __call__(self, x: torch.Tensor, memory_format: torch.memory_format | None = None) -> torch.Tensor:
        if self.solver is None:
            return run_in_dtype(self.layers[0], x)
        if self.gradients is not None and torch.is_grad_enabled():
            input_solver, weight_solver = self.gradients
            return gradients.conv(
                self.dense_op(),
                x,
                self.solver,
                input_solver=input_solver,
                weight_solver=weight_solver,
                memory_format=memory_format,
            )
        return solvers.run(self.solver, self.dense_op(), x, memory_format)


@dataclass
class Plan:
    memory_format: str  # "nchw" or "nhwc"
    steps: list[Step]

    def __call__(
        self, x: torch.Tensor, *, cancel: threading.Event | None = None, keep_layout: bool = False
    ) -> torch.Tensor:
        """The steps on x; the output NC*, or with ``keep_layout`` in the layout the plan computes in."""
        layout = torch_memory_format(self.memory_format, x.dim())
        y = run_steps(self.steps, to_format(x, self.memory_format), cancel, layout)
        return y if keep_layout else contiguous(y)

    def describe(self) -> list[dict]:
        """One row per step: its layers, solver, memory format, where the choice came from ("tuned" timings, the
        cost model's "predicted" times, "forced", "gpu-default": torch's op on a GPU before tuning), and the step's
        times per candidate in that format (ms, at the bucketed timing shape, with torch's fresh buffers charged:
        :mod:`densecnn.ops.allocator`). A training plan's
        conv whose gradients were chosen apart from its forward also has ``gradients`` ({"grad_input": solver or
        None, "grad_weight": solver}) and their ``gradient_times_ms``; its ``times_ms`` are then the forward's."""
        rows = []
        for step in self.steps:
            row = {
                "layers": [type(m).__name__ for m in step.layers],
                "solver": step.solver or "module",
                "format": self.memory_format,
                "source": step.source,
                "times_ms": step.times.get(self.memory_format, {}) if step.times else {},
            }
            if step.gradients is not None:
                row["gradients"] = dict(zip(gradients.DIRECTIONS, step.gradients, strict=True))
                row["gradient_times_ms"] = step.gradient_times.get(self.memory_format, {})
            rows.append(row)
        return rows


def run_in_dtype(layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """A layer without a dense op (a norm, PReLU, an activation) on x in x's dtype, the compute dtype of the whole
    net (as the windowed layers' solvers cast their weights): its floating-point tensors of another dtype are cast
    for the call, so that ``predict(x.bfloat16())`` runs a model with BatchNorm or PReLU too.

    Raises:
        InvalidTypeError: torch has no kernel of the layer for x's dtype on x's device.
    """
    cast = {
        name: t.to(x.dtype)
        for name, t in (*layer.named_parameters(), *layer.named_buffers())
        if t.is_floating_point() and t.dtype != x.dtype
    }
    try:
        return torch.func.functional_call(layer, cast, (x,)) if cast else layer(x)
    except NotImplementedError as exc:
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        # torch's words for a kernel missing for a dtype; any other NotImplementedError is the layer's own
        if "not implemented for" not in reason:
            raise
        raise InvalidTypeError(
            f"the layer {type(layer).__name__} cannot compute in {x.dtype} on {x.device.type} ({reason}); "
            "give the images in float32 (x.float())"
        ) from None


def run_steps(
    steps,
    x: torch.Tensor,
    cancel: threading.Event | None = None,
    memory_format: torch.memory_format | None = None,
) -> torch.Tensor:
    """``x`` through each step in turn, the windowed steps' outputs in ``memory_format`` (default: their input's);
    raises :class:`Cancelled` before a step once ``cancel`` is set.

    A tanh/ReLU step after a windowed one overwrites that step's output (which nothing else holds) when autograd
    does not need it: one memory pass instead of two, and no new buffer.
    """
    owned = False  # whether x was made by a windowed step of this run (never the caller's tensor)
    for step in steps:
        if cancel is not None and cancel.is_set():
            raise Cancelled("the computation was cancelled")
        activation = step.pointwise if step.solver is None else None
        if owned and activation and not (torch.is_grad_enabled() and x.requires_grad):
            x = solvers.activate_(x, activation)
        else:
            x = step(x, memory_format)
        owned = owned or step.solver is not None
    return x


def group_steps(layers: Sequence[nn.Module], activations: Sequence[str | None]) -> list[Step]:
    """Steps of the net: each windowed layer (absorbing a following tanh/ReLU after a pool), each other layer alone.

    ``activations``: for each layer, the name of the activation it is under which a pool step may absorb it
    ("tanh", "relu"), else None; the caller knows (for a dense net, its layer records).
    """
    layers, activations = list(layers), list(activations)
    if len(layers) != len(activations):
        raise ValueError(f"{len(layers)} layers but {len(activations)} activation names; pass one per layer")
    steps, i = [], 0
    while i < len(layers):
        layer = layers[i]
        if not hasattr(layer, "dense_op"):
            steps.append(Step((layer,), pointwise=activations[i]))
            i += 1
            continue
        follower = activations[i + 1] if i + 1 < len(layers) else None
        if isinstance(layer.dense_op(), PoolOp) and follower:
            steps.append(Step((layer, layers[i + 1]), follower))
            i += 2
        else:
            steps.append(Step((layer,)))
            i += 1
    return steps


def next_shape(step: Step, shape: Shape) -> Shape:
    """The (N, C', *S') the step outputs for an input of ``shape`` (windowed layers change it, the others keep it)."""
    for layer in step.layers:
        shape = layer.output_shape(shape) if hasattr(layer, "dense_op") else shape
    return shape


def make_plan(
    steps: list[Step],
    shape: Shape,
    dtype: torch.dtype,
    device,
    *,
    backend: Backend,
    train: bool,
    config: OpsConfig,
    input_grad: bool = False,
) -> Plan:
    """The fastest plan for running ``steps`` (fresh from :func:`group_steps`; the plan keeps and fills them) on a
    (N, C, *S) input of ``shape``: per-layer times predicted (immediate mode, or cached timings) or, with the
    config's ``tune``, timed by :func:`tuned_times`. Images and volumes run in NC* or channels-last, whichever is
    faster; signals in NC* (a forced "nhwc" is ignored for them). The config's ``solver`` and ``memory_format``
    force them.

    ``train``: plan for forward + backward; ``input_grad``: whether the input itself needs a gradient.
    """
    forced, fmt_forced = config.solver, config.memory_format
    if backend is Backend.NATIVE and fmt_forced is None:
        fmt_forced = "nchw"  # torch's dilated ops as they come: nothing to choose, nothing to time
    if fmt_forced not in (None, *names_for(len(shape))):
        fmt_forced = "nchw"  # signals have no channels-last format
    allowed = allowed_solvers(backend, forced)
    ext = ext_available()
    position = 0  # of the step's first layer in the net
    for index, step in enumerate(steps):
        if hasattr(step.layers[0], "dense_op"):
            op = step.dense_op()
            names = [n for n in solvers.candidates(op, ext_available=ext, dtype=dtype) if n in allowed]
            if not names and backend is Backend.EXT:
                raise _no_ext_solver(step.layers[0], position, allowed, dtype)
            needs_grad = input_grad or index > 0  # every later layer's input comes from parameters
            gradient_names = gradients.candidates(op, allowed) if train else []
            step.source, step.times = _times(
                op,
                names,
                shape,
                dtype,
                device,
                forced,
                fmt_forced,
                train=train and len(gradient_names) < 2,  # else the forward's times, the gradients' apart
                config=config,
                input_grad=needs_grad,
            )
            if len(gradient_names) > 1:
                step.gradient_source, step.gradient_times = _gradient_times(
                    op, gradient_names, shape, dtype, device, config=config, input_grad=needs_grad
                )
                if config.gradient_solver in gradient_names:
                    step.gradient_source = "forced"
        shape = next_shape(step, shape)
        position += len(step.layers)
    # A format is a choice when every step has times in it (the cost model may have measured only NC* for an op).
    timed = [f for f in names_for(len(shape)) if all(step.times is None or f in step.times for step in steps)]
    formats = [fmt_forced] if fmt_forced else timed or ["nchw"]
    return Plan(_choose(steps, formats, allowed, forced, config.gradient_solver), steps)


def _no_ext_solver(
    layer: nn.Module, position: int, allowed: set[str], dtype: torch.dtype
) -> InvalidTypeError:
    """The error for a layer none of densecnn's own kernels (``backend="ext"``) runs on inputs of ``dtype``."""
    source = getattr(layer, "source", None)
    what = type(layer).__name__ + (f" of a {type(source).__name__}" if isinstance(source, nn.Module) else "")
    return InvalidTypeError(
        no_ext_kernel(f"the dense net's layer features[{position}] ({what})", allowed, dtype, images=True)
    )


def _choose(
    steps: list[Step], formats: list[str], allowed: set[str], forced: str | None, gradient_solver
) -> str:
    """The memory format of ``formats`` in which the steps' best solvers (and gradient solvers) take the least time
    in all; sets each step's solver and gradient solvers to its best in that format."""
    best = {fmt: [_best(step.times, fmt, allowed, forced) for step in steps] for fmt in formats}
    best_gradients = {
        fmt: [_best_gradients(step.gradient_times, fmt, gradient_solver) for step in steps] for fmt in formats
    }
    chosen = min(
        formats, key=lambda fmt: sum(ms for _, ms in best[fmt]) + sum(ms for _, ms in best_gradients[fmt])
    )
    for step, (name, _), (chosen_gradients, _) in zip(steps, best[chosen], best_gradients[chosen]):
        step.solver, step.gradients = name, chosen_gradients
    return chosen


def _times(op, names, shape, dtype, device, forced, fmt_forced, *, train, config, input_grad):
    """(source, {memory_format: {solver: ms}}) for one step, with the page faults of torch's buffers that the bucketed
    shape does not show (:mod:`densecnn.ops.allocator`)."""
    if fmt_forced and names and (forced or len(names) == 1):  # nothing to choose: no timing, no prediction
        return "forced", {fmt_forced: {forced if forced in names else names[0]: 0.0}}
    ext, timed_shape = ext_available(), timing_shape(op, shape)
    source = "tuned"
    times = tuned_times(  # not tuning: None unless an earlier tuning timed this problem
        op, shape, dtype, device, train=train, ext=ext, cache_dir=config.cache_dir, input_grad=input_grad,
        time_missing=config.tune,
    )  # fmt: skip
    if times is None and torch.device(device).type != "cpu" and "native" in names:
        return GPU_DEFAULT, {"nchw": {name: 0.0 if name == "native" else None for name in names}}
    if times is None:
        # Predicted at the shape the tuning step times (and the cost model was measured at), so that immediate and
        # tuned plans rank the candidates on the same problem.
        source = "predicted"
        times = costmodel.estimate(op, timed_shape, dtype, train=train, candidates=names)
    if torch.device(device).type != "cpu":
        return source, times
    real, timed = (_output_bytes(op, s, dtype) for s in (shape, timed_shape))
    return source, {
        fmt: {
            name: None
            if ms is None
            else ms + allocator.fresh_buffers_ms(name, real_bytes=real, timed_bytes=timed, train=train)
            for name, ms in table.items()
        }
        for fmt, table in times.items()
    }


def _gradient_times(op, names, shape, dtype, device, *, config, input_grad):
    """(source, {memory_format: {direction: {gradient solver: ms}}}) for one conv's gradients: the tuning step's
    timings if cached (or timed now, when tuning), else the cost model's predictions; "grad_input" only when the
    input needs a gradient."""
    ext = ext_available()
    times = tuned_gradient_times(
        op, shape, dtype, device, ext=ext, cache_dir=config.cache_dir, input_grad=input_grad,
        time_missing=config.tune,
    )  # fmt: skip
    source = "tuned"
    if times is None and torch.device(device).type != "cpu":
        native = {"native": 0.0}
        return GPU_DEFAULT, {
            "nchw": {"grad_input": native, "grad_weight": native} if input_grad else {"grad_weight": native}
        }
    if times is None:
        source = "predicted"
        times = costmodel.estimate_gradients(op, timing_shape(op, shape), dtype, names, input_grad=input_grad)
    charged = _input_gradient_charge(shape, timing_shape(op, shape), dtype, device)
    return source, {
        fmt: {
            direction: {
                n: ms if ms is None or direction != "grad_input" else ms + charged(n)
                for n, ms in table.items()
                if n in names
            }
            for direction, table in tables.items()
        }
        for fmt, tables in times.items()
    }


def _input_gradient_charge(shape: Shape, timed_shape: Shape, dtype: torch.dtype, device):
    """solver -> ms of page faults its input gradient's fresh buffer adds on the real map beyond the bucketed shape
    (:func:`densecnn.ops.allocator.fresh_input_gradient_ms`; none off the CPU)."""
    if torch.device(device).type != "cpu":
        return lambda name: 0.0
    real, timed = (math.prod(s) * dtype.itemsize for s in (shape, timed_shape))
    return lambda name: allocator.fresh_input_gradient_ms(name, real_bytes=real, timed_bytes=timed)


def _best_gradients(table, fmt: str, forced: str | None) -> tuple[tuple[str | None, str] | None, float]:
    """((input gradient's solver or None, weight gradient's solver), ms) for one step: the ``forced`` gradient
    solver where it runs, else the fastest; (None, 0) for a step whose gradients are its forward solver's."""
    if table is None:
        return None, 0.0
    tables = table.get(fmt, table.get("nchw", {}))
    chosen, total = [], 0.0
    for direction in gradients.DIRECTIONS:
        timed = {n: ms for n, ms in tables.get(direction, {}).items() if ms is not None}
        if direction == "grad_input" and direction not in tables:
            chosen.append(None)  # the input needs no gradient
            continue
        name = min(timed, key=timed.get) if timed else "native"
        if forced in tables.get(direction, {}):
            name = forced
        chosen.append(name)
        total += timed.get(name, 0.0)
    return (chosen[0], chosen[1]), total


def _output_bytes(op, shape: Shape, dtype: torch.dtype) -> int:
    """Bytes of the step's output for an input of ``shape``."""
    channels = op.weight.shape[0] if isinstance(op, solvers.ConvOp) else shape[1]
    spatial = output_size(tuple(shape[2:]), op.kernel, op.dilation)
    return shape[0] * channels * math.prod(spatial) * dtype.itemsize


def _best(table, fmt: str, allowed: set[str], forced: str | None) -> tuple[str | None, float]:
    """(solver, ms) for one step: the forced solver when it applies, else the fastest allowed one."""
    if table is None:
        return None, 0.0
    times = table.get(fmt, table.get("nchw", {}))  # a forced format without times of its own ranks by NC*
    timed = {name: ms for name, ms in times.items() if name in allowed and ms is not None}
    if forced in timed:
        return forced, timed[forced]
    if forced in times:  # a forced solver the cost model has no fit for yet still runs
        return forced, 0.0
    if not timed:
        raise RuntimeError(f"no solver can run this layer with solvers {sorted(allowed)}; times: {times}")
    name = min(timed, key=timed.get)
    return name, timed[name]
