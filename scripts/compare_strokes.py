#!/usr/bin/env python
"""Training from strokes against what their users use today: an ilastik-style random forest, densecnn's default
recipe, and the patch minibatch at the recipe's settings, on stroke sets drawn from images with a dense ground truth.

    python scripts/compare_strokes.py --out docs/benchmarks/compare_strokes.json \
        --table docs/benchmarks/compare_strokes.md --plot docs/images/strokes.png

For each image (``scripts/stroke_sets.py``: grey, rgb, texture, fluorescence, a 3-D volume), stroke kind (random
walks, skeleton pieces, small polygons; ``--share`` of the pixels) and seed (the image, the strokes and the training
are drawn from it), and the fully labelled case (the top half labelled, the bottom half scored):

- ``forest``: scikit-learn's random forest (100 trees) on ilastik's filter features (Gaussian smoothing, Laplacian of
  Gaussian, gradient magnitude, difference of Gaussians, Hessian eigenvalues, structure-tensor eigenvalues, each at σ
  0.7, 1, 1.6, 3.5, 5 and 10, per channel). Its training CPU seconds are the features of the whole image plus the fit
  (prediction then reads the features already computed).
- ``densecnn``: :class:`densecnn.train.strokes.StrokeTrainer` with nothing but the images, labels and class names:
  the default recipe, its held-out strokes and early stopping.
- ``patches``: the same trainer and recipe, each step's loss by the classical patch minibatch of the same pixels
  (``Recipe.method = "patches"``).

The score is the mean IoU over the classes on the unlabelled pixels. The CNN runs are scored every few steps with the
best-so-far weights (scoring not counted): the CPU seconds each takes to first reach the forest's mIoU, and its mIoU at
the end. A CNN run stops at ``--budget`` times the forest's seconds or when its recipe ends it. CPU seconds are
``time.process_time`` (all threads of this process); torch and the forest use ``--threads`` threads (default 2).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from stroke_sets import IMAGES, KINDS, UNLABELLED, make_image, strokes  # noqa: E402

import densecnn  # noqa: E402
from densecnn.train.strokes import StrokeTrainer  # noqa: E402

SIGMAS = (0.7, 1.0, 1.6, 3.5, 5.0, 10.0)


def ilastik_features(image: np.ndarray) -> np.ndarray:
    """(C, *spatial) -> (F, pixels) float32: ilastik's filter features of every channel at every σ of SIGMAS."""
    from scipy import ndimage
    from skimage.feature import (
        hessian_matrix,
        hessian_matrix_eigvals,
        structure_tensor,
        structure_tensor_eigenvalues,
    )

    features = []
    for channel in image.astype(np.float64):
        for sigma in SIGMAS:
            smooth = ndimage.gaussian_filter(channel, sigma)
            features += [
                smooth,
                ndimage.gaussian_laplace(channel, sigma),
                ndimage.gaussian_gradient_magnitude(channel, sigma),
                smooth - ndimage.gaussian_filter(channel, 0.66 * sigma),
            ]
            hessian = hessian_matrix(channel, sigma, order="rc", use_gaussian_derivatives=False)
            features += list(hessian_matrix_eigvals(hessian))
            tensor = structure_tensor(channel, sigma=sigma, order="rc")
            features += list(structure_tensor_eigenvalues(tensor))
    return np.stack([f.ravel() for f in features]).astype(np.float32)


def mean_iou(predicted: np.ndarray, truth: np.ndarray, scored: np.ndarray, classes: int) -> float:
    """The mean over classes present in ``truth[scored]`` of their IoU on the ``scored`` pixels."""
    p, t = predicted[scored], truth[scored]
    ious = []
    for k in range(classes):
        union = np.sum((p == k) | (t == k))
        if np.any(t == k):
            ious.append(np.sum((p == k) & (t == k)) / union)
    return float(np.mean(ious))


def fit_forest(features: np.ndarray, labels: np.ndarray, seed: int):
    """scikit-learn's random forest (100 trees) fitted on the labelled pixels' ``features`` (F, pixels)."""
    from sklearn.ensemble import RandomForestClassifier

    labelled = labels.ravel() != UNLABELLED
    forest = RandomForestClassifier(n_estimators=100, n_jobs=torch.get_num_threads(), random_state=seed)
    return forest.fit(features[:, labelled].T, labels.ravel()[labelled])


def run_forest(image, labels, truth, scored, classes, seed) -> dict:
    started = time.process_time()
    features = ilastik_features(image)  # (F, pixels)
    forest = fit_forest(features, labels, seed)
    seconds = time.process_time() - started
    predicted = forest.predict(features.T).reshape(truth.shape)
    return {"miou": mean_iou(predicted, truth, scored, classes), "seconds": seconds}


def run_cnn(
    image, labels, truth, scored, names, seed, *, method: str, budget: float, score_every: int
) -> dict:
    """Train with the default recipe (its step by ``method``) until it ends or ``budget`` CPU seconds; the mIoU of
    the best-so-far weights every ``score_every`` steps against the CPU seconds spent."""
    started = time.process_time()  # setting up counts: it computes a fixed feature layer's features
    trainer = StrokeTrainer([image], [labels], unlabelled=UNLABELLED, class_names=names, seed=seed)
    if method != "auto":
        trainer.recipe = replace(trainer.recipe, method=method)
    spent = time.process_time() - started
    curve = [(spent, score(trainer, image, truth, scored))]
    steps = trainer.run()
    while spent < budget:
        started = time.process_time()
        progress = next(steps, None)
        spent += time.process_time() - started
        if progress is None:
            break
        if progress.step % score_every == 0:
            curve.append((spent, score(trainer, image, truth, scored)))
    if curve[-1][0] != spent:
        curve.append((spent, score(trainer, image, truth, scored)))
    return {"curve": curve, "miou": curve[-1][1], "seconds": spent, "steps": trainer.step}


@torch.no_grad()
def score(trainer: StrokeTrainer, image, truth, scored) -> float:
    dense = densecnn.convert(
        trainer.model, trainer.patch_size, padding_mode=trainer.loaded.padding_mode, verify=False
    )
    x = trainer.loaded.normalize(torch.from_numpy(image)[None])  # (1, C, *spatial)
    predicted = dense(x).argmax(1)[0].numpy()
    return mean_iou(predicted, truth, scored, len(trainer.class_names))


def reach(curve, target: float) -> float | None:
    """The CPU seconds at which ``curve`` first reaches ``target`` (None: never)."""
    return next((seconds for seconds, miou in curve if miou >= target), None)


def one_case(name: str, kind: str, seed: int, args) -> dict:
    image, truth, names = make_image(name, seed, args.size)
    if kind == "full":  # the top half labelled densely, the bottom half scored
        labels = np.full(truth.shape, UNLABELLED, np.int64)
        top = truth.shape[-2] // 2
        labels[..., :top, :] = truth[..., :top, :]
    else:
        labels = strokes(truth, kind, args.share, seed)
    scored = labels == UNLABELLED
    forest = run_forest(image, labels, truth, scored, len(names), seed)
    budget = args.budget * forest["seconds"]
    result = {
        "image": name, "kind": kind, "seed": seed,
        "labelled_share": float(np.mean(labels != UNLABELLED)), "forest": forest,
    }  # fmt: skip
    methods = ["auto"] + (["patches"] if kind in args.patches_on or "all" in args.patches_on else [])
    for method in methods:
        key = "densecnn" if method == "auto" else "patches"
        result[key] = run_cnn(
            image,
            labels,
            truth,
            scored,
            names,
            seed,
            method=method,
            budget=budget,
            score_every=args.score_every,
        )
        result[key]["reach_seconds"] = reach(result[key]["curve"], forest["miou"])
    print(json.dumps(_brief(result)), flush=True)
    return result


def _brief(result: dict) -> dict:
    brief = {k: result[k] for k in ("image", "kind", "seed")}
    brief["forest"] = [round(result["forest"]["miou"], 3), round(result["forest"]["seconds"], 1)]
    for key in ("densecnn", "patches"):
        if key in result:
            r = result[key]
            brief[key] = [
                round(r["miou"], 3),
                round(r["seconds"], 1),
                r["reach_seconds"] and round(r["reach_seconds"], 1),
            ]
    return brief


def summarize(results: list[dict]) -> list[dict]:
    """Per (image, kind): medians over seeds."""
    rows = []
    for name, kind in dict.fromkeys((r["image"], r["kind"]) for r in results):
        group = [r for r in results if r["image"] == name and r["kind"] == kind]

        def median(values):
            values = [v for v in values if v is not None]
            return statistics.median(values) if values else None

        row = {
            "image": name,
            "kind": kind,
            "labelled": median([r["labelled_share"] for r in group]),
            "forest_miou": median([r["forest"]["miou"] for r in group]),
            "forest_s": median([r["forest"]["seconds"] for r in group]),
            "dense_miou": median([r["densecnn"]["miou"] for r in group]),
            "dense_s": median([r["densecnn"]["seconds"] for r in group]),
            # a seed that never reached the forest counts as infinitely slow in the median
            "dense_reach_s": _median_reach([r["densecnn"]["reach_seconds"] for r in group]),
        }
        if all("patches" in r for r in group):
            row["patch_miou"] = median([r["patches"]["miou"] for r in group])
            row["patch_reach_s"] = _median_reach([r["patches"]["reach_seconds"] for r in group])
        rows.append(row)
    return rows


def _median_reach(values: list[float | None]) -> float | None:
    value = statistics.median([float("inf") if v is None else v for v in values])
    return None if value == float("inf") else value


def table(rows: list[dict]) -> str:
    lines = [
        "| image | strokes | labelled | forest mIoU | forest CPU s | densecnn mIoU (end) | densecnn CPU s to forest's "
        "mIoU (× forest s) | densecnn CPU s | patch minibatch mIoU (end) | patch CPU s to forest's mIoU |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        reach_text = (
            "never"
            if r["dense_reach_s"] is None
            else (f"{r['dense_reach_s']:.1f} ({r['dense_reach_s'] / r['forest_s']:.2f}×)")
        )
        patch = ("–", "–")
        if "patch_miou" in r:
            patch = (
                f"{r['patch_miou']:.3f}",
                "never" if r["patch_reach_s"] is None else f"{r['patch_reach_s']:.1f}",
            )
        lines.append(
            f"| {r['image']} | {r['kind']} | {100 * r['labelled']:.1f}% | {r['forest_miou']:.3f} | "
            f"{r['forest_s']:.1f} | {r['dense_miou']:.3f} | {reach_text} | {r['dense_s']:.1f} | {patch[0]} | {patch[1]} |"
        )
    return "\n".join(lines) + "\n"


def plot(results: list[dict], path: Path) -> None:
    """One panel per image: mIoU against CPU seconds of every CNN run, the forest as a point per seed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(dict.fromkeys(r["image"] for r in results))
    figure, axes = plt.subplots(1, len(names), figsize=(4 * len(names), 3.4), squeeze=False)
    colours = {"densecnn": "tab:blue", "patches": "tab:orange", "forest": "tab:green"}
    for axis, name in zip(axes[0], names, strict=True):
        for r in (r for r in results if r["image"] == name):
            style = "-" if r["kind"] != "full" else ":"
            for key in ("densecnn", "patches"):
                if key in r:
                    seconds, miou = zip(*r[key]["curve"], strict=True)
                    axis.plot(seconds, miou, style, color=colours[key], alpha=0.5, lw=1)
            axis.plot(r["forest"]["seconds"], r["forest"]["miou"], "o", color=colours["forest"], ms=4)
        axis.set_title(name)
        axis.set_xlabel("training CPU seconds")
        axis.set_ylim(0, 1)
    axes[0][0].set_ylabel("mIoU on unlabelled pixels")
    handles = [plt.Line2D([], [], color=c, marker="o" if k == "forest" else None) for k, c in colours.items()]
    figure.legend(
        handles, ["densecnn default", "patch minibatch", "random forest"], loc="lower center", ncol=3
    )
    figure.tight_layout(rect=(0, 0.08, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", nargs="+", default=list(IMAGES), choices=IMAGES)
    parser.add_argument("--kinds", nargs="+", default=[*KINDS, "full"], choices=[*KINDS, "full"])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument(
        "--first-seed",
        type=int,
        default=100,
        help="seed of the first image (default 100: images the default recipe was not chosen on, seeds 0-1)",
    )
    parser.add_argument(
        "--share", type=float, default=0.03, help="share of the pixels painted (default 0.03)"
    )
    parser.add_argument("--size", type=int, default=160, help="image side (volumes: 24 x side/2 x side/2)")
    parser.add_argument(
        "--budget", type=float, default=3.0, help="CNN CPU seconds, in forest seconds (default 3)"
    )
    parser.add_argument("--score-every", type=int, default=5, help="steps between scorings of a CNN run")
    parser.add_argument(
        "--patches-on",
        nargs="+",
        default=["walks"],
        help="stroke kinds the patch baseline runs on ('all': every one)",
    )
    parser.add_argument("--threads", type=int, default=2, help="threads of torch and the forest (default 2)")
    parser.add_argument("--out", type=Path, default=Path("runs/compare_strokes.json"))
    parser.add_argument("--table", type=Path)
    parser.add_argument("--plot", type=Path)
    parser.add_argument(
        "--from-results", action="store_true", help="only redraw the table and plot from the cases in --out"
    )
    args = parser.parse_args()
    warnings.filterwarnings("ignore", category=UserWarning)
    torch.set_num_threads(args.threads)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    results = json.loads(args.out.read_text())["results"] if args.from_results else []
    for name in [] if args.from_results else args.images:
        for kind in args.kinds:
            for seed in range(args.first_seed, args.first_seed + args.seeds):
                results.append(one_case(name, kind, seed, args))
                args.out.write_text(json.dumps({"results": results}, indent=1))  # kept case by case
    rows = summarize(results)
    args.out.write_text(json.dumps({"results": results, "summary": rows}, indent=1))
    text = table(rows)
    print(text)
    if args.table:
        args.table.parent.mkdir(parents=True, exist_ok=True)
        args.table.write_text(text)
    if args.plot:
        plot(results, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
