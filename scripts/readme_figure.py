"""Draw the README's picture: the nuclei image, the shipped model's label map, and the ground truth.

Needs the data (``python scripts/fetch_data.py nuclei --out data/nuclei``). Usage::

    python scripts/readme_figure.py --model models/nuclei --data data/nuclei --out docs/images/nuclei_example.png
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from PIL import Image  # noqa: E402

import densecnn  # noqa: E402
from densecnn.io import read_image  # noqa: E402


def whole_image(data: Path, kind: str, channels: int | None = None) -> np.ndarray:
    """The train (left) and validation (right) regions side by side again."""
    parts = [data / split / kind / "nuclei.png" for split in ("train", "val")]
    if channels is None:
        return np.concatenate([np.asarray(Image.open(p)) for p in parts], axis=1)  # (H, W) class ids
    return np.concatenate([read_image(p, channels) for p in parts], axis=2)  # (C, H, W)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="models/nuclei")
    parser.add_argument("--data", default="data/nuclei", type=Path)
    parser.add_argument("--out", default="docs/images/nuclei_example.png", type=Path)
    args = parser.parse_args()

    loaded = densecnn.load(args.model)
    image = whole_image(args.data, "images", loaded.in_channels)  # (C, H, W) in [0, 1]
    truth = whole_image(args.data, "labels")  # (H, W)
    x = loaded.normalize(torch.from_numpy(image)[None])
    labels = loaded.dense().predict(x)[0].numpy()  # (H, W)
    palette = np.array(loaded.palette, dtype=np.uint8)
    train_width = np.asarray(Image.open(args.data / "train" / "labels" / "nuclei.png")).shape[1]

    fig, axes = plt.subplots(1, 3, figsize=(13.5, 4.8), dpi=100)
    panels = [
        (image[0], "input (stardist img2d, 512×512)", "gray"),
        (palette[labels], "densecnn label map (one dense pass)", None),
        (palette[np.where(truth == 255, 0, truth)], "ground truth", None),
    ]
    for ax, (picture, title, cmap) in zip(axes, panels):
        ax.imshow(picture, cmap=cmap, interpolation="nearest")
        ax.axvline(train_width - 0.5, color="white", lw=1, ls="--")
        ax.set_title(title)
        ax.set_axis_off()
    handles = [plt.Rectangle((0, 0), 1, 1, color=np.array(c) / 255) for c in loaded.palette]
    fig.legend(handles, loaded.class_names, loc="lower center", ncol=len(handles), frameon=False)
    fig.tight_layout(rect=(0, 0.06, 1, 0.96))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
