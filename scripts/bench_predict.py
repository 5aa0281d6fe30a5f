#!/usr/bin/env python
"""Measure ``densecnn predict`` throughput: 1 and 2 local workers against one in-memory pass, on the same image,
and what skipping the background saves on a slide-like image.

    python scripts/bench_predict.py --size 2048 --chunk 512 --rounds 3 --out docs/benchmarks

The image is the nuclei test image tiled to SIZE x SIZE (real content), stored as a zarr array in CHUNK x CHUNK
chunks. Each round runs, in turn: the shipped model's dense net over the whole image in this process
(``dense.predict``), ``predict_to_disk(..., BlockwiseOptions(workers=1))`` (one worker in this process, torch using every core), and
``predict_to_disk(..., BlockwiseOptions(workers=2))`` (two worker processes, one core each), every output written to a fresh zarr array.
A warm-up round first fills the solver cache (each worker finds its solvers once per window shape).

The slide-like image is SIZE x SIZE of black with the same nuclei content in TISSUE of its area (a centred square),
as a fluorescence slide is mostly empty: it is labelled by 1 worker with and without ``--foreground auto``.

Reported: output pixels per second (medians over rounds), each as a ratio to the in-memory pass, the seconds per
chunk per worker, and an extrapolation to a 100,000 x 100,000 slide on N workers from that per-chunk cost, which
assumes the per-worker throughput measured here holds on every worker and that reading and writing keep up.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import zarr

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import densecnn  # noqa: E402
from densecnn.bench import machine  # noqa: E402
from densecnn.blockwise import BlockwiseOptions, predict_to_disk  # noqa: E402
from densecnn.io import model_input  # noqa: E402
from densecnn.ops.config import get_config, set_config  # noqa: E402
from tests.predict_support import NUCLEI_MODEL, tiled_nuclei  # noqa: E402

SLIDE = 100_000  # pixels per side of the extrapolated slide


def in_memory(pixels: np.ndarray) -> float:
    """Seconds for one pass of the dense net over the whole image, reading and normalising included."""
    started = time.perf_counter()
    loaded = densecnn.load(NUCLEI_MODEL)
    with torch.no_grad():
        loaded.dense().predict(model_input(pixels, loaded))
    return time.perf_counter() - started


def chunked(image: Path, out: Path, workers: int, chunk: int, foreground: str | None = None) -> float:
    shutil.rmtree(out, ignore_errors=True)
    options = BlockwiseOptions(workers=workers, block=chunk, foreground=foreground, progress=False)
    summary = predict_to_disk(NUCLEI_MODEL, image, out, options)
    assert summary.computed == summary.total, summary
    return summary.seconds


def slide_like(size: int, tissue: float) -> np.ndarray:
    """(size, size) uint8: black, with the nuclei content in a centred square of ``tissue`` of the area."""
    side = round(size * tissue**0.5)
    start = (size - side) // 2
    image = np.zeros((size, size), np.uint8)
    image[start : start + side, start : start + side] = tiled_nuclei(size, size)[
        start : start + side, start : start + side
    ]
    return image


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=2048)
    parser.add_argument("--chunk", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tissue", type=float, default=0.2, help="foreground share of the slide-like image")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks")
    args = parser.parse_args()
    if "DENSECNN_CACHE_DIR" not in os.environ:  # a private, empty solver cache unless one was chosen
        cache = tempfile.mkdtemp(prefix="densecnn-cache-")
        os.environ["DENSECNN_CACHE_DIR"] = cache  # worker processes read it when they import densecnn
        set_config(get_config().replace(cache_dir=cache))  # this one has read the environment already

    work = Path(tempfile.mkdtemp(prefix="bench-predict-"))
    pixels = tiled_nuclei(args.size, args.size)
    zarr.create_array(store=str(work / "image.zarr"), data=pixels, chunks=(args.chunk, args.chunk))
    slide = work / "slide.zarr"
    zarr.create_array(
        store=str(slide), data=slide_like(args.size, args.tissue), chunks=(args.chunk, args.chunk)
    )
    runs = {
        "in-memory, 1 process": lambda: in_memory(pixels),
        "predict, 1 worker": lambda: chunked(work / "image.zarr", work / "one.zarr", 1, args.chunk),
        "predict, 2 workers": lambda: chunked(work / "image.zarr", work / "two.zarr", 2, args.chunk),
        "slide-like, 1 worker": lambda: chunked(slide, work / "slide-all.zarr", 1, args.chunk),
        "slide-like, 1 worker, --foreground auto": lambda: chunked(
            slide, work / "slide-fg.zarr", 1, args.chunk, "auto"
        ),
    }
    for run in runs.values():  # warm-up: solver search, imports, worker start-up paths
        run()
    load_before = os.getloadavg()[0]
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.rounds):  # interleaved
        for name, run in runs.items():
            seconds[name].append(run())
    shutil.rmtree(work, ignore_errors=True)

    pixels_total = args.size * args.size
    chunks = math.ceil(args.size / args.chunk) ** 2
    base = statistics.median(seconds["in-memory, 1 process"])
    rows = []
    for name, times in seconds.items():
        median = statistics.median(times)
        rows.append({"run": name, "seconds": times, "median_s": median, "pixels_per_s": pixels_total / median,
                     "vs_in_memory": base / median})  # fmt: skip
    skipping = statistics.median(seconds["slide-like, 1 worker"]) / statistics.median(
        seconds["slide-like, 1 worker, --foreground auto"]
    )
    two = statistics.median(seconds["predict, 2 workers"])
    chunk_seconds = two * 2 / chunks  # per chunk per worker, measured with 2 workers
    slide_chunks = math.ceil(SLIDE / args.chunk) ** 2
    extrapolation = {n: slide_chunks * chunk_seconds / n / 3600 for n in (1, 8, 32, 128)}
    result = {
        "machine": f"{machine.description()}, {os.cpu_count()} cores, torch {torch.__version__}",
        "image": f"{args.size}x{args.size} nuclei (tiled), zarr chunks {args.chunk}x{args.chunk}",
        "rounds": args.rounds,
        "load_average": [round(load_before, 1), round(os.getloadavg()[0], 1)],
        "runs": rows,
        "seconds_per_chunk_per_worker": chunk_seconds,
        "tissue": args.tissue,
        "background_skipping_speedup": skipping,
        "extrapolated_hours_100k_slide": extrapolation,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "predict.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out / "predict.md").write_text(markdown(result, args))
    print(markdown(result, args))


def markdown(result: dict, args) -> str:
    lines = [
        "# `densecnn predict` throughput",
        "",
        f"Measured by `python scripts/bench_predict.py --size {args.size} --chunk {args.chunk} --rounds "
        f"{args.rounds}` on {result['machine']}: the shipped nuclei model over a {result['image']}; "
        "rounds interleaved, medians.",
        "",
        f"Machine load average (1 min) before and after the rounds: {result['load_average'][0]} and "
        f"{result['load_average'][1]} on {os.cpu_count()} cores: other work shared the cores, so absolute numbers "
        "are low; the ratios come from interleaved rounds.",
        "",
        "| run | median s | output pixels/s | vs in-memory |",
        "|---|---:|---:|---:|",
    ]
    for row in result["runs"]:
        lines.append(f"| {row['run']} | {row['median_s']:.2f} | {row['pixels_per_s']:,.0f} | "
                     f"{row['vs_in_memory']:.2f}x |")  # fmt: skip
    lines += [
        "",
        f"Background skipped: on the slide-like image ({100 * result['tissue']:.0f}% tissue in a centred square, "
        f"the rest black), `--foreground auto` labels it {result['background_skipping_speedup']:.2f}x as fast as "
        "computing every chunk (1 worker).",
        "",
        f"Per-chunk cost (2 workers): {result['seconds_per_chunk_per_worker']:.2f} s per {args.chunk}x{args.chunk} "
        "chunk per worker.",
        "",
        f"**Extrapolation, not a measurement**: a {SLIDE:,} x {SLIDE:,} slide in {args.chunk}-pixel chunks at that "
        "per-chunk cost, assuming every worker runs at the per-worker speed measured here (one core each) and "
        "storage keeps up:",
        "",
        "| workers | hours |",
        "|---:|---:|",
    ]
    lines += [f"| {n} | {hours:.2f} |" for n, hours in result["extrapolated_hours_100k_slide"].items()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
