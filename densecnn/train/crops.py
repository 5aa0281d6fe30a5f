"""Random training crops with their patch context, and flip/rot90 augmentation.

A crop of c×c labels comes with the image context its pixels' patches need, cut from the image padded with the
model's padding mode: every selected pixel then sees exactly the patch the classical patch sampler would cut from
the whole image. Flips and quarter turns are applied to crop and context together, before the context is trimmed
to the patch convention (top/left ⌊(P-1)/2⌋, bottom/right ⌊P/2⌋), so they stay exact for even P too.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..padding import pad_image


@dataclass
class Crop:
    """``image`` (C, c+Ph-1, c+Pw-1): the context of ``labels`` (c, c); ``image[:, i:i+Ph, j:j+Pw]`` is the patch
    of label pixel (i, j)."""

    image: torch.Tensor
    labels: torch.Tensor


class CropSampler:
    """Cuts random c×c crops (plus context) from images normalised for the model.

    Args:
        images: (C, H, W) float tensors, already normalised.
        labels: (H, W) int64 tensors.
        patch_size: (Ph, Pw) of the model.
        padding_mode: how the image is extended beyond its border.
        crop: the crop side c (must fit in every image).
        flip, rot90: random flips / quarter turns.
    """

    def __init__(self, images, labels, *, patch_size, padding_mode, crop, flip, rot90):
        self.patch_size, self.crop, self.flip, self.rot90 = patch_size, crop, flip, rot90
        self.margin = max(patch_size) - 1  # square context, so quarter turns keep it valid
        margin = (self.margin, self.margin)
        self.padded = [pad_image(image[None], margin, margin, padding_mode)[0] for image in images]
        self.labels = labels

    def sample(self, index: int, generator: torch.Generator) -> Crop:
        """A random crop of image ``index``, with all randomness drawn from ``generator``."""
        labels = self.labels[index]
        height, width = labels.shape
        c, m = self.crop, self.margin
        top = int(torch.randint(0, height - c + 1, (1,), generator=generator))
        left = int(torch.randint(0, width - c + 1, (1,), generator=generator))
        image = self.padded[index][:, top : top + c + 2 * m, left : left + c + 2 * m]  # (C, c+2m, c+2m)
        crop_labels = labels[top : top + c, left : left + c]  # (c, c)
        image, crop_labels = self._augment(image, crop_labels, generator)
        (ph, pw), before = self.patch_size, [(p - 1) // 2 for p in self.patch_size]
        row, col = m - before[0], m - before[1]
        return Crop(
            image[:, row : row + c + ph - 1, col : col + c + pw - 1].contiguous(), crop_labels.contiguous()
        )

    def _augment(self, image, labels, generator):
        flips = torch.randint(0, 2, (2,), generator=generator).tolist() if self.flip else [0, 0]
        turns = int(torch.randint(0, 4, (1,), generator=generator)) if self.rot90 else 0
        for axis, flipped in zip((-2, -1), flips, strict=True):
            if flipped:
                image, labels = image.flip(axis), labels.flip(axis)
        if turns:
            image, labels = image.rot90(turns, (-2, -1)), labels.rot90(turns, (-2, -1))
        return image, labels


def sample_generator(seed: int, epoch: int, position: int) -> torch.Generator:
    """The generator of one sample, keyed by the run seed, the epoch and the sample's position in the epoch.

    Keying by the GLOBAL position (not by process) makes a run on N processes draw exactly the crops, flips and
    masks of a single-process run with the same global batch, and lets a resumed run redraw them exactly.
    """
    state = np.random.SeedSequence([seed, epoch, position]).generate_state(2, dtype=np.uint32)
    return torch.Generator().manual_seed((int(state[0]) >> 1) << 32 | int(state[1]))  # < 2**63
