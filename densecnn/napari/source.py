"""Which pixels of a napari Image layer a model reads: the pyramid level, the spatial axes, the channels, the planes.

Works on the layer's attributes alone (no Qt, no viewer), so it is tested without napari:

- the spatial axes are the layer's last ``len(model.patch_size)`` axes (an RGB layer's colour axis aside);
- the colours of an RGB layer are its channels; otherwise, for a model of C > 1 channels, the non-spatial axis of
  length C nearest the spatial axes (CYX, TCYX, CZYX); with none, the layer is one channel (gray is replicated to
  RGB, RGB turned to gray as :func:`densecnn.io.pixels.unit_planes` does);
- every other axis indexes planes (a 2-D model labels each plane of a stack or time series), each one scaled and
  labelled as an image of its own;
- axes the layer names (napari's ``axis_labels``: ``c``/``channel`` for channels) are read as named: a named channel
  axis is the model's channel axis, and one among the axes the model convolves over (a ZCYX layer for a 3-D model)
  or of another length than the model's channels is refused, since it cannot be read right;
- of a multiscale layer, the level at the model's pixel size (``pixel_size`` in model.json, closest within 20%,
  the layer's ``scale`` read as micrometres), else level 0.

>>> source = LayerSource.of(np.zeros((5, 2, 64, 64)), rgb=False, multiscale=False, scale=(1, 1, 1, 1),
...                         spatial_dims=2, channels=2)
>>> source.channel_axis, source.plane_shape, source.labels_shape
(1, (5,), (5, 64, 64))
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import InvalidInputError

PIXEL_SIZE_TOLERANCE = 0.2  # a level within 20% of the model's pixel size along every spatial axis matches it
# napari axis labels read as the channel axis
CHANNEL_AXIS_NAMES = frozenset({"c", "ch", "channel", "channels"})


@dataclass(frozen=True)
class LayerSource:
    """One level of a layer, and the role of each of its axes.

    Attributes:
        array: the level's array (numpy, dask or zarr: only the windows asked for are read).
        level: its index in the pyramid (0 for a layer that is not multiscale).
        rgb: the last axis holds colours (napari's ``rgb``).
        spatial_axes: the axes the model convolves over (the last ones, colours aside).
        channel_axis: the axis holding the model's channels (None: RGB, or one channel).
        scale: world units per pixel of the labels' axes (the layer's scale at this level, the channel axis left out).
    """

    array: object
    level: int
    rgb: bool
    spatial_axes: tuple[int, ...]
    channel_axis: int | None
    scale: tuple[float, ...]

    @classmethod
    def of(
        cls,
        data,
        *,
        rgb: bool,
        multiscale: bool,
        scale: Sequence[float],
        spatial_dims: int,
        channels: int,
        pixel_size: Sequence[float] | None = None,
        axis_labels: Sequence[str] | None = None,
    ) -> LayerSource:
        """The source of a layer's ``data`` (a list of levels if ``multiscale``), with napari's ``rgb``, level-0
        ``scale`` and ``axis_labels``, for a model of ``spatial_dims`` axes and ``channels`` input channels.

        Raises:
            InvalidInputError: the layer has fewer axes than the model convolves over, or a channel axis it names
                cannot be the model's.
        """
        levels = list(data) if multiscale else [data]
        ndim = len(levels[0].shape) - rgb
        if ndim < spatial_dims:
            raise InvalidInputError(
                f"the model labels {spatial_dims}-D {'volumes' if spatial_dims == 3 else 'images'} but the layer "
                f"has {ndim} axes ({'x'.join(map(str, levels[0].shape[:ndim]))}); pick a layer with at least "
                f"{spatial_dims} axes"
            )
        spatial = tuple(range(ndim - spatial_dims, ndim))
        level, factor = _level(levels, ndim, spatial, scale, pixel_size)
        named = _named_channel_axis(levels[0].shape[:ndim], axis_labels, spatial, channels, rgb)
        channel_axis = None
        if named is not None and levels[0].shape[named] > 1:
            channel_axis = named
        elif channels > 1 and not rgb and named is None:
            candidates = [a for a in range(spatial[0]) if levels[level].shape[a] == channels]
            channel_axis = candidates[-1] if candidates else None
        labels_scale = tuple(s * f for a, (s, f) in enumerate(zip(scale, factor)) if a != channel_axis)
        return cls(levels[level], level, rgb, spatial, channel_axis, labels_scale)

    @property
    def spatial_shape(self) -> tuple[int, ...]:
        return tuple(self.array.shape[a] for a in self.spatial_axes)

    @property
    def plane_axes(self) -> tuple[int, ...]:
        """The axes that index planes: neither spatial nor channels."""
        return tuple(a for a in range(self.spatial_axes[0]) if a != self.channel_axis)

    @property
    def plane_shape(self) -> tuple[int, ...]:
        return tuple(self.array.shape[a] for a in self.plane_axes)

    @property
    def labels_shape(self) -> tuple[int, ...]:
        """The labels' shape: the planes' axes, then the spatial ones."""
        return (*self.plane_shape, *self.spatial_shape)

    def planes(self) -> Iterator[tuple[int, ...]]:
        """The index of each plane along :attr:`plane_axes` (one empty index for a single image)."""
        return itertools.product(*(range(n) for n in self.plane_shape))

    def read(self, plane: tuple[int, ...], region: tuple[slice, ...]) -> np.ndarray:
        """The raw pixels of ``region`` (a slice per spatial axis) of one ``plane``, channels last: (*region, C),
        C being the colours, the channel axis' length, or 1.

        >>> LayerSource.of(np.zeros((3, 8, 8)), rgb=False, multiscale=False, scale=(1, 1, 1), spatial_dims=2,
        ...                channels=3).read((), (slice(0, 4), slice(2, 4))).shape
        (4, 2, 3)
        """
        where = dict(zip(self.plane_axes, plane)) | dict(zip(self.spatial_axes, region))
        index = tuple(where.get(a, slice(None)) for a in range(self.spatial_axes[-1] + 1))
        pixels = np.asarray(self.array[index])  # reads only this window of a dask or zarr array
        if self.channel_axis is not None:  # after the planes' integer indices, it is the first axis left
            return np.moveaxis(pixels, 0, -1)
        return pixels if self.rgb else pixels[..., None]


def _named_channel_axis(
    shape: tuple[int, ...],
    axis_labels: Sequence[str] | None,
    spatial: tuple[int, ...],
    channels: int,
    rgb: bool,
) -> int | None:
    """The axis ``axis_labels`` names as channels (None: none named), checked against the model's ``channels``.

    >>> _named_channel_axis((2, 5, 64, 64), ("c", "z", "y", "x"), (1, 2, 3), 2, False)
    0
    """
    names = [str(label).strip().lower() for label in axis_labels or ()]
    named = [a for a, name in enumerate(names[: len(shape)]) if name in CHANNEL_AXIS_NAMES]
    if not named:
        return None
    axis = named[-1]
    described = "x".join(f"{names[a]}={n}" for a, n in enumerate(shape))
    if axis in spatial:
        raise InvalidInputError(
            f"the layer's axes are {described}: its channel axis '{names[axis]}' is among the last {len(spatial)} "
            f"axes, which the model convolves over; move the channels before them (e.g. CZYX) or split the layer's "
            "channels into layers of their own"
        )
    wanted = 1 if rgb else channels  # an RGB layer's colours are its channels
    if shape[axis] != wanted:
        raise InvalidInputError(
            f"the layer's axes are {described}: it has {shape[axis]} channels on axis '{names[axis]}' but the model "
            f"reads {wanted} there; pick a layer with {wanted} channel{'s' if wanted > 1 else ''} on that axis"
            + (" or split the layer's channels into layers of their own" if wanted == 1 else "")
        )
    return axis


def _level(levels: list, ndim: int, spatial: tuple[int, ...], scale, pixel_size) -> tuple[int, list[float]]:
    """The level to read and its downsampling factor per axis (relative to level 0)."""

    def factor(k: int) -> list[float]:
        return [levels[0].shape[a] / levels[k].shape[a] for a in range(ndim)]

    if pixel_size is None or len(levels) == 1:
        return 0, factor(0)
    wanted = np.asarray(pixel_size, dtype=float)
    errors = [
        np.abs(np.log(np.array([scale[a] * factor(k)[a] for a in spatial]) / wanted)).max()
        for k in range(len(levels))
    ]
    best = int(np.argmin(errors))
    return (best, factor(best)) if errors[best] <= np.log1p(PIXEL_SIZE_TOLERANCE) else (0, factor(0))
