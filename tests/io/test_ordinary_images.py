"""Ordinary images are labelled, the same on every path: 8-bit, 16-bit and float images that are empty, dark,
constant, normal or low-range go through the library, the service's segment endpoint and its jobs, ``densecnn
predict`` on a file, a set and a zarr array, training's data checks and the napari engine, and each path answers
with the same rule (docs/model-files.md#intensities):

- labelled: every 8-bit image, wider integer data using at least 1% of its range, floats in [0, 1], and any
  constant image (with a warning where the front end can give one);
- refused: varying 16-bit data using under 1% of its range, image floats outside [0, 1]; the fix names the option
  in the front end's words and never suggests the scaling just refused.

Labels are compared with patch-by-patch scanning of the same pixels scaled by hand.
"""

from __future__ import annotations

import contextlib
import functools
import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import tifffile
import torch
from PIL import Image

import densecnn
from densecnn.errors import DatasetError, IntensityError, cli_option, keyword_option, query_option, render
from densecnn.io import model_input
from tests.app_support import blobs, brightness_model, save_brightness_model, wait_ready
from tests.tolerances import assert_labels_equal_except_ties

GRAY = blobs(40, 52)[:, :, 0].astype(np.float64)  # (H, W) values 0..255
LABELLED, CONSTANT, REFUSED = "labelled", "constant", "refused"


@dataclass(frozen=True)
class Case:
    name: str
    image: np.ndarray  # (H, W), the dtype under test
    expected: str  # LABELLED, CONSTANT (labelled, with a warning) or REFUSED
    fix: str | None = None  # the intensity a refusal suggests

    @property
    def file_name(self) -> str:
        return "".join(c if c.isalnum() else "-" for c in self.name) + ".tif"


def _cases() -> list[Case]:
    cases = []
    for dtype, top in ((np.uint8, 255), (np.uint16, 65535), (np.float32, 1.0)):

        def case(what: str, values: np.ndarray, expected: str, fix: str | None = None, dtype=dtype) -> None:
            cases.append(
                Case(f"{np.dtype(dtype).name} {what}", np.asarray(values).astype(dtype), expected, fix)
            )

        case("empty", np.zeros_like(GRAY), CONSTANT)
        case("constant", np.full_like(GRAY, 0.61 * top), CONSTANT)
        case("normal", GRAY / 255 * top, LABELLED)
        case("dark", GRAY / 255 * 0.02 * top, LABELLED)  # 2% of the range: 0..5 in 8 bits, 0..1310 in 16
        if dtype is np.uint8:
            case("low-range", GRAY / 255 * 2, LABELLED)  # 0..2: 8-bit data is never refused for its range
        elif dtype is np.uint16:
            case("low-range", GRAY, REFUSED, "range:0,255")  # 8-bit data stored as 16-bit: 0.39% of the range
            case("10-bit low-range", GRAY * 2, REFUSED, "range:0,1023")
        else:
            case("low-range", GRAY / 255 * 0.002, LABELLED)
            case("outside [0, 1]", GRAY, REFUSED, "range:0,255")
    return cases


CASES = _cases()
IDS = [case.name for case in CASES]


def unit_pixels(case: Case) -> np.ndarray:
    """(H, W) float64: the case's pixels scaled to [0, 1] by hand (integers by their dtype's maximum)."""
    image = case.image.astype(np.float64)
    return image / np.iinfo(case.image.dtype).max if case.image.dtype.kind == "u" else image


@functools.cache
def reference_scores(name: str) -> torch.Tensor:
    """(1, K, H, W): the patch model run on the patch around every pixel of the case's scaled pixels."""
    case = next(c for c in CASES if c.name == name)
    model, patch = brightness_model(in_channels=1)
    x = torch.from_numpy(unit_pixels(case)).float()[None, None]  # (1, 1, H, W), normalisation: none
    with torch.no_grad():
        return densecnn.scan_patches(model, x, patch)


@dataclass
class Outcome:
    """What a front end answered: the labels, or the refusal's message; and its warning, if any."""

    labels: np.ndarray | None = None  # (H, W)
    error: str | None = None
    warning: str | None = None


def check(case: Case, outcome: Outcome, spell, warns: bool = True) -> None:
    """The rule: ``case`` labelled as scanning labels it (a constant one with a warning, when the front end
    ``warns``), or refused with the fix in the front end's words (``spell``)."""
    if case.expected == REFUSED:
        assert outcome.labels is None, f"{case.name} was labelled"
        assert outcome.error is not None and spell("intensity", case.fix) in outcome.error, outcome.error
        assert "dtype" not in outcome.error.split(";")[-1]  # never the scaling just refused
        if spell is not cli_option:
            assert "--" not in outcome.error, outcome.error
        return
    assert outcome.error is None, f"{case.name} was refused: {outcome.error}"
    labels = torch.from_numpy(outcome.labels.astype(np.int64))[None]
    assert_labels_equal_except_ties(labels, reference_scores(case.name), case.name)
    if warns:
        assert (outcome.warning is not None) == (case.expected == CONSTANT), outcome.warning
        assert outcome.warning is None or "single value" in outcome.warning


@pytest.fixture(scope="module")
def gray_model(tmp_path_factory) -> Path:
    return save_brightness_model(tmp_path_factory.mktemp("models"), "gray", in_channels=1)


def tiff_bytes(image: np.ndarray) -> bytes:
    out = io.BytesIO()
    tifffile.imwrite(out, image)
    return out.getvalue()


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_the_library(case, gray_model):
    loaded = densecnn.load(gray_model)
    try:
        x = model_input(case.image, loaded)  # (1, 1, H, W)
    except IntensityError as exc:
        return check(case, Outcome(error=str(exc)), keyword_option, warns=False)
    with torch.no_grad():
        check(case, Outcome(loaded.dense().predict(x)[0].numpy()), keyword_option, warns=False)


@pytest.fixture(scope="module")
def service(gray_model):
    from densecnn_app import Settings, create_app
    from fastapi.testclient import TestClient

    with TestClient(create_app(Settings(model_dir=gray_model.parent, warm_sizes=[]))) as client:
        wait_ready(client.get)
        yield client


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_the_services_segment_endpoint(case, service):
    response = service.post(
        "/v1/models/gray/segment", content=tiff_bytes(case.image), headers={"content-type": "image/tiff"}
    )
    if response.status_code == 400:
        error = response.json()["error"]
        assert error["code"] == "intensity_out_of_range"
        return check(case, Outcome(error=error["message"]), query_option)
    assert response.status_code == 200, response.text
    labels = np.asarray(Image.open(io.BytesIO(response.content)))
    check(case, Outcome(labels, warning=response.headers.get("x-densecnn-warning")), query_option)


def test_the_services_jobs(gray_model, tmp_path):
    pytest.importorskip("distributed")
    from tests.jobs_support import job_settings, serving, wait_for

    settings = job_settings(tmp_path, model_dir=gray_model.parent, max_jobs_per_key=len(CASES))
    with serving(settings) as client:
        posted = {}
        for case in CASES:
            response = client.post("/v1/jobs", params={"model": "gray"}, content=tiff_bytes(case.image),
                                   headers={"content-type": "image/tiff"})  # fmt: skip
            assert response.status_code == 202, response.text
            posted[case.name] = response.headers["location"]
        for case in CASES:
            job = wait_for(client, posted[case.name])
            if job["state"] == "failed":
                check(case, Outcome(error=job["error"]), query_option)
                continue
            assert job["state"] == "succeeded", job
            labels = np.asarray(Image.open(io.BytesIO(client.get(job["results"]["png"]).content)))
            check(case, Outcome(labels), query_option, warns=False)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_densecnn_predict_on_a_file(case, gray_model, tmp_path, capsys):
    pytest.importorskip("distributed")
    from densecnn.cli import main

    tifffile.imwrite(tmp_path / case.file_name, case.image)
    code = main(["predict", str(gray_model), str(tmp_path / case.file_name), str(tmp_path / "labels.png")])
    err = capsys.readouterr().err
    if code == 2:
        return check(case, Outcome(error=err), cli_option)
    assert code == 0, err
    warning = next((line for line in err.splitlines() if "warning:" in line), None)
    check(case, Outcome(np.asarray(Image.open(tmp_path / "labels.png")), warning=warning), cli_option)


@pytest.fixture(scope="module")
def predicted_set(gray_model, tmp_path_factory):
    """``densecnn predict`` over a folder of every case: (output folder, exit code, stdout, stderr)."""
    pytest.importorskip("distributed")
    from densecnn.cli import main

    root = tmp_path_factory.mktemp("set")
    (root / "images").mkdir()
    for case in CASES:
        tifffile.imwrite(root / "images" / case.file_name, case.image)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["predict", str(gray_model), str(root / "images"), str(root / "labels"), "--no-progress"])
    return root, code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_densecnn_predict_on_a_set(case, predicted_set):
    root, code, out, err = predicted_set
    assert code == (1 if any(c.expected == REFUSED for c in CASES) else 0)
    name = str(root / "images" / case.file_name)
    failed = next((line for line in out.splitlines() if line.startswith("failed:") and name in line), None)
    warning = next((line for line in err.splitlines() if "warning:" in line and name in line), None)
    output = root / "labels" / case.file_name
    labels = tifffile.imread(output) if output.exists() else None
    check(case, Outcome(labels, failed, warning), cli_option)


@pytest.fixture(scope="module")
def dask_client():
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=False,
                                  dashboard_address="127.0.0.1:0") as cluster, distributed.Client(cluster) as client:  # fmt: skip
        yield client


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_densecnn_predict_on_a_zarr_array(case, gray_model, tmp_path, dask_client):
    zarr = pytest.importorskip("zarr")
    from densecnn.blockwise import BlockwiseOptions, predict_to_disk

    zarr.create_array(store=str(tmp_path / "in.zarr"), data=case.image, chunks=(16, 16))
    options = BlockwiseOptions(chunk=16, block=32, progress=False, client=dask_client)
    try:
        summary = predict_to_disk(gray_model, tmp_path / "in.zarr", tmp_path / "out.zarr", options)
    except IntensityError as exc:
        assert not (tmp_path / "out.zarr").exists()  # refused before anything is written
        return check(case, Outcome(error=render(exc, cli_option)), cli_option)
    warning = summary.warnings[0][1] if summary.warnings else None
    check(case, Outcome(zarr.open_array(str(tmp_path / "out.zarr"))[:], warning=warning), cli_option)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_training_data_checks(case, tmp_path):
    from densecnn.train.dataset import read_dataset

    (tmp_path / "images").mkdir()
    (tmp_path / "labels").mkdir()
    tifffile.imwrite(tmp_path / "images" / case.file_name, case.image)
    Image.fromarray((GRAY > 128).astype(np.uint8)).save(
        tmp_path / "labels" / case.file_name.replace(".tif", ".png")
    )
    try:
        (sample,) = read_dataset(tmp_path, channels=1, num_classes=2)
    except DatasetError as exc:
        assert case.expected == REFUSED, f"{case.name} was refused: {exc}"
        assert case.file_name in str(exc)
        return check(case, Outcome(error=render(exc, cli_option)), cli_option)
    assert case.expected != REFUSED, f"{case.name} was accepted"
    np.testing.assert_allclose(sample.image[0], unit_pixels(case), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_the_napari_engine(case, gray_model):
    pytest.importorskip("napari")
    from densecnn.napari import engine
    from densecnn.napari.source import LayerSource

    loaded = densecnn.load(gray_model)
    source = LayerSource.of(
        case.image, rgb=False, multiscale=False, scale=(1.0, 1.0), spatial_dims=2, channels=1
    )
    steps = engine.predict_layer(loaded, source, max_memory=200 << 20)
    try:
        while True:
            next(steps)
    except StopIteration as stop:
        result = stop.value
    except IntensityError as exc:
        return check(case, Outcome(error=render(exc, engine.napari_option)), engine.napari_option)
    check(
        case,
        Outcome(result.labels, warning=result.warnings[0] if result.warnings else None),
        engine.napari_option,
    )
