"""Background skipped (``densecnn predict --foreground``): an output chunk holding no foreground pixel gets the
background label, class 0, without a forward pass, and a block of such chunks is never computed.

Which pixels are foreground:

- ``auto``: a threshold on the image's intensity, as whole-slide tools find tissue: Otsu's threshold (Otsu, "A
  Threshold Selection Method from Gray-Level Histograms") on the channel mean of the intensity sample
  (:func:`~densecnn.io.intensity.sample_windows`, scaled as the model scales its inputs). Foreground is the darker
  side for 3-channel (RGB brightfield: tissue on white glass), the brighter side otherwise (fluorescence: signal on
  black); ``dark`` or ``bright`` says which side instead.
- a mask: a 2-D (3-D) image or array, nonzero where the foreground is, at any resolution: its pixel covers the
  image's pixels in proportion (a 1000² mask of a 50000² slide: each mask pixel covers 50² image pixels).

The decision is per output chunk, whatever the block size, so the labels do not depend on how the work is split;
a chunk is computed (all of it) as soon as one of its pixels is foreground.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import Fix, PredictInputError
from ..io import LazyArray, Scaling, open_lazy_array
from ..io.intensity import sample_windows

BACKGROUND = (
    0  # the class a background chunk is labelled with (densecnn's training takes class 0 as background)
)
MODES = ("auto", "bright", "dark")


@dataclass(frozen=True)
class Foreground:
    """Where the foreground is: pixels beyond ``threshold`` (scaled channel mean; above it when ``bright``), or
    nonzero pixels of ``mask`` (of ``image_shape``'s image)."""

    threshold: float | None = None
    bright: bool = True
    mask: LazyArray | None = None
    image_shape: tuple[int, ...] = ()

    def mask_holds_foreground(self, region: tuple[slice, ...]) -> bool:
        """Whether the mask has a nonzero pixel over the image pixels ``region`` (mask only)."""
        window = tuple(
            slice(r.start * m // n, max(r.start * m // n + 1, -(-r.stop * m // n)))
            for r, m, n in zip(region, self.mask.spatial_shape, self.image_shape, strict=True)
        )
        return bool(np.any(self.mask.read(window)))

    def pixels_hold_foreground(self, pixels: np.ndarray, scaling: Scaling) -> bool:
        """Whether raw ``pixels`` (C, *region) hold a pixel beyond the threshold (threshold only)."""
        mean = scaling.apply_(pixels.mean(axis=0, dtype=np.float32))
        return bool(np.any(mean > self.threshold) if self.bright else np.any(mean < self.threshold))


def foreground(spec: str, source: LazyArray, scaling: Scaling) -> Foreground:
    """The :class:`Foreground` of ``--foreground spec`` ("auto", "bright", "dark" or a mask's path) for ``source``.

    Raises:
        PredictInputError: the mask cannot be read, or has other axes than the image.
    """
    if spec in MODES:
        mean = np.concatenate(
            [_scaled_mean(source.read(w), scaling) for w in sample_windows(source.spatial_shape)]
        )
        bright = source.channels != 3 if spec == "auto" else spec == "bright"
        return Foreground(threshold=otsu(mean), bright=bright)
    mask = open_lazy_array(spec, spatial_dims=len(source.spatial_shape))
    if mask.channels != 1:
        raise PredictInputError(
            f"the foreground mask {spec} has {mask.channels} channels",
            fix=Fix("give a mask of one channel (nonzero: foreground), or a threshold",
                    tuple(("foreground", rule) for rule in ("auto", "bright", "dark"))),
        )  # fmt: skip
    return Foreground(mask=mask, image_shape=source.spatial_shape)


def _scaled_mean(pixels: np.ndarray, scaling: Scaling) -> np.ndarray:
    return scaling.apply_(pixels.mean(axis=0, dtype=np.float32)).ravel()


def otsu(values: np.ndarray, bins: int = 256) -> float:
    """The threshold that maximises the between-class variance of ``values`` (Otsu's method), on a histogram.

    >>> otsu(np.array([0.1] * 50 + [0.9] * 50)) > 0.1
    True
    """
    values = values[np.isfinite(values)]
    low, high = float(values.min()), float(values.max())
    if not low < high:
        return high
    counts, edges = np.histogram(values, bins=bins, range=(low, high))
    centres = (edges[:-1] + edges[1:]) / 2
    weight = np.cumsum(counts)  # pixels at or below each bin
    mass = np.cumsum(counts * centres)
    total, total_mass = weight[-1], mass[-1]
    with np.errstate(divide="ignore", invalid="ignore"):
        mean_low = mass / weight
        mean_high = (total_mass - mass) / (total - weight)
        between = weight * (total - weight) * (mean_low - mean_high) ** 2
    best = int(np.nanargmax(between[:-1]))
    return float(edges[best + 1])
