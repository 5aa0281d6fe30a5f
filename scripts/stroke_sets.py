"""Images with a dense ground truth, and the stroke sets a user might paint on them, for scripts/compare_strokes.py.

Images (each drawn from a seed, values in [0, 1], channels first):

- ``grey``: noisy gray cells (bright discs), debris (mid-gray squares) on a dark background with a slow
  illumination gradient; 3 classes.
- ``rgb``: a colour "photograph" of four kinds of region (sky, foliage, soil, red objects), each its own colour
  texture, under an illumination gradient; 4 classes.
- ``texture``: a gray mosaic of four textures of equal mean and contrast (horizontal and diagonal gratings, coarse
  blobs, fine grain); 4 classes.
- ``fluorescence``: blurred nuclei with Poisson noise; classes background, nucleus, nucleus boundary (the rule of
  ``scripts/fetch_data.py``: an instance pixel with a 4-neighbour of another id is boundary).
- ``volume``: a 3-D fluorescence stack of nuclei, the same classes with 6 face neighbours.

Stroke kinds (``strokes(truth, kind, share, seed)``: about ``share`` of the pixels labelled, every class painted,
strokes kept inside the ground truth's regions, 2 pixels away from their borders, as a user paints):

- ``walks``: random walks (3 pixels wide) started inside the regions;
- ``skeletons``: pieces of the regions' skeletons;
- ``polygons``: small filled polygons inside the regions.
"""

from __future__ import annotations

import numpy as np
from scipy import ndimage
from skimage import draw, morphology

IMAGES = ("grey", "rgb", "texture", "fluorescence", "volume")
KINDS = ("walks", "skeletons", "polygons")
UNLABELLED = -1


def make_image(name: str, seed: int, size: int = 192) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """``(image (C, *spatial) float32 in [0, 1], truth (*spatial) int64, class names)``."""
    rng = np.random.default_rng(seed)
    return {
        "grey": _grey,
        "rgb": _rgb,
        "texture": _texture,
        "fluorescence": _fluorescence,
        "volume": _volume,
    }[name](rng, size)


def strokes(truth: np.ndarray, kind: str, share: float, seed: int) -> np.ndarray:
    """A label map with ``UNLABELLED`` except on about ``share`` of the pixels, painted by ``kind`` strokes inside
    the regions of ``truth`` (each class gets its share of the labelled pixels, at least one stroke)."""
    rng = np.random.default_rng(seed)
    labels = np.full(truth.shape, UNLABELLED, np.int64)
    classes = np.unique(truth)
    per_class = share * truth.size / len(classes)
    structure = np.ones((3,) * truth.ndim, bool)
    for k in classes:
        region = truth == k
        inside = ndimage.binary_erosion(region, structure, iterations=2)
        if not inside.any():
            inside = region
        painted = np.zeros(truth.shape, bool)
        paint = {"walks": _walk, "skeletons": _skeleton_piece, "polygons": _polygon}[kind]
        for _ in range(200):
            if painted.sum() >= per_class:
                break
            stroke = paint(inside, rng, per_class - painted.sum()) & inside
            if (painted | stroke).sum() > 1.5 * per_class:
                continue  # a stroke too long for what is left of the class's share
            painted |= stroke
        if not painted.any():  # every stroke of this kind was too long: a short walk instead
            painted = _walk(inside, rng, per_class) & inside
        labels[painted] = k
    return labels


def _walk(inside: np.ndarray, rng, budget: float) -> np.ndarray:
    """A random walk inside ``inside``, dilated to 3 pixels wide (in the plane)."""
    points = np.argwhere(inside)
    position = points[rng.integers(len(points))]
    path = np.zeros(inside.shape, bool)
    direction = rng.normal(size=inside.ndim)
    for _ in range(int(min(budget / 3, 120))):
        direction = direction + rng.normal(scale=0.6, size=inside.ndim)
        direction /= np.linalg.norm(direction) + 1e-9
        if inside.ndim == 3:
            direction[0] *= 0.3  # strokes are painted slice by slice: little travel along D
        step = np.rint(position + 1.5 * direction).astype(int)
        if np.any(step < 0) or np.any(step >= inside.shape) or not inside[tuple(step)]:
            direction = -direction
            continue
        position = step
        path[tuple(position)] = True
    return ndimage.binary_dilation(path, _plane_disc(inside.ndim))


def _skeleton_piece(inside: np.ndarray, rng, budget: float) -> np.ndarray:
    """A piece of the skeleton of ``inside`` around a random skeleton pixel, 3 pixels wide."""
    skeleton = morphology.skeletonize(inside)
    points = np.argwhere(skeleton)
    if not len(points):
        return _walk(inside, rng, budget)
    centre = points[rng.integers(len(points))]
    reach = int(min(max(budget / 6, 6), 30))
    box = tuple(slice(max(c - reach, 0), c + reach + 1) for c in centre)
    piece = np.zeros(inside.shape, bool)
    piece[box] = skeleton[box]
    return ndimage.binary_dilation(piece, _plane_disc(inside.ndim))


def _polygon(inside: np.ndarray, rng, budget: float) -> np.ndarray:
    """A small random polygon (in one slice of a volume) around a random pixel of ``inside``."""
    points = np.argwhere(inside)
    centre = points[rng.integers(len(points))]
    radius = min(max(np.sqrt(budget) / 3, 3), 10)
    angles = np.sort(rng.uniform(0, 2 * np.pi, 6))
    radii = radius * rng.uniform(0.5, 1.0, 6)
    rows = centre[-2] + radii * np.sin(angles)
    cols = centre[-1] + radii * np.cos(angles)
    filled = np.zeros(inside.shape[-2:], bool)
    rr, cc = draw.polygon(rows, cols, filled.shape)
    filled[rr, cc] = True
    if inside.ndim == 2:
        return filled
    out = np.zeros(inside.shape, bool)
    out[centre[0]] = filled
    return out


def _plane_disc(ndim: int) -> np.ndarray:
    disc = np.array([[0, 1, 0], [1, 1, 1], [0, 1, 0]], bool)
    return disc if ndim == 2 else disc[None]


def _gradient(shape, rng) -> np.ndarray:
    """A slow illumination ramp in [0.8, 1.2] over the last two axes."""
    rows, cols = np.meshgrid(*(np.linspace(-1, 1, s) for s in shape[-2:]), indexing="ij")
    angle = rng.uniform(0, 2 * np.pi)
    return 1 + 0.2 * (np.cos(angle) * rows + np.sin(angle) * cols)


def _voronoi(shape, cells: int, classes: int, rng) -> np.ndarray:
    """A mosaic of ``cells`` Voronoi regions with class ids 0..classes-1 (each class used at least once)."""
    seeds = rng.uniform(0, 1, (cells, 2)) * np.array(shape)
    rows, cols = np.mgrid[: shape[0], : shape[1]]
    distance = (rows[..., None] - seeds[:, 0]) ** 2 + (cols[..., None] - seeds[:, 1]) ** 2  # (H, W, cells)
    ids = np.concatenate([np.arange(classes), rng.integers(0, classes, cells - classes)])
    return ids[distance.argmin(-1)]


def _grey(rng, size):
    shape = (size, size)
    rows, cols = np.mgrid[:size, :size]
    truth = np.zeros(shape, np.int64)
    image = np.full(shape, 0.15)
    for _ in range(size // 12):
        top, left, side = rng.integers(0, size - 10, 2).tolist() + [int(rng.integers(5, 10))]
        truth[top : top + side, left : left + side] = 2
    for _ in range(size // 10):
        cy, cx, radius = rng.integers(0, size), rng.integers(0, size), rng.integers(5, 11)
        truth[(rows - cy) ** 2 + (cols - cx) ** 2 <= radius**2] = 1
    image[truth == 1] = 0.65
    image[truth == 2] = 0.4
    image = ndimage.gaussian_filter(image, 1.0) * _gradient(shape, rng) + rng.normal(0, 0.08, shape)
    return np.clip(image, 0, 1)[None].astype(np.float32), truth, ["background", "cell", "debris"]


def _rgb(rng, size):
    shape = (size, size)
    truth = _voronoi(shape, 10, 4, rng)
    colours = np.array([[0.45, 0.6, 0.85], [0.25, 0.5, 0.2], [0.5, 0.38, 0.25], [0.7, 0.2, 0.2]])
    grain = [0.5, 2.0, 1.0, 0.7]  # texture scale per class
    image = np.zeros((3, *shape))
    for k in range(4):
        noise = ndimage.gaussian_filter(rng.normal(0, 1, (3, *shape)), (0, grain[k], grain[k]))
        noise /= noise.std() + 1e-9
        texture = colours[k][:, None, None] + 0.12 * noise
        image = np.where(truth[None] == k, texture, image)
    image *= _gradient(shape, rng)[None]
    return np.clip(image, 0, 1).astype(np.float32), truth, ["sky", "foliage", "soil", "object"]


def _texture(rng, size):
    shape = (size, size)
    truth = _voronoi(shape, 9, 4, rng)
    rows, cols = np.mgrid[:size, :size]
    textures = [
        np.sin(2 * np.pi * rows / 7.0),
        np.sin(2 * np.pi * (rows + cols) / 10.0),
        ndimage.gaussian_filter(rng.normal(0, 1, shape), 3.0),
        ndimage.gaussian_filter(rng.normal(0, 1, shape), 0.7),
    ]
    image = np.zeros(shape)
    for k, texture in enumerate(textures):
        texture = (texture - texture.mean()) / (texture.std() + 1e-9)
        image = np.where(truth == k, texture, image)
    image = 0.5 + 0.15 * image + rng.normal(0, 0.05, shape)
    return np.clip(image, 0, 1)[None].astype(np.float32), truth, ["stripes", "diagonal", "blobs", "grain"]


def _nuclei_truth(instances: np.ndarray) -> np.ndarray:
    """Instance ids -> 0 background, 1 nucleus, 2 boundary (a face neighbour of another id)."""
    truth = (instances > 0).astype(np.int64)
    for axis in range(instances.ndim):
        for shift in (1, -1):
            neighbour = np.roll(instances, shift, axis)
            edge = [slice(None)] * instances.ndim
            edge[axis] = 0 if shift == 1 else -1
            neighbour[tuple(edge)] = instances[tuple(edge)]  # no neighbour across the border
            truth[(instances > 0) & (neighbour != instances)] = 2
    return truth


def _fluorescence(rng, size, shape=None):
    shape = shape or (size, size)
    grid = np.indices(shape)
    instances = np.zeros(shape, np.int64)
    count = int(np.prod(shape) / 900)
    for n in range(1, count + 1):
        centre = [rng.uniform(0, s) for s in shape]
        radii = rng.uniform(5, 10, len(shape))
        if len(shape) == 3:
            radii[0] *= 0.5  # coarser along D
        inside = sum(((g - c) / r) ** 2 for g, c, r in zip(grid, centre, radii, strict=True)) <= 1
        instances[inside & (instances == 0)] = n
    brightness = rng.uniform(0.4, 1.0, count + 1)
    brightness[0] = 0.05
    signal = ndimage.gaussian_filter(brightness[instances], 1.2)
    image = rng.poisson(signal * 40) / 40.0
    return (
        np.clip(image / image.max(), 0, 1)[None].astype(np.float32),
        _nuclei_truth(instances),
        ["background", "nucleus", "boundary"],
    )


def _volume(rng, size):
    return _fluorescence(rng, size, shape=(24, size // 2, size // 2))
