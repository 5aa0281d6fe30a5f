#!/usr/bin/env python
"""Draw the 3-D example: orthogonal slices through the centre of the validation volume (XY, XZ, YZ) of the image,
the shipped model's labels (one dense pass over the whole volume) and the ground truth; prints the validation
scores.

Needs the data (``python scripts/fetch_data.py nuclei3d --out data/nuclei3d``). Usage::

    python scripts/volume_figure.py --model models/nuclei3d --data data/nuclei3d/val \\
        --out docs/images/nuclei3d_example.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

import densecnn  # noqa: E402
from densecnn.train.dataset import read_dataset  # noqa: E402
from densecnn.train.metrics import confusion_matrix, segmentation_scores  # noqa: E402


def centre_slices(volume: np.ndarray) -> list[tuple[str, np.ndarray]]:
    """The three planes through the centre of a (D, H, W) or (D, H, W, 3) volume: XY (H, W), XZ (D, W), YZ (D, H).

    >>> [(name, s.shape) for name, s in centre_slices(np.zeros((3, 5, 7)))]
    [('XY (z = 1)', (5, 7)), ('XZ (y = 2)', (3, 7)), ('YZ (x = 3)', (3, 5))]
    """
    d, h, w = (side // 2 for side in volume.shape[:3])  # colour volumes: (D, H, W, 3)
    return [(f"XY (z = {d})", volume[d]), (f"XZ (y = {h})", volume[:, h]), (f"YZ (x = {w})", volume[:, :, w])]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="models/nuclei3d")
    parser.add_argument("--data", default="data/nuclei3d/val", type=Path)
    parser.add_argument("--out", default="docs/images/nuclei3d_example.png", type=Path)
    args = parser.parse_args()

    loaded = densecnn.load(args.model)
    (sample,) = read_dataset(
        args.data, channels=loaded.in_channels, num_classes=loaded.num_classes, spatial_dims=3
    )
    x = loaded.normalize(torch.from_numpy(sample.image)[None])  # (1, C, D, H, W)
    labels = loaded.dense().predict(x)[0]  # (D, H, W)
    truth = torch.from_numpy(sample.labels)  # (D, H, W), 255 = unlabelled
    scores = segmentation_scores(confusion_matrix(labels, truth, loaded.num_classes))
    print(json.dumps(scores, indent=1))

    palette = np.array(loaded.palette, dtype=np.uint8)
    rows = [
        ("image", sample.image[0], "gray"),
        ("densecnn labels", palette[labels.numpy()], None),
        ("ground truth", palette[np.where(sample.labels == 255, 0, sample.labels)], None),
    ]
    fig, axes = plt.subplots(3, 3, figsize=(10, 9), dpi=100, gridspec_kw={"width_ratios": [1, 1, 1]})
    for r, (row_name, volume, cmap) in enumerate(rows):
        for c, (plane, picture) in enumerate(centre_slices(volume)):
            ax = axes[r, c]
            ax.imshow(picture, cmap=cmap, interpolation="nearest")
            ax.set_title(f"{row_name}, {plane}", fontsize=10)
            ax.set_axis_off()
    handles = [plt.Rectangle((0, 0), 1, 1, color=np.array(c) / 255) for c in loaded.palette]
    fig.legend(handles, loaded.class_names, loc="lower center", ncol=len(handles), frameon=False)
    d, h, w = sample.labels.shape
    fig.suptitle(
        f"nuclei3d on the validation volume ({d}×{h}×{w}, D×H×W): foreground IoU {scores['foreground_iou']:.3f}"
    )
    fig.tight_layout(rect=(0, 0.04, 1, 0.97))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
