"""Every front end labels through the one façade on the loaded model (``LoadedModel.input``, ``labels``,
``probabilities``, ``label_dtype``): the same image gives the same labels and probabilities through the library,
the service (its segment endpoint and its jobs), ``densecnn predict`` and the napari engine, for a net that ends
in scores and for nets that end in ``nn.Softmax`` or ``nn.LogSoftmax`` (whose outputs are probabilities already:
no front end takes their softmax again).

The reference is patch-by-patch scanning of the patch model over the image scaled by hand.
"""

from __future__ import annotations

import io

import numpy as np
import pytest
import tifffile
import torch
from PIL import Image
from torch import nn

import densecnn
from tests.app_support import CLASS_NAMES, blobs, brightness_model, wait_ready
from tests.tolerances import assert_labels_equal_except_ties

IMAGE = blobs(40, 52)[:, :, 0]  # (H, W) uint8
ENDINGS = {"scores": [], "softmax": [nn.Softmax(dim=1)], "log-softmax": [nn.LogSoftmax(dim=1)]}
PROBABILITY_TOLERANCE = 2e-3  # probabilities stored as float16 by densecnn predict


def patch_model(ending: str) -> tuple[nn.Sequential, tuple[int, ...]]:
    scores, patch = brightness_model(in_channels=1)
    return nn.Sequential(*scores, *ENDINGS[ending]).eval(), patch


@pytest.fixture(scope="module", params=list(ENDINGS))
def model_dir(request, tmp_path_factory):
    model, patch = patch_model(request.param)
    palette = [[0, 0, 0], [40, 120, 255], [255, 200, 0]]
    root = tmp_path_factory.mktemp(request.param)
    return densecnn.save(model, root / "gray", patch_size=patch, class_names=CLASS_NAMES, palette=palette)


@pytest.fixture(scope="module")
def reference():
    """(scores (1, K, H, W), probabilities (K, H, W)) of scanning the scores-ending net patch by patch: the
    softmax of its scores, as every ending's probabilities must be."""
    model, patch = patch_model("scores")
    x = torch.from_numpy(IMAGE / 255).float()[None, None]  # (1, 1, H, W), normalisation: none
    with torch.no_grad():
        scores = densecnn.scan_patches(model, x, patch)  # (1, K, H, W)
    return scores, scores.softmax(1)[0]


def check(labels: np.ndarray, probabilities: np.ndarray | torch.Tensor | None, reference, what: str) -> None:
    scores, expected = reference
    assert labels.dtype == np.uint8, what  # the model's label dtype (3 classes)
    assert_labels_equal_except_ties(torch.from_numpy(labels.astype(np.int64))[None], scores, what)
    if probabilities is not None:
        torch.testing.assert_close(
            torch.as_tensor(np.asarray(probabilities, np.float32)),
            expected,
            rtol=0,
            atol=PROBABILITY_TOLERANCE,
        )


def test_the_facade(model_dir, reference):
    loaded = densecnn.load(model_dir)
    assert loaded.label_dtype == np.uint8
    labels, probabilities = loaded.classify(IMAGE)
    check(labels, probabilities, reference, "classify")
    check(loaded.labels(IMAGE), loaded.probabilities(IMAGE), reference, "labels, probabilities")
    x = loaded.input(IMAGE)  # (1, 1, H, W)
    assert x.shape == (1, 1, *IMAGE.shape)
    check(loaded.labels(x)[0], loaded.probabilities(x)[0], reference, "from the model input")
    check(loaded.labels(IMAGE[None], channel_axis=0), None, reference, "channels first")


def test_the_services_segment_endpoint(model_dir, reference):
    from densecnn_app import Settings, create_app
    from fastapi.testclient import TestClient

    with TestClient(create_app(Settings(model_dir=model_dir.parent, warm_sizes=[]))) as client:
        wait_ready(client.get)
        url, body = "/v1/models/gray/segment", {"content": tifffile_bytes(IMAGE)}
        png = client.post(url, headers={"content-type": "image/tiff"}, **body)
        npy = client.post(url, headers={"content-type": "image/tiff", "accept": "application/x-npy"}, **body)
    assert png.status_code == 200 and npy.status_code == 200, (png.text, npy.text)
    labels = np.asarray(Image.open(io.BytesIO(png.content)))
    check(labels, np.load(io.BytesIO(npy.content)), reference, "service")


def test_the_services_jobs(model_dir, reference, tmp_path):
    pytest.importorskip("distributed")
    from tests.jobs_support import job_settings, serving, wait_for

    with serving(job_settings(tmp_path, model_dir=model_dir.parent)) as client:
        posted = client.post("/v1/jobs", params={"model": "gray"}, content=tifffile_bytes(IMAGE),
                             headers={"content-type": "image/tiff"})  # fmt: skip
        assert posted.status_code == 202, posted.text
        job = wait_for(client, posted.headers["location"])
        assert job["state"] == "succeeded", job
        labels = np.asarray(Image.open(io.BytesIO(client.get(job["results"]["png"]).content)))
    check(labels, None, reference, "jobs")


def test_densecnn_predict(model_dir, reference, tmp_path):
    zarr = pytest.importorskip("zarr")
    pytest.importorskip("distributed")
    from densecnn.cli import main

    zarr.create_array(store=str(tmp_path / "in.zarr"), data=IMAGE, chunks=(16, 16))
    argv = [str(model_dir), str(tmp_path / "in.zarr"), str(tmp_path / "labels.zarr"), "--no-progress"]
    assert main(["predict", *argv, "--probabilities", str(tmp_path / "p.zarr"), "--chunk", "16"]) == 0
    labels = zarr.open_array(str(tmp_path / "labels.zarr"))[:]
    check(labels, zarr.open_array(str(tmp_path / "p.zarr"))[:], reference, "densecnn predict")


def test_the_napari_engine(model_dir, reference):
    pytest.importorskip("napari")
    from densecnn.napari import engine
    from densecnn.napari.source import LayerSource

    loaded = densecnn.load(model_dir)
    source = LayerSource.of(IMAGE, rgb=False, multiscale=False, scale=(1.0, 1.0), spatial_dims=2, channels=1)
    steps = engine.predict_layer(loaded, source, max_memory=1 << 20, probabilities=True)  # several tiles
    with pytest.raises(StopIteration) as finished:
        while True:
            next(steps)
    result = finished.value.value
    check(result.labels, result.probabilities, reference, "napari")


def tifffile_bytes(image: np.ndarray) -> bytes:
    out = io.BytesIO()
    tifffile.imwrite(out, image)
    return out.getvalue()
