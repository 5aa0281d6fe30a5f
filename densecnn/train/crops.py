"""Random training crops with their patch context, and flip/rot90 augmentation, for signals, images and volumes.

A crop of labels comes with the input context its pixels' patches need, cut from the input padded with the
model's padding mode: every selected pixel then sees exactly the patch the classical patch sampler would cut from
the whole image. Flips (along every spatial axis) and quarter turns (in the (H, W) plane only: volumes are often
anisotropic along D, and a signal has no plane) are applied to crop and context together, before the context is
trimmed to the patch convention (per axis ⌊(P-1)/2⌋ before, ⌊P/2⌋ after), so they stay exact for even P too.

One code path serves 1, 2 and 3 spatial axes: sizes are tuples with one entry per axis, (c,), (ch, cw) or
(cd, ch, cw).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..errors import InvalidInputError
from ..geometry import Size, ntuple
from ..padding import pad_image


@dataclass
class Crop:
    """``image`` (C, c1+P1-1, ..., cn+Pn-1): the context of ``labels`` (c1, ..., cn); in 2-D
    ``image[:, i:i+Ph, j:j+Pw]`` is the patch of label pixel (i, j), and likewise along every axis."""

    image: torch.Tensor
    labels: torch.Tensor


class CropSampler:
    """Cuts random crops (plus context) from inputs normalised for the model.

    Args:
        images: (C, *spatial) float tensors, already normalised: (C, L), (C, H, W) or (C, D, H, W).
        labels: (*spatial) int64 tensors.
        patch_size: the model's patch, one entry per spatial axis.
        padding_mode: how the input is extended beyond its border.
        crop: the crop size, an int (the same on every axis) or one entry per axis (must fit in every input).
        flip: random flips along every spatial axis.
        rot90: random quarter turns in the (H, W) plane (the last two axes; needs equal H and W crop sizes);
            a signal has no plane and is never turned.

    >>> sampler = CropSampler([volume], [labels], patch_size=(5, 9, 9), padding_mode="reflect", crop=(8, 32, 32),
    ...                       flip=True, rot90=True)
    >>> sampler.sample(0, torch.Generator().manual_seed(0)).image.shape   # (C, 8+5-1, 32+9-1, 32+9-1)
    torch.Size([1, 12, 40, 40])
    """

    def __init__(self, images, labels, *, patch_size, padding_mode, crop, flip, rot90):
        dims = len(patch_size)
        self.patch_size, self.crop, self.flip = tuple(patch_size), ntuple(crop, dims, "crop"), flip
        self.rot90 = rot90 and dims >= 2
        if self.rot90 and self.crop[-2] != self.crop[-1]:
            raise InvalidInputError(
                f"crop {self.crop}: quarter turns need equal H and W crop sizes; make them equal or turn rot90 off"
            )
        self.margin = context_margin(self.patch_size)
        self.padded = [pad_spatial(image, self.margin, self.margin, padding_mode) for image in images]
        self.labels = labels

    def sample(self, index: int, generator: torch.Generator, centre: Size | None = None) -> Crop:
        """A random crop of input ``index``, with all randomness drawn from ``generator``; with ``centre`` (one
        coordinate per spatial axis) a crop that holds that pixel at a random place, shifted inside the input where
        it is near a border (so crops are drawn where the labels are)."""
        labels = self.labels[index]
        if centre is None:
            starts = [
                int(torch.randint(0, size - c + 1, (1,), generator=generator))
                for size, c in zip(labels.shape, self.crop, strict=True)
            ]
        else:
            starts = [
                min(max(x - int(torch.randint(0, c, (1,), generator=generator)), 0), size - c)
                for x, size, c in zip(centre, labels.shape, self.crop, strict=True)
            ]
        # (C, c1+2m1, ..., cn+2mn) and (c1, ..., cn)
        image = self.padded[index][(slice(None), *windows(starts, self.crop, self.margin))]
        crop_labels = labels[windows(starts, self.crop, (0,) * len(starts))]
        image, crop_labels = self._augment(image, crop_labels, generator)
        kept = tuple(
            slice(m - (p - 1) // 2, m - (p - 1) // 2 + c + p - 1)  # the patch convention's context
            for c, p, m in zip(self.crop, self.patch_size, self.margin, strict=True)
        )
        image = image[(slice(None), *kept)]  # (C, c1+P1-1, ..., cn+Pn-1)
        return Crop(image.contiguous(), crop_labels.contiguous())

    def _augment(self, image, labels, generator):
        dims = labels.dim()
        flips = torch.randint(0, 2, (dims,), generator=generator).tolist() if self.flip else [0] * dims
        turns = int(torch.randint(0, 4, (1,), generator=generator)) if self.rot90 else 0
        for axis, flipped in zip(range(-dims, 0), flips, strict=True):
            if flipped:
                image, labels = image.flip(axis), labels.flip(axis)
        if turns:
            image, labels = image.rot90(turns, (-2, -1)), labels.rot90(turns, (-2, -1))
        return image, labels


def context_margin(patch_size: Size) -> Size:
    """Context kept on each side of a crop before augmenting: P-1 per axis, the same in the (H, W) plane (the larger
    of Ph-1 and Pw-1) so that a quarter turn keeps it valid."""
    margin = [p - 1 for p in patch_size]
    if len(margin) >= 2:
        margin[-2:] = [max(margin[-2:])] * 2
    return tuple(margin)


def windows(starts, sizes, margin) -> tuple[slice, ...]:
    """Per axis, the slice ``start : start + size + 2·margin``."""
    return tuple(slice(s, s + c + 2 * m) for s, c, m in zip(starts, sizes, margin, strict=True))


def pad_spatial(image: torch.Tensor, before: Size, after: Size, padding_mode: str) -> torch.Tensor:
    """(C, *spatial) padded by ``before[a]`` / ``after[a]`` along spatial axis a, in ``padding_mode``
    (:func:`~densecnn.padding.pad_image`, which takes any number of spatial axes, on a batch of one).

    >>> pad_spatial(torch.arange(3.).view(1, 3), (2,), (1,), "reflect")
    tensor([[2., 1., 0., 1., 2., 1.]])
    """
    return pad_image(image[None], before, after, padding_mode)[0]


def sample_generator(seed: int, epoch: int, position: int) -> torch.Generator:
    """The generator of one sample, keyed by the run seed, the epoch and the sample's position in the epoch.

    Keying by the GLOBAL position (not by process) makes a run on N processes draw exactly the crops, flips and
    masks of a single-process run with the same global batch, and lets a resumed run redraw them exactly.
    """
    state = np.random.SeedSequence([seed, epoch, position]).generate_state(2, dtype=np.uint32)
    return torch.Generator().manual_seed((int(state[0]) >> 1) << 32 | int(state[1]))  # < 2**63
