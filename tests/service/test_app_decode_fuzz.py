"""Decode fuzzing: truncated and bit-flipped PNG/JPEG/GIF/BMP/TIFF files, TIFF stacks and .npy arrays (images for a
2-D model, volumes for a 3-D model) through the upload path.

Every answer is a 200 or a 4xx in the error shape (never a 5xx, never a hang), and the service stays healthy.
Seeded, so a failure reproduces; the seed and the mutation are in the assertion message.
"""

from __future__ import annotations

import io

import numpy as np
import pytest
import tifffile
from densecnn_app import Settings, create_app
from fastapi.testclient import TestClient

import densecnn
from tests.app_support import blobs, encode, save_brightness_model, wait_ready
from tests.service.test_app_volumes import volume_model

MUTANTS_PER_FILE = 40
IMAGE = blobs(24, 32, seed=4)


VOLUME = IMAGE[:, :, :1].reshape(6, 4, 32).repeat(3, axis=1)  # (D, H, W) from the same content


def tiff(array=IMAGE, **kwargs) -> bytes:
    out = io.BytesIO()
    tifffile.imwrite(out, array, photometric="rgb" if array.ndim == 3 and array is IMAGE else None, **kwargs)
    return out.getvalue()


def npy(array) -> bytes:
    out = io.BytesIO()
    np.save(out, array)
    return out.getvalue()


FILES = {
    "png": encode(IMAGE),
    "png-gray16": encode(IMAGE[:, :, 0].astype(np.uint16) * 257),
    "jpeg": encode(IMAGE, "JPEG", quality=90),
    "gif": encode(IMAGE, "GIF"),
    "bmp": encode(IMAGE, "BMP"),
    "tiff": tiff(),
    "tiff-lzw": tiff(compression="lzw"),
    "tiff-deflate-tiled": tiff(compression="zlib", tile=(16, 16)),
    "tiff-jpeg": tiff(compression="jpeg"),
    "tiff-packbits": tiff(compression="packbits"),
    "npy-image": npy(np.moveaxis(IMAGE, -1, 0)),
    "npy-volume": npy(VOLUME),
    "tiff-stack": tiff(VOLUME),
    "tiff-stack-lzw": tiff(VOLUME, compression="lzw"),
}
MODEL = {"npy-volume": "stack", "tiff-stack": "stack", "tiff-stack-lzw": "stack"}  # the others: "cells"


def mutate(data: bytes, rng: np.random.Generator) -> tuple[bytes, str]:
    """A truncated, bit-flipped, or truncated and bit-flipped copy of ``data``, and what was done."""
    kind = rng.choice(["truncate", "flip", "both"])
    out, done = bytearray(data), []
    if kind in ("flip", "both"):
        for _ in range(int(rng.integers(1, 9))):
            at = int(rng.integers(0, len(out)))
            bit = int(rng.integers(0, 8))
            out[at] ^= 1 << bit
            done.append(f"flip byte {at} bit {bit}")
    if kind in ("truncate", "both"):
        keep = int(rng.integers(1, len(out)))
        del out[keep:]
        done.append(f"truncate to {keep}")
    return bytes(out), "; ".join(done)


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    save_brightness_model(root, "cells")
    densecnn.save(volume_model()[0], root / "stack", patch_size=volume_model()[1])
    settings = Settings(
        model_dir=root, torch_threads=1, backend="native", max_image_pixels=1_000_000, max_decode_bytes=8_000_000,
        request_timeout=10,
    )  # fmt: skip
    with TestClient(create_app(settings)) as client:
        wait_ready(client.get)
        yield client


@pytest.mark.parametrize("name", sorted(FILES))
def test_mutated_files_get_200_or_a_4xx_and_the_server_stays_healthy(client, name):
    original, url = FILES[name], f"/v1/models/{MODEL.get(name, 'cells')}/segment"
    assert (
        client.post(url, content=original, headers={"content-type": "application/octet-stream"}).status_code
        == 200
    )
    seed = sorted(FILES).index(name)
    rng = np.random.default_rng(seed)
    statuses = []
    for _ in range(MUTANTS_PER_FILE):
        data, mutation = mutate(original, rng)
        response = client.post(url, content=data, headers={"content-type": "application/octet-stream"})
        where = f"{name}, seed {seed}: {mutation} -> {response.status_code} {response.text[:200]}"
        assert response.status_code == 200 or 400 <= response.status_code < 500, where
        if response.status_code != 200:
            assert set(response.json()["error"]) == {"code", "message", "request_id"}, where
        statuses.append(response.status_code)
    assert any(status != 200 for status in statuses)  # the mutations did reach the decoders' error paths
    assert client.get("/readyz").status_code == 200
    assert (
        client.post(url, content=original, headers={"content-type": "application/octet-stream"}).status_code
        == 200
    )
