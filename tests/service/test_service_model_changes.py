"""The service and its files changing under it: a model replaced or removed while it runs, jobs racing each other
and deletes, the data directory unwritable, a full disk; and the jobs API's messages for malformed requests."""

from __future__ import annotations

import errno
import io
import re
import shutil
import threading

import numpy as np
import pytest
import tifffile
import torch
from PIL import Image

pytest.importorskip("sqlalchemy")
pytest.importorskip("distributed")
pytest.importorskip("zarr")

import densecnn  # noqa: E402
from densecnn.errors import InvalidInputError, PredictInputError  # noqa: E402
from tests.app_support import CLASS_NAMES, blobs, brightness_model, encode  # noqa: E402
from tests.jobs_support import (  # noqa: E402
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


def _save_other_model(directory) -> None:
    """A model of the same shape as ``save_brightness_model``'s but other weights, saved into ``directory``."""
    torch.manual_seed(7)
    model, patch = brightness_model(3)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter))
    palette = [[0, 0, 0], [40, 120, 255], [255, 200, 0]]
    densecnn.save(model, directory, patch_size=patch, class_names=CLASS_NAMES, palette=palette)


def _png_labels(response) -> np.ndarray:
    assert response.status_code == 200, response.text
    return np.asarray(Image.open(io.BytesIO(response.content)))


def test_a_model_replaced_in_place_is_served_alike_by_segment_jobs_and_the_model_list(tmp_path):
    settings = job_settings(tmp_path)
    pixels = blobs(48, 64, seed=11)
    png = encode(pixels)
    model_dir = settings.model_dir / "cells"
    with serving(settings) as client:
        before = _png_labels(client.post("/v1/models/cells/segment", files={"image": ("a.png", png)}))
        other = tmp_path / "other"
        _save_other_model(other)
        for path in other.iterdir():  # the model's files replaced while the server runs
            shutil.copy(path, model_dir / path.name)
        expected = reference_labels(model_dir, pixels)
        assert (expected != before).any(), "the replacement model must label the image otherwise"
        segment = _png_labels(client.post("/v1/models/cells/segment", files={"image": ("a.png", png)}))
        job = succeeded_upload_job(client, png)
        from_job = _png_labels(client.get(job["results"]["png"]))
        np.testing.assert_array_equal(segment, expected)
        np.testing.assert_array_equal(from_job, expected)
        loaded = densecnn.load(model_dir)
        described = client.get("/v1/models/cells").json()
        assert described["classes"] == client.get("/v1/models").json()["models"][0]["classes"]
        assert len(described["classes"]) == loaded.num_classes


def _held_job(client, request: dict) -> tuple[dict, object]:
    """A job created from the JSON ``request`` but not yet run, and the function that runs it."""
    runner = client.app.state.jobs
    original = runner.submit
    runner.submit = lambda job_id: None  # held back until the caller runs it
    try:
        created = client.post("/v1/jobs", json=request)
    finally:
        runner.submit = original
    assert created.status_code == 202, created.text
    return created.json(), lambda: runner.submit(created.json()["id"])


def test_a_job_runs_the_model_segment_serves_when_it_starts_and_records_its_version(tmp_path):
    """A model replaced (as densecnn.save writes it: new files renamed into place) after a job on it ran and before
    the next one starts: the next job labels with the new weights, as /segment then does, and says which version it
    ran with (the one /v1/models gives)."""
    pixels = write_zarr(tmp_path / "data" / "blobs.zarr", 48, 64, seed=11)
    settings = job_settings(tmp_path)
    model_dir = settings.model_dir / "cells"
    request = {"model": "cells", "input": "blobs.zarr"}
    with serving(settings) as client:
        first = wait_for(client, client.post("/v1/jobs", json=request).headers["location"])
        assert first["state"] == "succeeded", first
        versions = [client.get("/v1/models/cells").json().get("version")]
        held, run = _held_job(client, request)
        _save_other_model(model_dir)  # between the job's submission and its start
        run()
        job = wait_for(client, f"/v1/jobs/{held['id']}")
        assert job["state"] == "succeeded", job
        versions.append(client.get("/v1/models/cells").json().get("version"))
        segment = client.post("/v1/models/cells/segment", files={"image": ("a.png", encode(pixels))})
        from_job = download_zarr(client, job["id"], tmp_path / "copy.zarr")
    np.testing.assert_array_equal(_png_labels(segment), reference_labels(model_dir, pixels))
    np.testing.assert_array_equal(from_job, _png_labels(segment))
    assert held["model_version"] is None  # not started yet when it was created
    assert [first["model_version"], job["model_version"]] == versions and versions[0] != versions[1]


def test_a_model_replaced_while_its_job_runs_leaves_the_job_on_the_version_it_started_with(
    tmp_path, monkeypatch
):
    import densecnn.blockwise

    settings = job_settings(tmp_path)
    pixels = blobs(40, 48, seed=5)
    model_dir = settings.model_dir / "cells"
    kept = tmp_path / "kept"
    shutil.copytree(model_dir, kept)
    engine = densecnn.blockwise.predict_to_disk

    def replaced_first(*args, **kwargs):  # the model's files change once the job has chosen its model
        _save_other_model(model_dir)
        return engine(*args, **kwargs)

    monkeypatch.setattr(densecnn.blockwise, "predict_to_disk", replaced_first)
    with serving(settings) as client:
        before = client.get("/v1/models/cells").json()["version"]
        job = succeeded_upload_job(client, encode(pixels))
        from_job = _png_labels(client.get(job["results"]["png"]))
        after = client.get("/v1/models/cells").json()["version"]
    old, new = reference_labels(kept, pixels), reference_labels(model_dir, pixels)
    assert (old != new).any(), "the replacement model must label the image otherwise"
    np.testing.assert_array_equal(from_job, old)
    assert job["model_version"] == before != after
    assert not (settings.data_dir / "jobs" / job["id"] / "model").exists()  # its copy goes with the run


def test_a_job_resumed_after_its_model_was_replaced_finishes_on_the_version_it_started_with(tmp_path):
    pixels = write_zarr(tmp_path / "data" / "big.zarr", 256, 256, seed=7, chunks=16)
    settings = job_settings(tmp_path, job_block=16)
    model_dir = settings.model_dir / "cells"
    kept = tmp_path / "kept"
    shutil.copytree(model_dir, kept)
    with serving(settings) as client:
        request = {"model": "cells", "input": "big.zarr", "chunk": 16}
        location = client.post("/v1/jobs", json=request).headers["location"]
        started = wait_for(client, location, until=lambda job: job["progress"]["blocks_done"] >= 8)
    _save_other_model(model_dir)  # while the server is stopped, the job's first run half done
    with serving(settings) as client:
        job = wait_for(client, location)
        assert job["state"] == "succeeded", job
        served = client.get("/v1/models/cells").json()["version"]
        metrics = client.get("/metrics").text
        stored = download_zarr(client, job["id"], tmp_path / "copy.zarr")
    computed = float(re.search(r"^densecnn_job_blocks_total (\S+)$", metrics, re.MULTILINE).group(1))
    assert 0 < computed < 256, computed  # the second run resumed from the first one's chunks
    np.testing.assert_array_equal(stored, reference_labels(kept, pixels))
    assert job["model_version"] == started["model_version"] != served


def test_a_job_whose_model_is_broken_when_it_starts_fails_saying_so(tmp_path):
    settings = job_settings(tmp_path)
    with serving(settings) as client:
        (tmp_path / "data" / "a.png").write_bytes(encode(blobs()))
        held, run = _held_job(client, {"model": "cells", "input": "a.png"})
        (settings.model_dir / "cells" / "model.json").write_text("{ half-copied")
        run()
        job = wait_for(client, f"/v1/jobs/{held['id']}")
    assert job["state"] == "failed" and "model 'cells' could not be loaded" in job["error"], job
    assert "submit the job again" in job["error"] and str(tmp_path) not in job["error"]
    assert job["model_version"] is None


def test_a_job_taken_over_while_the_models_load_waits_for_them(tmp_path, monkeypatch):
    """A job resumed at start-up runs once the models are loaded, with the model they serve (not failed as removed
    because the service had not loaded it yet)."""
    import time

    import densecnn_app.main
    from densecnn_app.jobs.db import JobRecord, make_engine
    from densecnn_app.jobs.store import JobStore

    pixels = write_zarr(tmp_path / "data" / "blobs.zarr", 32, 32)
    settings = job_settings(tmp_path)
    settings.data_dir.mkdir(parents=True)
    engine = make_engine(settings.database)
    JobStore(engine).add(JobRecord(
        id="d1ed", owner="", model="cells", input=str(tmp_path / "data" / "blobs.zarr"), input_name="blobs.zarr",
        result="zarr", state="queued", runner=None, heartbeat=0.0, created=time.time(),
    ), max_unfinished=4)  # fmt: skip
    engine.dispose()
    load_models = densecnn_app.main.load_models

    def slow_load(*args, **kwargs):
        time.sleep(1.0)
        return load_models(*args, **kwargs)

    monkeypatch.setattr(densecnn_app.main, "load_models", slow_load)
    with serving(settings) as client:
        job = wait_for(client, "/v1/jobs/d1ed")
        assert job["state"] == "succeeded", job
        assert job["model_version"] == client.get("/v1/models/cells").json()["version"]
        stored = download_zarr(client, "d1ed", tmp_path / "copy.zarr")
    np.testing.assert_array_equal(stored, reference_labels(settings.model_dir / "cells", pixels))


def test_a_reloaded_model_is_warmed_as_at_start_up(tmp_path, monkeypatch):
    from densecnn.dense import DenseCNN

    warmed = []
    warm = DenseCNN.warm

    def recorded(self, shape, **kwargs):
        warmed.append((self, tuple(shape), kwargs.get("max_memory")))
        return warm(self, shape, **kwargs)

    monkeypatch.setattr(DenseCNN, "warm", recorded)
    settings = job_settings(tmp_path, warm_sizes=[[24, 24], [8, 8, 8]])
    with serving(settings) as client:
        service = client.app.state.service
        assert warmed == [(service.models["cells"].dense, (1, 3, 24, 24), settings.max_inference_memory)]
        warmed.clear()
        _save_other_model(settings.model_dir / "cells")
        assert client.get("/v1/models/cells").status_code == 200  # reloaded
        assert warmed == [(service.models["cells"].dense, (1, 3, 24, 24), settings.max_inference_memory)]


def test_a_removed_model_keeps_finished_results_and_refuses_new_jobs_at_once(tmp_path):
    settings = job_settings(tmp_path)
    pixels = blobs(40, 48, seed=2)
    with serving(settings) as client:
        job = succeeded_upload_job(client, encode(pixels))
        shutil.rmtree(settings.model_dir / "cells")
        expected = _png_labels(client.get(job["results"]["png"]))
        tiff = client.get(f"/v1/jobs/{job['id']}/result.tif")
        assert tiff.status_code == 200, tiff.text
        np.testing.assert_array_equal(tifffile.imread(io.BytesIO(tiff.content)), expected)
        geojson = client.get(f"/v1/jobs/{job['id']}/result.geojson", params={"background": True})
        assert geojson.status_code == 200 and geojson.json()["type"] == "FeatureCollection", geojson.text
        error = error_of(
            client.post("/v1/jobs", params={"model": "cells"}, files={"image": ("a.png", encode(pixels))}),
            404,
            "unknown_model",
        )
        assert str(tmp_path) not in error["message"]
        error_of(client.get("/v1/models/cells"), 404, "unknown_model")
        assert client.get("/v1/models").json()["models"] == []


def test_a_model_removed_while_its_job_waits_fails_it_without_server_paths(tmp_path):
    from densecnn_app.jobs.runner import JobRunner

    settings = job_settings(tmp_path)
    with serving(settings) as client:
        runner: JobRunner = client.app.state.jobs
        original = runner.submit
        runner.submit = lambda job_id: None  # held back until the model is gone
        created = client.post(
            "/v1/jobs", params={"model": "cells"}, files={"image": ("a.png", encode(blobs()))}
        )
        assert created.status_code == 202, created.text
        shutil.rmtree(settings.model_dir / "cells")
        runner.submit = original
        runner.submit(created.json()["id"])
        job = wait_for(client, created.headers["location"])
        assert job["state"] == "failed" and "model 'cells' was removed" in job["error"], job
        assert str(tmp_path) not in job["error"] and "densecnn.save" not in job["error"]


def test_two_jobs_on_one_upload_at_once_get_one_202_and_404s(tmp_path):
    from densecnn_app.jobs import upload_store

    settings = job_settings(tmp_path, max_jobs_per_key=20)
    data = encode(blobs(32, 32))
    with serving(settings) as client:
        created = client.post(
            "/v1/uploads", headers={"Tus-Resumable": "1.0.0", "Upload-Length": str(len(data))}
        )
        location = created.headers["location"]
        patched = client.patch(
            location,
            content=data,
            headers={
                "Tus-Resumable": "1.0.0",
                "Upload-Offset": "0",
                "Content-Type": "application/offset+octet-stream",
            },
        )
        assert patched.status_code == 204, patched.text
        upload_id = location.rsplit("/", 1)[-1]
        # the loser's view: its check found the upload, then the winner's rename took the data
        real_info = upload_store.info
        taken = threading.Event()

        def info_then_lose(*args):
            described = real_info(*args)
            if not taken.is_set():
                taken.set()
                (upload_store.uploads_root(args[0]) / upload_id / "data").unlink()
            return described

        upload_store.info = info_then_lose
        try:
            lost = client.post("/v1/jobs", json={"model": "cells", "upload": upload_id})
        finally:
            upload_store.info = real_info
        error = error_of(lost, 404, "unknown_upload")
        assert "taken by another job" in error["message"]


def test_results_of_a_job_deleted_while_they_are_read_are_404(tmp_path):
    from densecnn_app.jobs.runner import JobRunner

    settings = job_settings(tmp_path)
    tiff = io.BytesIO()
    tifffile.imwrite(tiff, blobs(64, 64), tile=(32, 32))
    with serving(settings) as client:
        created = client.post("/v1/jobs", params={"model": "cells", "chunk": 32}, content=tiff.getvalue(),
                              headers={"content-type": "image/tiff"})  # fmt: skip
        job = wait_for(client, created.headers["location"])
        assert job["state"] == "succeeded", job
        runner: JobRunner = client.app.state.jobs
        (runner.directory(job["id"]) / "labels.tif").unlink(
            missing_ok=True
        )  # so result.tif is made from the PNG again
        real_get = runner.store.get
        calls = {"n": 0, "delete_at": 1}

        def get_then_deleted(job_id, *args):  # the route finds the job, then the DELETE removes it
            calls["n"] += 1
            if calls["n"] == calls["delete_at"]:
                shutil.rmtree(runner.directory(job_id))
            found = real_get(job_id, *args)
            return found if calls["n"] <= calls["delete_at"] else None

        # the last lookup before the route reads the files: result.tif and .geojson look the job up twice
        for route, delete_at in (("result.tif", 2), ("result.png", 1), ("result.geojson", 2),
                                 ("result.zarr/zarr.json", 1)):  # fmt: skip
            shutil.copytree(runner.directory(job["id"]), tmp_path / "kept", dirs_exist_ok=True)
            calls.update(n=0, delete_at=delete_at)
            runner.store.get = get_then_deleted
            try:
                response = client.get(f"/v1/jobs/{job['id']}/{route}")
            finally:
                runner.store.get = real_get
                shutil.copytree(tmp_path / "kept", runner.directory(job["id"]), dirs_exist_ok=True)
            error_of(response, 404, "unknown_job")


def test_a_job_that_runs_out_of_disk_says_what_the_client_can_do(tmp_path, monkeypatch):
    import densecnn.blockwise

    def full(*args, **kwargs):
        raise PredictInputError(
            "/x/labels.zarr: cannot be written (No space left on device); free space on its disk or choose "
            "another output, then run again to resume"
        )

    monkeypatch.setattr(densecnn.blockwise, "predict_to_disk", full)
    settings = job_settings(tmp_path)
    with serving(settings) as client:
        created = client.post(
            "/v1/jobs", params={"model": "cells"}, files={"image": ("a.png", encode(blobs()))}
        )
        job = wait_for(client, created.headers["location"])
    assert job["state"] == "failed", job
    assert "ran out of disk space" in job["error"] and "submit the job again later" in job["error"]
    assert "operator" in job["error"] and "choose another output" not in job["error"]
    assert "resume" not in job["error"] and "\n" not in job["error"]


def test_malformed_job_requests_get_clear_messages(tmp_path):
    (tmp_path / "data" / "a.tif").parent.mkdir(parents=True, exist_ok=True)
    settings = job_settings(tmp_path)
    json_type = {"Content-Type": "application/json"}
    with serving(settings) as client:
        bad = error_of(client.post("/v1/jobs", content=b'{"model": "cells", input: "a.tif"}', headers=json_type),
                       422, "invalid_request")  # fmt: skip
        assert (
            bad["message"].startswith("the body is not valid JSON (")
            and "send a JSON object" in bad["message"]
        )
        array = error_of(client.post("/v1/jobs", content=b'[{"model": "cells"}]', headers=json_type),
                         422, "invalid_request")  # fmt: skip
        assert array["message"].startswith("the body is a JSON array, not an object")
        neither = error_of(client.post("/v1/jobs", json={"model": "cells"}), 422, "invalid_request")
        assert neither["message"].startswith("name the input")
        for media in ("application/vnd.api+json", "application/merge-patch+json; charset=utf-8"):
            other = client.post(
                "/v1/jobs", content=b'{"model": "cells", "input": ""}', headers={"Content-Type": media}
            )
            empty = error_of(other, 422, "invalid_request")
            assert empty["message"].startswith("'input' is empty; give the path"), empty
        empty = error_of(
            client.post("/v1/jobs", json={"model": "cells", "input": " "}), 422, "invalid_request"
        )
        assert "is a directory" not in empty["message"]


def test_serve_refuses_a_data_directory_it_cannot_write_in_one_line(tmp_path, monkeypatch):
    import densecnn_app.privacy

    from densecnn.commands import serve
    from tests.service.test_service_keys import _serve_args

    settings = job_settings(tmp_path)
    (tmp_path / "ro").mkdir()
    monkeypatch.setenv("DENSECNN_DATA_DIR", str(tmp_path / "ro"))

    def read_only(path):
        raise OSError(errno.EROFS, "Read-only file system", str(path))

    monkeypatch.setattr(densecnn_app.privacy, "private_directory", read_only)
    with pytest.raises(InvalidInputError) as raised:
        serve.run(_serve_args("127.0.0.1", settings.model_dir))
    message = str(raised.value)
    assert message.startswith(f"invalid service settings: data_dir: {tmp_path / 'ro'}: cannot be written")
    assert "set DENSECNN_DATA_DIR to a writable directory" in message and "\n" not in message
