"""Jobs: images of any size labelled in the background on densecnn predict's engine; progress, cancel, restart,
quota, results (one image, or the zarr store file by file)."""

from __future__ import annotations

import io
import re
import time

import numpy as np
import pytest
import tifffile
from PIL import Image

pytest.importorskip("sqlalchemy")
pytest.importorskip("distributed")
zarr = pytest.importorskip("zarr")


from tests.app_support import blobs, encode  # noqa: E402
from tests.jobs_support import (  # noqa: E402
    FINISHED,
    download_zarr,
    error_of,
    job_settings,
    reference_labels,
    serving,
    succeeded_upload_job,
    wait_for,
    write_zarr,
)

pytestmark = pytest.mark.xdist_group("jobs")  # Dask clusters: one test at a time


def test_a_server_side_zarr_job_equals_the_in_memory_prediction(tmp_path):
    pixels = write_zarr(tmp_path / "data" / "blobs.zarr", 96, 128)
    settings = job_settings(tmp_path)
    with serving(settings) as client:
        response = client.post("/v1/jobs", json={"model": "cells", "input": "blobs.zarr", "chunk": 32})
        assert response.status_code == 202, response.text
        location = response.headers["location"]
        assert location == f"/v1/jobs/{response.json()['id']}" and response.json()["state"] == "queued"
        job = wait_for(client, location)
        assert job["state"] == "succeeded", job
        assert job["progress"]["blocks_done"] == job["progress"]["blocks_total"] == 3 * 4
        assert job["shape"] == [96, 128] and set(job["results"]) == {"zarr", "png", "tiff"}
        expected = reference_labels(settings.model_dir / "cells", pixels)
        stored = download_zarr(client, job["id"], tmp_path / "copy.zarr")
        np.testing.assert_array_equal(stored, expected)
        png = client.get(job["results"]["png"])
        assert png.headers["content-type"] == "image/png"
        np.testing.assert_array_equal(np.asarray(Image.open(io.BytesIO(png.content))), expected)
        tiff = client.get(job["results"]["tiff"])
        np.testing.assert_array_equal(tifffile.imread(io.BytesIO(tiff.content)), expected)
        assert [j["id"] for j in client.get("/v1/jobs").json()["jobs"]] == [job["id"]]
        error_of(client.get(f"/v1/jobs/{job['id']}/result.zarr/c/9/9"), 404, "no_such_key")
        error_of(client.get(f"/v1/jobs/{job['id']}/result.zarr/..%2F..%2Fjobs.db"), 400, "path_traversal")
        for key in ("c/0%000", "x" * 300):
            error_of(client.get(f"/v1/jobs/{job['id']}/result.zarr/{key}"), 404, "no_such_key")
        metrics = client.get("/metrics").text
        assert (
            'densecnn_jobs{state="succeeded"} 1.0' in metrics and "densecnn_job_blocks_total 12.0" in metrics
        )
        # a finished job is deleted with its files
        assert client.delete(location).status_code == 204
        error_of(client.get(location), 404, "unknown_job")
        assert not (settings.data_dir / "jobs" / job["id"]).exists()


def test_uploads_are_labelled_tiff_by_blocks_and_png_whole(tmp_path):
    settings = job_settings(tmp_path)
    pixels = blobs(80, 72, seed=5)
    expected = reference_labels(settings.model_dir / "cells", pixels)
    tiff = io.BytesIO()
    tifffile.imwrite(tiff, pixels, tile=(16, 16))
    with serving(settings) as client:
        raw = client.post("/v1/jobs", params={"model": "cells", "chunk": 32}, content=tiff.getvalue(),
                          headers={"content-type": "image/tiff"})  # fmt: skip
        assert raw.status_code == 202, raw.text
        form = client.post(
            "/v1/jobs", params={"model": "cells"}, files={"image": ("cells.png", encode(pixels))}
        )
        assert form.status_code == 202, form.text
        assert form.json()["input"] == "cells.png"
        for response, results in ((raw, {"zarr", "png", "tiff"}), (form, {"png", "tiff"})):
            job = wait_for(client, response.headers["location"])
            assert job["state"] == "succeeded" and set(job["results"]) == results, job["error"]
            png = client.get(job["results"]["png"]).content
            np.testing.assert_array_equal(np.asarray(Image.open(io.BytesIO(png))), expected)
        error_of(client.get(f"/v1/jobs/{form.json()['id']}/result.zarr/zarr.json"), 404, "no_such_result")


def test_a_job_stopped_with_the_server_resumes_at_the_next_start(tmp_path):
    pixels = write_zarr(tmp_path / "data" / "big.zarr", 256, 256, seed=7, chunks=16)
    settings = job_settings(tmp_path, job_block=16)
    with serving(settings) as client:
        location = client.post("/v1/jobs", json={"model": "cells", "input": "big.zarr", "chunk": 16}).headers[
            "location"
        ]
        wait_for(client, location, until=lambda job: job["progress"]["blocks_done"] >= 8)
    # the server stopped mid-job: the job is queued again, with what it wrote kept
    with serving(settings) as client:
        job = wait_for(client, location)
        assert job["state"] == "succeeded", job
        progress = job["progress"]
        assert progress["blocks_done"] == progress["blocks_total"] == 256
        # the second run computed only what the first left: the engine resumed from the written chunks
        metrics = client.get("/metrics").text
        computed = float(re.search(r"^densecnn_job_blocks_total (\S+)$", metrics, re.MULTILINE).group(1))
        assert 0 < computed < 256, computed
        stored = download_zarr(client, job["id"], tmp_path / "copy.zarr")
    np.testing.assert_array_equal(stored, reference_labels(settings.model_dir / "cells", pixels))


def test_a_one_image_job_rerun_after_its_label_image_was_written_replaces_it(tmp_path):
    # the server stopped after the job wrote labels.png and before it was marked done: the rerun writes it again
    settings = job_settings(tmp_path)
    pixels = blobs(40, 36, seed=2)
    with serving(settings) as client:
        job = succeeded_upload_job(client, encode(pixels), "cells.png")
        location = f"/v1/jobs/{job['id']}"
        assert (settings.data_dir / "jobs" / job["id"] / "labels.png").is_file()
        client.app.state.jobs.store.set(job["id"], state="queued", finished=None, runner=None)
    with serving(settings) as client:
        job = wait_for(client, location)
        assert job["state"] == "succeeded", job["error"]
        png = client.get(job["results"]["png"]).content
    np.testing.assert_array_equal(
        np.asarray(Image.open(io.BytesIO(png))), reference_labels(settings.model_dir / "cells", pixels)
    )


def test_cancelling_a_running_job_frees_its_slot(tmp_path):
    write_zarr(tmp_path / "data" / "big.zarr", 256, 256, chunks=16)
    write_zarr(tmp_path / "data" / "small.zarr", 32, 32)
    settings = job_settings(tmp_path, job_block=16, max_jobs_per_key=1)
    with serving(settings) as client:
        location = client.post("/v1/jobs", json={"model": "cells", "input": "big.zarr", "chunk": 16}).headers[
            "location"
        ]
        wait_for(client, location, until=lambda job: job["progress"]["blocks_done"] >= 1)
        refused = client.post("/v1/jobs", json={"model": "cells", "input": "small.zarr"})
        error_of(refused, 429, "too_many_jobs")
        assert refused.headers["retry-after"]
        cancelling = client.delete(location)
        assert cancelling.status_code == 202 and cancelling.json()["cancel_requested"]
        job = wait_for(client, location)
        assert job["state"] == "cancelled" and job["progress"]["blocks_done"] < 256, job
        message = error_of(client.get(f"{location}/result.png"), 409, "job_not_finished")["message"]
        assert "was cancelled, so it has no results; submit the job again" in message
        assert "poll" not in message
        second = client.post("/v1/jobs", json={"model": "cells", "input": "small.zarr"})
        assert second.status_code == 202, second.text
        assert wait_for(client, second.headers["location"])["state"] == "succeeded"


def test_the_disk_quota_refuses_new_jobs_with_507(tmp_path):
    write_zarr(tmp_path / "data" / "blobs.zarr", 96, 128)
    settings = job_settings(tmp_path, disk_quota_bytes=5_000)
    tiff = io.BytesIO()
    tifffile.imwrite(tiff, blobs(64, 64))  # 12 kB: more than the quota
    with serving(settings) as client:
        too_big = client.post("/v1/jobs", params={"model": "cells"}, content=tiff.getvalue(),
                              headers={"content-type": "image/tiff"})  # fmt: skip
        error_of(too_big, 507, "quota_exceeded")
        # 96 x 128 labels (12 kB uncompressed) would not fit either
        error_of(
            client.post("/v1/jobs", json={"model": "cells", "input": "blobs.zarr"}), 507, "quota_exceeded"
        )
        assert client.get("/v1/jobs").json()["jobs"] == []
    assert list((settings.data_dir / "jobs").iterdir()) == []  # nothing left behind


def test_bad_job_requests_get_clear_errors_never_500(tmp_path):
    write_zarr(tmp_path / "data" / "blobs.zarr", 32, 32)
    (tmp_path / "data" / "plain").mkdir()
    (tmp_path / "data" / "notes.tif").write_bytes(b"II*\x00 not really a tiff")
    settings = job_settings(tmp_path, max_image_pixels=1000)
    with serving(settings) as client:
        error_of(client.post("/v1/jobs", json={"model": "nope", "input": "blobs.zarr"}), 404, "unknown_model")
        error_of(client.post("/v1/jobs", json={"input": "blobs.zarr"}), 422, "invalid_request")
        error_of(
            client.post("/v1/jobs", json={"model": "cells", "input": "x", "extra": 1}), 422, "invalid_request"
        )
        error_of(client.post("/v1/jobs", content=b"{", headers={"content-type": "application/json"}), 422,
                 "invalid_request")  # fmt: skip
        error_of(client.post("/v1/jobs", content=encode(blobs()), headers={"content-type": "image/png"}), 422,
                 "missing_model")  # fmt: skip
        error_of(client.post("/v1/jobs", params={"model": "cells"}, content=b"hello",
                             headers={"content-type": "text/plain"}), 415, "unsupported_media_type")  # fmt: skip
        error_of(client.post("/v1/jobs", params={"model": "cells"}, content=b"",
                             headers={"content-type": "image/png"}), 400, "empty_image")  # fmt: skip
        error_of(client.post("/v1/jobs", params={"model": "cells"}, content=b"not an image at all",
                             headers={"content-type": "image/png"}), 415, "unsupported_image_type")  # fmt: skip
        # an image file decoded whole must fit the image limits; a TIFF of the same size would not need to
        error_of(client.post("/v1/jobs", params={"model": "cells"}, files={"image": ("a.png", encode(blobs()))}),
                 413, "image_too_large")  # fmt: skip
        error_of(
            client.post("/v1/jobs", json={"model": "cells", "input": "nothing.zarr"}), 404, "input_not_found"
        )
        error_of(client.post("/v1/jobs", json={"model": "cells", "input": "plain"}), 400, "not_an_input")
        for name in ("bad\0name", "a" * 300, "b" * 5000):  # a NUL; too long for the file system; too long
            error_of(client.post("/v1/jobs", json={"model": "cells", "input": name}), 400, "invalid_path")
        error_of(client.post("/v1/jobs", json={"model": "cells", "input": "notes.tif"}), 400, "invalid_image")
        error_of(client.post("/v1/jobs", json={"model": "cells", "input": "blobs.zarr", "intensity": "loud"}), 400,
                 "intensity_out_of_range")  # fmt: skip
        error_of(client.get("/v1/jobs/0123abcd"), 404, "unknown_job")
        error_of(client.delete("/v1/jobs/0123abcd"), 404, "unknown_job")
        error_of(client.get("/v1/jobs/0123abcd/result.png"), 404, "unknown_job")
        assert list((settings.data_dir / "jobs").iterdir()) == []
    with serving(job_settings(tmp_path, data_roots=[])) as client:
        error_of(client.post("/v1/jobs", json={"model": "cells", "input": "blobs.zarr"}), 403,
                 "server_paths_disabled")  # fmt: skip


def test_a_failing_job_says_why(tmp_path):
    write_zarr(tmp_path / "data" / "blobs.zarr", 32, 32)
    np.save(
        tmp_path / "data" / "gray.npy", np.zeros((5, 32, 32), np.uint8)
    )  # 5 channels for a 3-channel model
    with serving(job_settings(tmp_path)) as client:
        response = client.post("/v1/jobs", json={"model": "cells", "input": "gray.npy"})
        assert response.status_code == 202, response.text
        job = wait_for(client, response.headers["location"])
        assert job["state"] == "failed" and "channels" in job["error"], job


def test_an_rgba_tiff_job_is_labelled_as_segment_labels_it(tmp_path):
    rgb = blobs(40, 56, seed=5)
    alpha = np.linspace(0, 255, 40 * 56).astype(np.uint8).reshape(40, 56)
    tiff = io.BytesIO()
    tifffile.imwrite(tiff, np.dstack([rgb, alpha]), photometric="rgb", extrasamples=["unassalpha"])
    options = {"model": "cells", "intensity": "percentiles:1,99"}  # a sample of the colours, not of the alpha
    with serving(job_settings(tmp_path)) as client:
        segmented = client.post("/v1/models/cells/segment", params={"intensity": options["intensity"]},
                                files={"image": ("rgba.tif", tiff.getvalue())})  # fmt: skip
        assert segmented.status_code == 200, segmented.text
        response = client.post("/v1/jobs", params=options, files={"image": ("rgba.tif", tiff.getvalue())})
        job = wait_for(client, response.headers["location"])
        assert job["state"] == "succeeded", job["error"]
        labels = client.get(job["results"]["png"]).content
        np.testing.assert_array_equal(
            np.asarray(Image.open(io.BytesIO(labels))), np.asarray(Image.open(io.BytesIO(segmented.content)))
        )


def test_a_job_error_offers_no_option_the_jobs_api_lacks(tmp_path):
    settings = job_settings(tmp_path)
    np.save(tmp_path / "data" / "hwc.npy", blobs(40, 56))  # channels last: read as 40 channels of 56x3
    with serving(settings) as client:
        response = client.post("/v1/jobs", json={"model": "cells", "input": "hwc.npy"})
        job = wait_for(client, response.headers["location"])
    assert job["state"] == "failed", job
    assert job["error"].startswith("hwc.npy: 40 channels cannot feed a model of 3"), job["error"]
    assert "as its first axis, (C, H, W)" in job["error"]
    assert "channel_axis" not in job["error"] and "channel-axis" not in job["error"]


def test_a_job_whose_zarr_input_loses_a_chunk_while_it_runs_fails_saying_so(tmp_path, monkeypatch):
    from densecnn_app.jobs import runner

    settings = job_settings(tmp_path)
    write_zarr(tmp_path / "data" / "blobs.zarr", 128, 128, chunks=16)
    report = runner._Reporter.__call__

    def deleting_a_chunk(self, summary):  # after a first task: a chunk not read yet, most likely
        (tmp_path / "data" / "blobs.zarr" / "c" / "0" / "7" / "7").unlink(missing_ok=True)
        report(self, summary)

    monkeypatch.setattr(runner._Reporter, "__call__", deleting_a_chunk)
    with serving(settings) as client:
        response = client.post("/v1/jobs", json={"model": "cells", "input": "blobs.zarr", "chunk": 16})
        job = wait_for(client, response.headers["location"])
        assert job["state"] == "failed", job
        assert job["error"].startswith("blobs.zarr changed or vanished while the job read it"), job["error"]
        assert "submit the job again" in job["error"]
        message = error_of(
            client.get(f"/v1/jobs/{job['id']}/result.zarr/zarr.json"), 409, "job_not_finished"
        )["message"]
        assert "failed, so it has no results (its error" in message and "poll" not in message


def test_workers_sharing_a_database_see_and_cancel_each_others_jobs(tmp_path):
    """Two apps on one database, as two worker processes are: either answers for a job the other runs (and does not
    take it over while its heartbeat is fresh); a cancel reaches the job through the database."""
    write_zarr(tmp_path / "data" / "big.zarr", 256, 256, chunks=16)
    settings = job_settings(tmp_path, job_block=16)
    with serving(settings) as first, serving(settings) as second:
        response = first.post("/v1/jobs", json={"model": "cells", "input": "big.zarr", "chunk": 16})
        location, job_id = response.headers["location"], response.json()["id"]
        wait_for(second, location, until=lambda job: job["progress"]["blocks_done"] >= 1)
        # either worker may have claimed the queued job first: the other one answers for it and cancels it
        runner = second.app.state.jobs.store.get(job_id).runner
        names = {client.app.state.jobs.name: client for client in (first, second)}
        assert runner in names
        other = second if names[runner] is first else first
        assert other.delete(location).status_code == 202
        job = wait_for(names[runner], location)
        assert job["state"] == "cancelled" and job["progress"]["blocks_done"] < 256, job


def test_a_running_job_renews_its_heartbeat_with_its_progress(tmp_path):
    """Between two maintenance periods (here a minute apart) the job's own progress reports keep its heartbeat
    fresh, so a worker whose maintenance runs late on a loaded machine does not lose a job it is advancing (1,024
    blocks: seconds of work even on a fast CPU; cancelled once seen)."""
    write_zarr(tmp_path / "data" / "big.zarr", 512, 512, chunks=16)
    settings = job_settings(tmp_path, job_block=16, job_poll_seconds=60)
    with serving(settings) as client:
        location = client.post("/v1/jobs", json={"model": "cells", "input": "big.zarr", "chunk": 16}).headers[
            "location"
        ]
        job_id = wait_for(client, location, until=lambda job: job["progress"]["blocks_done"] >= 1)["id"]
        store = client.app.state.jobs.store
        first = store.get(job_id).heartbeat
        job = wait_for(client, location, until=lambda job: store.get(job_id).heartbeat > first + 0.4 or
                       job["state"] in FINISHED)  # fmt: skip
        assert job["state"] == "running", job
        assert client.delete(location).status_code == 202


def test_finished_jobs_expire_with_their_files(tmp_path):
    write_zarr(tmp_path / "data" / "blobs.zarr", 32, 32)
    settings = job_settings(tmp_path, job_retention=0.5)
    with serving(settings) as client:
        location = client.post("/v1/jobs", json={"model": "cells", "input": "blobs.zarr"}).headers["location"]
        job_id = wait_for(client, location)["id"]
        deadline = time.monotonic() + 30
        while client.get(location).status_code == 200:
            assert time.monotonic() < deadline, "the job did not expire"
            time.sleep(0.1)
        error_of(client.get(location), 404, "unknown_job")
        assert not (settings.data_dir / "jobs" / job_id).exists()


def test_a_job_whose_worker_died_is_taken_over(tmp_path):
    """A job left running by a worker that stopped without releasing it (killed) is resumed once its heartbeat is
    three poll periods old."""
    from densecnn_app.jobs.db import JobRecord, make_engine
    from densecnn_app.jobs.store import JobStore

    pixels = write_zarr(tmp_path / "data" / "blobs.zarr", 32, 32)
    settings = job_settings(tmp_path)
    settings.data_dir.mkdir(parents=True)
    engine = make_engine(settings.database)
    JobStore(engine).add(JobRecord(
        id="d1ed", owner="", model="cells", input=str(tmp_path / "data" / "blobs.zarr"), input_name="blobs.zarr",
        result="zarr", state="running", runner="gone:1:x", heartbeat=time.time() - 1, created=time.time(),
    ), max_unfinished=4)  # fmt: skip
    engine.dispose()
    with serving(settings) as client:
        job = wait_for(client, "/v1/jobs/d1ed")
        assert job["state"] == "succeeded", job
        stored = download_zarr(client, "d1ed", tmp_path / "copy.zarr")
    np.testing.assert_array_equal(stored, reference_labels(settings.model_dir / "cells", pixels))
