"""The service as a real uvicorn process (``densecnn serve``): readiness, exact labels, load, graceful drain."""

from __future__ import annotations

import asyncio
import io
import signal
import threading
import time

import httpx
import numpy as np
import pytest
import torch
from PIL import Image

import densecnn
from tests.app_support import Server, blobs, encode, library_labels, save_brightness_model

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("server_process")]  # one server per module


@pytest.fixture(scope="module")
def model_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    save_brightness_model(root, "cells")
    torch.manual_seed(0)
    slow, patch = densecnn.zoo.stages_46(
        in_channels=3, num_classes=4
    )  # a few seconds for a 160x160 image on one core
    densecnn.save(slow.eval(), root / "slow", patch_size=patch)
    return root


@pytest.fixture(scope="module")
def server(model_root, tmp_path_factory):
    log = tmp_path_factory.mktemp("server") / "server.log"
    server = Server(model_root, log, max_concurrent_inferences=1, queue_size=2)
    yield server
    server.stop()


def test_segment_over_http_equals_library_predict(server, model_root):
    image = encode(blobs(61, 77, seed=3))
    response = httpx.post(
        f"{server.url}/v1/models/cells/segment", files={"image": ("b.png", image, "image/png")}
    )
    assert response.status_code == 200
    labels = np.asarray(Image.open(io.BytesIO(response.content)))
    assert np.array_equal(
        labels, library_labels(model_root / "cells", image, backend="auto")
    )  # both defaults
    assert "infer;dur=" in response.headers["server-timing"]


def test_load_gives_only_200_or_503(server):
    """200 requests at concurrency 16 against 1 worker + a queue of 2: the excess is refused with 503."""
    image = encode(blobs(96, 96, seed=5))

    async def one(client: httpx.AsyncClient) -> tuple[int, float, str | None]:
        started = time.perf_counter()
        response = await client.post(
            "/v1/models/cells/segment", content=image, headers={"content-type": "image/png"}
        )
        return response.status_code, time.perf_counter() - started, response.headers.get("retry-after")

    async def run() -> list[tuple[int, float, str | None]]:
        limits = httpx.Limits(max_connections=16)
        async with httpx.AsyncClient(base_url=server.url, limits=limits, timeout=60) as client:
            gate = asyncio.Semaphore(16)

            async def bounded():
                async with gate:
                    return await one(client)

            return await asyncio.gather(*(bounded() for _ in range(200)))

    results = asyncio.run(run())
    statuses = [status for status, _, _ in results]
    assert set(statuses) <= {200, 503}, statuses
    assert statuses.count(200) > 0
    assert all(retry == "1" for status, _, retry in results if status == 503)
    latencies = np.array([seconds for status, seconds, _ in results if status == 200])
    p95 = np.percentile(latencies, 95) * 1000
    print(f"\nload: {statuses.count(200)} x 200, {statuses.count(503)} x 503; p95 of 200s {p95:.0f} ms")
    assert httpx.get(f"{server.url}/readyz").status_code == 200


def test_sigterm_drains_in_flight_requests(model_root, tmp_path):
    server = Server(model_root, tmp_path / "server.log", backend="native")  # no solver timing: bounded time
    image = encode(blobs(160, 160, seed=7))
    answers = []

    def post():
        answers.append(httpx.post(f"{server.url}/v1/models/slow/segment", content=image,
                                  headers={"content-type": "image/png"}, timeout=60))  # fmt: skip

    worker = threading.Thread(target=post)
    worker.start()
    deadline = time.monotonic() + 30
    while "densecnn_inferences_running 1.0" not in httpx.get(f"{server.url}/metrics").text:
        assert time.monotonic() < deadline, "the slow request never started"
        time.sleep(0.01)
    server.process.send_signal(signal.SIGTERM)
    worker.join(60)
    assert server.process.wait(30) in (0, -signal.SIGTERM)  # uvicorn re-raises the signal it handled
    assert answers and answers[0].status_code == 200  # the in-flight request finished
    assert Image.open(io.BytesIO(answers[0].content)).size == (160, 160)
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{server.url}/healthz", timeout=2)
    log = (tmp_path / "server.log").read_text()
    assert "Waiting for application shutdown" in log or "Shutting down" in log
