"""Shared pieces of the ``densecnn predict`` tests: real image content, small saved models, references."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch import nn

import densecnn
from densecnn.io import class_probabilities, model_input

ROOT = Path(__file__).resolve().parent.parent
NUCLEI_MODEL = ROOT / "models" / "nuclei"
# The fluorescence-nuclei image shipped in the stardist wheel (stardist/data/images/img2d.tif, BSD-3-Clause),
# 512x512, written as an 8-bit PNG (its values are 0..235): real content for the tests, read offline.
NUCLEI_IMAGE = Path(__file__).resolve().parent / "images" / "nuclei.png"


def nuclei_pixels() -> np.ndarray:
    """(512, 512) uint8."""
    return np.asarray(Image.open(NUCLEI_IMAGE))


def tiled_nuclei(height: int, width: int) -> np.ndarray:
    """(height, width) uint8: the nuclei image tiled, every other copy mirrored so that no seam is a straight copy."""
    image = nuclei_pixels()
    row = np.concatenate([image, image[:, ::-1]], axis=1)
    block = np.concatenate([row, row[::-1]], axis=0)  # (1024, 1024)
    reps = (-(-height // block.shape[0]), -(-width // block.shape[1]))
    return np.ascontiguousarray(np.tile(block, reps)[:height, :width])


def save_model(model: nn.Module, path: Path, patch, padding_mode: str, channels: int) -> Path:
    """Save a small patch classifier with seeded weights and a non-trivial normalisation."""
    torch.manual_seed(0)
    for parameter in model.parameters():
        nn.init.normal_(parameter, std=0.5)
    normalization = {"mean": [0.3] * channels, "std": [0.2] * channels}
    return densecnn.save(
        model.eval(), path, patch_size=patch, normalization=normalization, padding_mode=padding_mode
    )


@torch.no_grad()
def whole_image_scores(model_dir: Path, pixels: np.ndarray) -> torch.Tensor:
    """(K, H, W) scores of one in-memory pass of the dense net over the whole image, with the service's input helper."""
    loaded = densecnn.load(model_dir)
    dense = loaded.dense()
    return dense(model_input(pixels, loaded))[0]


def probabilities_of(model_dir: Path, scores: torch.Tensor) -> torch.Tensor:
    return class_probabilities(scores[None], densecnn.load(model_dir).dense())[0]


def dies_the_first_time(job, chunks):
    """A block task whose worker process dies the first time any task of the run starts (a marker file beside the
    output says it died already): Dask re-runs the task on a fresh worker by itself."""
    import os

    from densecnn.blockwise.blocks import label_block

    marker = Path(job.labels + ".died")
    if not marker.exists():
        marker.write_text("")
        os._exit(1)
    return label_block(job, chunks)
