"""Soak benchmark of the service: N requests against a real `densecnn serve`, server RSS before and after.

    .venv/bin/python scripts/soak.py                       # 1000 requests, a tiny zoo model, 256x256 images
    .venv/bin/python scripts/soak.py --model-dir models --model nuclei --size 512
    .venv/bin/python scripts/soak.py --shapes 1000             # every request a new image size

Starts the server on a free loopback port, warms it up (RSS "before" is taken after the warm-up, so one-time
allocations are not counted as growth), sends the requests at the given concurrency with a few image sizes, and
prints statuses, latency percentiles and the server's resident memory before and after. Not a CI test.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
from local_server import running_server
from PIL import Image


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


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
    parser.add_argument("--out", type=Path, help="also write the numbers as JSON here")
    args = parser.parse_args()

    model_dir = args.model_dir or tiny_model_dir()
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
