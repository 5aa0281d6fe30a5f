"""The service for volume (3-D) and signal (1-D) models: uploads, answers, refusals, limits, model facts.

Labels are checked against the library's dense net run on the array the test itself built (scaled by hand), so
the decoding and the answer's encoding are both under test.
"""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
import tifffile
import torch
from densecnn_app import Settings, create_app
from fastapi.testclient import TestClient
from torch import nn

import densecnn
from densecnn.io import array_input, read_nd
from tests.app_support import blobs, encode, save_brightness_model, wait_ready
from tests.tolerances import assert_close_relative, assert_labels_equal_except_ties

MAX_VOXELS = 200_000


def volume_model() -> tuple[nn.Sequential, tuple[int, int, int]]:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv3d(1, 4, (1, 3, 3)), nn.ReLU(), nn.MaxPool3d((1, 2, 2)), nn.Conv3d(4, 4, (2, 3, 3)), nn.Tanh(),
        nn.MaxPool3d(2), nn.Flatten(), nn.Linear(4 * 2 * 2 * 2, 3),
    )  # fmt: skip
    return model.eval(), (5, 14, 14)  # anisotropic, like an EM stack's (slices, rows, columns)


def signal_model() -> tuple[nn.Sequential, tuple[int]]:
    torch.manual_seed(1)
    model = nn.Sequential(nn.Conv1d(2, 3, 5), nn.ReLU(), nn.MaxPool1d(3, 2), nn.Conv1d(3, 4, 3, dilation=2),
                          nn.AvgPool1d(2), nn.Conv1d(4, 2, 3))  # fmt: skip
    return model.eval(), (25,)


@pytest.fixture(scope="module")
def model_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    save_brightness_model(root, "cells")
    model, patch = volume_model()
    densecnn.save(model, root / "stack", patch_size=patch, class_names=["out", "membrane", "cell"],
                  normalization={"mean": [0.5], "std": [0.25]}, padding_mode="reflect")  # fmt: skip
    model, patch = signal_model()
    densecnn.save(model, root / "ecg", patch_size=patch, class_names=["rest", "beat"])
    return root


@pytest.fixture(scope="module")
def client(model_root):
    settings = Settings(
        model_dir=model_root, default_model="cells", torch_threads=1, backend="native",
        max_image_pixels=MAX_VOXELS, max_decode_bytes=2_000_000,
    )  # fmt: skip
    with TestClient(create_app(settings)) as client:
        wait_ready(client.get)
        yield client


def post(
    client, model: str, data: bytes, content_type: str = "application/octet-stream", accept: str = "*/*"
):
    headers = {"content-type": content_type, "accept": accept}
    return client.post(f"/v1/models/{model}/segment", content=data, headers=headers)


def assert_error(response, status: int, code: str) -> str:
    assert response.status_code == status, response.text
    assert response.json()["error"]["code"] == code, response.text
    return response.json()["error"]["message"]


def npy(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, array)
    return out.getvalue()


def tiff(array: np.ndarray, **kwargs) -> bytes:
    out = io.BytesIO()
    tifffile.imwrite(out, array, **kwargs)
    return out.getvalue()


def library_scores(model_root, name: str, unit: np.ndarray) -> torch.Tensor:
    """Scores of the saved model for (C, *spatial) values already in [0, 1]: normalize -> dense net. (1, K, ...)."""
    loaded = densecnn.load(model_root / name)
    with torch.no_grad():
        return loaded.dense(backend="native")(loaded.normalize(torch.from_numpy(unit)[None].float()))


VOLUME = (np.random.default_rng(0).random((7, 20, 23)) * 255).astype(np.uint8)  # (D, H, W)
SIGNAL = np.random.default_rng(1).standard_normal((2, 90)).astype(np.float32)  # (C, L)


def assert_volume_labels(labels: np.ndarray, model_root, volume: np.ndarray = VOLUME) -> None:
    assert labels.shape == volume.shape and labels.dtype == np.uint8
    scores = library_scores(model_root, "stack", volume[None].astype(np.float32) / 255)
    assert_labels_equal_except_ties(torch.from_numpy(labels.astype(np.int64))[None], scores)


# --- volumes ---


def test_a_multi_page_tiff_gets_a_multi_page_label_tiff_by_default(client, model_root):
    response = post(client, "stack", tiff(VOLUME), "image/tiff")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "image/tiff"
    with tifffile.TiffFile(io.BytesIO(response.content)) as answer:
        assert len(answer.pages) == VOLUME.shape[0]
        labels = answer.asarray()
    assert_volume_labels(labels, model_root)


@pytest.mark.parametrize(
    "upload",
    [
        npy(VOLUME),  # (D, H, W) uint8
        npy(VOLUME[None].astype(np.uint16) * 257),  # (C, D, H, W) uint16: scaled by its range
        npy(VOLUME.astype(np.float32) / 255),  # floats are taken as they are
        npy(np.asfortranarray(VOLUME)),
    ],
    ids=["uint8", "uint16-channel-first", "float32", "fortran-order"],
)
def test_npy_volumes_give_the_same_labels(client, model_root, upload):
    response = post(client, "stack", upload, "application/x-npy", "image/tiff")
    assert response.status_code == 200, response.text
    assert_volume_labels(tifffile.imread(io.BytesIO(response.content)), model_root)


def test_npy_answer_is_the_probabilities_for_volumes_too(client, model_root):
    response = post(client, "stack", tiff(VOLUME), "image/tiff", "application/x-npy")
    assert response.status_code == 200 and response.headers["content-type"] == "application/x-npy"
    probabilities = np.load(io.BytesIO(response.content), allow_pickle=False)
    assert probabilities.shape == (3, *VOLUME.shape) and probabilities.dtype == np.float32
    scores = library_scores(model_root, "stack", VOLUME[None].astype(np.float32) / 255)
    assert_close_relative(torch.from_numpy(probabilities)[None], scores.softmax(1), 1e-5)


def test_json_answer_for_a_volume(client, model_root):
    response = post(client, "stack", tiff(VOLUME), "image/tiff", "application/json")
    assert response.status_code == 200
    document = response.json()
    assert document["shape"] == list(VOLUME.shape)
    assert [c["name"] for c in document["classes"]] == ["out", "membrane", "cell"]
    labels = tifffile.imread(io.BytesIO(base64.b64decode(document["labels_tiff_base64"])))
    assert_volume_labels(labels, model_root)
    assert document["counts"] == np.bincount(labels.ravel(), minlength=3).tolist()
    assert "labels_png_base64" not in document


def test_tiff_orientation_is_applied_to_every_page(client, model_root):
    stored = np.ascontiguousarray(
        VOLUME.transpose(0, 2, 1)
    )  # orientation 5 (transpose): rows are the columns
    response = post(client, "stack", tiff(stored, extratags=[(274, "H", 1, 5, True)]), "image/tiff")
    assert response.status_code == 200, response.text
    assert_volume_labels(tifffile.imread(io.BytesIO(response.content)), model_root)


def test_rgb_and_imagej_channel_stacks_are_read_channel_first():
    rgb = np.random.default_rng(2).integers(0, 255, (4, 6, 5, 3), dtype=np.uint8)  # (D, H, W, S)
    np.testing.assert_array_equal(read_nd(tiff(rgb, photometric="rgb"), 3), np.moveaxis(rgb, -1, 0))
    hyperstack = np.random.default_rng(3).integers(0, 999, (4, 2, 6, 5), dtype=np.uint16)  # (Z, C, Y, X)
    read = read_nd(tiff(hyperstack, imagej=True, metadata={"axes": "ZCYX"}), 3)
    np.testing.assert_array_equal(read, np.moveaxis(hyperstack, 1, 0))


def test_array_input_scales_converts_channels_and_normalizes(model_root):
    loaded = densecnn.load(model_root / "stack")  # one channel, mean 0.5, std 0.25
    rgb = np.random.default_rng(4).integers(0, 255, (3, 2, 4, 5), dtype=np.uint8)  # (C, D, H, W)
    gray = (0.299 * rgb[0] + 0.587 * rgb[1] + 0.114 * rgb[2]) / 255
    expected = torch.from_numpy((gray - 0.5) / 0.25)[None, None].float()
    assert_close_relative(array_input(rgb, loaded), expected, 1e-6)


def test_a_2d_image_sent_to_a_volume_model_is_422_naming_both(client):
    for upload, received in [
        (encode(blobs(20, 20)), "PNG image"),
        (tiff(VOLUME[0]), "one TIFF page"),
        (npy(VOLUME[0]), f"shape {VOLUME[0].shape}"),
    ]:
        message = assert_error(post(client, "stack", upload), 422, "wrong_dimensions")
        assert received in message and "the model takes a volume" in message
    assert post(client, "stack", tiff(VOLUME)).status_code == 200


def test_a_volume_sent_to_an_image_model_is_still_refused(client):
    assert_error(post(client, "cells", tiff(VOLUME)), 422, "image_is_a_stack")
    message = assert_error(post(client, "cells", npy(VOLUME[None])), 422, "wrong_dimensions")
    assert "(1, 7, 20, 23)" in message and "one 2-D image" in message


def test_an_image_model_takes_a_channel_first_npy(client):
    image = blobs(24, 30)  # (H, W, 3)
    by_png = post(client, "cells", encode(image), "image/png")
    by_npy = post(client, "cells", npy(np.moveaxis(image, -1, 0)), "application/x-npy")
    assert by_npy.status_code == 200 and by_npy.headers["content-type"] == "image/png"
    assert by_npy.content == by_png.content  # the same pixels through the same kernels


def test_png_answer_for_a_volume_is_406_naming_what_works(client):
    message = assert_error(post(client, "stack", tiff(VOLUME), accept="image/png"), 406, "not_acceptable")
    assert "label volume" in message and "image/tiff" in message and "application/x-npy" in message
    assert post(client, "stack", tiff(VOLUME), accept="image/*").headers["content-type"] == "image/tiff"
    response = client.post("/v1/models/stack/segment?view=overlay", content=tiff(VOLUME))
    assert_error(response, 422, "overlay_needs_image")


def test_volume_limits_are_judged_from_the_header(client):
    side = 100  # 10^6 voxels > MAX_VOXELS, announced by the .npy header; the data is never sent
    header = npy(np.zeros((side, side, side), np.uint8))[:128]
    message = assert_error(post(client, "stack", header), 413, "image_too_large")
    assert "1,000,000 voxels" in message
    header = npy(np.zeros((2, 20, 100, 100)))[:128]  # 200,000 voxels, but 3.2 MB of float64
    assert "3,200,000 bytes" in assert_error(post(client, "stack", header), 413, "image_too_large")
    message = assert_error(post(client, "stack", npy(np.zeros((5, 7, 20, 23)))), 400, "invalid_image")
    assert "5 channels" in message
    message = assert_error(
        post(client, "stack", tiff(np.zeros((60, 60, 60), np.uint8))), 413, "image_too_large"
    )
    assert "216,000 voxels" in message
    assert post(client, "stack", tiff(VOLUME)).status_code == 200


def test_npy_uploads_are_never_unpickled(client):
    out = io.BytesIO()
    np.save(out, np.array([{"x": 1}], dtype=object), allow_pickle=True)
    message = assert_error(post(client, "ecg", out.getvalue()), 400, "invalid_image")
    assert "dtype object" in message
    assert_error(post(client, "ecg", npy(SIGNAL)[:-8]), 400, "invalid_image")  # truncated


# --- signals ---


def test_a_signal_gets_json_labels_by_default_and_npy_probabilities(client, model_root):
    scores = library_scores(model_root, "ecg", SIGNAL)
    response = post(client, "ecg", npy(SIGNAL), "application/x-npy")
    assert response.status_code == 200 and response.headers["content-type"] == "application/json"
    document = response.json()
    assert document["shape"] == [SIGNAL.shape[1]]
    labels = np.load(io.BytesIO(base64.b64decode(document["labels_npy_base64"])), allow_pickle=False)
    assert labels.shape == (SIGNAL.shape[1],) and labels.dtype == np.uint8
    assert_labels_equal_except_ties(torch.from_numpy(labels.astype(np.int64))[None], scores)
    assert sum(document["counts"]) == SIGNAL.shape[1]

    response = post(client, "ecg", npy(SIGNAL), "application/x-npy", "application/x-npy")
    probabilities = np.load(io.BytesIO(response.content), allow_pickle=False)
    assert probabilities.shape == (2, SIGNAL.shape[1])
    assert_close_relative(torch.from_numpy(probabilities)[None], scores.softmax(1), 1e-5)


def test_a_signal_model_refuses_images_and_volumes(client):
    for upload in (encode(blobs(20, 20)), tiff(VOLUME), npy(VOLUME)):
        assert "the model takes a signal" in assert_error(
            post(client, "ecg", upload), 422, "wrong_dimensions"
        )
    assert_error(post(client, "ecg", npy(SIGNAL), accept="image/png"), 406, "not_acceptable")


# --- what the models are ---


def test_models_report_their_axes_and_formats(client):
    models = {m["name"]: m for m in client.get("/v1/models").json()["models"]}
    stack, ecg, cells = models["stack"], models["ecg"], models["cells"]
    assert (stack["dims"], stack["axes"], stack["patch_size"]) == (
        3,
        ["depth", "height", "width"],
        [5, 14, 14],
    )
    assert stack["receptive_field"] == [5, 14, 14] and stack["answers"][0] == "image/tiff"
    assert "image/png" not in stack["answers"] and "image/png" not in stack["accepts"]
    assert (ecg["dims"], ecg["axes"], ecg["patch_size"], ecg["accepts"]) == (
        1, ["length"], [25], ["application/x-npy"]
    )  # fmt: skip
    assert (cells["dims"], cells["axes"], cells["answers"][0]) == (2, ["height", "width"], "image/png")


def test_memory_bound_counts_the_copies_a_volume_takes(tmp_path):
    settings = Settings(model_dir=tmp_path)
    extra = settings.request_memory_bound(1, dims=3) - settings.request_memory_bound(1)
    assert extra == settings.max_decode_bytes + 2 * settings.max_image_pixels


def test_a_volume_as_multipart_field_and_the_image_json_has_shape_and_counts(client, model_root):
    response = client.post("/v1/models/stack/segment", files={"image": ("stack.tif", tiff(VOLUME))})
    assert response.status_code == 200 and response.headers["content-type"] == "image/tiff"
    assert_volume_labels(tifffile.imread(io.BytesIO(response.content)), model_root)
    document = post(client, "cells", encode(blobs(24, 30)), "image/png", "application/json").json()
    assert document["shape"] == [24, 30] and document["counts"] == document["pixel_counts"]
