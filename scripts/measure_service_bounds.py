"""What a hostile client can still take from a real `densecnn serve`, after the service's bounds: the largest resident
memory growth a job parameter causes, the disk quota's worst overshoot, and the time from a cancel to the job's last
write.

    .venv/bin/python scripts/measure_service_bounds.py            # about 3 minutes on 2 cores

- memory: the server's resident memory (its own and its children's, sampled every 0.1 s) while a job runs on a
  SIDE x SIDE zarr array with the largest chunk the API schema takes (16384: one task for the whole image), and the
  answer to the chunk that grew the server by 9.5 GiB before (100000);
- quota: jobs of small chunks (each chunk file takes a whole disk block) and a resumable upload: the bytes reserved
  at admission against the disk blocks the files take once written; and five 6 MB uploads under an 8 MB quota,
  created, then sent;
- cancel: a job of many small chunks cancelled mid-run; the time from the DELETE to the newest file of its store.

Prints one JSON line. Not a CI test.
"""

from __future__ import annotations

import argparse
import base64
import json
import sqlite3
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import psutil
from local_server import REPO, running_server
from measure_job import tree_rss, write_input

import densecnn

TUS = {"Tus-Resumable": "1.0.0"}


def disk_blocks(path: Path) -> int:
    return sum(p.lstat().st_blocks * 512 for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def reserved(service: Path, name: str) -> int:
    with sqlite3.connect(service / "jobs.db") as db:
        row = db.execute("SELECT bytes FROM reservations WHERE id = ?", (name,)).fetchone()
    return row[0] if row else 0


def finished(url: str, location: str) -> dict:
    while True:
        job = httpx.get(url + location, timeout=30).json()
        if job["state"] not in ("queued", "running"):
            return job
        time.sleep(0.1)


def memory(url: str, server, model: str, source: str) -> dict:
    process = psutil.Process(server.pid)
    idle = tree_rss(process)
    refused = httpx.post(
        f"{url}/v1/jobs", json={"model": model, "input": source, "chunk": 100_000}, timeout=60
    )
    peak, stop = [idle], threading.Event()

    def sample():
        while not stop.is_set():
            peak[0] = max(peak[0], tree_rss(process))
            time.sleep(0.1)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        response = httpx.post(
            f"{url}/v1/jobs", json={"model": model, "input": source, "chunk": 16384}, timeout=60
        )
        response.raise_for_status()
        job = finished(url, response.headers["location"])
    finally:
        stop.set()
        sampler.join()
    return {"chunk_100000_status": refused.status_code, "chunk_16384_state": job["state"],
            "idle_rss_mib": round(idle / 2**20), "chunk_16384_peak_rss_mib": round(peak[0] / 2**20),
            "largest_growth_mib": round((peak[0] - idle) / 2**20)}  # fmt: skip


def quota(url: str, service: Path, model: str, source: str) -> dict:
    overshoots = []
    for chunk in (16, 64, 256):
        response = httpx.post(
            f"{url}/v1/jobs", json={"model": model, "input": source, "chunk": chunk}, timeout=60
        )
        response.raise_for_status()
        job_id = response.json()["id"]
        planned = reserved(service, job_id)  # before the job ends (then it becomes the blocks taken)
        job = finished(url, response.headers["location"])
        assert job["state"] == "succeeded", job
        taken = disk_blocks(service / "jobs" / job_id)
        overshoots.append({"chunk": chunk, "reserved": planned, "taken": taken, "overshoot": taken - planned})
        httpx.delete(f"{url}/v1/jobs/{job_id}", timeout=30)
    name = base64.b64encode(b"x.tif").decode()
    created = [httpx.post(f"{url}/v1/uploads", headers={**TUS, "Upload-Length": str(6_000_000),
                                                         "Upload-Metadata": f"filename {name}"})
               for _ in range(5)]  # fmt: skip
    sent = [httpx.patch(f"{url}{c.headers['location']}", content=b"\0" * 6_000_000, timeout=60,
                        headers={**TUS, "Upload-Offset": "0", "Content-Type": "application/offset+octet-stream"})
            for c in created if c.status_code == 201]  # fmt: skip
    return {"jobs": overshoots, "worst_overshoot_bytes": max(o["overshoot"] for o in overshoots),
            "uploads_of_6MB_under_8MB": {"created": [c.status_code for c in created],
                                         "sent": [r.status_code for r in sent]}}  # fmt: skip


def cancel(url: str, service: Path, model: str, source: str) -> dict:
    response = httpx.post(f"{url}/v1/jobs", json={"model": model, "input": source, "chunk": 32}, timeout=60)
    response.raise_for_status()
    location, job_id = response.headers["location"], response.json()["id"]
    while httpx.get(url + location, timeout=30).json()["progress"]["blocks_done"] < 20:
        time.sleep(0.05)
    cancelled_at = time.time()
    httpx.delete(url + location, timeout=30)
    job = finished(url, location)
    answered = time.time() - cancelled_at
    time.sleep(5)  # anything still writing shows by now
    store = service / "jobs" / job_id / "labels.zarr"
    last = max((p.stat().st_mtime for p in store.rglob("*") if p.is_file()), default=cancelled_at)
    return {"state": job["state"], "blocks_done": job["progress"]["blocks_done"],
            "blocks_total": job["progress"]["blocks_total"], "cancel_to_cancelled_s": round(answered, 2),
            "cancel_to_last_write_s": round(max(0.0, last - cancelled_at), 2)}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--side", type=int, default=4096, help="of the memory job's input")
    parser.add_argument("--model-dir", type=Path, default=REPO / "models")
    parser.add_argument("--model", default="nuclei")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="densecnn-bounds-"))
    channels = densecnn.load(args.model_dir / args.model).in_channels
    write_input(work / "data" / "large.zarr", args.side, channels)
    write_input(work / "data" / "small.zarr", 512, channels)
    service = work / "service"
    env = {"DENSECNN_DATA_ROOTS": json.dumps([str(work / "data")]), "DENSECNN_DATA_DIR": str(service),
           "DENSECNN_WARM_SIZES": "[]", "DENSECNN_JOB_BLOCK": "256"}  # fmt: skip
    with running_server(args.model_dir, env=env) as (url, server):
        figures = {"memory": memory(url, server, args.model, "large.zarr")}
        figures["cancel"] = cancel(url, service, args.model, "small.zarr")
    service = work / "service-quota"  # a data directory of its own, under a quota of 8 MB
    env.update(DENSECNN_DATA_DIR=str(service), DENSECNN_DISK_QUOTA_BYTES=str(8_000_000))
    with running_server(args.model_dir, env=env) as (url, server):
        figures["quota"] = quota(url, service, args.model, "small.zarr")
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
