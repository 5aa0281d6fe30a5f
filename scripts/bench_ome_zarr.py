#!/usr/bin/env python
"""What writing OME-Zarr labels costs: ``densecnn predict --labels-into`` (level 0 plus its pyramid) against a plain
zarr output, on the same OME-Zarr image, and the result read back as a label image with ome-zarr-py's reader.

    python scripts/bench_ome_zarr.py --size 6000 --rounds 2

The image is the nuclei test image tiled to SIZE x SIZE, written as an NGFF 0.5 image (tczyx, 512² chunks, 0.5 um
per pixel, 2 levels). Rounds interleave the two runs (1 worker, the shipped model); medians.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import zarr
from ome_zarr import format as ngff_format
from ome_zarr.io import parse_url
from ome_zarr.reader import Label, Reader
from ome_zarr.writer import write_multiscales_metadata

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from densecnn.bench import machine  # noqa: E402
from densecnn.blockwise import BlockwiseOptions, predict_to_disk  # noqa: E402
from tests.predict_support import NUCLEI_MODEL, tiled_nuclei  # noqa: E402


def write_image(path: Path, size: int) -> None:
    pixels = tiled_nuclei(size, size)
    group = zarr.open_group(str(path), mode="w", zarr_format=3)
    for k, level in enumerate((pixels, pixels[::2, ::2])):
        group.create_array(str(k), data=level[None, None, None], chunks=(1, 1, 1, 512, 512))
    axes = [{"name": "t", "type": "time"}, {"name": "c", "type": "channel"}]
    axes += [{"name": n, "type": "space", "unit": "micrometer"} for n in "zyx"]
    datasets = [{"path": str(k), "coordinateTransformations": [{"type": "scale", "scale": [1, 1, 1, 0.5 * 2**k, 0.5 * 2**k]}]}
                for k in range(2)]  # fmt: skip
    write_multiscales_metadata(group, datasets, fmt=ngff_format.FormatV05(), axes=axes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=6000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-ome-zarr-"))
    image = work / "image.ome.zarr"
    write_image(image, args.size)

    def into_labels() -> float:
        shutil.rmtree(image / "labels", ignore_errors=True)
        return predict_to_disk(
            NUCLEI_MODEL, image, None, BlockwiseOptions(labels_into="nuclei", progress=False)
        ).seconds

    def plain() -> float:
        shutil.rmtree(work / "plain.zarr", ignore_errors=True)
        return predict_to_disk(
            NUCLEI_MODEL, image, work / "plain.zarr", BlockwiseOptions(progress=False)
        ).seconds

    runs = {"plain zarr output": plain, "--labels-into (level 0)": into_labels}
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    pyramid: list[float] = []
    for _ in range(args.rounds):
        for name, run in runs.items():
            started = time.perf_counter()
            level0 = run()
            seconds[name].append(level0)
            if name.startswith("--labels-into"):
                pyramid.append(time.perf_counter() - started - level0)
    (node,) = [n for n in Reader(parse_url(str(image)))() if n.load(Label)]
    print(
        f"{machine.description()}; {args.size}x{args.size} OME-Zarr image, 1 worker, {args.rounds} rounds, medians:"
    )
    for name, times in seconds.items():
        print(f"  {name}: {statistics.median(times):.1f} s")
    print(f"  the pyramid after level 0 (--labels-into): {statistics.median(pyramid):.1f} s")
    print(f"  read back: label image {node.metadata['name']!r}, {len(node.data)} levels, "
          f"classes {[p['class'] for p in node.metadata['properties'].values()]}")  # fmt: skip
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
