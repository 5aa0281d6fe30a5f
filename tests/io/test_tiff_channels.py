"""A TIFF's 2 or 4 samples are gray or colour with alpha only where its extra samples say alpha: where they are
channels ("unspecified", a two-channel fluorescence image), a model of other channels refuses the image in every
front end, instead of labelling it from the first channels alone."""

from __future__ import annotations

import io
import re

import numpy as np
import pytest
import tifffile

import densecnn
from densecnn.errors import ImageReadError
from densecnn.io import decode_array, open_lazy_array
from tests.app_support import blobs, save_brightness_model, wait_ready

REFUSAL = "the image has 2 channels (its extra samples are not alpha) and the model takes 1"
FILE_REFUSAL = re.compile(
    r"2 channels \(its extra samples are not alpha\) (and the model takes|cannot feed a model of) 1"
)


def two_samples() -> np.ndarray:
    """(H, W, 2) uint8: the blobs' gray, then a second sample bright where the gray is dark."""
    gray = blobs()[..., 0]
    return np.dstack([gray, 255 - gray])


def tiff_bytes(pixels: np.ndarray, *, alpha: bool) -> bytes:
    out = io.BytesIO()
    tifffile.imwrite(
        out, pixels, photometric="minisblack", extrasamples=["unassalpha" if alpha else "unspecified"]
    )
    return out.getvalue()


@pytest.fixture(scope="module")
def gray_model(tmp_path_factory):
    return save_brightness_model(tmp_path_factory.mktemp("models"), "gray", in_channels=1)


def test_decoding_for_a_model_of_other_channels_refuses_channels_but_drops_alpha():
    pixels = two_samples()
    with pytest.raises(ImageReadError, match=re.escape(REFUSAL)):
        decode_array(tiff_bytes(pixels, alpha=False), channels=1)
    assert np.array_equal(decode_array(tiff_bytes(pixels, alpha=False), channels=2), pixels)
    assert np.array_equal(
        decode_array(tiff_bytes(pixels, alpha=True), channels=1), pixels
    )  # alpha dropped later


def test_a_lazily_read_tiff_keeps_its_channels_for_a_model_of_other_channels(tmp_path):
    (tmp_path / "channels.tif").write_bytes(tiff_bytes(two_samples(), alpha=False))
    (tmp_path / "alpha.tif").write_bytes(tiff_bytes(two_samples(), alpha=True))
    assert open_lazy_array(tmp_path / "channels.tif", spatial_dims=2).for_model(1).channels == 2
    assert open_lazy_array(tmp_path / "alpha.tif", spatial_dims=2).for_model(1).channels == 1


@pytest.mark.parametrize("output", ["labels.png", "labels.zarr"])
def test_predict_refuses_channels_and_labels_gray_with_alpha_as_the_gray(
    gray_model, tmp_path, capsys, output
):
    pytest.importorskip("distributed")
    from densecnn.cli import main

    pixels = two_samples()
    (tmp_path / "channels.tif").write_bytes(tiff_bytes(pixels, alpha=False))
    assert main(["predict", str(gray_model), str(tmp_path / "channels.tif"), str(tmp_path / output)]) == 2
    error = capsys.readouterr().err
    assert FILE_REFUSAL.search(error) and "Traceback" not in error and "channel-axis" not in error, error
    assert not (tmp_path / output).exists()

    (tmp_path / "alpha.tif").write_bytes(tiff_bytes(pixels, alpha=True))
    out = tmp_path / f"alpha_{output}"
    assert main(["predict", str(gray_model), str(tmp_path / "alpha.tif"), str(out)]) == 0, (
        capsys.readouterr().err
    )
    expected = densecnn.load(gray_model).labels(pixels[..., 0])
    if output.endswith(".png"):
        labels = decode_array(out, as_stored=True)
    else:
        labels = np.asarray(open_lazy_array(out, spatial_dims=2, as_stored=True).read())[0]
    assert np.array_equal(labels, expected)


def test_the_service_refuses_channels_in_its_words(gray_model):
    from densecnn_app import Settings, create_app
    from fastapi.testclient import TestClient

    with TestClient(create_app(Settings(model_dir=gray_model.parent, warm_sizes=[]))) as client:
        wait_ready(client.get)
        body = tiff_bytes(two_samples(), alpha=False)
        response = client.post(
            "/v1/models/gray/segment", content=body, headers={"content-type": "image/tiff"}
        )
    assert response.status_code in (400, 422), response.text
    assert REFUSAL in response.json()["error"]["message"]
