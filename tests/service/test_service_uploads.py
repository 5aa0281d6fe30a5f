"""Resumable uploads (tus 1.0: core, creation, termination): an image sent in pieces, cut off and resumed, then
labelled by a job exactly as the whole image; offsets, lengths, owners and versions checked."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
import tifffile

pytest.importorskip("sqlalchemy")
pytest.importorskip("distributed")
pytest.importorskip("zarr")

from tests.app_support import blobs  # noqa: E402
from tests.jobs_support import job_settings, reference_labels, serving, wait_for  # noqa: E402
from tests.service.test_service_jobs import error_of  # noqa: E402
from tests.service.test_service_keys import keys_for  # noqa: E402

pytestmark = pytest.mark.xdist_group("jobs")  # Dask clusters: one test at a time

TUS = {"Tus-Resumable": "1.0.0"}


def patch(client, location: str, offset: int, data: bytes, **headers):
    headers = {
        **TUS,
        "Upload-Offset": str(offset),
        "Content-Type": "application/offset+octet-stream",
        **headers,
    }
    return client.patch(location, content=data, headers=headers)


def create(client, length: int, name: str = "tissue.tif", **headers):
    metadata = f"filename {base64.b64encode(name.encode()).decode()}"
    return client.post("/v1/uploads", headers={**TUS, "Upload-Length": str(length), "Upload-Metadata": metadata,
                                               **headers})  # fmt: skip


def test_an_upload_sent_in_pieces_and_resumed_is_labelled_as_the_whole_image(tmp_path):
    settings = job_settings(tmp_path)
    pixels = blobs(96, 80, seed=7)
    tiff = io.BytesIO()
    tifffile.imwrite(tiff, pixels, tile=(16, 16))
    data = tiff.getvalue()
    with serving(settings) as client:
        options = client.options("/v1/uploads")
        assert options.status_code == 204 and options.headers["tus-version"] == "1.0.0"
        assert "creation" in options.headers["tus-extension"]
        created = create(client, len(data))
        assert created.status_code == 201, created.text
        location = created.headers["location"]
        upload_id = location.rsplit("/", 1)[1]
        assert patch(client, location, 0, data[:1000]).headers["upload-offset"] == "1000"
        # a cut-off: the client lost the answer; HEAD says where to resume, a wrong offset is refused
        head = client.head(location, headers=TUS)
        assert (head.headers["upload-offset"], head.headers["upload-length"]) == ("1000", str(len(data)))
        error_of(patch(client, location, 0, data[:10]), 409, "upload_offset_mismatch")
        error_of(
            client.post("/v1/jobs", json={"model": "cells", "upload": upload_id}), 409, "upload_incomplete"
        )
        error_of(patch(client, location, 1000, data[1000:] + b"more"), 413, "upload_too_long")
        offset = int(client.head(location, headers=TUS).headers["upload-offset"])  # what arrived is kept
        response = patch(client, location, offset, data[offset:])
        assert response.status_code == 204 and response.headers["upload-offset"] == str(len(data))
        job = client.post("/v1/jobs", json={"model": "cells", "upload": upload_id, "chunk": 32})
        assert job.status_code == 202, job.text
        assert job.json()["input"] == "tissue.tif"
        finished = wait_for(client, job.headers["location"])
        assert finished["state"] == "succeeded", finished
        labels = tifffile.imread(io.BytesIO(client.get(finished["results"]["tiff"]).content))
        np.testing.assert_array_equal(labels, reference_labels(settings.model_dir / "cells", pixels))
        assert client.head(location, headers=TUS).status_code == 404  # it became the job's input


def test_uploads_are_refused_clearly_and_belong_to_their_key(tmp_path):
    settings = job_settings(tmp_path, max_job_upload_bytes=10_000, disk_quota_bytes=1_000_000)
    with serving(settings) as client:
        error_of(client.post("/v1/uploads", headers={"Upload-Length": "10"}), 412, "tus_version")
        error_of(client.post("/v1/uploads", headers={**TUS}), 400, "invalid_upload_length")
        error_of(create(client, 10_001), 413, "payload_too_large")
        bad_name = client.post(
            "/v1/uploads", headers={**TUS, "Upload-Length": "10", "Upload-Metadata": "filename @@"}
        )
        error_of(bad_name, 400, "invalid_upload_metadata")
        location = create(client, 20).headers["location"]
        error_of(
            patch(client, location, 0, b"x", **{"Content-Type": "image/png"}), 415, "unsupported_media_type"
        )
        for unknown in ("nosuch", "..", "%2e%2e%2fjobs.db"):
            assert client.head(f"/v1/uploads/{unknown}", headers=TUS).status_code == 404
        assert patch(client, location, 0, b"not an image at all!").status_code == 204
        upload_id = location.rsplit("/", 1)[1]
        error_of(
            client.post("/v1/jobs", json={"model": "cells", "upload": upload_id}),
            415,
            "unsupported_image_type",
        )
        error_of(client.post("/v1/jobs", json={"model": "cells", "upload": upload_id, "input": "a.zarr"}), 422,
                 "invalid_request")  # fmt: skip
        assert client.delete(location, headers=TUS).status_code == 204
        # a job refused after its upload was taken (a 4-D array for a 2-D model) gives the upload back whole
        array = io.BytesIO()
        np.save(array, np.zeros((2, 3, 16, 16), np.uint8))
        data = array.getvalue()
        stack = create(client, len(data), "stack.npy").headers["location"]
        assert patch(client, stack, 0, data).status_code == 204
        refused = client.post("/v1/jobs", json={"model": "cells", "upload": stack.rsplit("/", 1)[1]})
        assert 400 <= refused.status_code < 500, refused.text
        assert client.head(stack, headers=TUS).headers["upload-offset"] == str(len(data))
        assert not list((settings.data_dir / "jobs").glob("*/input.*"))  # no job directory left behind
        error_of(patch(client, location, 0, b"x"), 404, "unknown_upload")


def test_another_key_cannot_see_or_use_an_upload(tmp_path):
    settings = job_settings(tmp_path, require_keys=True)
    keys = keys_for(settings, "alice", "bob")
    with serving(settings) as client:
        error_of(create(client, 10), 401, "missing_key")
        location = create(client, 10, **keys["alice"]).headers["location"]
        upload_id = location.rsplit("/", 1)[1]
        assert client.head(location, headers={**TUS, **keys["bob"]}).status_code == 404
        error_of(patch(client, location, 0, b"x", **keys["bob"]), 404, "unknown_upload")
        error_of(client.delete(location, headers={**TUS, **keys["bob"]}), 404, "unknown_upload")
        job = client.post("/v1/jobs", json={"model": "cells", "upload": upload_id}, headers=keys["bob"])
        error_of(job, 404, "unknown_upload")
        assert patch(client, location, 0, b"0123456789", **keys["alice"]).status_code == 204
