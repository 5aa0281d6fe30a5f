"""The service attacked as a hostile client would: parameters that would take the server's memory, bombs through
every entry point, a quota raced and overrun, paths swapped and linked out of their root, jobs that should end,
keys reused, and the client mistakes that used to answer 500. Each case is one that got through before."""

from __future__ import annotations

import io
import json
import os
import stat
import struct
import threading
import time
import zlib

import numpy as np
import pytest
import tifffile
from PIL import Image

pytest.importorskip("sqlalchemy")
pytest.importorskip("distributed")
zarr = pytest.importorskip("zarr")

from tests.app_support import blobs, encode  # noqa: E402
from tests.jobs_support import job_settings, serving, wait_for, write_zarr  # noqa: E402
from tests.service.test_service_jobs import error_of  # noqa: E402
from tests.service.test_service_keys import keys_for  # noqa: E402
from tests.service.test_service_uploads import TUS, create, patch  # noqa: E402

pytestmark = pytest.mark.xdist_group("jobs")  # Dask clusters: one test at a time

HUGE = 2**63  # past SQLite's integers


# --- 1. parameters bounded where they enter ---


@pytest.mark.parametrize("chunk", [100_000, 1, 15, True, HUGE, "64", 64.0])
def test_a_chunk_out_of_its_range_or_not_an_integer_is_refused_before_the_job(tmp_path, chunk):
    write_zarr(tmp_path / "data" / "blobs.zarr", 32, 32)
    with serving(job_settings(tmp_path)) as client:
        refused = client.post("/v1/jobs", json={"model": "cells", "input": "blobs.zarr", "chunk": chunk})
        error_of(refused, 422, "invalid_request")
        assert "chunk" in refused.json()["error"]["message"]
        for level in (HUGE, -1, True):
            error_of(client.post("/v1/jobs", json={"model": "cells", "input": "blobs.zarr", "level": level}), 422,
                     "invalid_request")  # fmt: skip
        for query in ({"chunk": "true"}, {"chunk": str(HUGE)}, {"level": str(HUGE)}, {"chunk": "1"}):
            error_of(client.post("/v1/jobs", params={"model": "cells", **query}, content=encode(blobs(16, 16)),
                                 headers={"content-type": "image/png"}), 422, "invalid_request")  # fmt: skip
        assert client.get("/v1/jobs").json()["jobs"] == []


def test_the_api_schema_states_the_ranges(tmp_path):
    with serving(job_settings(tmp_path)) as client:
        schema = client.get("/openapi.json").json()
    post = schema["paths"]["/v1/jobs"]["post"]
    chunk = post["requestBody"]["content"]["application/json"]["schema"]["properties"]["chunk"]["anyOf"][0]
    assert (chunk["minimum"], chunk["maximum"]) == (16, 16384)
    query = {p["name"]: p["schema"] for p in post["parameters"]}
    assert query["chunk"]["anyOf"][0]["maximum"] == 16384 and query["level"]["anyOf"][0]["maximum"] == 64


def test_a_chunk_whose_memory_passes_the_plan_is_refused_and_a_default_one_is_made_to_fit(tmp_path):
    from densecnn_app.jobs.admission import chunk_memory
    from densecnn_app.registry import ServedModel

    import densecnn
    from densecnn.io import open_lazy_array

    write_zarr(tmp_path / "data" / "blobs.zarr", 96, 96, chunks=96)
    loaded = densecnn.load(job_settings(tmp_path).model_dir / "cells")
    served = ServedModel("cells", loaded, loaded.dense())
    source = open_lazy_array(tmp_path / "data" / "blobs.zarr", spatial_dims=2)
    budget = 2 * chunk_memory(32, source, served) + 1000  # a chunk of 32 fits, one of 64 does not
    settings = job_settings(tmp_path, max_job_memory=budget)
    with serving(settings) as client:
        refused = client.post("/v1/jobs", json={"model": "cells", "input": "blobs.zarr", "chunk": 64})
        assert "use at most 32" in error_of(refused, 422, "chunk_too_large")["message"]
        # the input's own chunks (96) would not fit either: the plan asks the engine for a smaller chunk
        job = wait_for(client, client.post("/v1/jobs", json={"model": "cells", "input": "blobs.zarr"}).headers[
            "location"])  # fmt: skip
        assert job["state"] == "succeeded", job
        stored = zarr.open_array(str(settings.data_dir / "jobs" / job["id"] / "labels.zarr"), mode="r")
        assert stored.chunks == (32, 32)


# --- 2. one admission for every way an image enters ---


def _tile_bomb() -> bytes:
    """A 16x16 image stored in one 512x512 zlib tile: small on the wire, a whole tile decoded."""
    out = io.BytesIO()
    tifffile.imwrite(out, np.zeros((16, 16), np.uint8), tile=(512, 512), compression="zlib")
    return out.getvalue()


def _pixel_bomb() -> bytes:
    """A PNG whose header declares 40000 x 40000 pixels (its data is a few bytes)."""
    png = bytearray(encode(blobs(16, 16)))
    header = struct.pack(">II", 40_000, 40_000) + bytes(png[24:29])
    png[16:29] = header
    png[29:33] = struct.pack(">I", zlib.crc32(b"IHDR" + header))
    return bytes(png)


def _enter(client, tmp_path, how: str, data: bytes, name: str):
    if how == "segment":
        return client.post("/v1/models/cells/segment", files={"image": (name, data)})
    if how == "job upload":
        return client.post("/v1/jobs", params={"model": "cells"}, files={"image": (name, data)})
    if how == "resumable upload":
        location = create(client, len(data), name).headers["location"]
        assert patch(client, location, 0, data).status_code == 204
        return client.post("/v1/jobs", json={"model": "cells", "upload": location.rsplit("/", 1)[1]})
    (tmp_path / "data" / name).write_bytes(data)
    return client.post("/v1/jobs", json={"model": "cells", "input": name})


@pytest.mark.parametrize("how", ["segment", "job upload", "resumable upload", "server path"])
def test_every_entry_point_refuses_tile_and_pixel_bombs_from_their_headers(tmp_path, how):
    settings = job_settings(tmp_path, max_decode_bytes=100_000, max_image_pixels=1_000_000)
    with serving(settings) as client:
        error_of(_enter(client, tmp_path, how, _tile_bomb(), "bomb.tif"), 413, "image_too_large")
        error_of(_enter(client, tmp_path, how, _pixel_bomb(), "bomb.png"), 413, "image_too_large")
        assert client.get("/v1/jobs").json()["jobs"] == []


def test_a_zarr_store_of_one_huge_chunk_is_refused_like_a_tile_bomb(tmp_path):
    zarr.create_array(store=str(tmp_path / "data" / "one.zarr"), shape=(3, 64, 64), dtype="uint8",
                      chunks=(3, 4096, 4096))  # fmt: skip
    with serving(job_settings(tmp_path, max_decode_bytes=1_000_000)) as client:
        refused = client.post("/v1/jobs", json={"model": "cells", "input": "one.zarr"})
        assert "3x4096x4096" in error_of(refused, 413, "image_too_large")["message"]


# --- 3. a quota that holds ---


def test_upload_bytes_are_reserved_as_they_arrive_so_empty_uploads_hold_no_quota(tmp_path):
    with serving(job_settings(tmp_path, disk_quota_bytes=8_000_000)) as client:
        error_of(create(client, 9_000_000), 507, "quota_exceeded")  # more than the quota can ever hold
        first, second = (create(client, 6_000_000) for _ in range(2))  # nothing sent: nothing held
        assert first.status_code == second.status_code == 201, second.text
        assert patch(client, first.headers["location"], 0, b"\0" * 6_000_000).status_code == 204
        error_of(patch(client, second.headers["location"], 0, b"\0" * 6_000_000), 507, "quota_exceeded")
        held = int(client.head(second.headers["location"], headers=TUS).headers["upload-offset"])
        assert held < 2_000_000  # what fitted before the quota ran out is kept
        assert client.delete(first.headers["location"], headers=TUS).status_code == 204
        rest = patch(client, second.headers["location"], held, b"\0" * (6_000_000 - held))
        assert rest.status_code == 204  # deleting gave the room back: the upload resumes


def test_one_key_cannot_take_the_quota_with_unfinished_uploads(tmp_path):
    with serving(job_settings(tmp_path, max_uploads_per_key=2)) as client:
        assert [create(client, 4_000_000).status_code for _ in range(2)] == [201, 201]
        error_of(create(client, 4_000_000), 429, "too_many_uploads")


def test_simultaneous_upload_creations_cannot_pass_the_limit_together(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    settings = job_settings(tmp_path, require_keys=True, max_uploads_per_key=2, requests_per_minute=10_000)
    key = keys_for(settings, "alice")["alice"]
    with serving(settings) as client:
        with ThreadPoolExecutor(16) as pool:
            created = list(pool.map(lambda _: create(client, 1000, **key), range(16)))
        statuses = sorted(response.status_code for response in created)
        assert statuses == [201] * 2 + [429] * 14, statuses
        assert len([d for d in (tmp_path / "service" / "jobs" / "uploads").iterdir() if d.is_dir()]) == 2


def test_bytes_of_unknown_length_are_reserved_as_they_arrive(tmp_path):
    """A growing reservation takes a step at a time, within the quota and the upload's limit, and just what is
    needed when a whole step does not fit."""
    from densecnn_app.jobs.quota import GROWTH_STEP, GrowingReservation, QuotaExceeded

    with serving(job_settings(tmp_path, disk_quota_bytes=GROWTH_STEP + 8192)) as client:
        quota = client.app.state.jobs.quota
        quota.reserve("job-a", 0)
        reservation = GrowingReservation(quota, "job-a", limit=4 << 30)
        reservation.cover(4096)
        assert quota.reserved("job-a") == GROWTH_STEP  # one step ahead, not the limit (4 GiB)
        reservation.cover(GROWTH_STEP + 4096)  # a second step does not fit: just what is needed
        assert quota.reserved("job-a") == GROWTH_STEP + 4096
        with pytest.raises(QuotaExceeded):
            reservation.cover(GROWTH_STEP + 3 * 4096)
        quota.reserve("job-b", 0)
        small = GrowingReservation(quota, "job-b", limit=4096)
        small.cover(10)
        assert quota.reserved("job-b") == 4096  # never past its limit


def test_a_job_upload_over_the_quota_is_refused_before_its_body_is_read(tmp_path):
    settings = job_settings(tmp_path, disk_quota_bytes=100_000)
    received = []

    def body():
        for _ in range(50):
            received.append(1)
            yield b"\0" * 100_000

    with serving(settings) as client:
        length = {"content-length": str(5_000_000), "content-type": "image/tiff"}
        error_of(client.post("/v1/jobs", params={"model": "cells"}, content=body(), headers=length), 507,
                 "quota_exceeded")  # fmt: skip
        assert len(received) <= 1  # the answer came from the declared length, not after the body
        # without a length, the stream is cut at the room left
        error_of(client.post("/v1/jobs", params={"model": "cells"}, content=body(),
                             headers={"content-type": "image/tiff"}), 507, "quota_exceeded")  # fmt: skip
    assert not [p for p in (settings.data_dir / "jobs").iterdir() if p.name != "uploads"]


def test_a_job_uploads_reservation_is_the_disk_its_input_takes(tmp_path):
    from densecnn_app.jobs.quota import disk_usage

    settings = job_settings(tmp_path)
    with serving(settings) as client:
        client.app.state.jobs.submit = lambda job_id: None  # it stays queued: its reservation is the input's
        tiff = io.BytesIO()
        tifffile.imwrite(tiff, blobs(64, 64))
        response = client.post("/v1/jobs", params={"model": "cells"}, content=tiff.getvalue(),
                               headers={"content-type": "image/tiff"})  # fmt: skip
        assert response.status_code == 202, response.text
        job_id = response.json()["id"]
        taken = disk_usage(settings.data_dir / "jobs" / job_id / "input.tif")
        assert taken > 0 and client.app.state.jobs.quota.used() >= taken


def test_finished_jobs_count_their_disk_blocks(tmp_path):
    from densecnn_app.jobs.db import make_engine
    from densecnn_app.jobs.quota import Quota, disk_usage

    write_zarr(tmp_path / "data" / "blobs.zarr", 64, 64)
    settings = job_settings(tmp_path)
    with serving(settings) as client:
        job = wait_for(client, client.post("/v1/jobs", json={"model": "cells", "input": "blobs.zarr",
                                                            "chunk": 16}).headers["location"])  # fmt: skip
        assert job["state"] == "succeeded"
    used = Quota(make_engine(settings.database), settings.disk_quota_bytes).used()
    blocks = disk_usage(settings.data_dir / "jobs" / job["id"])
    files = sum(p.stat().st_size for p in (settings.data_dir / "jobs" / job["id"]).rglob("*") if p.is_file())
    assert used == blocks > files  # 16 chunks of a few bytes each take a block each


def test_simultaneous_jobs_of_one_key_pass_its_limit_never(tmp_path):
    write_zarr(tmp_path / "data" / "blobs.zarr", 32, 32)
    settings = job_settings(tmp_path, max_jobs_per_key=4, max_running_jobs=1)
    with serving(settings) as client:
        client.app.state.jobs.submit = lambda job_id: None  # they stay queued
        start = threading.Barrier(14)
        statuses = []

        def post():
            start.wait()
            statuses.append(
                client.post("/v1/jobs", json={"model": "cells", "input": "blobs.zarr"}).status_code
            )

        threads = [threading.Thread(target=post) for _ in range(14)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert sorted(statuses) == [202] * 4 + [429] * 10
        assert len(client.get("/v1/jobs").json()["jobs"]) == 4


# --- 4. paths that stay inside ---


def test_a_path_swapped_for_a_symlink_after_submission_is_not_followed_out(tmp_path):
    from densecnn_app.jobs.db import JobRecord, make_engine
    from densecnn_app.jobs.store import JobStore

    outside = tmp_path / "outside"
    outside.mkdir()
    write_zarr(outside / "secret.zarr", 32, 32)
    settings = job_settings(tmp_path)
    (tmp_path / "data" / "sub").symlink_to(outside)  # swapped in after a job on sub/secret.zarr was queued
    settings.data_dir.mkdir(parents=True)
    engine = make_engine(settings.database)
    JobStore(engine).add(JobRecord(
        id="5a1d", owner="", model="cells", input="", input_name="sub/secret.zarr", result="zarr", state="queued",
        created=time.time(),
    ), max_unfinished=4)  # fmt: skip
    engine.dispose()
    with serving(settings) as client:
        job = wait_for(client, "/v1/jobs/5a1d")
    assert job["state"] == "failed" and "outside the data roots" in job["error"], job
    assert str(tmp_path) not in job["error"]


@pytest.mark.parametrize("chunk", ["symlink out", "fifo", "device"])
def test_a_zarr_chunk_that_leads_out_or_never_ends_fails_the_job(tmp_path, chunk):
    write_zarr(tmp_path / "data" / "blobs.zarr", 32, 32, chunks=16)
    secret = tmp_path / "secret"
    write_zarr(secret, 32, 32, chunks=16)
    target = tmp_path / "data" / "blobs.zarr" / "c" / "0" / "1" / "1"
    target.unlink()
    if chunk == "symlink out":
        target.symlink_to(secret / "c" / "0" / "1" / "1")
    elif chunk == "fifo":
        os.mkfifo(target)
    else:
        target.symlink_to("/dev/zero")
    with serving(job_settings(tmp_path)) as client:
        response = client.post("/v1/jobs", json={"model": "cells", "input": "blobs.zarr", "chunk": 16})
        job = wait_for(client, response.headers["location"], timeout=60)
    assert job["state"] == "failed" and "refused" in job["error"], job


def test_inputs_that_are_not_regular_files_and_loops_are_client_errors(tmp_path):
    settings = job_settings(tmp_path)
    data = tmp_path / "data"
    os.mkfifo(data / "pipe.tif")
    (data / "loop").symlink_to(data / "loop")
    (data / "plain").mkdir()
    with serving(settings) as client:
        fifo = error_of(
            client.post("/v1/jobs", json={"model": "cells", "input": "pipe.tif"}), 400, "not_an_input"
        )
        assert "FIFO" in fifo["message"] and "is a directory" not in fifo["message"]
        error_of(client.post("/v1/jobs", json={"model": "cells", "input": "loop/x.tif"}), 400, "invalid_path")
        error_of(client.post("/v1/jobs", json={"model": "cells", "input": "plain"}), 400, "not_an_input")


def test_results_name_no_server_path(tmp_path):
    write_zarr(tmp_path / "data" / "blobs.zarr", 32, 32)
    settings = job_settings(tmp_path)
    with serving(settings) as client:
        job = wait_for(client, client.post("/v1/jobs", json={"model": "cells", "input": "blobs.zarr"}).headers[
            "location"])  # fmt: skip
        metadata = client.get(f"/v1/jobs/{job['id']}/result.zarr/zarr.json").text
    assert job["state"] == "succeeded"
    described = json.loads(metadata)["attributes"]["densecnn"]
    assert (described["model"], described["input"]) == ("cells", "blobs.zarr")
    assert str(tmp_path) not in metadata and str(settings.model_dir) not in metadata


# --- 5. jobs that always end, nothing left behind ---


def test_a_cancelled_job_writes_nothing_after_it_says_cancelled_and_its_delete_leaves_nothing(tmp_path):
    write_zarr(tmp_path / "data" / "big.zarr", 256, 256, chunks=16)
    settings = job_settings(tmp_path, job_block=128)  # tasks of 8 x 8 chunks: a cancel lands inside one
    with serving(settings) as client:
        response = client.post("/v1/jobs", json={"model": "cells", "input": "big.zarr", "chunk": 16})
        location, job_id = response.headers["location"], response.json()["id"]
        wait_for(client, location, until=lambda job: job["progress"]["blocks_done"] >= 1)
        client.delete(location)
        job = wait_for(client, location)
        store = settings.data_dir / "jobs" / job_id / "labels.zarr"
        written = sorted(store.rglob("c/*/*"))
        time.sleep(1.0)  # a block still in flight would write its next chunk meanwhile
        assert job["state"] == "cancelled" and sorted(store.rglob("c/*/*")) == written
        assert len(written) < 256
        assert client.delete(location).status_code == 204
        client.app.state.jobs.maintain()
        assert not (settings.data_dir / "jobs" / job_id).exists()
        assert client.app.state.jobs.quota.names() == set()


def test_an_outcome_the_database_cannot_take_is_shown_and_written_later(tmp_path, monkeypatch):
    from densecnn_app.jobs.store import JobStore
    from sqlalchemy.exc import OperationalError

    write_zarr(tmp_path / "data" / "blobs.zarr", 32, 32)
    full = threading.Event()
    full.set()
    real_set = JobStore.set

    def set_unless_full(self, job_id, **values):
        if full.is_set() and values.get("state") in ("succeeded", "failed", "cancelled"):
            raise OperationalError("UPDATE jobs", {}, Exception("database or disk is full"))
        return real_set(self, job_id, **values)

    monkeypatch.setattr(JobStore, "set", set_unless_full)
    settings = job_settings(tmp_path, job_poll_seconds=0.2)
    with serving(settings) as client:
        location = client.post("/v1/jobs", json={"model": "cells", "input": "blobs.zarr"}).headers["location"]
        assert (
            wait_for(client, location)["state"] == "succeeded"
        )  # from memory: the database still says running
        full.clear()
        deadline = time.monotonic() + 10
        while (
            JobStore(client.app.state.jobs.store.engine).get(location.rsplit("/", 1)[1]).state != "succeeded"
        ):
            assert time.monotonic() < deadline, "maintenance never wrote the outcome"
            time.sleep(0.1)


def test_a_full_database_answers_503_not_500(tmp_path, monkeypatch):
    from densecnn_app.jobs.store import JobStore
    from sqlalchemy.exc import OperationalError

    def full(*args, **kwargs):
        raise OperationalError("SELECT", {}, Exception("database or disk is full"))

    with serving(job_settings(tmp_path)) as client:
        monkeypatch.setattr(JobStore, "list", full)
        error_of(client.get("/v1/jobs"), 503, "storage_unavailable")


def test_orphans_and_idle_uploads_are_removed_by_maintenance(tmp_path):
    settings = job_settings(tmp_path, upload_idle_seconds=60)
    with serving(settings) as client:
        runner = client.app.state.jobs
        orphan = runner.root / "0rphan"  # a job upload killed mid-stream: no record
        orphan.mkdir()
        (orphan / "input.part").write_bytes(b"x" * 1000)
        fresh = runner.root / "fresh"  # a job upload still streaming
        fresh.mkdir()
        idle = create(client, 100).headers["location"].rsplit("/", 1)[1]
        active = create(client, 100).headers["location"].rsplit("/", 1)[1]
        long_ago = time.time() - 3600
        for path in (orphan, orphan / "input.part", *(runner.root / "uploads" / idle).rglob("*"),
                     runner.root / "uploads" / idle):  # fmt: skip
            os.utime(path, (long_ago, long_ago))
        os.utime(
            runner.root / "uploads" / active / "upload.json", (long_ago, long_ago)
        )  # old, but bytes came now
        runner.maintain()
        assert not orphan.exists() and fresh.exists()
        assert client.head(f"/v1/uploads/{idle}", headers=TUS).status_code == 404
        assert client.head(f"/v1/uploads/{active}", headers=TUS).status_code == 200
        assert runner.quota.names() == {f"upload-{active}"}


def test_bytes_for_an_upload_deleted_meanwhile_answer_404_and_maintenance_survives_vanishing_files(tmp_path):
    from densecnn_app.errors import ApiError
    from densecnn_app.jobs import upload_store

    with serving(job_settings(tmp_path)) as client:
        runner = client.app.state.jobs
        upload_id = create(client, 100).headers["location"].rsplit("/", 1)[1]
        upload_store.remove(runner.root, upload_id)  # deleted (or expired) while a PATCH streams
        with pytest.raises(ApiError) as refused:
            upload_store.append(runner.root, upload_id, 0, b"x")
        assert refused.value.status == 404
        assert not (runner.root / "uploads" / upload_id).exists()  # the write did not bring it back
        (runner.root / "uploads" / "half").mkdir()  # an upload killed while it was created
        assert upload_store.remove_idle(runner.root, active_before=time.time() + 1) == ["half"]


def test_a_patch_that_finds_the_disk_full_answers_507_and_keeps_the_offset(tmp_path, monkeypatch):
    import errno

    from densecnn_app.jobs import upload_store

    with serving(job_settings(tmp_path)) as client:
        location = create(client, 10).headers["location"]
        assert patch(client, location, 0, b"abcd").status_code == 204

        def full(fd):
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(upload_store.os, "fsync", full)
        error_of(patch(client, location, 4, b"efgh"), 507, "disk_full")
        monkeypatch.undo()
        offset = int(client.head(location, headers=TUS).headers["upload-offset"])
        assert offset in (4, 8)  # what reached the file before the disk filled is what HEAD says


# --- 6. keys ---


def test_a_key_added_again_under_a_reused_name_sees_none_of_the_old_keys_jobs(tmp_path):
    from densecnn_app.jobs.db import make_engine
    from densecnn_app.keys import KeyStore

    write_zarr(tmp_path / "data" / "blobs.zarr", 32, 32)
    settings = job_settings(tmp_path, require_keys=True)
    old = keys_for(settings, "carol")["carol"]
    with serving(settings) as client:
        location = client.post("/v1/jobs", json={"model": "cells", "input": "blobs.zarr"}, headers=old).headers[
            "location"]  # fmt: skip
        wait_for(client, location, headers=old)
        store = KeyStore(make_engine(settings.database))
        assert store.remove("carol")
        new = {"Authorization": f"Bearer {store.add('carol')}"}
        assert client.get("/v1/jobs", headers=new).json()["jobs"] == []
        error_of(client.get(location, headers=new), 404, "unknown_job")
        error_of(client.get(f"{location}/result.png", headers=new), 404, "unknown_job")


def test_metrics_need_a_key_where_keys_are_required_and_failed_keys_are_rate_limited(tmp_path):
    settings = job_settings(tmp_path, require_keys=True, failed_auth_per_minute=5)
    key = keys_for(settings, "dave")["dave"]
    with serving(settings) as client:
        error_of(client.get("/metrics"), 401, "missing_key")
        assert client.get("/metrics", headers=key).status_code == 200
        for _ in range(4):
            error_of(
                client.get("/v1/jobs", headers={"Authorization": "Bearer dcnn_guess"}), 401, "invalid_key"
            )
        limited = client.get("/v1/jobs", headers={"Authorization": "Bearer dcnn_guess"})
        error_of(limited, 429, "too_many_failed_keys")
        assert int(limited.headers["retry-after"]) >= 1
    with serving(job_settings(tmp_path, require_keys=True, public_metrics=True)) as client:
        assert client.get("/metrics").status_code == 200


def test_the_data_directory_is_private(tmp_path):
    settings = job_settings(tmp_path)
    with serving(settings):
        pass
    assert stat.S_IMODE(settings.data_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE((settings.data_dir / "jobs.db").stat().st_mode) == 0o600


# --- 7. client mistakes answer 4xx, never 500 ---


@pytest.mark.parametrize("value", ["\u00b2", "\uff11\uff12", "1" * 5000, "-1", "0x10", "1e3", ""])
def test_upload_lengths_and_offsets_in_anything_but_ascii_digits_get_400(tmp_path, value):
    value = value.encode()  # as sent on the wire (UTF-8)
    with serving(job_settings(tmp_path)) as client:
        error_of(
            client.post("/v1/uploads", headers={**TUS, "Upload-Length": value}), 400, "invalid_upload_length"
        )
        location = create(client, 10).headers["location"]
        error_of(client.patch(location, content=b"x", headers={**TUS, "Upload-Offset": value,
                 "Content-Type": "application/offset+octet-stream"}), 400, "invalid_upload_offset")  # fmt: skip


def test_an_empty_png_names_the_upload_not_an_object(tmp_path):
    with serving(job_settings(tmp_path)) as client:
        for data in (b"\x89PNG\r\n\x1a\n", b"\x89PNG\r\n\x1a\n" + b"\0" * 8):
            for path, params in (("/v1/jobs", {"model": "cells"}), ("/v1/models/cells/segment", {})):
                response = client.post(path, params=params, files={"image": ("empty.png", data)})
                assert 400 <= response.status_code < 500, response.text
                assert " at 0x" not in response.json()["error"]["message"], response.text


def test_result_routes_answer_head_and_range_errors_in_the_json_shape(tmp_path):
    write_zarr(tmp_path / "data" / "blobs.zarr", 32, 32)
    with serving(job_settings(tmp_path)) as client:
        job = wait_for(client, client.post("/v1/jobs", json={"model": "cells", "input": "blobs.zarr"}).headers[
            "location"])  # fmt: skip
        base = f"/v1/jobs/{job['id']}"
        for route in ("result.png", "result.tif", "result.geojson", "result.zarr/zarr.json"):
            head, get = client.head(f"{base}/{route}"), client.get(f"{base}/{route}")
            assert head.status_code == 200 and head.content == b"", route
            for header in ("content-type", "content-length", "content-disposition", "accept-ranges"):
                assert head.headers.get(header) == get.headers.get(header), (route, header)
            assert int(get.headers.get("content-length", len(get.content))) == len(get.content), route
        error_of(client.get(f"{base}/result.png", headers={"Range": "bytes=abc"}), 400, "invalid_range")
        past = client.get(f"{base}/result.png", headers={"Range": "bytes=99999999-"})
        error_of(past, 416, "range_not_satisfiable")
        assert past.headers["content-range"].startswith("bytes */")
        error_of(
            client.get(f"{base}/result.png", headers={"Range": "bytes=-0"}), 416, "range_not_satisfiable"
        )
        assert client.get(f"{base}/result.png", headers={"Range": "bytes=0-3"}).content == b"\x89PNG"


def test_creating_an_upload_does_not_walk_the_jobs_directory(tmp_path, monkeypatch):
    with serving(job_settings(tmp_path)) as client:
        monkeypatch.setattr(os, "walk", lambda *a, **k: pytest.fail("walked the jobs' directory"))
        assert create(client, 100).status_code == 201


# --- 8. GeoJSON results ---


def test_a_jobs_labels_as_geojson_cover_each_class_region_by_region(tmp_path):
    from rasterio.features import rasterize
    from scipy import ndimage

    write_zarr(tmp_path / "data" / "blobs.zarr", 64, 64)
    with serving(job_settings(tmp_path)) as client:
        job = wait_for(client, client.post("/v1/jobs", json={"model": "cells", "input": "blobs.zarr"}).headers[
            "location"])  # fmt: skip
        labels = np.asarray(Image.open(io.BytesIO(client.get(job["results"]["png"]).content)))
        response = client.get(f"/v1/jobs/{job['id']}/result.geojson")
    assert response.headers["content-type"].startswith("application/geo+json")
    features = response.json()["features"]
    names, colours = ["background", "dim", "bright"], [[0, 0, 0], [40, 120, 255], [255, 200, 0]]
    assert {f["properties"]["classification"]["name"] for f in features} <= {"dim", "bright"}
    for class_id in (1, 2):
        mine = [f for f in features if f["properties"]["classification"]["name"] == names[class_id]]
        _, regions = ndimage.label(labels == class_id)  # 4-connected, independently of the tracing
        assert len(mine) == regions
        if regions:
            covered = rasterize([f["geometry"] for f in mine], out_shape=labels.shape)
            np.testing.assert_array_equal(covered.astype(bool), labels == class_id)
            assert mine[0]["properties"]["classification"]["color"] == colours[class_id]


def test_result_images_take_the_models_classes_not_the_labels_largest(tmp_path):
    zarr.create_array(store=str(tmp_path / "data" / "dark.zarr"), data=np.zeros((3, 32, 32), np.uint8),
                      chunks=(3, 32, 32))  # fmt: skip  # all background: labels.max() is 0
    with serving(job_settings(tmp_path)) as client:
        job = wait_for(client, client.post("/v1/jobs", json={"model": "cells", "input": "dark.zarr"}).headers[
            "location"])  # fmt: skip
        png = Image.open(io.BytesIO(client.get(job["results"]["png"]).content))
        assert png.getpalette()[:9] == [0, 0, 0, 40, 120, 255, 255, 200, 0]
        tiff = tifffile.imread(io.BytesIO(client.get(job["results"]["tiff"]).content))
        assert tiff.dtype == np.uint8 and not tiff.any()
