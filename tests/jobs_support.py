"""Helpers for the job tests: a service with a data root holding a small zarr image, polling, the reference labels,
the API's error bodies."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

import densecnn
from densecnn.io import model_input
from tests.app_support import blobs, save_brightness_model, wait_ready

FINISHED = {"succeeded", "failed", "cancelled"}


def job_settings(tmp_path: Path, **changes):
    """Settings of a service with the model "cells", its own data dir, and a data root (``tmp_path/"data"``)."""
    from densecnn_app.settings import Settings

    models = tmp_path / "models"
    if not (models / "cells").exists():
        save_brightness_model(models, "cells")
    (tmp_path / "data").mkdir(exist_ok=True)
    values = dict(model_dir=models, data_dir=tmp_path / "service", data_roots=[tmp_path / "data"], warm_sizes=[],
                  torch_threads=1, job_block=32, job_poll_seconds=0.2, job_task_memory=256 << 20)  # fmt: skip
    return Settings(**{**values, **changes})


@contextmanager
def serving(settings) -> Iterator:
    """A TestClient of the app for ``settings``, its lifespan run and its models loaded."""
    from densecnn_app.main import create_app
    from fastapi.testclient import TestClient

    with TestClient(create_app(settings)) as client:
        wait_ready(client.get)
        yield client


def write_zarr(path: Path, height: int = 96, width: int = 128, seed: int = 3, chunks: int = 32) -> np.ndarray:
    """A (3, H, W) uint8 zarr array of :func:`blobs`; returns the (H, W, 3) pixels."""
    import zarr

    pixels = blobs(height, width, seed=seed)
    zarr.create_array(store=str(path), data=np.moveaxis(pixels, -1, 0), chunks=(3, chunks, chunks))
    return pixels


def reference_labels(model_dir: Path, pixels: np.ndarray) -> np.ndarray:
    """(H, W) labels of one in-memory pass of ``LoadedModel.dense().predict`` over the whole image."""
    loaded = densecnn.load(model_dir)
    with torch.no_grad():
        return loaded.dense().predict(model_input(pixels, loaded))[0].numpy()


def error_of(response, status: int, code: str) -> dict:
    """The error body of ``response``, checked to have ``status``, ``code``, a message and the request's id."""
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert (
        error["code"] == code and error["message"] and error["request_id"] == response.headers["x-request-id"]
    ), error
    return error


def wait_for(
    client, location: str, until=lambda job: job["state"] in FINISHED, timeout: float = 120.0, **kwargs
):
    """Poll the job at ``location`` until ``until(job)``; the job."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        response = client.get(location, **kwargs)
        assert response.status_code == 200, response.text
        job = response.json()
        if until(job):
            return job
        time.sleep(0.02)
    raise AssertionError(f"the job did not get there in {timeout} s: {job}")


def succeeded_upload_job(client, image: bytes, name: str = "a.png") -> dict:
    """Submit the encoded ``image`` as an uploaded job for the model "cells" and wait until it ends; the job,
    checked to have been accepted and to have succeeded."""
    created = client.post("/v1/jobs", params={"model": "cells"}, files={"image": (name, image)})
    assert created.status_code == 202, created.text
    job = wait_for(client, created.headers["location"])
    assert job["state"] == "succeeded", job
    return job


def download_zarr(client, job_id: str, target: Path, **kwargs):
    """Copy the job's label store file by file over HTTP (zarr.json, then each chunk) and open it."""
    import json

    import zarr

    def get(key: str) -> bytes:
        response = client.get(f"/v1/jobs/{job_id}/result.zarr/{key}", **kwargs)
        assert response.status_code == 200, response.text
        (target / key).parent.mkdir(parents=True, exist_ok=True)
        (target / key).write_bytes(response.content)
        return response.content

    meta = json.loads(get("zarr.json"))
    shape, chunks = meta["shape"], meta["chunk_grid"]["configuration"]["chunk_shape"]
    for i in range(-(-shape[0] // chunks[0])):
        for j in range(-(-shape[1] // chunks[1])):
            get(f"c/{i}/{j}")
    return zarr.open_array(str(target), mode="r")[...]
