"""The patch sizes a patch net accepts, in closed form from its layers' window arithmetic.

While converting, each layer records what it does to the size of the map along every axis: a :class:`Window`
(convolution, pooling) or an :class:`Adaptive` pool, and, once the map is flattened, a :class:`Features` step (a
Linear reading all C·h·w values). A window maps size n to ``(n - extent) // stride + 1``; that is monotone, so the
sizes a chain of windows brings to a given output form an interval, computed backwards layer by layer::

    out = (n - extent) // stride + 1   <=>   (out - 1)·stride + extent  <=  n  <=  (out - 1)·stride + extent + stride - 1

An adaptive pool or a Linear fixes the size after it, so only the windows before the first of them depend on the patch
size, and what they must produce is a target set: 1 at the end of the net, a multiple of an adaptive pool's output,
or the map a Linear reads. Valid sizes and their neighbours thus cost O(layers), whatever the patch size.

>>> plain_133 = [Window(6, 1), Window(8, 8), Window(3, 1), Window(2, 2), Window(7, 1)]  # its steps along one axis
>>> preimage(plain_133, 1)
(133, 148)
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

Size = tuple[int, ...]


@dataclass(frozen=True)
class Window:
    """A window of ``extent`` pixels ((k - 1)·dilation + 1) moved by ``stride``."""

    extent: int
    stride: int

    def apply(self, n: int) -> int:
        """The output size; < 1 when the window does not fit."""
        return (n - self.extent) // self.stride + 1 if n >= 1 else n


@dataclass(frozen=True)
class Adaptive:
    """An adaptive pool to ``output`` values: it needs a multiple of ``output`` (equal windows)."""

    output: int


@dataclass(frozen=True)
class Features:
    """A Linear reading the flattened (C, h, w) map: C·h·w must equal ``in_features``.

    ``channels`` is None when no earlier layer fixes C (an MLP on raw patches): then C is what h·w leaves.
    """

    in_features: int
    channels: int | None

    def accepts(self, area: int) -> bool:
        if area < 1:
            return False
        if self.channels is None:
            return self.in_features % area == 0
        return self.channels * area == self.in_features


AxisStep = Window | Adaptive
Step = tuple[AxisStep, ...] | Features  # one entry per axis, or a Linear over the whole map


def accepts(steps: list[Step], size: Size) -> bool:
    """Whether a patch of ``size`` brings the net to one output (simulated forward, O(layers))."""
    size = list(size)
    for step in steps:
        if isinstance(step, Features):
            if not step.accepts(math.prod(size)) or min(size) < 1:
                return False
            size = [1] * len(size)
            continue
        for axis, axis_step in enumerate(step):
            n = size[axis]
            if isinstance(axis_step, Adaptive):
                if n < 1 or n % axis_step.output:
                    return False
                size[axis] = axis_step.output
            else:
                size[axis] = axis_step.apply(n)
                if size[axis] < 1:
                    return False
    return all(n == 1 for n in size)


def preimage(windows: list[Window], low: int, high: int | None = None) -> tuple[int, int]:
    """The interval of input sizes that ``windows`` bring to an output in [low, high] (high defaults to low)."""
    high = low if high is None else high
    for window in reversed(windows):
        low, high = (low - 1) * window.stride + window.extent, (high - 1) * window.stride + window.extent
        high += window.stride - 1
    return low, high


def _forward(windows: list[Window], n: int) -> int:
    for window in windows:
        n = window.apply(n)
    return n


def _axis(steps: list[Step], axis: int) -> list[AxisStep | Features]:
    return [step if isinstance(step, Features) else step[axis] for step in steps]


def _prefix(axis_steps: list[AxisStep | Features]) -> list[Window]:
    """The windows before the first step that fixes the size (an adaptive pool or a Linear)."""
    prefix = []
    for step in axis_steps:
        if not isinstance(step, Window):
            break
        prefix.append(step)
    return prefix


class _Targets:
    """The prefix outputs that make the whole net valid: a sorted finite list, or all multiples of ``period``."""

    def __init__(self, values: list[int] | None = None, period: int | None = None):
        self.values, self.period = sorted(values or []), period

    def below(self, n: int) -> int | None:
        """The largest target <= n."""
        if self.period is not None:
            return n // self.period * self.period if n >= self.period else None
        found = [v for v in self.values if v <= n]
        return found[-1] if found else None

    def above(self, n: int) -> int | None:
        """The smallest target > n."""
        if self.period is not None:
            return (max(n, 0) // self.period + 1) * self.period
        return next((v for v in self.values if v > n), None)


def _targets(steps: list[Step], moving: tuple[int, ...], size: Size) -> _Targets:
    """The targets for the prefix output of the moving axes (equal prefixes), the other axes held at ``size``."""
    axis_steps = _axis(steps, moving[0])
    prefix = _prefix(axis_steps)
    rest = axis_steps[len(prefix) :]

    def valid(t: int) -> bool:  # a patch whose moving axes bring the prefix to exactly t
        low = preimage(prefix, t)[0]
        return accepts(steps, tuple(low if axis in moving else n for axis, n in enumerate(size)))

    if not rest:
        return _Targets([1] if valid(1) else [])
    fixing = rest[0]
    if isinstance(fixing, Adaptive):
        # everything after the pool sees its fixed output: one check decides all multiples
        return _Targets(period=fixing.output) if valid(fixing.output) else _Targets()
    held = math.prod(
        _size_before(steps, steps.index(fixing), axis, n) for axis, n in enumerate(size) if axis not in moving
    )
    return _Targets([t for t in _divisors(fixing.in_features) if held >= 1 and valid(t)])


def _size_before(steps: list[Step], index: int, axis: int, n: int) -> int:
    """The size of ``axis`` entering ``steps[index]`` for a patch of ``n`` along it."""
    for step in steps[:index]:
        axis_step = step[axis]  # no Features step comes before the first one
        n = axis_step.output if isinstance(axis_step, Adaptive) else axis_step.apply(n)
    return n


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(max(n, 0)) + 1) if n % d == 0]
    return sorted({*small, *(n // d for d in small)})


def nearest(steps: list[Step], size: Size, moving: tuple[int, ...]) -> list[int]:
    """The valid sizes just below and just above ``size`` when the ``moving`` axes (equal steps, equal sizes) vary
    together and the others stay put."""

    def with_moving(p: int) -> Size:
        return tuple(p if axis in moving else n for axis, n in enumerate(size))

    return [p for p in _candidates(steps, size, moving) if accepts(steps, with_moving(p))]


def _candidates(steps: list[Step], size: Size, moving: tuple[int, ...]) -> list[int]:
    """The sizes just below and just above ``size`` along the ``moving`` axes that their own layers take (the other
    axes may still be invalid)."""
    prefix = _prefix(_axis(steps, moving[0]))
    targets = _targets(steps, moving, size)
    reached = _forward(prefix, size[moving[0]])
    found = []
    below, above = targets.below(reached), targets.above(reached)
    if below is not None:
        found.append(min(preimage(prefix, below)[1], size[moving[0]]))
    if above is not None:
        found.append(preimage(prefix, above)[0])
    return [p for p in found if p != size[moving[0]]]


def nearest_whole_sizes(steps: list[Step], size: Size, alike: bool) -> list[Size]:
    """The valid whole sizes made of sizes near ``size`` along every axis, for when no single axis fixes it.

    Axes with the same layers (``alike``) take the sizes near their own as a square's sides; otherwise an axis keeps
    its size if its own layers take it, else offers the sizes just below and above that they take
    (:func:`_sizes_along`), whatever the other axes are.
    """
    everywhere = tuple(range(len(size)))
    around = [
        (nearest(steps, (n,) * len(size), everywhere) or [n]) if alike else _sizes_along(steps, size, axis)
        for axis, n in enumerate(size)
    ]
    return [s for s in itertools.product(*around) if accepts(steps, s)]


def _sizes_along(steps: list[Step], size: Size, axis: int) -> list[int]:
    """``[size[axis]]`` if the layers of ``axis`` take it, else the sizes just below and above it that they take, the
    other axes left out (a Linear head then takes any size that divides its input features)."""
    along = [
        Features(step.in_features, None) if isinstance(step, Features) else (step[axis],) for step in steps
    ]
    n = size[axis]
    return [n] if accepts(along, (n,)) else nearest(along, (n,), (0,))


def smallest_equivalent(steps: list[Step], size: Size) -> Size:
    """The smallest patch size that the net reduces exactly like ``size`` (per axis: the pooling floors drop the rest)."""
    smallest = []
    for axis, n in enumerate(size):
        prefix = _prefix(_axis(steps, axis))
        smallest.append(preimage(prefix, _forward(prefix, n))[0])
    return tuple(smallest)


def describe_nearest(steps: list[Step], size: Size) -> str:
    """A hint naming the valid sizes nearest to an invalid ``size`` (for (h, w): per axis, the other one held).

    A valid size below ``size`` is named with the smallest size that gives the same net, the likely training size:
    ``133 to 148 (one net; most likely trained with 133)``.
    """

    def phrase(found: list[int], moving: tuple[int, ...]) -> list[str]:
        texts = []
        for p in found:
            low = smallest_equivalent(steps, tuple(p if a in moving else n for a, n in enumerate(size)))[
                moving[0]
            ]
            texts.append(str(p) if low == p else f"{low} to {p} (one net; most likely trained with {low})")
        return texts

    alike = len({tuple(_axis(steps, a)) for a in range(len(size))}) == 1  # every axis has the same layers
    if len(set(size)) == 1 and alike:
        moving = tuple(range(len(size)))
        found = phrase(nearest(steps, size, moving), moving)
        return f"Nearest valid patch sizes: {' and '.join(found)}" if found else "No valid size is near it"
    names = {1: ("length",), 2: ("height", "width"), 3: ("depth", "height", "width")}[len(size)]
    per_axis = [nearest(steps, size, (axis,)) for axis in range(len(size))]
    if not any(per_axis):  # no single axis fixes it (more than one is off): name whole sizes
        sizes = nearest_whole_sizes(steps, size, alike)
        return (
            f"Nearest valid patch sizes: {', '.join('x'.join(map(str, s)) for s in sizes)}"
            if sizes
            else "No valid size is near it"
        )
    parts = []
    for axis, (name, found) in enumerate(zip(names, per_axis)):
        if found:  # the axes that alone fix it
            held = ", ".join(f"{names[a]} {n}" for a, n in enumerate(size) if a != axis)
            parts.append(f"nearest valid {name}s ({held}): {', '.join(phrase(found, (axis,)))}")
    text = "; ".join(parts)
    return text[:1].upper() + text[1:]
