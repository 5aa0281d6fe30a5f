"""Synthetic segmentation datasets for the training tests: bright discs (class 1) and grey squares (class 2)."""

from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path

import numpy as np
from PIL import Image
from safetensors.torch import load_file

from densecnn.commands.train import add_arguments
from densecnn.train.config import NOT_IN_COMMAND


def make_dataset(root: Path, *, images: int, size=(40, 36), seed: int = 0) -> Path:
    """Write ``images`` noisy gray images with their class-id maps under ``root``; returns ``root``."""
    rng = np.random.default_rng(seed)
    for folder in ("images", "labels"):
        (root / folder).mkdir(parents=True, exist_ok=True)
    height, width = size
    rows, cols = np.mgrid[:height, :width]
    for i in range(images):
        image = rng.normal(40, 10, size)
        labels = np.zeros(size, np.uint8)
        for _ in range(4):
            cy, cx, r = rng.integers(0, height), rng.integers(0, width), rng.integers(3, 7)
            disc = (rows - cy) ** 2 + (cols - cx) ** 2 <= r * r
            image[disc] += 120
            labels[disc] = 1
        for _ in range(3):
            top, left, side = rng.integers(0, height - 6), rng.integers(0, width - 6), rng.integers(4, 8)
            image[top : top + side, left : left + side] = 90
            labels[top : top + side, left : left + side] = 2
        Image.fromarray(np.clip(image, 0, 255).astype(np.uint8)).save(root / "images" / f"im{i}.png")
        Image.fromarray(labels).save(root / "labels" / f"im{i}.png")
    return root


def weights(model_dir: Path) -> dict:
    return load_file(Path(model_dir) / "weights.safetensors")


def max_weight_difference(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


def card_command(model_dir) -> list[str]:
    """The words of the command in a model card's "Training command" block."""
    card = (model_dir / "README.md").read_text()
    return shlex.split(card.split("## Training command")[1].split("```")[1])


def parser_with_other_defaults() -> argparse.ArgumentParser:
    """The ``densecnn train`` options with every default changed, as a later version might change them (except
    ``--resume``, which says how a run starts, not what it trains)."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    other = {}
    for action in parser._actions:
        default = action.default
        if action.dest in NOT_IN_COMMAND:
            continue
        if action.choices:
            other[action.dest] = next(c for c in action.choices if c != default)
        elif isinstance(default, bool):
            other[action.dest] = not default
        elif isinstance(default, int | float):
            other[action.dest] = default + 7
        elif isinstance(default, str):
            other[action.dest] = default + "-changed"
    parser.set_defaults(**other)
    return parser


def discs(seed: int = 0, size: int = 40) -> tuple[np.ndarray, np.ndarray]:
    """A gray image of bright discs on a dark background and its dense truth (0 background, 1 disc)."""
    rng = np.random.default_rng(seed)
    rows, cols = np.mgrid[:size, :size]
    truth = np.zeros((size, size), np.int64)
    for _ in range(4):
        cy, cx = rng.integers(6, size - 6, 2)
        truth[(rows - cy) ** 2 + (cols - cx) ** 2 <= 25] = 1
    image = 0.2 + 0.6 * truth + rng.normal(0, 0.05, truth.shape)
    return np.clip(image, 0, 1)[None].astype(np.float32), truth


def painted(truth: np.ndarray, every: int = 5) -> np.ndarray:
    """Strokes: every ``every``-th row of the truth, -1 elsewhere."""
    labels = np.full(truth.shape, -1, np.int64)
    labels[::every] = truth[::every]
    return labels


def discs_and_strokes(seed: int = 0):
    """48² bright discs, their truth, and strokes on every 6th row."""
    image, truth = discs(seed, size=48)
    return image, truth, painted(truth, every=6)


def geojson(path, features: list[tuple[str, list]]) -> None:
    """A FeatureCollection of polygons (outer rings) with their class names."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps(
            {
                "type": "FeatureCollection",
                "features": [
                    {
                        "type": "Feature",
                        "geometry": {"type": "Polygon", "coordinates": [ring]},
                        "properties": {"classification": {"name": name}},
                    }
                    for name, ring in features
                ],
            }
        )
    )


def square(x0, y0, x1, y1) -> list:
    return [[x0, y0], [x1, y0], [x1, y1], [x0, y1], [x0, y0]]
