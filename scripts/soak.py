"""Soak benchmark of the service: N requests against a real `densecnn serve`, server RSS before and after.

    .venv/bin/python scripts/soak.py                       # 1000 requests, a tiny zoo model, 256x256 images
    .venv/bin/python scripts/soak.py --model-dir models --model nuclei --size 512
    .venv/bin/python scripts/soak.py --shapes 1000             # every request a new image size
    .venv/bin/python scripts/soak.py --peak 4000               # peak memory of one 4000x4000 request per format

Starts the server on a free loopback port, warms it up (RSS "before" is taken after the warm-up, so one-time
allocations are not counted as growth), sends the requests at the given concurrency with a few image sizes, and
prints statuses, latency percentiles and the server's resident memory before and after. Not a CI test.

``--peak SIDE`` instead measures one request's peak memory at the default limits: for each answer format (label
PNG, JSON with overlay, npy probabilities) a fresh server gets one SIDE x SIDE RGB image, and the report gives the
server's peak resident memory (VmHWM) minus its resident memory when idle (after a small warm-up request).
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import httpx
import numpy as np
from local_server import running_server
from PIL import Image


def rss_mib(pid: int, field: str = "VmRSS") -> float:
    """The process's resident memory (VmRSS) or its peak so far (VmHWM), MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} for pid {pid}")


PEAK_FORMATS = {  # name -> (Accept, query)
    "labels_png": ("image/png", ""),
    "json_overlay": ("application/json", "?view=overlay"),
    "npy_probabilities": ("application/x-npy", ""),
}


def smooth_image(side: int) -> bytes:
    """A side x side RGB JPEG of smooth blobs: many pixels, few bytes on the wire."""
    yy, xx = np.mgrid[:side, :side].astype(np.float32) / side
    rgb = np.stack([np.sin(9 * xx) * np.cos(7 * yy), np.cos(5 * xx + yy), np.sin(3 * yy)], axis=2)
    buf = io.BytesIO()
    Image.fromarray(((rgb + 1) * 127.5).astype(np.uint8)).save(buf, format="JPEG", quality=85)
    return buf.getvalue()


def peak_memory(model_dir: Path, model: str, side: int) -> dict:
    """Per answer format: one side x side request on a fresh server at the default limits; peak minus idle MiB."""
    body, warm = smooth_image(side), smooth_image(64)
    report = {"image_side": side, "upload_bytes": len(body), "formats": {}}
    env = {"DENSECNN_TORCH_THREADS": "1", "DENSECNN_BACKEND": "native", "DENSECNN_REQUEST_TIMEOUT": "3600"}
    for name, (accept, query) in PEAK_FORMATS.items():
        with running_server(model_dir, env=env) as (url, server):
            post = partial(httpx.post, headers={"content-type": "image/jpeg", "accept": accept}, timeout=3600)
            assert post(f"{url}/v1/models/{model}/segment{query}", content=warm).status_code == 200
            idle = rss_mib(server.pid)
            started = time.perf_counter()
            response = post(f"{url}/v1/models/{model}/segment{query}", content=body)
            seconds = time.perf_counter() - started
            peak = rss_mib(server.pid, "VmHWM")
        report["formats"][name] = {
            "status": response.status_code,
            "seconds": round(seconds, 1),
            "idle_mib": round(idle, 1),
            "peak_mib": round(peak, 1),
            "peak_over_idle_mib": round(peak - idle, 1),
        }
        print(name, report["formats"][name], flush=True)
    return report


def tiny_model_dir() -> Path:
    import densecnn

    root = Path(tempfile.mkdtemp(prefix="densecnn-soak-"))
    model, patch = densecnn.zoo.tiny(in_channels=3, num_classes=3)
    densecnn.save(model.eval(), root / "tiny", patch_size=patch, class_names=["a", "b", "c"])
    return root


def images(size: int, count: int) -> list[bytes]:
    """``count`` PNG images of distinct sizes around ``size`` (shapes vary as in real traffic)."""
    rng = np.random.default_rng(0)
    out = []
    for k in range(count):
        h, w = size - 3 * (k % 17), size - (k % 97)  # 17 x 97 distinct pairs
        buf = io.BytesIO()
        Image.fromarray((rng.random((h, w, 3)) * 255).astype(np.uint8)).save(buf, format="PNG")
        out.append(buf.getvalue())
    return out


async def soak(url: str, model: str, bodies: list[bytes], requests: int, concurrency: int):
    gate = asyncio.Semaphore(concurrency)
    results = []
    async with httpx.AsyncClient(
        base_url=url, timeout=120, limits=httpx.Limits(max_connections=concurrency)
    ) as client:

        async def one(k: int):
            async with gate:
                started = time.perf_counter()
                response = await client.post(
                    f"/v1/models/{model}/segment",
                    content=bodies[k % len(bodies)],
                    headers={"content-type": "image/png"},
                )
                results.append((response.status_code, time.perf_counter() - started))

        await asyncio.gather(*(one(k) for k in range(requests)))
    return results


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model-dir", type=Path, help="default: a temporary directory with a tiny zoo model")
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--size", type=int, default=256, help="image side in pixels (default 256)")
    parser.add_argument(
        "--shapes", type=int, default=4, help="distinct image sizes, used in turn (default 4)"
    )
    parser.add_argument(
        "--peak", type=int, metavar="SIDE", help="measure one SIDE x SIDE request's peak memory"
    )
    parser.add_argument("--out", type=Path, help="also write the numbers as JSON here")
    args = parser.parse_args()

    model_dir = args.model_dir or tiny_model_dir()
    if args.peak:
        report = peak_memory(model_dir, args.model, args.peak)
        print(json.dumps(report, indent=2))
        if args.out:
            args.out.write_text(json.dumps(report, indent=2) + "\n")
        return 0
    env = {"DENSECNN_TORCH_THREADS": "1", "DENSECNN_QUEUE_SIZE": str(args.concurrency)}
    with running_server(model_dir, env=env) as (url, server):
        bodies = images(args.size, args.shapes)
        asyncio.run(soak(url, args.model, bodies, 20, args.concurrency))  # warm-up
        before = rss_mib(server.pid)
        started = time.perf_counter()
        results = asyncio.run(soak(url, args.model, bodies, args.requests, args.concurrency))
        elapsed = time.perf_counter() - started
        after = rss_mib(server.pid)

    statuses = {}
    for status, _ in results:
        statuses[str(status)] = statuses.get(str(status), 0) + 1
    latencies = np.array([seconds for status, seconds in results if status == 200]) * 1000
    report = {
        "requests": args.requests,
        "concurrency": args.concurrency,
        "image_side": args.size,
        "distinct_shapes": args.shapes,
        "statuses": statuses,
        "requests_per_second": round(args.requests / elapsed, 1),
        "latency_ms": {f"p{q}": round(float(np.percentile(latencies, q)), 1) for q in (50, 95, 99)},
        "server_rss_mib": {
            "before": round(before, 1),
            "after": round(after, 1),
            "growth": round(after - before, 1),
        },
    }
    print(json.dumps(report, indent=2))
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
