"""Window arithmetic shared by the converter, the ops, tiling and the scanners: one entry per spatial axis.

Every size, kernel, dilation and stride is a tuple with one int per spatial axis (1 for signals, 2 for images,
3 for volumes); :func:`ntuple` turns a user's int into one.

>>> ntuple(3, 2)
(3, 3)
>>> output_size((512, 512), kernel=(7, 7), dilation=(16, 16))
(416, 416)
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence

from .errors import InvalidInputError, InvalidTypeError

Size = tuple[int, ...]


def ntuple(value: int | Sequence[int], n: int, name: str = "value") -> Size:
    """An int (numpy ints included) repeated ``n`` times, or a sequence of ``n`` ints, as a tuple of Python ints.

    Raises:
        TypeError: ``value`` is neither an int nor a sequence of ints.
        ValueError: the sequence has the wrong length.
    """
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return (int(value),) * n
    if isinstance(value, Sequence) and all(
        isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in value
    ):
        if len(value) != n:
            raise InvalidInputError(
                f"{name} needs {n} entries (one per spatial axis), got {len(value)}: {tuple(value)}"
            )
        return tuple(int(v) for v in value)
    raise InvalidTypeError(f"{name} must be an int or a sequence of {n} ints, got {value!r}")


def reach(kernel: Size, dilation: Size) -> Size:
    """How many pixels past its first tap a dilated window reaches: (k - 1)·d per axis."""
    return tuple((k - 1) * d for k, d in zip(kernel, dilation, strict=True))


def output_size(size: Size, kernel: Size, dilation: Size) -> Size:
    """Spatial size after a stride-1 dilated window without padding: size - (k - 1)·d per axis."""
    return tuple(s - r for s, r in zip(size, reach(kernel, dilation), strict=True))


def pooled_length(length: int, extent: int, stride: int, ceil_mode: bool) -> int:
    """The outputs of an unpadded pool of ``extent``-pixel windows moved by ``stride`` along an axis of ``length``
    pixels (length >= extent), as torch counts them: ``ceil_mode`` adds a last, partial window, but only one that
    starts inside the axis.

    >>> pooled_length(9, 2, 2, ceil_mode=False), pooled_length(9, 2, 2, ceil_mode=True)
    (4, 5)
    >>> pooled_length(6, 2, 3, ceil_mode=True)  # a third window would start at 6, past the axis
    2
    """
    if not ceil_mode:
        return (length - extent) // stride + 1
    outputs = -(-(length - extent) // stride) + 1
    return outputs - 1 if (outputs - 1) * stride >= length else outputs
