"""Held-out strokes: a share of the labelled connected components of each class kept for validation.

Sparse labels (strokes, points, outlined regions) come as label maps where most pixels are unlabelled. Holding out
single pixels would validate on the neighbours of training pixels, which says little about the rest of the image;
holding out whole strokes (the connected components of each class's labelled pixels, 8-connected in 2-D and
26-connected in 3-D) asks the model what it will be asked: label pixels nobody painted.

>>> train_labels, val_labels = split_strokes([labels], share=0.25, seed=0)   # (H, W) int64, 255 = unlabelled
>>> int((val_labels[0] != 255).sum()) > 0
True
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import TrainingError
from ..losses import IGNORE_INDEX


@dataclass(frozen=True)
class Stroke:
    """One connected component of a class's labelled pixels: in image ``image``, ``pixels`` of class ``label``."""

    image: int
    label: int
    pixels: int
    component: int


def strokes(labels: list[np.ndarray]) -> tuple[list[Stroke], list[np.ndarray]]:
    """The strokes of every label map (255 = unlabelled), and per map the component id of each pixel (0: none).

    >>> found, components = strokes([np.array([[0, 0, 255, 1], [255, 255, 255, 1]])])
    >>> [(s.label, s.pixels) for s in found]
    [(0, 2), (1, 2)]
    """
    ndimage = _ndimage()
    found, maps = [], []
    for index, label_map in enumerate(labels):
        components = np.zeros(label_map.shape, np.int64)
        structure = np.ones((3,) * label_map.ndim, bool)  # 8-connected in 2-D, 26 in 3-D
        offset = 0
        for label in np.unique(label_map[label_map != IGNORE_INDEX]).tolist():
            ids, count = ndimage.label(label_map == label, structure=structure)
            sizes = np.bincount(ids.ravel(), minlength=count + 1)
            components[ids > 0] = ids[ids > 0] + offset
            found += [Stroke(index, int(label), int(sizes[c]), offset + c) for c in range(1, count + 1)]
            offset += count
        maps.append(components)
    return found, maps


def split_strokes(
    labels: list[np.ndarray], *, share: float = 0.25, seed: int = 0
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """``(train, val)`` label maps: about ``share`` of each class's strokes (by count, at most ``share`` of its
    pixels plus one stroke) moved to ``val``, the rest kept in ``train``. At least one stroke of each class stays in
    ``train``, whatever the share: a class with a single stroke keeps it for training (it has nothing to spare; ``val``
    is then unlabelled for that class), and a high share of a class with few strokes holds out all but one.

    Every pixel labelled in ``labels`` is labelled in exactly one of the two.
    """
    if not 0.0 <= share < 1.0:
        raise TrainingError(f"the held-out share must be in [0, 1), got {share}")
    found, components = strokes(labels)
    rng = np.random.default_rng(seed)
    held: set[tuple[int, int]] = set()
    for label in sorted({s.label for s in found}):
        own = [s for s in found if s.label == label]
        if len(own) < 2 or share == 0.0:
            continue
        budget = share * sum(s.pixels for s in own)
        wanted = min(max(1, round(share * len(own))), len(own) - 1)  # one stroke of each class always trains
        taken_strokes, taken_pixels = 0, 0
        for position in rng.permutation(len(own)).tolist():
            if taken_strokes >= wanted or taken_pixels >= budget:
                break
            held.add((own[position].image, own[position].component))
            taken_strokes, taken_pixels = taken_strokes + 1, taken_pixels + own[position].pixels
    train, val = [], []
    for index, (label_map, component_map) in enumerate(zip(labels, components, strict=True)):
        chosen = [c for image, c in held if image == index]
        in_val = np.isin(component_map, chosen) if chosen else np.zeros(label_map.shape, bool)
        train.append(np.where(in_val, IGNORE_INDEX, label_map).astype(np.int64))
        val.append(np.where(in_val, label_map, IGNORE_INDEX).astype(np.int64))
    return train, val


def _ndimage():
    try:
        from scipy import ndimage
    except ImportError:
        raise TrainingError(
            "holding out strokes needs scipy; install it with pip install 'densecnn[train]'"
        ) from None
    return ndimage
