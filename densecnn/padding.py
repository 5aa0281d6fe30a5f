"""The image padding convention shared by the dense net and the patch scanners.

Pixel (i, j)'s P×P patch covers rows i - ⌊(P-1)/2⌋ … i + ⌊P/2⌋ (columns alike), so a whole image is padded by
⌊(P-1)/2⌋ at the top/left and ⌊P/2⌋ at the bottom/right. Signals and volumes follow the same rule along each of their
spatial axes (a patch of (Pd, Ph, Pw) voxels is padded by ⌊(P-1)/2⌋ before and ⌊P/2⌋ after along each axis).

Padding modes:
- ``"zeros"``: zeros outside the image.
- ``"replicate"``: the nearest edge pixel.
- ``"reflect"``: mirror about the edge pixel without repeating it (``numpy.pad(mode="reflect")``), repeated as often as
  needed, so an image smaller than the patch is still padded (a 1-pixel-wide axis reflects onto itself).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .errors import InvalidInputError
from .geometry import Size

PADDING_MODES = ("zeros", "reflect", "replicate")


def check_padding_mode(padding_mode: str) -> str:
    if padding_mode not in PADDING_MODES:
        raise InvalidInputError(
            f"padding_mode={padding_mode!r} is not supported; use one of {', '.join(PADDING_MODES)}"
        )
    return padding_mode


def patch_offsets(patch_size: int) -> tuple[int, int]:
    """(before, after): how far a patch of this size reaches before and after its centre pixel."""
    return (patch_size - 1) // 2, patch_size // 2


def dense_padding(patch_size: Size, receptive_field: Size) -> tuple[Size, Size]:
    """(before, after) per axis for a dense net: the patch centre's offsets, with ``after`` cut to what the dense ops
    consume (R - 1 in all), so the output has the image's size. ``after`` is negative where R < P - before.

    >>> dense_padding((133, 133), (133, 133))
    ((66, 66), (66, 66))
    """
    before = tuple(patch_offsets(p)[0] for p in patch_size)
    return before, tuple(r - 1 - b for r, b in zip(receptive_field, before, strict=True))


def source_index(positions: torch.Tensor, length, padding_mode: str) -> torch.Tensor:
    """For padded ``positions`` along an axis of ``length`` (an int, or a 0-d tensor while tracing for ONNX), the
    index of the image pixel each one copies: the nearest (``replicate``) or the mirrored one (``reflect``).

    >>> source_index(torch.arange(-2, 5), 3, "reflect")
    tensor([2, 1, 0, 1, 2, 1, 0])
    """
    length = torch.as_tensor(length, device=positions.device)
    if padding_mode == "replicate":
        return torch.minimum(positions.clamp(min=0), length - 1)
    period = torch.clamp(
        2 * (length - 1), min=1
    )  # reflect: ... 2 1 [0 1 2 ... L-1] L-2 ...; a 1-pixel axis: itself
    folded = positions.remainder(period)
    return torch.where(folded < length, folded, period - folded)


def pad_image(x: torch.Tensor, before: Size, after: Size, padding_mode: str) -> torch.Tensor:
    """Pad (N, C, *spatial) by ``before[a]`` pixels before and ``after[a]`` after along each spatial axis ``a``, in
    ``padding_mode``. A negative ``after`` crops that many pixels instead.

    >>> pad_image(torch.arange(3.).view(1, 1, 1, 3), (0, 2), (0, 2), "reflect")
    tensor([[[[2., 1., 0., 1., 2., 1., 0.]]]])
    >>> pad_image(torch.arange(3.).view(1, 1, 3), (1,), (-1,), "replicate")  # a signal (N, C, L)
    tensor([[[0., 0., 1.]]])
    """
    spatial = tuple(x.shape[2:])
    if padding_mode == "zeros":
        widths = [w for b, a in zip(reversed(before), reversed(after), strict=True) for w in (b, max(a, 0))]
        padded = F.pad(x, widths)
        return padded[(..., *(slice(0, b + s + a) for b, s, a in zip(before, spatial, after, strict=True)))]
    # one gather over every axis at once: the padded array is the only copy (a gather per axis made one per axis,
    # which on a thin image is as large as the result: twice the memory the callers' estimates count)
    sources = [
        source_index(torch.arange(-b, s + a, device=x.device), s, padding_mode).view(
            [-1 if other == axis else 1 for other in range(len(spatial))]
        )
        for axis, (b, s, a) in enumerate(zip(before, spatial, after, strict=True))
    ]  # one (1, ..., n_axis, ..., 1) index per axis, broadcast against the others
    return x[(slice(None), slice(None), *sources)]


def padded_window(
    x: torch.Tensor, before: Size, window: tuple[tuple[int, int], ...], padding_mode: str
) -> torch.Tensor:
    """The window ``[start, stop)`` per spatial axis, in padded coordinates, of ``x`` padded by ``before`` in
    ``padding_mode``: equal to slicing :func:`pad_image`'s result, computed from ``x`` alone, so a tile's input costs
    its own size, not a padded copy of the whole image (a 1×3,000,000 image padded by 39 rows is 40 times its size).

    >>> x = torch.arange(5.).view(1, 1, 5)
    >>> padded_window(x, (2,), ((0, 4),), "reflect")  # pad_image(x, (2,), (2,), "reflect")[..., 0:4]
    tensor([[[2., 1., 0., 1.]]])
    """
    spatial = tuple(x.shape[2:])
    if padding_mode == "zeros":
        out = x.new_zeros((*x.shape[:2], *(stop - start for start, stop in window)))
        source, target = [], []
        for (start, stop), b, s in zip(window, before, spatial, strict=True):
            low, high = max(start - b, 0), min(stop - b, s)  # the image pixels the window holds
            high = max(high, low)
            source.append(slice(low, high))
            target.append(slice(low + b - start, high + b - start))
        out[(slice(None), slice(None), *target)] = x[(slice(None), slice(None), *source)]
        return out
    sources = [
        source_index(torch.arange(start - b, stop - b, device=x.device), s, padding_mode).view(
            [-1 if other == axis else 1 for other in range(len(spatial))]
        )
        for axis, ((start, stop), b, s) in enumerate(zip(window, before, spatial, strict=True))
    ]  # one (1, ..., n_axis, ..., 1) index per axis, broadcast against the others: one gather, one copy
    return x[(slice(None), slice(None), *sources)]


def pad_for_patches(x: torch.Tensor, patch_size: Size, padding_mode: str) -> torch.Tensor:
    """Pad (N, C, *spatial) so that every window of ``patch_size`` in the result is the patch of one pixel:
    (N, C, *(S + P - 1)).

    The padding of training crops and of the patch scanners; the dense net pads by :func:`dense_padding`.
    """
    offsets = [patch_offsets(p) for p in patch_size]
    return pad_image(x, tuple(b for b, _ in offsets), tuple(a for _, a in offsets), padding_mode)
