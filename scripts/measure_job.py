"""A large job against a real `densecnn serve`: wall time, pixels/s, the server's peak resident memory, and whether its
labels equal `densecnn predict`'s on the same array.

    .venv/bin/python scripts/measure_job.py --side 8000
    .venv/bin/python scripts/measure_job.py --side 20000 --model-dir models --model nuclei --work /big/disk

Writes a SIDE x SIDE uint8 zarr array (RGB, or gray for a 1-channel model) (chunks of 1024, written chunk by chunk: bounded memory) of blob-like
texture under --work, starts the server with that directory as its data root, submits the job as JSON, polls it,
and samples the server's resident memory (its own and its children's, every 0.2 s) until it finishes. Then runs
`densecnn predict` on the same array and compares the two label stores chunk by chunk. Prints one JSON line. Not a
CI test.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
import psutil
import zarr
from local_server import REPO, running_server

import densecnn

CHUNK = 1024


def write_input(path: Path, side: int, channels: int) -> None:
    """(side, side) or (3, side, side) uint8, chunk by chunk: dark background, bright discs, noise (seeded per
    chunk)."""
    lead = (3,) if channels == 3 else ()
    array = zarr.create_array(
        store=str(path), shape=(*lead, side, side), chunks=(*lead, CHUNK, CHUNK), dtype=np.uint8
    )
    yy, xx = np.mgrid[:CHUNK, :CHUNK]
    for i in range(0, side, CHUNK):
        for j in range(0, side, CHUNK):
            rng = np.random.default_rng([i, j])
            tile = np.full((CHUNK, CHUNK), 0.1)
            for _ in range(12):
                cy, cx, r = rng.uniform(0, CHUNK, 2).tolist() + [rng.uniform(10, 60)]
                tile[(yy - cy) ** 2 + (xx - cx) ** 2 < r * r] = rng.choice([0.45, 0.95])
            tile = np.clip(tile + rng.normal(0, 0.03, tile.shape), 0, 1)
            planes = np.stack([tile, tile * 0.9, tile * 0.8]) if lead else tile
            h, w = min(CHUNK, side - i), min(CHUNK, side - j)
            array[..., i : i + h, j : j + w] = (planes * 255).astype(np.uint8)[..., :h, :w]


def tree_rss(process: psutil.Process) -> int:
    total = 0
    for p in [process, *process.children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess):
            total += p.memory_info().rss
    return total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--side", type=int, default=8000)
    parser.add_argument("--model-dir", type=Path, default=REPO / "models")
    parser.add_argument("--model", default="nuclei")
    parser.add_argument(
        "--work", type=Path, help="directory for the input and outputs (default: a temporary one)"
    )
    parser.add_argument("--threads", type=int, default=0, help="DENSECNN_TORCH_THREADS (0: all cores)")
    args = parser.parse_args()

    work = Path(args.work or tempfile.mkdtemp(prefix="densecnn-job-"))
    work.mkdir(parents=True, exist_ok=True)
    source = work / "data" / f"input-{args.side}.zarr"
    if not source.exists():
        started = time.perf_counter()
        write_input(source, args.side, densecnn.load(args.model_dir / args.model).in_channels)
        print(f"wrote {source} in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    env = {"DENSECNN_DATA_ROOTS": json.dumps([str(work / "data")]), "DENSECNN_DATA_DIR": str(work / "service"),
           "DENSECNN_WARM_SIZES": "[]"}  # fmt: skip
    if args.threads:
        env["DENSECNN_TORCH_THREADS"] = str(args.threads)
    with running_server(args.model_dir, env=env) as (url, server):
        process = psutil.Process(server.pid)
        idle = tree_rss(process)
        response = httpx.post(f"{url}/v1/jobs", json={"model": args.model, "input": source.name}, timeout=60)
        response.raise_for_status()
        location, job_id = url + response.headers["location"], response.json()["id"]
        started, peak = time.perf_counter(), idle
        while True:
            peak = max(peak, tree_rss(process))
            job = httpx.get(location, timeout=30).json()
            if job["state"] not in ("queued", "running"):
                break
            time.sleep(0.2)
        seconds = time.perf_counter() - started
    if job["state"] != "succeeded":
        raise SystemExit(f"the job ended {job['state']}: {job['error']}")
    served = work / "service" / "jobs" / job_id / "labels.zarr"
    reference = work / f"predict-{args.side}.zarr"
    started = time.perf_counter()
    command = [sys.executable, "-m", "densecnn.cli", "predict", str(args.model_dir / args.model), str(source),
               str(reference), "--overwrite", "--no-progress"]  # fmt: skip
    subprocess.run(command, check=True, cwd=REPO, env={**os.environ, **env})
    predict_seconds = time.perf_counter() - started
    a, b = zarr.open_array(str(served), mode="r"), zarr.open_array(str(reference), mode="r")
    equal = a.shape == b.shape and all(
        np.array_equal(a[i : i + CHUNK * 4], b[i : i + CHUNK * 4]) for i in range(0, a.shape[0], CHUNK * 4)
    )
    print(json.dumps({
        "side": args.side, "pixels": args.side**2, "model": args.model, "job_seconds": round(seconds, 1),
        "pixels_per_second": round(args.side**2 / seconds), "server_idle_rss_mib": round(idle / 2**20),
        "server_peak_rss_mib": round(peak / 2**20), "predict_seconds": round(predict_seconds, 1),
        "labels_equal_to_predict": bool(equal), "blocks": job["progress"]["blocks_total"],
    }))  # fmt: skip
    return 0 if equal else 1


if __name__ == "__main__":
    sys.exit(main())
