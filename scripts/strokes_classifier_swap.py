#!/usr/bin/env python
"""Where the random forest still beats the strokes recipe: its classifier or its features? Trains both classifiers on
both feature sets, on the stroke sets of ``scripts/compare_strokes.py``, and prints the mIoU on the unlabelled pixels.

    python scripts/strokes_classifier_swap.py --images rgb grey --kinds walks skeletons --seeds 0 1 2

- ``forest``: scikit-learn's random forest of ``compare_strokes.py`` (100 trees);
- ``head``: the recipe's head trained on the labelled pixels' fixed features alone, as the recipe did before its
  smoothness term (``standardize``-d, ``zoo.FEATURE_DROPOUT`` of them dropped, 1×1 layers of 32 and 32, AdamW with
  the default recipe's learning rate, warm-up, cosine schedule, steps and pixels a step, the classes drawn equally
  often), without the flip and turn permutations, which ilastik's features do not have;
- ``ilastik``: ilastik's filter features (``compare_strokes.ilastik_features``); ``filter bank``: the features of
  ``densecnn.zoo.filter_bank``'s fixed layers, by their dense pass over the normalised image.

Results in docs/training.md ("Where the forest won").
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare_strokes import fit_forest, ilastik_features, mean_iou  # noqa: E402
from stroke_sets import UNLABELLED, make_image, strokes  # noqa: E402

import densecnn  # noqa: E402
from densecnn.train.features import fixed_layers, standardize  # noqa: E402
from densecnn.train.recipe import default_recipe  # noqa: E402
from densecnn.train.strokes import _warmup_cosine  # noqa: E402
from densecnn.zoo import FEATURE_DROPOUT  # noqa: E402

HIDDEN = 32  # the filter bank net's hidden 1×1 layers


def filter_bank_features(image: np.ndarray, classes: int) -> np.ndarray:
    """(C, H, W) -> (F, pixels): the default net's fixed layers on the image normalised per channel."""
    model, patch = densecnn.zoo.filter_bank(in_channels=image.shape[0], num_classes=classes)
    dense = densecnn.convert(model[: fixed_layers(model)], patch, padding_mode="reflect", verify=False)
    x = torch.from_numpy(image).double()
    std = x.flatten(1).std(1).clamp(min=1e-6)[:, None, None]
    x = ((x - x.flatten(1).mean(1)[:, None, None]) / std).float()[None]  # (1, C, H, W)
    with torch.no_grad():
        return dense(x)[0].flatten(1).numpy()


def head(features: np.ndarray, labels: np.ndarray, classes: int, seed: int) -> np.ndarray:
    recipe = default_recipe(
        [labels.shape], labelled_pixels=int((labels != UNLABELLED).sum()), per_pixel_head=True
    )
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    x = torch.from_numpy(features.T.copy())  # (pixels, F)
    y = torch.from_numpy(labels.ravel())
    labelled = y != UNLABELLED
    norm = nn.BatchNorm1d(x.shape[1], affine=False).eval()
    standardize(norm, x[labelled], torch.arange(x.shape[1])[None])  # no flips or turns: one identity order
    with torch.no_grad():
        x = norm(x)
    pools = [torch.nonzero(labelled & (y == k))[:, 0] for k in range(classes) if (labelled & (y == k)).any()]
    net = nn.Sequential(
        nn.Dropout(FEATURE_DROPOUT), nn.Linear(x.shape[1], HIDDEN), nn.ReLU(),
        nn.Linear(HIDDEN, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, classes),
    )  # fmt: skip
    optimizer = torch.optim.AdamW(net.parameters(), lr=recipe.lr)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: _warmup_cosine(s, recipe.warmup, recipe.steps)
    )
    sizes = torch.tensor([len(p) for p in pools])
    for _ in range(recipe.steps):
        pool = torch.randint(len(pools), (recipe.pixels,), generator=generator)
        within = (torch.rand(recipe.pixels, generator=generator) * sizes[pool]).long()
        picked = torch.stack([pools[k][i] for k, i in zip(pool.tolist(), within.tolist(), strict=True)])
        loss = nn.functional.cross_entropy(net(x[picked]), y[picked])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
    with torch.no_grad():
        return net.eval()(x).argmax(1).numpy()


def one_case(name: str, kind: str, seed: int, size: int, share: float) -> dict:
    image, truth, names = make_image(name, seed, size)
    labels = strokes(truth, kind, share, seed)
    scored = labels == UNLABELLED
    features = {"ilastik": ilastik_features(image), "filter bank": filter_bank_features(image, len(names))}
    result = {"image": name, "kind": kind, "seed": seed}
    for feature_name, values in features.items():
        for classifier in ("forest", "head"):
            predicted = (
                fit_forest(values, labels, seed).predict(values.T)
                if classifier == "forest"
                else head(values, labels, len(names), seed)
            )
            miou = mean_iou(predicted.reshape(truth.shape), truth, scored, len(names))
            result[f"{classifier} on {feature_name}"] = round(miou, 3)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--images", nargs="+", default=["rgb", "grey"], choices=["grey", "rgb", "texture", "fluorescence"]
    )
    parser.add_argument(
        "--kinds", nargs="+", default=["walks", "skeletons"], choices=["walks", "skeletons", "polygons"]
    )
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--size", type=int, default=384)
    parser.add_argument(
        "--share", type=float, default=0.03, help="share of the pixels painted (default 0.03)"
    )
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    for name in args.images:
        for kind in args.kinds:
            for seed in args.seeds:
                print(json.dumps(one_case(name, kind, seed, args.size, args.share)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
