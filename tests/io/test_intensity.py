"""Intensities: how raw values become the [0, 1] a model expects is declared, applied the same way on every path
(library, ``densecnn predict``, service, training), and an image it cannot be right for is refused with the
numbers, never labelled."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import torch
from PIL import Image

import densecnn
from densecnn.errors import DatasetError, IntensityError, ModelFileError, NonFiniteInputError
from densecnn.io import Intensity, array_input, model_input
from densecnn.io import intensity as intensity_module
from densecnn.io.intensity import sample_windows
from densecnn.train.dataset import read_dataset
from tests.app_support import blobs, encode, save_brightness_model
from tests.tolerances import assert_labels_equal_except_ties

GRAY = blobs(40, 52)[:, :, 0]  # (H, W) uint8, values 0..255


@pytest.fixture(scope="module")
def gray_model(tmp_path_factory):
    return save_brightness_model(tmp_path_factory.mktemp("models"), "gray", in_channels=1)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("dtype", Intensity()),
        ("range:0,4095", Intensity("range", 0, 4095)),
        ("percentiles:1,99.8", Intensity("percentiles", 1, 99.8)),
    ],
)
def test_the_declarations_parse_and_print_back(text, expected):
    assert Intensity.parse(text) == expected
    assert str(expected) == text
    assert Intensity.from_json(expected.to_json()) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("range:5,5", "low must be below high"),
        ("percentiles:1,120", r"percentiles must lie in \[0, 100\]"),
        ("range:0", "not understood"),
        ("gamma:1,2", "not one of dtype, range, percentiles"),
        ("range:nan,3", "finite low and high"),
    ],
)
def test_bad_declarations_are_refused(text, message):
    with pytest.raises(IntensityError, match=message):
        Intensity.parse(text)


def test_sixteen_bit_data_using_a_sliver_of_its_range_is_refused_with_the_numbers(gray_model):
    loaded = densecnn.load(gray_model)
    dark = GRAY.astype(
        np.uint16
    )  # the same values, now 0.4% of uint16's range: all but black if scaled by it
    with pytest.raises(IntensityError, match=r"uses 0\.\.255 of uint16's 0\.\.65535 \(0\.39% of the range\)"):
        model_input(dark, loaded)
    declared = model_input(dark, loaded, Intensity("range", 0, 255).scaling(dark))
    torch.testing.assert_close(declared, model_input(GRAY, loaded), rtol=0, atol=0)
    assert model_input(dark * 200, loaded).shape == (1, 1, 40, 52)  # 75% of the range: fine


def test_the_fix_a_refusal_spells_works_as_spelled(gray_model):
    loaded = densecnn.load(gray_model)
    dark = GRAY.astype(np.uint16)
    with pytest.raises(IntensityError) as refused:
        loaded.input(dark)
    assert 'intensity="range:0,255"' in str(refused.value)
    torch.testing.assert_close(loaded.input(dark, intensity="range:0,255"), model_input(GRAY, loaded))
    assert np.array_equal(loaded.labels(dark, intensity="range:0,255"), loaded.labels(GRAY))
    with pytest.raises(IntensityError, match="intensity is a int; give a densecnn.io.intensity.Intensity"):
        loaded.input(dark, intensity=255)


def test_image_floats_outside_unit_range_are_refused_and_a_signals_are_not(gray_model):
    loaded = densecnn.load(gray_model)
    with pytest.raises(
        IntensityError, match=r"values in \[0, 255\], but the model expects floats in \[0, 1\]"
    ):
        model_input(GRAY.astype(np.float32), loaded)
    assert model_input(GRAY.astype(np.float32) / 255 + 0.005, loaded).shape == (
        1,
        1,
        40,
        52,
    )  # within the slack
    signal = np.random.default_rng(0).standard_normal((1, 90)).astype(np.float32) * 40
    assert Intensity().scaling(signal, floats_in_unit_range=False) == intensity_module.Scaling(0.0, 1.0)


@pytest.mark.parametrize("bad", [np.nan, np.inf, 1e308])
def test_non_finite_values_are_refused_with_their_count_and_first_position(gray_model, bad):
    loaded = densecnn.load(gray_model)
    image = GRAY.astype(np.float64) / 255
    image[7, 3] = image[30, 40] = bad
    with pytest.raises(NonFiniteInputError, match=r"has 2 pixels holding NaN .* first at position \(7, 3\)"):
        model_input(image, loaded)
    volume = np.stack([image, image])[None]  # (C, D, H, W)
    with pytest.raises(NonFiniteInputError, match=r"has 4 pixels .* first at position \(0, 7, 3\)"):
        array_input(volume, loaded)


@pytest.mark.parametrize(
    "low, high, suggested",
    [(0.001, 4.998, "range:0,5"), (0.0, 200.0, "range:0,255"), (3.0, 3000.0, "range:0,4095"),
     (-3.2, 7.01, "range:-3.2,7.1")],
)  # fmt: skip
def test_floats_beyond_the_unit_range_are_refused_suggesting_a_range_they_span(low, high, suggested):
    image = np.linspace(low, high, 100, dtype=np.float64).reshape(10, 10)
    with pytest.raises(IntensityError, match=r"holds values in \[") as refused:
        Intensity().scaling(image, floats_in_unit_range=True)
    assert refused.value.fix.values[0] == suggested
    scaled = Intensity.parse(suggested).scaling(image).apply_(image.copy())
    assert scaled.min() >= 0 and scaled.max() <= 1 and scaled.max() - scaled.min() > 0.5  # not all but black


def test_percentiles_map_to_zero_and_one_as_computed_independently(gray_model):
    loaded = densecnn.load(gray_model)
    image = (GRAY.astype(np.uint16) * 16 + 1000).astype(np.uint16)  # 12-bit-like data with an offset
    low, high = np.percentile(image.astype(np.float64), [1, 99.8])
    x = model_input(image, loaded, Intensity("percentiles", 1, 99.8).scaling(image))
    expected = (torch.from_numpy(image.astype(np.float32)) - float(low)) / float(
        high - low
    )  # normalisation: none
    torch.testing.assert_close(x[0, 0], expected, rtol=1e-6, atol=1e-6)
    hot_pixels = np.zeros((40, 40), np.uint16)
    hot_pixels[3, 4] = 900  # varies, but both percentiles are 0
    with pytest.raises(IntensityError, match="percentiles are both 0") as refused:
        Intensity("percentiles", 1, 99.8).scaling(hot_pixels)
    assert refused.value.fix.values == ("range:LOW,HIGH",)  # a fixed range, not percentiles again
    constant = Intensity("percentiles", 1, 99.8).scaling(np.full((10, 10), 7, np.uint16))
    assert constant.constant == 7 and constant.apply_(np.full(3, 7, np.float32)).tolist() == [0, 0, 0]


def test_the_sample_is_the_whole_of_a_small_image_and_a_grid_of_windows_of_a_large_one():
    assert sample_windows((40, 52)) == [(slice(0, 40), slice(0, 52))]
    windows = sample_windows((20000, 30000))
    assert len(windows) == 64 and len({tuple((w.start, w.stop) for w in ws) for ws in windows}) == 64
    assert all(w.start >= 0 and w.stop <= n and w.stop - w.start == 256 for ws in windows for w, n in
               zip(ws, (20000, 30000)))  # fmt: skip
    assert {ws[0].start for ws in windows} >= {0, 20000 - 256}  # reaching both borders
    assert windows == sample_windows((20000, 30000))
    assert sum(np.prod([w.stop - w.start for w in ws]) for ws in sample_windows((5, 3000, 3000))) <= 1 << 22


def test_a_model_file_records_its_intensity_and_refuses_a_bad_one(tmp_path):
    model, patch = densecnn.zoo.tiny(in_channels=1, num_classes=2)
    declared = Intensity("percentiles", 2, 99)
    path = densecnn.save(model, tmp_path / "m", patch_size=patch, intensity=declared)
    assert json.loads((path / "model.json").read_text())["intensity"] == {
        "mode": "percentiles",
        "low": 2,
        "high": 99,
    }
    assert densecnn.load(path).intensity == declared
    plain = densecnn.save(model, tmp_path / "plain", patch_size=patch)
    assert "intensity" not in json.loads((plain / "model.json").read_text())  # the default is left out
    config = json.loads((path / "model.json").read_text())
    config["intensity"] = {"mode": "range", "low": 10, "high": 3}
    (path / "model.json").write_text(json.dumps(config))
    with pytest.raises(ModelFileError, match=r"intensity.*low must be below high"):
        densecnn.load(path)


def test_training_reads_images_by_the_declared_intensity_and_names_a_file_it_refuses(tmp_path):
    (tmp_path / "images").mkdir()
    (tmp_path / "labels").mkdir()
    Image.fromarray(GRAY.astype(np.uint16)).save(tmp_path / "images" / "dark.png")
    Image.fromarray((GRAY > 128).astype(np.uint8)).save(tmp_path / "labels" / "dark.png")
    with pytest.raises(DatasetError, match=r"dark\.png.*0\.39% of the range"):
        read_dataset(tmp_path, channels=1, num_classes=2)
    (sample,) = read_dataset(tmp_path, channels=1, num_classes=2, intensity=Intensity("range", 0, 255))
    np.testing.assert_allclose(sample.image[0], GRAY / 255, rtol=1e-6)


def test_the_service_refuses_what_does_not_fit_and_takes_an_intensity_override(gray_model):
    from densecnn_app import Settings, create_app
    from fastapi.testclient import TestClient

    from tests.app_support import wait_ready

    dark = GRAY.astype(np.uint16)
    settings = Settings(model_dir=gray_model.parent, warm_sizes=[])
    with TestClient(create_app(settings)) as client:
        wait_ready(client.get)

        def post(data: bytes, query: str = ""):
            return client.post(
                f"/v1/models/gray/segment{query}", content=data, headers={"content-type": "image/png"}
            )

        response = post(encode(dark))
        assert response.status_code == 400 and response.json()["error"]["code"] == "intensity_out_of_range"
        assert "0.39% of the range" in response.json()["error"]["message"]
        response = post(encode(dark), "?intensity=range:0,255")
        assert response.status_code == 200, response.text
        labels = np.asarray(Image.open(io.BytesIO(response.content)))
        reference = densecnn.load(gray_model)
        with torch.no_grad():
            scores = reference.dense()(reference.normalize(torch.from_numpy(GRAY / 255).float()[None, None]))
        assert_labels_equal_except_ties(torch.from_numpy(labels.astype(np.int64))[None], scores)
        response = post(encode(dark), "?intensity=gamma:2")
        assert response.status_code == 400 and response.json()["error"]["code"] == "intensity_out_of_range"


def test_a_blockwise_run_scales_every_block_as_one_pass_over_the_image_would(
    gray_model, tmp_path, monkeypatch
):
    """Percentiles from the same sample windows (made small here, so that the image has several), read lazily by
    the driver and from memory by the reference: the same scaling, so the same labels."""
    zarr = pytest.importorskip("zarr")
    pytest.importorskip("distributed")
    from densecnn.blockwise import BlockwiseOptions, predict_to_disk

    monkeypatch.setattr(intensity_module, "SAMPLE_PIXELS", 1000)
    monkeypatch.setattr(intensity_module, "SAMPLE_WINDOW", 8)
    assert len(sample_windows(GRAY.shape)) == 16
    image = (GRAY.astype(np.uint16) * 16 + 1000).astype(np.uint16)
    zarr.create_array(store=str(tmp_path / "in.zarr"), data=image, chunks=(16, 16))
    declared = Intensity("percentiles", 1, 99.8)
    options = BlockwiseOptions(chunk=16, block=16, intensity=declared, progress=False)
    predict_to_disk(gray_model, tmp_path / "in.zarr", tmp_path / "out.zarr", options)
    labels = zarr.open_array(str(tmp_path / "out.zarr"))[:]
    loaded = densecnn.load(gray_model)
    scaling = declared.scaling(np.concatenate([image[w].ravel() for w in sample_windows(image.shape)]))
    with torch.no_grad():
        scores = loaded.dense()(array_input(image[None], loaded, scaling))
    assert_labels_equal_except_ties(torch.from_numpy(labels.astype(np.int64))[None], scores)
    zarr.create_array(store=str(tmp_path / "dark.zarr"), data=GRAY.astype(np.uint16), chunks=(16, 16))
    with pytest.raises(IntensityError, match="0.39% of the range"):  # the model's own declaration: dtype
        predict_to_disk(
            gray_model,
            tmp_path / "dark.zarr",
            tmp_path / "dark-labels.zarr",
            BlockwiseOptions(progress=False),
        )
    assert not (tmp_path / "dark-labels.zarr").exists()  # refused before anything is written


def test_densecnn_predict_refuses_in_one_line_and_takes_intensity(gray_model, tmp_path, capsys):
    pytest.importorskip("distributed")
    from densecnn.cli import main

    Image.fromarray(GRAY.astype(np.uint16)).save(tmp_path / "dark.png")
    assert main(["predict", str(gray_model), str(tmp_path / "dark.png"), str(tmp_path / "a.png")]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "0.39% of the range" in error and "--intensity" in error
    assert not (tmp_path / "a.png").exists()
    argv = [
        str(gray_model),
        str(tmp_path / "dark.png"),
        str(tmp_path / "b.png"),
        "--intensity",
        "range:0,255",
    ]
    assert main(["predict", *argv]) == 0
    with pytest.raises(SystemExit):  # argparse: exit 2 with the usage and the reason
        main(["predict", *argv[:3], "--intensity", "range:9"])
    assert "not understood" in capsys.readouterr().err
    labels = np.asarray(Image.open(tmp_path / "b.png"))
    Image.fromarray(GRAY).save(tmp_path / "bright.png")
    assert main(["predict", str(gray_model), str(tmp_path / "bright.png"), str(tmp_path / "c.png")]) == 0
    np.testing.assert_array_equal(labels, np.asarray(Image.open(tmp_path / "c.png")))
