"""Helpers for the service tests: small model directories, test images, waiting for readiness."""

from __future__ import annotations

import io
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import torch
from PIL import Image

import densecnn
from densecnn.io import read_image
from tests.tolerances import assert_labels_equal_except_ties

REPO = Path(__file__).resolve().parent.parent
CLASS_NAMES = ["background", "dim", "bright"]


def brightness_model(in_channels: int = 3) -> tuple[torch.nn.Sequential, int]:
    """zoo.tiny with hand-set weights: labels pixels by the mean brightness h of their patch (0 < h < tanh 1).

    Every layer averages, so h is a local mean; the head scores 0, 10(h-0.25), 20(h-0.375): class 0 "background"
    for h < 0.25, 1 "dim" up to 0.5, 2 "bright" above.
    """
    model, patch = densecnn.zoo.tiny(in_channels=in_channels, num_classes=3)
    conv1, conv2, fc1, fc2 = model[0], model[3], model[7], model[9]
    with torch.no_grad():
        conv1.weight.fill_(1.0 / conv1.weight[0].numel())
        conv2.weight.fill_(1.0 / conv2.weight[0].numel())
        fc1.weight.fill_(1.0 / fc1.in_features)
        fc2.weight.copy_(torch.tensor([0.0, 10.0, 20.0])[:, None].expand(3, 8) / 8)
        for layer in (conv1, conv2, fc1):
            layer.bias.zero_()
        fc2.bias.copy_(torch.tensor([0.0, -2.5, -7.5]))
    return model.eval(), patch


def save_brightness_model(root: Path, name: str = "cells", in_channels: int = 3, **kwargs) -> Path:
    model, patch = brightness_model(in_channels)
    palette = [[0, 0, 0], [40, 120, 255], [255, 200, 0]]
    return densecnn.save(
        model, root / name, patch_size=patch, class_names=CLASS_NAMES, palette=palette, **kwargs
    )


def blobs(height: int = 48, width: int = 64, seed: int = 0) -> np.ndarray:
    """An (H, W, 3) uint8 picture: dark background, dim and bright discs, a little noise."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[:height, :width]
    image = np.full((height, width), 0.1)
    for k in range(6):
        cy, cx, r = rng.uniform(0, height), rng.uniform(0, width), rng.uniform(4, min(height, width) / 4)
        image[(yy - cy) ** 2 + (xx - cx) ** 2 < r * r] = 0.45 if k % 2 else 0.95
    image += rng.normal(0, 0.03, image.shape)
    rgb = np.stack([image, image * 0.9, image * 0.8], axis=2)
    return (np.clip(rgb, 0, 1) * 255).astype(np.uint8)


def encode(array: np.ndarray, fmt: str = "PNG", **save_kwargs) -> bytes:
    out = io.BytesIO()
    Image.fromarray(array).save(out, format=fmt, **save_kwargs)
    return out.getvalue()


def wait_ready(get, timeout: float = 30.0) -> None:
    """Poll ``get("/readyz")`` until it answers 200."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if get("/readyz").status_code == 200:
                return
        except Exception:  # the server is not listening yet
            pass
        time.sleep(0.05)
    raise TimeoutError("the service did not become ready")


def library_scores(model_dir: Path, image_bytes: bytes, backend: str = "native") -> torch.Tensor:
    """The scores the library gives for an image file: read_image -> normalize -> DenseCNN. (1, K, H, W)."""
    loaded = densecnn.load(model_dir)
    x = torch.from_numpy(read_image(image_bytes, loaded.in_channels))[None]
    with torch.no_grad():
        return loaded.dense(backend=backend)(loaded.normalize(x))


def assert_library_labels(
    labels: np.ndarray, model_dir: Path, image_bytes: bytes, backend: str = "native"
) -> None:
    """(H, W) labels from the service are the library's labels for the same file, except at exact ties.

    The service may compute in tiles or with other solvers than this reference, so scores agree to rounding and
    labels everywhere but where the two best classes are within rounding of each other.
    """
    scores = library_scores(model_dir, image_bytes, backend)
    assert labels.shape == tuple(scores.shape[2:]), (labels.shape, scores.shape)
    assert_labels_equal_except_ties(torch.from_numpy(labels.astype(np.int64))[None], scores)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    """``densecnn serve`` in a subprocess on a free loopback port. No start-up warm-up unless ``warm_sizes`` is given:
    readiness is awaited on one worker, and a warming sibling would answer 503 meanwhile."""

    def __init__(self, model_dir: Path, log: Path, *, workers: int = 1, **settings):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**os.environ, "DENSECNN_TORCH_THREADS": "1", "DENSECNN_WARM_SIZES": "[]"}
        env.update({f"DENSECNN_{key.upper()}": str(value) for key, value in settings.items()})
        self.log = log
        command = [
            sys.executable,
            "-m",
            "densecnn.cli",
            "serve",
            "--model-dir",
            str(model_dir),
            "--port",
            str(self.port),
            "--workers",
            str(workers),
        ]
        self.process = subprocess.Popen(
            command, cwd=REPO, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT
        )
        try:
            wait_ready(lambda path: httpx.get(self.url + path, timeout=2), timeout=60)
        except TimeoutError:
            self.stop()
            raise AssertionError(f"server did not become ready:\n{log.read_text()}") from None

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode
