"""Jobs with ``nonfinite``: a NaN image fails by default naming ``?nonfinite=propagate``; any other value is a
422; under ``propagate`` the job's blockwise labels (holes across chunk borders) are the library's dense predict on
the whole image, no-data as the label type's maximum."""

from __future__ import annotations

import io

import numpy as np
import pytest
import tifffile

pytest.importorskip("sqlalchemy")
pytest.importorskip("distributed")
zarr = pytest.importorskip("zarr")

from tests.jobs_support import download_zarr, job_settings, serving, wait_for  # noqa: E402
from tests.nonfinite_support import assert_no_data_labels, holed_image, library_no_data_scores  # noqa: E402

pytestmark = pytest.mark.xdist_group("jobs")  # Dask clusters: one test at a time

HOLES = [
    (slice(28, 36), slice(30, 35)),
    (slice(60, 61), slice(10, 11)),
]  # the first across the chunk corner (32, 32)


def _holed_zarr(path) -> np.ndarray:
    """A (3, 72, 70) float32 zarr array in chunks of 32 with NaN/±Inf holes; returns the (H, W, 3) pixels."""
    plane = holed_image(72, 70, HOLES)  # (H, W)
    pixels = np.stack([plane, plane[:, ::-1], plane], axis=-1)  # (H, W, 3): holes in every channel but one
    pixels[..., 1] = np.nan_to_num(pixels[..., 1], nan=0.5, posinf=1.0, neginf=0.0)
    zarr.create_array(store=str(path), data=np.moveaxis(pixels, -1, 0), chunks=(3, 32, 32))
    return pixels


def test_a_job_on_non_finite_pixels_fails_naming_the_parameter(tmp_path):
    _holed_zarr(tmp_path / "data" / "holes.zarr")
    with serving(job_settings(tmp_path)) as client:
        response = client.post(
            "/v1/jobs", json={"model": "cells", "input": "holes.zarr", "nonfinite": "ignore"}
        )
        assert response.status_code == 422, response.text
        response = client.post("/v1/jobs", json={"model": "cells", "input": "holes.zarr", "chunk": 32})
        assert response.status_code == 202, response.text
        job = wait_for(client, response.headers["location"])
        assert (
            job["state"] == "failed" and "NaN" in job["error"] and "?nonfinite=propagate" in job["error"]
        ), job


def test_a_propagating_job_equals_the_whole_image_predict(tmp_path):
    pixels = _holed_zarr(tmp_path / "data" / "holes.zarr")
    settings = job_settings(tmp_path)
    with serving(settings) as client:
        body = {"model": "cells", "input": "holes.zarr", "chunk": 32, "nonfinite": "propagate"}
        response = client.post("/v1/jobs", json=body)
        assert response.status_code == 202, response.text
        job = wait_for(client, response.headers["location"])
        assert job["state"] == "succeeded", job
        scores, library = library_no_data_scores(settings.model_dir / "cells", pixels)
        stored = download_zarr(client, job["id"], tmp_path / "copy.zarr")
        assert_no_data_labels(stored, scores, library, no_data=255)
        tiff = client.get(job["results"]["tiff"])
        assert_no_data_labels(tifffile.imread(io.BytesIO(tiff.content)), scores, library, no_data=255)
