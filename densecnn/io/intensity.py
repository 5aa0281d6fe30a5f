"""How raw pixel values become the [0, 1] a model's normalisation starts from: declared by the model, checked on
every image, the same in ``densecnn predict``, the service and training.

A model file may declare ``"intensity"`` (:class:`Intensity`):

- ``{"mode": "dtype"}``, the default: integers by their dtype's full range (uint8 0–255, uint16 0–65535 → 0–1),
  floats as they are (for images and volumes: expected in [0, 1]; a signal's floats may take any values);
- ``{"mode": "range", "low": L, "high": H}``: ``(x − L) / (H − L)``, e.g. 12-bit camera data stored as uint16:
  ``low`` 0, ``high`` 4095;
- ``{"mode": "percentiles", "low": 1, "high": 99.8}``: per image, its ``low``-th and ``high``-th percentiles map to
  0 and 1, as StarDist and cellpose normalise (Schmidt et al., "Cell Detection with Star-Convex Polygons";
  Stringer et al., "Cellpose: a generalist algorithm for cellular segmentation"). Both are taken over all channels
  together, from a sample of the image (:func:`sample_windows`: the whole image up to :data:`SAMPLE_PIXELS`,
  otherwise a grid of windows spread over it), so a slide's percentiles cost a few million pixels, and every path
  that reads the same image takes the same sample.

An image the declared mode cannot be right for is refused with the numbers and the fix (the intensity that
suits it, never the one just used), never labelled:

- ``dtype`` on integers wider than 8 bits whose values vary but use under 1% of their dtype's range (a 16-bit image
  holding 0–235 would be all but black: 12-bit camera data wants ``range:0,4095``);
- ``dtype`` on an image's or volume's floats outside [0, 1] (beyond :data:`FLOAT_SLACK`), constant or not;
- ``percentiles`` on an image whose values vary but whose two percentiles are equal;
- NaN or infinite values, whatever the mode (:func:`require_finite`).

Everything else is labelled, as scanning it patch by patch would label it: 8-bit images whatever their range (an
empty field of view, a dark frame), and constant images of any dtype (an all-zero 16-bit tile; under
``percentiles`` a constant image scales to 0, as CSBDeep's ``normalize`` does). A constant image's
:class:`Scaling` says so (``constant``), and the front ends pass that on as a warning.

>>> from densecnn.io.intensity import Intensity
>>> Intensity.parse("percentiles:1,99.8").scaling(np.array([[0, 10], [20, 4000]], np.uint16)).high > 3900
True
>>> Intensity().scaling(np.array([0, 0], np.uint8)).constant
0
>>> Intensity().scaling(np.array([0, 235], np.uint16))
Traceback (most recent call last):
IntensityError: the image uses 0..235 of uint16's 0..65535 (0.36% of the range) ...
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from ..errors import Fix, IntensityError, NonFiniteInputError
from ..nonfinite import NO_DATA_FIX

MODES = ("dtype", "range", "percentiles")
MIN_RANGE_USE = 0.01  # the fraction of an integer dtype's range an image must reach for mode "dtype"
FLOAT_SLACK = 0.01  # float values this far outside [0, 1] still pass mode "dtype" (the rounding of a rescale)
SAMPLE_PIXELS = 1 << 22  # pixels (per channel) sampled for percentiles and checks: the whole image up to this
SAMPLE_WINDOW = 256  # side of each sampled window of a larger image
ADVICE = "declare how the model's inputs are scaled"
PERCENTILES = "percentiles:1,99.8"  # the percentiles suggested when an image's scaling must be declared


def intensity_fix(advice: str, *values: str) -> Fix:
    """The fix of giving the intensity one of ``values``."""
    return Fix(advice, tuple(("intensity", value) for value in values))


@dataclass(frozen=True)
class Scaling:
    """``(x − low) / (high − low)``: one image's raw values -> the [0, 1] the model's normalisation expects.
    ``constant``: the one value the image holds everywhere (judged from its sample), or None."""

    low: float
    high: float
    constant: float | None = None

    def note(self) -> str | None:
        """What a front end warns of a constant image (None for any other)."""
        if self.constant is None:
            return None
        return (
            f"the image holds the single value {self.constant:g} everywhere; it was labelled as such (check it is "
            "the image meant)"
        )

    def apply_(self, plane: np.ndarray) -> np.ndarray:
        """Scale a float32 ``plane`` in place (and return it)."""
        if self.low:
            plane -= np.float32(self.low)
        if self.high - self.low != 1:
            plane /= np.float32(self.high - self.low)
        return plane


@dataclass(frozen=True)
class Intensity:
    """A model's declared input scaling (see the module's docs). ``low``/``high``: the range's values (mode
    "range") or percentiles (mode "percentiles"); unused by mode "dtype"."""

    mode: str = "dtype"
    low: float | None = None
    high: float | None = None

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise IntensityError(f"intensity mode {self.mode!r} is not one of {', '.join(MODES)}")
        if self.mode == "dtype":
            if self.low is not None or self.high is not None:
                raise IntensityError(
                    'intensity mode "dtype" takes no low/high; use mode "range" for fixed values'
                )
            return
        if (
            self.low is None
            or self.high is None
            or not math.isfinite(self.low)
            or not math.isfinite(self.high)
        ):
            raise IntensityError(
                f'intensity mode "{self.mode}" needs finite low and high, got {self.low}, {self.high}'
            )
        if not self.low < self.high:
            raise IntensityError(f"intensity low must be below high, got low={self.low}, high={self.high}")
        if self.mode == "percentiles" and not 0 <= self.low < self.high <= 100:
            raise IntensityError(f"percentiles must lie in [0, 100], got {self.low}, {self.high}")
        scale = 1 / (self.high - self.low)  # low < high, checked above
        if self.mode == "range" and scale * max(abs(self.low), abs(self.high), 1) >= float(
            np.finfo(np.float32).max
        ):
            raise IntensityError(
                f"intensity range {self.low:g}..{self.high:g} is too narrow to scale in float32 (1 / (high - low) = "
                f"{scale:.3g}); give the range the image's values span, e.g. range:0,4095 for 12-bit data"
            )

    @classmethod
    def parse(cls, text: str) -> Intensity:
        """``"dtype"``, ``"range:0,4095"`` or ``"percentiles:1,99.8"`` (as the front ends take it)."""
        mode, _, values = text.strip().partition(":")
        if mode == "dtype" and not values:
            return cls()
        try:
            low, high = (float(v) for v in values.split(","))
        except ValueError:
            raise IntensityError(
                f"the intensity {text!r} is not understood",
                fix=intensity_fix("give one of", "dtype", "range:LOW,HIGH", "percentiles:LOW,HIGH"),
            ) from None
        return cls(mode, low, high)

    @classmethod
    def of(cls, value: Intensity | str | None) -> Intensity | None:
        """``value`` as an Intensity: one as it is, its text parsed (:meth:`parse`), None kept.

        >>> Intensity.of("range:0,4095")
        Intensity(mode='range', low=0.0, high=4095.0)
        """
        if value is None or isinstance(value, Intensity):
            return value
        if isinstance(value, str):
            return cls.parse(value)
        raise IntensityError(
            f"intensity is a {type(value).__name__}; give a densecnn.io.intensity.Intensity or its text: 'dtype', "
            "'range:LOW,HIGH' or 'percentiles:LOW,HIGH'"
        )

    @classmethod
    def from_json(cls, value: dict | None) -> Intensity:
        return cls() if value is None else cls(value["mode"], value.get("low"), value.get("high"))

    def to_json(self) -> dict:
        return (
            {"mode": self.mode}
            if self.mode == "dtype"
            else {"mode": self.mode, "low": self.low, "high": self.high}
        )

    def __str__(self) -> str:
        return self.mode if self.mode == "dtype" else f"{self.mode}:{self.low:g},{self.high:g}"

    def scaling(self, sample: np.ndarray, *, floats_in_unit_range: bool = True) -> Scaling:
        """The scaling of an image from a ``sample`` of its raw values (any shape, the image's dtype), after the
        checks above (NaN and infinite values are left out of it); ``floats_in_unit_range``: whether mode "dtype"
        expects floats in [0, 1] (images and volumes; not signals). Raises :class:`~densecnn.errors.IntensityError`."""
        if sample.dtype == np.bool_:  # False and True are 0 and 1, as they are as floats
            sample = sample.view(np.uint8)
            if self.mode == "dtype":
                return Scaling(0.0, 1.0, _constant(sample))
        if sample.dtype.kind == "f":  # non-finite values are refused with their positions once scaled
            sample = sample[np.isfinite(sample)]
        if self.mode == "range":
            return Scaling(self.low, self.high, _constant(sample))
        if sample.size == 0:
            return Scaling(0.0, 1.0)
        if self.mode == "percentiles":
            return self._percentile_scaling(sample)
        return _dtype_scaling(sample, floats_in_unit_range)

    def _percentile_scaling(self, sample: np.ndarray) -> Scaling:
        constant = _constant(sample)
        if constant is not None:  # x - low is 0 everywhere: the image scales to 0
            return Scaling(constant, constant + 1.0, constant)
        low, high = (float(v) for v in np.percentile(sample, (self.low, self.high)))
        if not low < high:
            raise IntensityError(
                f"the image's {self.low:g}th and {self.high:g}th percentiles are both {low:g} (its values vary only "
                "beyond them), so percentile scaling would divide by zero",
                fix=intensity_fix("give a fixed range", "range:LOW,HIGH"),
            )
        return Scaling(low, high)


def _constant(sample: np.ndarray) -> float | None:
    """The one value ``sample`` holds, or None (also for an empty sample)."""
    if sample.size == 0:
        return None
    lowest, highest = sample.min().item(), sample.max().item()
    return lowest if lowest == highest else None


def _dtype_scaling(sample: np.ndarray, floats_in_unit_range: bool) -> Scaling:
    lowest, highest = sample.min().item(), sample.max().item()
    constant = lowest if lowest == highest else None
    if sample.dtype.kind in "ui":
        return _integer_scaling(sample.dtype, lowest, highest, constant)
    if floats_in_unit_range and (lowest < -FLOAT_SLACK or highest > 1 + FLOAT_SLACK):
        raise IntensityError(
            f"the float image holds values in [{lowest:.4g}, {highest:.4g}], but the model expects floats in [0, 1] "
            "(its intensity mode is dtype)",
            fix=intensity_fix(ADVICE, _float_range(lowest, highest), PERCENTILES),
        )
    return Scaling(0.0, 1.0, constant)


def _float_range(lowest: float, highest: float) -> str:
    """The range to suggest for floats beyond [0, 1]: that of the fewest bits holding non-negative values beyond
    25.5 (camera data stored as floats: 0..255, 0..4095, ...), else the values' own bounds rounded outwards to two
    significant digits, so that the image spans the model's [0, 1] rather than a sliver of it.

    >>> _float_range(0.001, 4.998), _float_range(0.0, 200.0), _float_range(0.0, 3000.0), _float_range(-3.2, 7.01)
    ('range:0,5', 'range:0,255', 'range:0,4095', 'range:-3.2,7.1')
    """
    if lowest >= 0 and highest > 25.5:
        return _bit_depth_range(0, math.ceil(highest))
    low = 0.0 if lowest >= 0 else -_round_up(-lowest)
    return f"range:{low:g},{_round_up(highest):g}"


def _round_up(value: float) -> float:
    """``value`` > 0 rounded up to two significant digits."""
    step = 10.0 ** (math.floor(math.log10(value)) - 1)
    return math.ceil(value / step - 1e-9) * step


def _integer_scaling(dtype: np.dtype, lowest: int, highest: int, constant: int | None) -> Scaling:
    """Integers by their dtype's range; data wider than 8 bits that varies within a sliver of it is refused."""
    info = np.iinfo(dtype)
    used = (highest - min(lowest, 0)) / info.max
    if info.bits > 8 and constant is None and used < MIN_RANGE_USE:
        raise IntensityError(
            f"the image uses {lowest}..{highest} of {dtype}'s {min(info.min, 0)}..{info.max} ({100 * used:.2g}% of "
            "the range): "
            "scaled by its dtype's range it is all but black, and would be labelled as such",
            fix=intensity_fix(ADVICE, _bit_depth_range(lowest, highest), PERCENTILES),
        )
    return Scaling(0.0, float(info.max), constant)


def _bit_depth_range(lowest: int, highest: int) -> str:
    """The range of the fewest bits (8, 10, 12, ...) holding ``lowest..highest``, as for a camera of that bit
    depth whose data is stored in a wider dtype: ``"range:0,4095"`` for values up to 4095."""
    if lowest < 0:
        return "range:LOW,HIGH"
    bits = max(8, highest.bit_length() + highest.bit_length() % 2)
    return f"range:0,{2**bits - 1}"


def require_finite(
    values: np.ndarray | torch.Tensor,
    *,
    channel_axis: int | None = None,
    origin: tuple[int, ...] | None = None,
    scaled_by: Scaling | None = None,
) -> None:
    """Refuse ``values`` holding NaN or infinite entries (in float64 arrays, also values beyond float32's range,
    which the model's input cannot hold), naming how many pixels and the first one's position: in the spatial axes
    (``channel_axis`` left out), shifted by ``origin`` (a window's first pixel in the whole image). ``scaled_by``:
    the values are a finite image scaled by it (and normalised), so what is not finite overflowed there
    (:class:`~densecnn.errors.IntensityError`, naming the scaling)."""
    if isinstance(values, torch.Tensor):
        bad = ~torch.isfinite(values)
        if channel_axis is not None:
            bad = bad.any(dim=channel_axis)
        if not bad.any():
            return
        count, first = int(bad.sum()), bad.nonzero()[0].tolist()
    else:
        if values.dtype.kind != "f":
            return
        with np.errstate(invalid="ignore"):
            bad = ~np.isfinite(values)
            if values.dtype.itemsize > 4:
                bad |= np.abs(values) > np.finfo(np.float32).max
        if channel_axis is not None:
            bad = bad.any(axis=channel_axis)
        if not bad.any():
            return
        count, first = int(bad.sum()), [int(i) for i in np.argwhere(bad)[0]]
    if origin is not None:
        first = [i + o for i, o in zip(first, origin)]
    if scaled_by is not None:
        raise IntensityError(
            f"scaled by {scaled_by.low:g}..{scaled_by.high:g} -> 0..1 (and normalised), {count:,} pixels go beyond "
            f"float32's range, the first at position {tuple(first)}: the image's values lie far outside that "
            "range; give the intensity range the image's values span"
        )
    raise NonFiniteInputError(
        f"the image has {count:,} {'pixel' if count == 1 else 'pixels'} holding NaN or infinite values (beyond "
        f"float32's range counts too), the first at position {tuple(first)}; no label map computed from them means "
        "anything: send finite values",
        fix=NO_DATA_FIX,
    )


def sample_windows(spatial_shape: tuple[int, ...], pixels: int | None = None) -> list[tuple[slice, ...]]:
    """The windows an image's intensity sample is read from: the whole image when it has at most ``pixels``
    pixels, otherwise windows of :data:`SAMPLE_WINDOW` per side (shorter axes whole) on an even grid over it, about
    ``pixels`` in all.

    >>> sample_windows((100, 100))
    [(slice(0, 100, None), slice(0, 100, None))]
    >>> len(sample_windows((20000, 20000)))
    64
    """
    pixels = pixels or SAMPLE_PIXELS
    if math.prod(spatial_shape) <= pixels:
        return [tuple(slice(0, n) for n in spatial_shape)]
    sides = [min(n, SAMPLE_WINDOW) for n in spatial_shape]
    count = max(1, pixels // math.prod(sides))
    per_axis = max(1, round(count ** (1 / len(spatial_shape))))
    starts = [
        sorted({round(i * (n - s) / max(1, per_axis - 1)) for i in range(per_axis)}) if n > s else [0]
        for n, s in zip(spatial_shape, sides)
    ]
    grid = np.stack(np.meshgrid(*starts, indexing="ij"), -1).reshape(-1, len(spatial_shape))
    return [tuple(slice(int(a), int(a) + s) for a, s in zip(corner, sides)) for corner in grid]
