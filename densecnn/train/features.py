"""Training the per-pixel head of a net whose leading layers are fixed (:func:`densecnn.zoo.filter_bank`): the fixed
layers' features of every labelled pixel are computed once, by their dense pass over the image, and each step trains
the head on a sample of them (and, with the smoothness term, on pairs of neighbours among every pixel's features).

This is the masked-error step at its cheapest: with the leading layers fixed, the patch model's loss on a set of
labelled pixels is the head's loss on their features, and a pixel's features in the dense pass equal those of its
own patch. The dense pass costs one pass over the image (or over the blocks of it that hold labels); the patch
minibatch of the same pixels recomputes the fixed layers for every patch.

>>> model, patch = densecnn.zoo.filter_bank(in_channels=3, num_classes=4)
>>> fixed_layers(model)
6
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import torch
from torch import nn

from ..convert import convert
from ..losses import IGNORE_INDEX

ELEMENTWISE = (nn.ReLU, nn.LeakyReLU, nn.ELU, nn.GELU, nn.SiLU, nn.Tanh, nn.Sigmoid, nn.Identity, nn.Dropout)
BATCH_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)
BLOCK_BYTES = 256 * 2**20  # the most feature memory one block of the dense pass takes
KEPT_BYTES = 1024 * 2**20  # the most memory the kept feature maps of a set of images take


def fixed_layers(model: nn.Sequential) -> int:
    """How many leading layers of ``model`` training leaves as they are: those up to the last layer whose
    parameters are all fixed (``requires_grad`` off), when every layer after it is a 1×1 conv or elementwise (a
    per-pixel head); 0 when there are none or the rest is not per-pixel."""
    last = -1
    for index, layer in enumerate(model):
        parameters = list(layer.parameters())
        if parameters and not any(p.requires_grad for p in parameters):
            last = index
    if last < 0 or not all(_per_pixel(layer) for layer in list(model)[last + 1 :]):
        return 0
    return last + 1


def fix_layers(model: nn.Sequential, count: int) -> None:
    """Turn ``requires_grad`` off for the parameters of the first ``count`` layers (a saved model's fixed layers)."""
    for layer in list(model)[:count]:
        for parameter in layer.parameters():
            parameter.requires_grad_(False)


def _per_pixel(layer: nn.Module) -> bool:
    if isinstance(layer, ELEMENTWISE + BATCH_NORMS):  # batch norms as eval mode runs them: per channel
        return True
    if isinstance(layer, (nn.Conv1d, nn.Conv2d, nn.Conv3d)):
        return all(k == 1 for k in layer.kernel_size) and all(s == 1 for s in layer.stride)
    return False


@torch.no_grad()
def standardize(norm: nn.Module, features: torch.Tensor, gathers: torch.Tensor) -> None:
    """Set the statistics of ``norm`` (a batch norm after the fixed layers) from ``features`` (N, F) under the flips
    and turns that training draws (``gathers`` (T, F): each transform's order of the features): each feature's mean
    is taken off and it is divided by the square root of its variance plus the median feature's variance.

    The head then sees features on one scale, where a feature that hardly varies on the labelled pixels (a fine
    derivative on smooth strokes) is not scaled up past the median one, which would make it as loud as the
    features that tell the classes apart (docs/training.md, "How the recipe was chosen").

    Averaged over the transforms, the statistics are the same for a feature and its flipped or turned partner: the
    standardised features permute as the raw ones do."""
    features = features.double()
    mean = features.mean(0)[gathers].mean(0)  # (F,)
    variance = ((features**2).mean(0)[gathers].mean(0) - mean**2).clamp(min=0)  # (F,)
    norm.running_mean.copy_(mean)
    norm.running_var.copy_(variance + variance.median())


class PixelFeatures:
    """The fixed layers' features of the labelled pixels of a set of images.

    ``padded``: the images padded by ``margin`` per spatial axis (as :class:`~densecnn.train.crops.CropSampler`
    pads them); ``prefix``: the model's first layers, the fixed ones; ``patch_size``: the whole model's. The dense
    pass runs by near-cubic blocks (:data:`BLOCK_BYTES` of features each) and only over blocks that hold labelled
    pixels; the feature maps of images are kept (for the next strokes on the same images) while they take at most
    :data:`KEPT_BYTES` in all.
    """

    def __init__(self, prefix: nn.Sequential, patch_size, padding_mode: str, padded, margin):
        self.dense = convert(prefix, patch_size, padding_mode=padding_mode, verify=False)
        self.padded, self.margin, self.patch_size = padded, margin, tuple(patch_size)
        self._maps: dict[int, torch.Tensor] = {}
        # each image's spatial size, without its padding
        self._sizes = [[n - 2 * m for n, m in zip(p.shape[1:], margin, strict=True)] for p in padded]
        map_bytes = sum(self.dense.num_classes * 4 * math.prod(size) for size in self._sizes)
        self._keep = map_bytes <= KEPT_BYTES

    @torch.no_grad()
    def gather(self, labels: list[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
        """(N, F) features and (N,) class ids of the labelled pixels of ``labels`` (one map per image), in the
        order of the images, then row-major."""
        features, targets = [], []
        for index, label_map in enumerate(labels):
            where = np.nonzero(label_map != IGNORE_INDEX)
            if not len(where[0]):
                continue
            features.append(self._features_at(index, where))
            targets.append(torch.from_numpy(label_map[where]))
        if not features:
            return torch.zeros(0, self.dense.num_classes), torch.zeros(0, dtype=torch.int64)
        return torch.cat(features), torch.cat(targets)

    def adopt(self, index: int, other: PixelFeatures, other_index: int) -> None:
        """Take ``other``'s kept features of its image ``other_index`` (the same pixels, padded the same way) as
        those of image ``index``, instead of computing them again."""
        if self._keep and other_index in other._maps:
            self._maps[index] = other._maps[other_index]

    def kept(self, index: int) -> torch.Tensor | None:
        """(*spatial, F) the features of every pixel of image ``index``, pixel-major (a pixel's features are
        contiguous: drawing pixels at random reads whole cache lines), when they are kept (None otherwise)."""
        return self._maps.get(index)

    def _features_at(self, index: int, where: tuple[np.ndarray, ...]) -> torch.Tensor:
        """(n, F) features of image ``index`` at the pixels ``where`` (row-major, as ``np.nonzero`` gives them)."""
        if index in self._maps:
            return self._maps[index][tuple(map(torch.from_numpy, where))]
        blocks = self._blocks(index)
        if self._keep:
            maps = torch.empty(*self._sizes[index], self.dense.num_classes)  # (*spatial, F)
            for block in blocks:
                maps[block] = self._block(index, block).movedim(0, -1)
            self._maps[index] = maps
            return self._features_at(index, where)
        pieces, order = [], []
        points = np.stack(where, 1)  # (n, spatial axes)
        for block in blocks:  # only the blocks holding labelled pixels run
            inside = np.all(
                [(points[:, a] >= s.start) & (points[:, a] < s.stop) for a, s in enumerate(block)], 0
            )
            if not inside.any():
                continue
            at = tuple(torch.from_numpy(points[inside, a] - s.start) for a, s in enumerate(block))
            pieces.append(self._block(index, block)[(slice(None), *at)].T)
            order.append(np.nonzero(inside)[0])
        return torch.cat(pieces)[torch.from_numpy(np.argsort(np.concatenate(order), kind="stable"))]

    def _blocks(self, index: int) -> list[tuple[slice, ...]]:
        """The boxes (a slice per spatial axis) the dense pass over image ``index`` runs by: each holds at most
        :data:`BLOCK_BYTES` of features, and is as near a cube as halving its longest side makes it, so that the
        reach the pass adds around it (the fixed layers' receptive field) is a small part of it also in volumes."""
        size = self._sizes[index]
        most = max(1, BLOCK_BYTES // (self.dense.num_classes * 4))  # pixels of features a block may hold
        side = list(size)
        while math.prod(side) > most:
            longest = int(np.argmax(side))
            side[longest] = -(-side[longest] // 2)
        starts = itertools.product(*(range(0, n, s) for n, s in zip(size, side, strict=True)))
        return [
            tuple(slice(a, min(a + s, n)) for a, s, n in zip(start, side, size, strict=True))
            for start in starts
        ]

    def _block(self, index: int, block: tuple[slice, ...]) -> torch.Tensor:
        """(F, *block) features of ``block`` of image ``index`` by the fixed layers' dense pass over its padded
        window (the block and the receptive field around it)."""
        padded, field = self.padded[index], self.dense.receptive_field
        start = [m - (p - 1) // 2 for m, p in zip(self.margin, self.patch_size, strict=True)]
        window = tuple(
            slice(o + b.start, o + b.stop + r - 1) for o, b, r in zip(start, block, field, strict=True)
        )
        return self.dense.run_padded(padded[(slice(None), *window)][None])[0]


@torch.no_grad()
def dihedral_permutations(dense, in_channels: int, *, seed: int = 0) -> list[torch.Tensor]:
    """The flips and quarter turns of the (H, W) plane (of images, and of each slice of volumes) under which the
    fixed layers' features only change places: for each such transform T, the (F,) index ``perm`` with
    ``features(T(image))[perm[i]]`` at T(p) equal to ``features(image)[i]`` at p. The identity is first, then the
    transforms in the order of :func:`_transform`'s (turns, flip).

    The permutations of a quarter turn and of a flip are found by running ``dense`` (the fixed layers' dense net) on
    test images (:func:`_probes`) and their transforms; the others are their compositions. A generator whose
    features are not a permutation of the others is left out, with the transforms it generates.

    Training then augments features as the crop path augments images: a pixel's features permuted as a flip or
    turn of the image would permute them (:class:`~densecnn.train.strokes.StrokeTrainer`)."""
    field = dense.receptive_field
    identity = torch.arange(dense.num_classes)
    if len(field) not in (2, 3):
        return [identity]
    depth = field[0] + 5 if len(field) == 3 else None
    image = _probes(in_channels, max(field[-2:]) + 5, seed, depth=depth)  # (11, C, [d,] s, s)
    plain = dense.run_padded(image)  # (11, F, *spatial)
    scale = plain.transpose(0, 1).flatten(1).abs().amax(1).clamp(min=1e-12)  # (F,)
    turn, flip = (
        _permutation(dense, image, plain, scale, turns, flipped) for turns, flipped in ((1, False), (0, True))
    )
    powers = [identity]  # the permutations of 0..3 quarter turns
    while turn is not None and len(powers) < 4:
        powers.append(turn[powers[-1]])
    return [f for p in powers for f in ([p] if flip is None else [p, flip[p]])]


def _permutation(dense, image, plain, scale, turns: int, flip: bool) -> torch.Tensor | None:
    """(F,) the permutation of the features under :func:`_transform` (``turns``, ``flip``), or None when the
    transformed image's features are not the plain ones moved and permuted (``scale``: each feature's largest
    magnitude on the plain images)."""
    moved = dense.run_padded(_transform(image, turns, flip)).transpose(0, 1).flatten(1)  # (F, 11·pixels)
    expected = _transform(plain, turns, flip).transpose(0, 1).flatten(1)  # where each feature goes
    distance = torch.cdist(moved, expected, p=float("inf")) / scale[None]  # (F moved, F expected)
    perm = distance.argmin(0)  # feature i of the images is feature perm[i] of the transformed images
    # a match within float32 rounding, never another feature (they differ by far more)
    exact = bool((distance.gather(0, perm[None]) < 1e-4).all())
    return perm if exact and len(set(perm.tolist())) == len(perm) else None


def _probes(channels: int, side: int, seed: int, depth: int | None = None) -> torch.Tensor:
    """(11, C, side, side) test images, or (11, C, depth, side, side) volumes: noise, and noise plus a constant, a
    ramp along y or x, a bowl or a saddle of either sign (the same in every slice), so that every feature of a
    filter bank up to second derivatives, with either sign, is non-zero on one of them and no two of them are
    equal."""
    generator = torch.Generator().manual_seed(seed)
    noise = torch.randn(channels, *((depth,) if depth else ()), side, side, generator=generator)
    y, x = torch.meshgrid(*(torch.linspace(-1, 1, side),) * 2, indexing="ij")
    shapes = [torch.ones_like(y), y, x, y**2 + x**2, y * x]  # (side, side) each, broadcast over slices
    return torch.stack([noise, *(noise + sign * 3 * shape for shape in shapes for sign in (1, -1))])


def _transform(x: torch.Tensor, turns: int, flip: bool) -> torch.Tensor:
    """(N, C, [D,] H, W) turned by ``turns`` quarter turns in the (H, W) plane, then flipped along W when
    ``flip``."""
    x = torch.rot90(x, turns, (-2, -1))
    return torch.flip(x, (-1,)) if flip else x
