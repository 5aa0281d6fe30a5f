"""The image padding convention shared by the dense net and the patch scanners.

Pixel (i, j)'s P×P patch covers rows i - ⌊(P-1)/2⌋ … i + ⌊P/2⌋ (columns alike), so a whole image is padded by
⌊(P-1)/2⌋ at the top/left and ⌊P/2⌋ at the bottom/right.

Padding modes:
- ``"zeros"``: zeros outside the image.
- ``"replicate"``: the nearest edge pixel.
- ``"reflect"``: mirror about the edge pixel without repeating it (``numpy.pad(mode="reflect")``), repeated as often as
  needed, so an image smaller than the patch is still padded (a 1-pixel-wide axis reflects onto itself).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

PADDING_MODES = ("zeros", "reflect", "replicate")


def check_padding_mode(padding_mode: str) -> str:
    if padding_mode not in PADDING_MODES:
        raise ValueError(
            f"padding_mode={padding_mode!r} is not supported; use one of {', '.join(PADDING_MODES)}"
        )
    return padding_mode


def patch_offsets(patch_size: int) -> tuple[int, int]:
    """(before, after): how far a patch of this size reaches before and after its centre pixel."""
    return (patch_size - 1) // 2, patch_size // 2


def _source_index(length: int, before: int, after: int, padding_mode: str, device) -> torch.Tensor:
    """Index into an axis of ``length`` for each of the ``before + length + after`` padded positions."""
    positions = torch.arange(-before, length + after, device=device)
    if padding_mode == "replicate" or length == 1:
        return positions.clamp(0, length - 1)
    period = 2 * (length - 1)  # reflect: ... 2 1 [0 1 2 ... L-1] L-2 ...
    folded = positions.remainder(period)
    return torch.where(folded < length, folded, period - folded)


def pad_image(
    x: torch.Tensor, before: tuple[int, int], after: tuple[int, int], padding_mode: str
) -> torch.Tensor:
    """Pad (N, C, H, W) by ``before=(top, left)`` and ``after=(bottom, right)`` pixels in ``padding_mode``.

    A negative ``after`` crops that many rows/columns instead.

    >>> pad_image(torch.arange(3.).view(1, 1, 1, 3), (0, 2), (0, 2), "reflect")
    tensor([[[[2., 1., 0., 1., 2., 1., 0.]]]])
    """
    top, left = before
    bottom, right = after
    if padding_mode == "zeros":
        padded = F.pad(x, (left, max(right, 0), top, max(bottom, 0)))
        return padded[..., : top + x.shape[-2] + bottom, : left + x.shape[-1] + right]
    rows = _source_index(x.shape[-2], top, bottom, padding_mode, x.device)
    cols = _source_index(x.shape[-1], left, right, padding_mode, x.device)
    return x.index_select(-2, rows).index_select(-1, cols)


def pad_for_patches(x: torch.Tensor, patch_size: tuple[int, int], padding_mode: str) -> torch.Tensor:
    """Pad (N, C, H, W) so that every P×P window of the result is the patch of one pixel: (N, C, H+Ph-1, W+Pw-1)."""
    (top, bottom), (left, right) = patch_offsets(patch_size[0]), patch_offsets(patch_size[1])
    return pad_image(x, (top, left), (bottom, right), padding_mode)
