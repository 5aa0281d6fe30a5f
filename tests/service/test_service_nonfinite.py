"""``?nonfinite=`` on the segment endpoint: NaN/±Inf pixels refused by default (400 non_finite_input naming the
parameter as the fix), any other value 422, and under ``propagate`` labels that are the library's dense predict on
the whole image with no-data as the label type's maximum."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
import torch
from densecnn_app import Settings, create_app
from fastapi.testclient import TestClient
from PIL import Image

from tests.app_support import save_brightness_model, wait_ready
from tests.nonfinite_support import assert_no_data_labels, holed_image, library_no_data_scores

PIXELS = holed_image(40, 36, [(slice(12, 18), slice(20, 26)), (slice(30, 31), slice(3, 4))])  # (H, W) float32


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    save_brightness_model(root, "gray", in_channels=1, normalization={"mean": [0.2], "std": [0.5]})
    return root / "gray"


@pytest.fixture(scope="module")
def client(model_dir):
    settings = Settings(model_dir=model_dir.parent, default_model="gray", torch_threads=1, backend="native",
                        warm_sizes=[])  # fmt: skip
    with TestClient(create_app(settings)) as client:
        wait_ready(client.get)
        yield client


def _npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def _segment(client, query: str = "", accept: str = "image/png"):
    return client.post(f"/v1/models/gray/segment{query}", content=_npy(PIXELS),
                       headers={"content-type": "application/x-npy", "accept": accept})  # fmt: skip


def test_non_finite_pixels_are_refused_by_default_naming_the_parameter(client):
    response = _segment(client)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "non_finite_input" and "?nonfinite=propagate" in error["message"]
    assert 'nonfinite="propagate"' not in error["message"]  # the service's words, not the library's


@pytest.mark.parametrize("value", ["ignore", "PROPAGATE", ""])
def test_an_unknown_policy_is_a_422(client, value):
    response = _segment(client, f"?nonfinite={value}")
    assert response.status_code == 422, response.text


def test_propagate_labels_no_data_with_the_label_types_maximum(client, model_dir):
    scores, library = library_no_data_scores(model_dir, PIXELS)
    response = _segment(client, "?nonfinite=propagate")
    assert response.status_code == 200, response.text
    image = Image.open(io.BytesIO(response.content))
    assert image.mode == "P" and image.info["transparency"] == 255
    assert_no_data_labels(np.asarray(image), scores, library, no_data=255)


def test_propagate_in_json_counts_the_no_data_pixels(client, model_dir):
    scores, library = library_no_data_scores(model_dir, PIXELS)
    response = _segment(client, "?nonfinite=propagate", accept="application/json")
    assert response.status_code == 200, response.text
    document = response.json()
    labels = np.asarray(Image.open(io.BytesIO(base64.b64decode(document["labels_png_base64"]))))
    assert_no_data_labels(labels, scores, library, no_data=255)
    assert document["no_data_count"] == int((library == -1).sum())
    assert sum(document["counts"]) + document["no_data_count"] == PIXELS.size


def test_propagate_gives_nan_probabilities_where_a_patch_reads_no_data(client, model_dir):
    scores, library = library_no_data_scores(model_dir, PIXELS)
    response = _segment(client, "?nonfinite=propagate", accept="application/x-npy")
    assert response.status_code == 200, response.text
    probabilities = torch.from_numpy(np.load(io.BytesIO(response.content)))  # (K, H, W)
    np.testing.assert_array_equal(torch.isnan(probabilities).any(0).numpy(), (library == -1).numpy())


def test_an_overlay_shows_no_data_black(client, model_dir):
    _, library = library_no_data_scores(model_dir, PIXELS)
    response = _segment(client, "?nonfinite=propagate&view=overlay")
    assert response.status_code == 200, response.text
    overlay = np.asarray(Image.open(io.BytesIO(response.content)).convert("RGB"))  # (H, W, 3)
    no_data = (library == -1).numpy()
    assert overlay.shape == (*PIXELS.shape, 3)
    # the blend of a no-data pixel holds no class colour: black mixed into the image's own gray
    assert (overlay[no_data].max(axis=-1) - overlay[no_data].min(axis=-1)).max() <= 1
