"""Security of the service: API keys (hashed, one owner's jobs invisible to another), rate limits, server-side paths
confined to the data roots, CORS, request ids, and `densecnn serve` refusing to listen beyond the machine without
keys."""

from __future__ import annotations

import argparse
import os
import re
import sqlite3
import time
from pathlib import Path

import pytest

pytest.importorskip("sqlalchemy")
pytest.importorskip("distributed")
pytest.importorskip("zarr")

from densecnn_app.jobs.db import make_engine  # noqa: E402
from densecnn_app.keys import KeyStore, digest  # noqa: E402

from densecnn.cli import main as cli  # noqa: E402
from densecnn.errors import InvalidInputError  # noqa: E402
from tests.jobs_support import job_settings, serving, wait_for, write_zarr  # noqa: E402
from tests.service.test_service_jobs import error_of  # noqa: E402

pytestmark = pytest.mark.xdist_group("jobs")


def keys_for(settings, *names: str) -> dict[str, dict[str, str]]:
    """Authorization headers of new keys called ``names``, in the settings' database."""
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    engine = make_engine(settings.database)
    store = KeyStore(engine)
    headers = {name: {"Authorization": f"Bearer {store.add(name)}"} for name in names}
    engine.dispose()
    return headers


def test_two_keys_cannot_see_each_others_jobs(tmp_path):
    write_zarr(tmp_path / "data" / "blobs.zarr", 32, 32)
    settings = job_settings(tmp_path, require_keys=True)
    keys = keys_for(settings, "alice", "bob")
    with serving(settings) as client:
        missing = client.get("/v1/jobs")
        error_of(missing, 401, "missing_key")
        assert missing.headers["www-authenticate"].startswith("Bearer")
        error_of(client.get("/v1/models"), 401, "missing_key")  # every /v1 endpoint, not only jobs
        error_of(client.get("/v1/jobs", headers={"Authorization": "Bearer dcnn_wrong"}), 401, "invalid_key")
        error_of(client.get("/v1/jobs", headers={"Authorization": "Basic abc"}), 401, "invalid_authorization")
        assert client.get("/healthz").status_code == 200  # probes and the page need no key

        response = client.post(
            "/v1/jobs", json={"model": "cells", "input": "blobs.zarr"}, headers=keys["alice"]
        )
        assert response.status_code == 202, response.text
        location = response.headers["location"]
        job = wait_for(client, location, headers=keys["alice"])
        assert job["state"] == "succeeded"
        for request in (client.get, client.delete):
            error_of(request(location, headers=keys["bob"]), 404, "unknown_job")
        error_of(client.get(f"{location}/result.png", headers=keys["bob"]), 404, "unknown_job")
        error_of(client.get(f"{location}/result.zarr/zarr.json", headers=keys["bob"]), 404, "unknown_job")
        assert client.get("/v1/jobs", headers=keys["bob"]).json()["jobs"] == []
        assert [j["id"] for j in client.get("/v1/jobs", headers=keys["alice"]).json()["jobs"]] == [job["id"]]
        assert client.get(f"{location}/result.png", headers=keys["alice"]).status_code == 200


def test_keys_are_stored_hashed_and_made_by_the_cli(tmp_path, monkeypatch, capsys):
    settings = job_settings(tmp_path)
    monkeypatch.setenv("DENSECNN_DATA_DIR", str(settings.data_dir))
    assert cli(["keys", "add", "carol"]) == 0
    secret = capsys.readouterr().out.strip()
    assert secret.startswith("dcnn_")
    assert cli(["keys", "add", "carol"]) == 2  # a second key of that name is refused, saying why
    assert "exists" in capsys.readouterr().err
    assert cli(["keys", "list"]) == 0 and capsys.readouterr().out.split() == ["carol"]
    with sqlite3.connect(settings.data_dir / "jobs.db") as database:
        rows = database.execute("SELECT * FROM api_keys").fetchall()
    assert len(rows) == 1 and digest(secret) in rows[0] and not any(secret in str(value) for value in rows[0])
    with serving(job_settings(tmp_path, require_keys=True)) as client:
        assert client.get("/v1/jobs", headers={"Authorization": f"Bearer {secret}"}).status_code == 200
        assert cli(["keys", "remove", "carol"]) == 0
        error_of(client.get("/v1/jobs", headers={"Authorization": f"Bearer {secret}"}), 401, "invalid_key")


def test_a_key_over_its_request_rate_gets_429_with_retry_after(tmp_path):
    settings = job_settings(tmp_path, requests_per_minute=3)
    keys = keys_for(settings, "dave")
    with serving(settings) as client:
        for _ in range(3):
            assert client.get("/v1/jobs", headers=keys["dave"]).status_code == 200
        refused = client.get("/v1/jobs", headers=keys["dave"])
        error_of(refused, 429, "rate_limited")
        assert 1 <= int(refused.headers["retry-after"]) <= 20


def test_server_side_paths_stay_inside_the_data_roots(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    write_zarr(outside / "secret.zarr", 32, 32)
    write_zarr(tmp_path / "data" / "ok.zarr", 32, 32)
    (tmp_path / "data" / "link.zarr").symlink_to(outside / "secret.zarr")
    (tmp_path / "data" / "door").symlink_to(outside)
    settings = job_settings(tmp_path)
    with serving(settings) as client:

        def post(path: str):
            return client.post("/v1/jobs", json={"model": "cells", "input": path})

        error_of(post("../outside/secret.zarr"), 400, "path_traversal")
        error_of(post("ok.zarr/../../outside/secret.zarr"), 400, "path_traversal")
        error_of(post(str(outside / "secret.zarr")), 403, "path_outside_roots")
        error_of(post("link.zarr"), 403, "path_outside_roots")
        error_of(post("door/secret.zarr"), 403, "path_outside_roots")
        error_of(post("/etc/passwd"), 403, "path_outside_roots")
        inside = post(str(tmp_path / "data" / "ok.zarr"))  # absolute, inside a root
        assert inside.status_code == 202, inside.text
        wait_for(client, inside.headers["location"])
        assert client.get("/v1/jobs").json()["jobs"][0]["input"] == str(tmp_path / "data" / "ok.zarr")


def test_request_ids_and_cors(tmp_path):
    settings = job_settings(tmp_path, cors_origins=["https://lab.example"])
    with serving(settings) as client:
        ok = client.get("/healthz")
        assert len(ok.headers["x-request-id"]) == 32
        assert (
            client.get("/healthz", headers={"X-Request-ID": "trace-42"}).headers["x-request-id"] == "trace-42"
        )
        odd = client.get("/healthz", headers={"X-Request-ID": "no spaces\tplease"}).headers["x-request-id"]
        assert odd != "no spaces\tplease" and len(odd) == 32
        missing = client.get("/nowhere", headers={"X-Request-ID": "trace-43"})
        assert error_of(missing, 404, "not_found")["request_id"] == "trace-43"
        too_big = client.post("/v1/models/cells/segment", content=b"x" * (settings.max_upload_bytes + 1),
                              headers={"content-type": "image/png"})  # fmt: skip
        error_of(too_big, 413, "payload_too_large")
        preflight = client.options("/v1/jobs", headers={"Origin": "https://lab.example",
                                                        "Access-Control-Request-Method": "POST",
                                                        "Access-Control-Request-Headers": "authorization"})  # fmt: skip
        assert preflight.headers["access-control-allow-origin"] == "https://lab.example"
        other = client.get("/healthz", headers={"Origin": "https://evil.example"})
        assert "access-control-allow-origin" not in other.headers


def test_a_refused_cors_preflight_answers_in_the_error_shape(tmp_path):
    with serving(job_settings(tmp_path, cors_origins=["https://lab.example"])) as client:
        asking = {"Access-Control-Request-Method": "POST"}
        evil = client.options("/v1/jobs", headers={"Origin": "https://evil.example", **asking})
        message = error_of(evil, 400, "cors_origin_not_allowed")["message"]
        assert "'https://evil.example'" in message and "cors_origins" in message
        assert "access-control-allow-origin" not in evil.headers
        odd = client.options("/v1/jobs", headers={"Origin": "https://lab.example", **asking,
                                                  "Access-Control-Request-Headers": "x-secret"})  # fmt: skip
        assert "header" in error_of(odd, 400, "cors_request_not_allowed")["message"]
        assert odd.headers["access-control-allow-origin"] == "https://lab.example"


def _serve_args(host: str, model_dir) -> argparse.Namespace:
    return argparse.Namespace(host=host, port=0, model_dir=str(model_dir), workers=1)


def test_serve_refuses_to_listen_beyond_the_machine_without_keys(tmp_path, monkeypatch):
    from densecnn.commands import serve

    settings = job_settings(tmp_path)
    for name in ("DENSECNN_REQUIRE_KEYS", "DENSECNN_MODEL_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DENSECNN_DATA_DIR", str(settings.data_dir))
    environment = dict(os.environ)
    with pytest.raises(InvalidInputError, match="densecnn keys add NAME"):
        serve.run(_serve_args("0.0.0.0", settings.model_dir))
    assert dict(os.environ) == environment  # the settings went to the app as an object


def test_workers_read_the_settings_serve_checked_from_the_files_it_hands_uvicorn(tmp_path, monkeypatch):
    from densecnn_app.worker_settings import read_worker_settings, write_worker_environment
    from dotenv import dotenv_values

    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    settings = job_settings(tmp_path, torch_threads=3, require_keys=True, database_url="sqlite:///wörk €.db")
    (tmp_path / "serve").mkdir()
    environment = dotenv_values(write_worker_environment(settings, tmp_path / "serve"))  # as uvicorn loads it
    assert Path(environment["PROMETHEUS_MULTIPROC_DIR"]).is_dir()
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    assert read_worker_settings() == settings


def test_a_data_root_that_is_not_a_directory_stops_the_start(tmp_path):
    with pytest.raises(ValueError, match="not a directory; DENSECNN_DATA_ROOTS"):
        job_settings(tmp_path, data_roots=[tmp_path / "nowhere"])


def test_a_zarr_client_reads_the_labels_over_http_with_its_key(tmp_path):
    """A real server (`densecnn serve`): zarr opens a job's result store by URL, the key in fsspec's headers."""
    import json

    import httpx
    import numpy as np
    import zarr

    aiohttp = pytest.importorskip("aiohttp")  # fsspec's HTTP file system
    from tests.app_support import Server
    from tests.jobs_support import reference_labels

    pixels = write_zarr(tmp_path / "data" / "blobs.zarr", 64, 96)
    settings = job_settings(tmp_path)
    key = keys_for(settings, "erin")["erin"]
    server = Server(settings.model_dir, tmp_path / "server.log", data_dir=settings.data_dir, require_keys="true",
                    data_roots=json.dumps([str(tmp_path / "data")]))  # fmt: skip
    try:
        response = httpx.post(f"{server.url}/v1/jobs", json={"model": "cells", "input": "blobs.zarr", "chunk": 32},
                              headers=key)  # fmt: skip
        location = f"{server.url}{response.headers['location']}"
        while httpx.get(location, headers=key).json()["state"] in ("queued", "running"):
            time.sleep(0.1)
        url = f"{location}/result.zarr"
        with pytest.raises(aiohttp.ClientResponseError, match="401"):  # without the key
            zarr.open_array(url, mode="r")[...]
        labels = zarr.open_array(url, mode="r", storage_options={"headers": key})[...]
    finally:
        server.stop()
    np.testing.assert_array_equal(labels, reference_labels(settings.model_dir / "cells", pixels))


def test_serve_says_when_its_data_directory_cannot_be_made(tmp_path, monkeypatch):
    from densecnn.commands import serve

    settings = job_settings(tmp_path)
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("DENSECNN_DATA_DIR", str(tmp_path / "a-file" / "data"))
    with pytest.raises(InvalidInputError, match="cannot be created.*set DENSECNN_DATA_DIR to a writable"):
        serve.run(_serve_args("127.0.0.1", settings.model_dir))


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        (
            "DENSECNN_DATABASE_URL",
            "garbage",
            "database_url: 'garbage' is not a database URL SQLAlchemy reads",
        ),
        (
            "DENSECNN_DATABASE_URL",
            "mssql+pymssql://u@h/x",
            "database_url: the driver of mssql.pymssql is not installed",
        ),
        ("DENSECNN_WARM_SIZES", "garbage", "warm_sizes.*give lists and objects as JSON"),
        ("DENSECNN_MAX_UPLOAD_BYTES", "-5", "max_upload_bytes: Input should be greater than 0"),
    ],
)
@pytest.mark.parametrize("command", [["serve"], ["keys", "list"]])
def test_bad_settings_stop_serve_and_keys_in_one_line(
    tmp_path, monkeypatch, capsys, command, variable, value, message
):
    monkeypatch.setenv("DENSECNN_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("DENSECNN_MODEL_DIR", str(job_settings(tmp_path).model_dir))
    monkeypatch.setenv(variable, value)
    assert cli(command) == 2
    err = capsys.readouterr().err
    assert f"densecnn {command[0]}: error: invalid service settings:" in err and "Traceback" not in err
    assert re.search(message, err), err


def test_a_data_directory_that_is_a_file_and_a_port_out_of_range_are_refused(tmp_path, monkeypatch, capsys):
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("DENSECNN_DATA_DIR", str(tmp_path / "file"))
    monkeypatch.setenv("DENSECNN_MODEL_DIR", str(job_settings(tmp_path).model_dir))
    assert cli(["keys", "list"]) == 2
    assert "cannot be created (File exists); set DENSECNN_DATA_DIR" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli(["serve", "--port", "99999"])
    assert "argument --port: '99999' is not a port number: give 0 to 65535" in capsys.readouterr().err
