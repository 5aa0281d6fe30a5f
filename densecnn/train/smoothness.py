"""The smoothness term of training from strokes: a relaxed Potts penalty on the class probabilities of neighbouring
pixels, weighted by how alike their image values are, over every pixel of the training images.

Strokes say what each class looks like, never where it ends: a skeleton stroke through a cell shows its middle and
nothing of its border. The term costs ``w · (1 − Σₖ pₖ qₖ)`` for neighbours with class probabilities ``p`` and ``q``:
a label change costs little where the image changes (``w`` small) and much where it does not, so the classes learnt
from the strokes spread to the edges of the image rather than to wherever the features last looked like a stroke.
The weight of neighbours with values ``a`` and ``b`` is ``exp(−β ‖a − b‖²)``, ``β = 1 / (2 · mean ‖a − b‖²)`` over
the image's neighbour pairs (GrabCut's contrast weight: no parameter to set).

After "On Regularized Losses for Weakly-supervised CNN Segmentation" (Tang, Perazzi, Djelouah, Ben Ayed, Schroers and
Boykov, ECCV 2018) and "GrabCut: Interactive Foreground Extraction using Iterated Graph Cuts" (Rother, Kolmogorov and
Blake, SIGGRAPH 2004).

>>> pairs = NeighbourPairs([torch.rand(3, 64, 64)])
>>> drawn = pairs.draw(256, torch.Generator().manual_seed(0))
>>> [(n, p.shape, q.shape, w.shape) for n, p, q, w in drawn]
[(0, torch.Size([256]), torch.Size([256]), torch.Size([256]))]
"""

from __future__ import annotations

import itertools
import math

import torch


class NeighbourPairs:
    """Pairs of neighbouring pixels of a set of images (8-connected; 26-connected in volumes), drawn uniformly over
    all their pixels, with their contrast weights.

    ``images``: (C, *spatial) tensors, as the net sees them (normalised). Pixels are flat indices into an image's
    spatial axes (row-major).
    """

    def __init__(self, images: list[torch.Tensor]):
        self.images = [image.reshape(image.shape[0], -1) for image in images]  # (C, pixels) each
        self.shapes = [tuple(image.shape[1:]) for image in images]
        dims = len(self.shapes[0]) if images else 0
        # (O, dims): every offset to a neighbour
        self.offsets = torch.tensor([o for o in itertools.product((-1, 0, 1), repeat=dims) if any(o)])
        self.betas = [_contrast(image) for image in images]
        self.sizes = torch.tensor([math.prod(shape) for shape in self.shapes], dtype=torch.float64)

    def draw(
        self, count: int, generator: torch.Generator
    ) -> list[tuple[int, torch.Tensor, torch.Tensor, torch.Tensor]]:
        """``count`` pairs in all: per image drawn from, ``(index, p, q, weights)``, (n,) each: flat pixel indices
        of a pixel and of one of its neighbours (an offset that would leave the image is taken the other way), and
        their contrast weights."""
        images = torch.multinomial(self.sizes, count, replacement=True, generator=generator)  # (count,)
        drawn = []
        for index in images.unique().tolist():
            n = int((images == index).sum())
            shape = torch.tensor(self.shapes[index])  # (dims,)
            pixels = int(self.sizes[index])
            flat = (torch.rand(n, generator=generator, dtype=torch.float64) * pixels).long()
            p = _unravel(flat.clamp(max=pixels - 1), shape)  # (n, dims)
            offset = self.offsets[torch.randint(len(self.offsets), (n,), generator=generator)]  # (n, dims)
            q = p + offset
            outside = (q < 0) | (q >= shape)
            q = torch.where(outside, p - offset, q).clamp(min=torch.zeros_like(shape), max=shape - 1)
            p_flat, q_flat = _ravel(p, shape), _ravel(q, shape)
            values = self.images[index]  # (C, pixels)
            distance = (values[:, p_flat] - values[:, q_flat]).pow(2).sum(0)  # (n,)
            drawn.append((index, p_flat, q_flat, torch.exp(-self.betas[index] * distance)))
        return drawn


def potts(p: torch.Tensor, q: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """The relaxed Potts penalty of neighbours' class probabilities ``p`` and ``q`` (N, K) with ``weights`` (N,):
    the mean of ``w · (1 − Σₖ pₖ qₖ)``, 0 where both are sure of the same class, ``w`` where they are sure of two.

    >>> sure = torch.tensor([[1.0, 0.0]])
    >>> float(potts(sure, sure, torch.ones(1))), float(potts(sure, sure.flip(1), torch.ones(1)))
    (0.0, 1.0)
    """
    return (weights * (1 - (p * q).sum(1))).mean()


def _contrast(image: torch.Tensor) -> float:
    """GrabCut's β of a (C, *spatial) image: 1 / (2 · the mean squared difference of neighbours along each axis)."""
    squares = [
        torch.diff(image.double(), dim=axis).pow(2).sum(0).mean()
        for axis in range(1, image.dim())
        if image.shape[axis] > 1
    ]
    mean = float(torch.stack(squares).mean()) if squares else 0.0
    return 1 / (2 * mean) if mean > 0 else 0.0


def _unravel(flat: torch.Tensor, shape: torch.Tensor) -> torch.Tensor:
    """(n,) row-major flat indices -> (n, dims) coordinates."""
    coordinates = []
    for size in reversed(shape.tolist()):
        coordinates.append(flat % size)
        flat = flat // size
    return torch.stack(coordinates[::-1], 1)


def _ravel(coordinates: torch.Tensor, shape: torch.Tensor) -> torch.Tensor:
    """(n, dims) coordinates -> (n,) row-major flat indices."""
    strides = torch.tensor([math.prod(shape.tolist()[axis + 1 :]) for axis in range(len(shape))])
    return (coordinates * strides).sum(1)
