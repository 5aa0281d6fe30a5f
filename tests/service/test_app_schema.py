"""schemathesis against the app's own OpenAPI spec: generated requests never get a 5xx other than 503, and every
answer matches what the spec declares for it (status code, content type, JSON body)."""

from __future__ import annotations

import pytest
from densecnn_app import Settings, create_app
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings

from tests.app_support import save_brightness_model, wait_ready

schemathesis = pytest.importorskip("schemathesis")

# resumable uploads' bytes (tus PATCH bodies) are generated as any binary body is
schemathesis.serializer.alias("application/offset+octet-stream", "application/octet-stream")

CHECKS = [
    schemathesis.checks.not_a_server_error,
    schemathesis.checks.status_code_conformance,
    schemathesis.checks.content_type_conformance,
    schemathesis.checks.response_schema_conformance,
]


def without_lifespan(app):
    """``app`` for schemathesis' per-call test clients: the lifespan events are acknowledged, not run again."""

    async def wrapper(scope, receive, send):
        if scope["type"] != "lifespan":
            await app(scope, receive, send)
            return
        while True:
            message = await receive()
            await send({"type": message["type"] + ".complete"})
            if message["type"] == "lifespan.shutdown":
                return

    return wrapper


@pytest.fixture(scope="module")
def api_schema(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    save_brightness_model(root, "cells")
    app = create_app(
        Settings(
            model_dir=root, default_model="cells", torch_threads=1, backend="native", max_upload_bytes=100_000
        )
    )
    with TestClient(app) as client:  # one lifespan for all cases: models loaded once
        wait_ready(client.get)
        yield schemathesis.openapi.from_asgi("/openapi.json", without_lifespan(app))


def test_api_conforms_to_its_schema(api_schema):
    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert {"POST /v1/models/{name}/segment", "GET /v1/models/{name}"} <= {op.label for op in operations}
    seen, calls = set(), []
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck), database=None,
                  derandomize=True)  # fmt: skip
        def check(case):
            calls.append(case)
            if case.path_parameters and len(calls) % 2:
                case.path_parameters["name"] = "cells"  # half the cases reach a real model, half get 404
            response = case.call()
            seen.add((case.operation.label, response.status_code))
            if response.status_code == 503:  # load answers are allowed; a 500 never is
                assert "retry-after" in {key.lower() for key in response.headers}
                return
            case.validate_response(response, checks=CHECKS)

        check()
    segment = {status for label, status in seen if label == "POST /v1/models/{name}/segment"}
    assert 404 in segment and segment - {404}, (
        seen
    )  # both the unknown-model and the real-model paths were exercised


def test_every_operation_has_its_own_id_and_head_still_answers(tmp_path):
    save_brightness_model(tmp_path, "cells")
    app = create_app(Settings(model_dir=tmp_path, torch_threads=1, backend="native", warm_sizes=[]))
    with TestClient(app) as client:
        wait_ready(client.get)
        spec = client.get("/openapi.json").json()
        ids = [
            op["operationId"]
            for path in spec["paths"].values()
            for op in path.values()
            if "operationId" in op
        ]
        assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)
        assert client.head("/healthz").status_code == 200 and client.head("/readyz").status_code == 200
        assert "image/webp" in client.get("/v1/models/cells").json()["accepts"]
