"""The service as a real uvicorn process (``densecnn serve``): readiness, exact labels, load, graceful drain."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import signal
import socket
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from PIL import Image

import densecnn
from tests.app_support import (
    CLASS_NAMES,
    Server,
    assert_library_labels,
    blobs,
    encode,
    save_brightness_model,
)

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
    assert_library_labels(labels, model_root / "cells", image, backend="auto")  # both defaults
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
    assert server.process.wait(30) == 0  # a clean shutdown, not death by the signal (143)
    assert answers and answers[0].status_code == 200  # the in-flight request finished
    assert Image.open(io.BytesIO(answers[0].content)).size == (160, 160)
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{server.url}/healthz", timeout=2)
    log = (tmp_path / "server.log").read_text()
    assert "Waiting for application shutdown" in log or "Shutting down" in log


def test_two_worker_processes_serve_and_stop_cleanly(model_root, tmp_path):
    server = Server(model_root, tmp_path / "server.log", workers=2, backend="native")
    # Server waits for one worker; the other may still be loading (and verifying) its models and answer 503
    # not_ready meanwhile: wait until new connections, which either worker may take, keep finding one ready
    deadline, ready_in_a_row = time.monotonic() + 60, 0
    while ready_in_a_row < 20:
        assert time.monotonic() < deadline, "the second worker never became ready"
        ready_in_a_row = ready_in_a_row + 1 if httpx.get(f"{server.url}/readyz").status_code == 200 else 0
    answers = [httpx.post(f"{server.url}/v1/models/cells/segment", content=encode(blobs(40, 40)),
                          headers={"content-type": "image/png"}, timeout=60) for _ in range(4)]  # fmt: skip
    assert [a.status_code for a in answers] == [200] * 4
    # multiprocess metrics: whichever worker answers /metrics (a new connection each time) counts both workers'
    for _ in range(6):
        samples = [line for line in httpx.get(f"{server.url}/metrics").text.splitlines()
                   if line.startswith("densecnn_http_requests_total{") and 'status="200"' in line
                   and "/segment" in line]  # fmt: skip
        assert [float(line.rsplit(" ", 1)[1]) for line in samples] == [4.0], samples
    assert server.stop() == 0
    assert "died" not in (tmp_path / "server.log").read_text()  # no worker was restarted


def metric(url: str, line_start: str) -> float:
    """The value of the first /metrics sample line starting with ``line_start`` (0 if absent)."""
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith(line_start):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_clients_that_give_up_do_not_delay_the_next_one(model_root, tmp_path):
    """Four clients post 1024x1024 images to a slow model (~20 s each here) and give up after 1 s: the queued jobs
    never start and the running one stops at its next layer, so a fifth, small request is answered at once."""
    server = Server(model_root, tmp_path / "server.log", backend="native", queue_size=4)
    try:
        big = encode(blobs(1024, 1024, seed=11))

        def give_up() -> None:
            with pytest.raises(httpx.ReadTimeout):
                httpx.post(f"{server.url}/v1/models/slow/segment", content=big,
                           headers={"content-type": "image/png"}, timeout=httpx.Timeout(30, read=1.0))  # fmt: skip

        clients = [threading.Thread(target=give_up) for _ in range(4)]
        for client in clients:
            client.start()
        for client in clients:
            client.join(30)
        started = time.perf_counter()
        small = httpx.post(f"{server.url}/v1/models/cells/segment", content=encode(blobs(64, 64)),
                           headers={"content-type": "image/png"}, timeout=60)  # fmt: skip
        waited = time.perf_counter() - started
        print(f"\nthe fifth request took {waited:.2f} s after four clients gave up")
        assert small.status_code == 200
        assert waited < 5  # not the 4 x ~20 s the abandoned work would take
        assert metric(server.url, 'densecnn_inferences_abandoned_total{reason="client_gone"}') == 4
        assert (
            metric(
                server.url,
                'densecnn_http_requests_total{method="POST",route="/v1/models/{name}/segment",status="499"}',
            )
            == 4
        )
    finally:
        assert server.stop() == 0
    assert "Traceback" not in (tmp_path / "server.log").read_text()


@pytest.fixture(scope="module")
def strict_server(model_root, tmp_path_factory):
    """A server with short deadlines for slow clients."""
    log = tmp_path_factory.mktemp("strict") / "server.log"
    server = Server(
        model_root, log, backend="native", header_timeout=1, upload_timeout=1, keep_alive_timeout=1
    )
    yield server
    server.stop()


def raw_connection(server: Server) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    return sock


def closed_within(sock: socket.socket, seconds: float) -> bool:
    """Whether the server closes ``sock`` within ``seconds`` (reading whatever it sends first)."""
    sock.settimeout(seconds)
    try:
        while sock.recv(4096):
            pass
        return True
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def read_until_closed(sock: socket.socket, seconds: float) -> bytes:
    """Everything the server sends until it closes the connection (or ``seconds`` pass)."""
    sock.settimeout(seconds)
    chunks = []
    try:
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    except (TimeoutError, ConnectionResetError):
        pass
    return b"".join(chunks)


def test_slowloris_headers_are_cut_off(strict_server):
    with raw_connection(strict_server) as sock:
        sock.sendall(b"POST /v1/models/cells/segment HTTP/1.1\r\nHost: x\r\n")
        started = time.perf_counter()
        try:
            for _ in range(20):  # one header byte every 0.2 s: never a complete request
                sock.sendall(b"X")
                time.sleep(0.2)
        except (BrokenPipeError, ConnectionResetError):
            pass
        assert closed_within(sock, 1)
        assert (
            time.perf_counter() - started < 4
        )  # the header timeout (1 s), not the 4 s the client would take
    assert httpx.get(f"{strict_server.url}/healthz").status_code == 200


def test_idle_keep_alive_connection_is_closed(strict_server):
    with raw_connection(strict_server) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        time.sleep(0.2)
        assert sock.recv(4096).startswith(b"HTTP/1.1 200")
        assert closed_within(sock, 5)  # keep-alive timeout of 1 s


def test_slow_body_is_408(strict_server):
    with raw_connection(strict_server) as sock:
        sock.sendall(b"POST /v1/models/cells/segment HTTP/1.1\r\nHost: x\r\nContent-Type: image/png\r\n"
                     b"Content-Length: 100000\r\n\r\n" + b"\x89PNG" + b"\x00" * 100)  # fmt: skip
        answer = read_until_closed(sock, 10)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408") and b"application/json" in head
    assert json.loads(body)["error"]["code"] == "upload_timeout"


def test_a_stalled_job_upload_is_408(strict_server):
    """A job upload has no deadline as a whole (it may be large), but a pause of upload_timeout ends it."""
    with raw_connection(strict_server) as sock:
        sock.sendall(b"POST /v1/jobs?model=cells HTTP/1.1\r\nHost: x\r\nContent-Type: image/tiff\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n64\r\nII*\x00" + b"\x00" * 96 + b"\r\n")  # fmt: skip
        answer = read_until_closed(sock, 10)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), answer[:300]
    assert b"upload_timeout" in body


def test_client_leaving_mid_upload_is_one_log_line_and_499(strict_server):
    before = metric(
        strict_server.url,
        'densecnn_http_requests_total{method="POST",route="/v1/models/{name}/segment",status="499"}',
    )
    with raw_connection(strict_server) as sock:
        sock.sendall(b"POST /v1/models/cells/segment HTTP/1.1\r\nHost: x\r\nContent-Type: image/png\r\n"
                     b"Content-Length: 100000\r\n\r\n" + b"\x89PNG" + b"\x00" * 1000)  # fmt: skip
        time.sleep(0.2)
    deadline = time.monotonic() + 5
    line = 'densecnn_http_requests_total{method="POST",route="/v1/models/{name}/segment",status="499"}'
    while metric(strict_server.url, line) == before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert metric(strict_server.url, line) == before + 1
    assert 'status="500"' not in httpx.get(f"{strict_server.url}/metrics").text
    log = strict_server.log.read_text()
    assert log.count("closed the connection before the answer") == 1 and "Traceback" not in log


def test_protocol_errors_are_plain_text_from_uvicorn(strict_server):
    """Malformed HTTP never reaches the app: uvicorn answers 400 in plain text (documented)."""
    with raw_connection(strict_server) as sock:
        sock.sendall(b"NOT HTTP AT ALL\r\n\r\n")
        answer = read_until_closed(sock, 10)
    assert answer.startswith(b"HTTP/1.1 400") and b"text/plain" in answer


# The bound is "about": at these limits, scaled down to 1 M pixels, where one buffer more or less in a malloc arena is
# a tenth of the request, the same request's peak moved between 78 and 100 MiB (bound 89) from one fresh server to
# the next.
ALLOCATOR_SLACK = 1.15


def memory_mib(pid: int, field: str) -> float:
    """VmRSS (resident now) or VmHWM (peak resident so far) of a process, MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no {field} for {pid}")


def smooth_jpeg(side: int) -> bytes:
    yy, xx = np.mgrid[:side, :side].astype(np.float32) / side
    rgb = np.stack([np.sin(9 * xx) * np.cos(7 * yy), np.cos(5 * xx + yy), np.sin(3 * yy)], axis=2)
    return encode(((rgb + 1) * 127.5).astype(np.uint8), "JPEG", quality=85)


@pytest.mark.parametrize(
    ("accept", "query"), [("image/png", ""), ("application/json", "?view=overlay"), ("application/x-npy", "")]
)
def test_one_request_stays_within_the_documented_memory_bound(model_root, tmp_path, accept, query):
    """A 1000x1000 RGB image at limits scaled down from the defaults, on a fresh server: its peak resident memory
    over idle stays under Settings.request_memory_bound (docs/service.md measures the defaults at 4000x4000)."""
    from densecnn_app.settings import Settings

    limits = dict(max_upload_bytes=2_000_000, max_image_pixels=1_000_000, max_decode_bytes=4 << 20,
                  max_inference_memory=64 << 20)  # fmt: skip
    classes = len(CLASS_NAMES) if accept == "application/x-npy" else 0  # the probabilities answer
    settings = Settings(model_dir=model_root, **limits)
    bound = settings.request_memory_bound(in_channels=3, probability_classes=classes) / 2**20
    server = Server(model_root, tmp_path / "server.log", backend="native", **limits)
    try:
        url = f"{server.url}/v1/models/cells/segment{query}"
        headers = {"content-type": "image/jpeg", "accept": accept}
        assert httpx.post(url, content=smooth_jpeg(64), headers=headers).status_code == 200  # warm-up
        idle = memory_mib(server.process.pid, "VmRSS")
        response = httpx.post(url, content=smooth_jpeg(1000), headers=headers, timeout=120)
        assert response.status_code == 200, response.text
        peak = memory_mib(server.process.pid, "VmHWM") - idle
        print(f"\n{accept}{query}: peak over idle {peak:.1f} MiB, bound {bound:.1f} MiB")
        assert peak <= bound * ALLOCATOR_SLACK
    finally:
        server.stop()


@pytest.mark.parametrize("accept", ["image/tiff", "application/x-npy"])
def test_one_volume_request_stays_within_the_documented_memory_bound(model_root, tmp_path, accept):
    """A 100x100x100 volume at the limits of the image test, on a fresh server: its peak resident memory over idle
    stays under Settings.request_memory_bound(dims=3)."""
    from densecnn_app.settings import Settings

    from tests.service.test_app_volumes import volume_model

    root = tmp_path / "models"
    model, patch = volume_model()
    densecnn.save(model, root / "stack", patch_size=patch)
    limits = dict(max_upload_bytes=2_000_000, max_image_pixels=1_000_000, max_decode_bytes=4 << 20,
                  max_inference_memory=64 << 20)  # fmt: skip
    classes = 3 if accept == "application/x-npy" else 0  # the probabilities answer
    bound = (
        Settings(model_dir=root, **limits).request_memory_bound(1, dims=3, probability_classes=classes)
        / 2**20
    )
    server = Server(root, tmp_path / "server.log", backend="native", **limits)
    rng = np.random.default_rng(0)
    try:
        url = f"{server.url}/v1/models/stack/segment"
        headers = {"content-type": "application/x-npy", "accept": accept}
        small = io.BytesIO()
        np.save(small, rng.integers(0, 255, (8, 16, 16), dtype=np.uint8))
        warm = httpx.post(url, content=small.getvalue(), headers=headers)
        assert warm.status_code == 200, warm.text  # warm-up
        idle = memory_mib(server.process.pid, "VmRSS")
        volume = io.BytesIO()
        np.save(volume, rng.integers(0, 255, (100, 100, 100), dtype=np.uint8))
        response = httpx.post(url, content=volume.getvalue(), headers=headers, timeout=300)
        assert response.status_code == 200, response.text
        peak = memory_mib(server.process.pid, "VmHWM") - idle
        print(f"\nvolume, {accept}: peak over idle {peak:.1f} MiB, bound {bound:.1f} MiB")
        assert peak <= bound * ALLOCATOR_SLACK
    finally:
        server.stop()


@pytest.fixture(scope="module")
def limited_server(model_root, tmp_path_factory):
    """A server that holds 5 connections, 3 per client address."""
    log = tmp_path_factory.mktemp("limited") / "server.log"
    server = Server(model_root, log, backend="native", max_connections=5, max_connections_per_client=3)
    yield server
    server.stop()


def connect_from(server: Server, address: str) -> socket.socket:
    """A connection to the server from another loopback address (127.0.0.0/8 is all this machine's)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((address, 0))
    sock.settimeout(10)
    sock.connect(("127.0.0.1", server.port))
    return sock


def refused_as_overloaded(sock: socket.socket) -> bool:
    head, _, body = read_until_closed(sock, 5).partition(b"\r\n\r\n")
    return (
        head.startswith(b"HTTP/1.1 503")
        and b"retry-after: " in head.lower()
        and json.loads(body)["error"]["code"] == "overloaded"
    )


def healthz_from(server: Server, address: str) -> bytes:
    with connect_from(server, address) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        return read_until_closed(sock, 5)


def test_one_client_cannot_take_every_connection(limited_server):
    idle = [connect_from(limited_server, "127.0.0.2") for _ in range(3)]  # half-open: no request ever sent
    try:
        time.sleep(0.2)
        with connect_from(limited_server, "127.0.0.2") as fourth:
            assert refused_as_overloaded(fourth)  # JSON, with Retry-After: not uvicorn's plain text
        assert healthz_from(limited_server, "127.0.0.3").startswith(b"HTTP/1.1 200")  # others are served
        more = [connect_from(limited_server, "127.0.0.4") for _ in range(2)]  # 5 open in all
        time.sleep(0.2)
        with connect_from(limited_server, "127.0.0.5") as sixth:
            assert refused_as_overloaded(sixth)
        for sock in more:
            sock.close()
    finally:
        for sock in idle:
            sock.close()
    time.sleep(0.2)
    assert healthz_from(limited_server, "127.0.0.2").startswith(b"HTTP/1.1 200")  # its slots are back


@pytest.mark.parametrize("header_bytes", [120_000, 1_000_000])
def test_headers_past_max_header_bytes_are_431_however_they_arrive(strict_server, header_bytes):
    request = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * header_bytes + b"\r\n\r\n"
    with raw_connection(strict_server) as sock:
        # one write: h11 parses complete headers past its own limit; refused before the client finished sending,
        # the answer is still there to read
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(request)
        head, _, body = read_until_closed(sock, 5).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 431"), head[:80]
    assert json.loads(body)["error"]["code"] == "headers_too_large"
    assert httpx.get(f"{strict_server.url}/healthz").status_code == 200
