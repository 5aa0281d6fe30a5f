"""Unknown query parameters get 422 ``unknown_query_parameter`` naming them, the closest known name and what the
endpoint takes, on every API endpoint, never a result computed without the option meant."""

from __future__ import annotations

from typing import Annotated

import pytest
from densecnn_app import Settings, create_app
from densecnn_app.errors import install_error_handlers
from densecnn_app.query_parameters import refuse_unknown_query_parameters
from densecnn_app.requestid import RequestIdMiddleware
from fastapi import Depends, FastAPI, Query
from fastapi.testclient import TestClient

from tests.app_support import blobs, encode, save_brightness_model, wait_ready

PNG = encode(blobs(40, 52))


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    save_brightness_model(root, "cells")
    settings = Settings(
        model_dir=root, default_model="cells", torch_threads=1, backend="native", warm_sizes=[]
    )
    with TestClient(create_app(settings)) as client:
        wait_ready(client.get)
        yield client


def refused(response) -> str:
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert (
        error["code"] == "unknown_query_parameter" and error["request_id"] == response.headers["x-request-id"]
    )
    return error["message"]


def segment(client, query: str):
    return client.post(
        f"/v1/models/cells/segment?{query}", content=PNG, headers={"content-type": "image/png"}
    )


def test_a_misspelt_segment_option_is_refused_naming_it_and_the_closest_name(client):
    message = refused(segment(client, "veiw=overlay"))
    assert "'veiw' (did you mean view?)" in message
    assert "POST /v1/models/{name}/segment takes the query parameters view, intensity, nonfinite" in message
    message = refused(segment(client, "nonfinte=propagate&chanel_axis=0"))  # no suggestion for a stranger
    assert "parameters 'nonfinte' (did you mean nonfinite?), 'chanel_axis':" in message
    # names are case-sensitive, as FastAPI reads them; one unknown among known ones is enough
    assert "'View' (did you mean view?)" in refused(segment(client, "View=overlay"))
    assert "'levle'" in refused(segment(client, "view=overlay&levle=1"))


def test_correct_segment_options_still_work(client):
    plain = segment(client, "")
    assert plain.status_code == 200 and plain.headers["content-type"] == "image/png"
    overlay = segment(client, "view=overlay&intensity=dtype&nonfinite=refuse")
    assert overlay.status_code == 200 and overlay.content != plain.content


def test_a_misspelt_job_option_is_refused_before_any_job_is_made(client):
    before = client.get("/v1/jobs").json()["jobs"]
    response = client.post("/v1/jobs?model=cells&levle=1", content=PNG, headers={"content-type": "image/png"})
    message = refused(response)
    assert "'levle' (did you mean level?)" in message
    assert "POST /v1/jobs takes the query parameters model, chunk, level, intensity, nonfinite" in message
    assert client.get("/v1/jobs").json()["jobs"] == before
    known = client.get("/v1/jobs/0123abcd/result.geojson?background=true")
    assert known.status_code == 404 and known.json()["error"]["code"] == "unknown_job"
    assert "(did you mean background?)" in refused(
        client.get("/v1/jobs/0123abcd/result.geojson?backgroud=true")
    )


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/healthz"),
        ("HEAD", "/healthz"),
        ("GET", "/readyz"),
        ("GET", "/v1/models"),
        ("GET", "/v1/models/cells"),
        ("GET", "/v1/jobs"),
        ("GET", "/v1/jobs/0123abcd"),
        ("HEAD", "/v1/jobs/0123abcd/result.png"),
        ("POST", "/v1/uploads"),
        ("OPTIONS", "/v1/uploads"),
    ],
)
def test_an_endpoint_without_query_parameters_refuses_one(client, method, path):
    response = client.request(method, f"{path}?verbose=1")
    assert response.status_code == 422, response.text
    assert response.headers["content-type"] == "application/json"
    if method != "HEAD":
        route = path.replace("cells", "{name}").replace("0123abcd", "{job_id}")
        assert (
            refused(response)
            == f"unknown query parameter 'verbose': {method} {route} takes no query parameters"
        )
    assert client.request(method, path).status_code != 422  # the same request without it is not refused


def test_the_web_page_static_files_docs_and_metrics_keep_their_query_strings(client):
    assert client.get("/?utm_source=mail").status_code == 200
    assert client.get("/static/app.js?v=2").status_code == 200
    assert client.get("/docs?x=1").status_code == 200
    assert client.get("/metrics?name[]=densecnn_requests_total").status_code == 200  # a scrape's own params
    assert client.get("/docs/oauth2-redirect?code=abc&state=xyz").status_code == 200
    assert client.get("/openapi.json?x=1").status_code == 200


def test_a_long_list_of_unknown_names_is_cut_short(client):
    query = "&".join(f"p{i}=1" for i in range(8)) + "&" + "x" * 500 + "=1"
    message = refused(client.get(f"/healthz?{query}"))
    assert "'p0', 'p1', 'p2', 'p3', 'p4', and 4 more:" in message and "x" * 100 not in message


def page(size: int = 10) -> int:
    return size


def test_parameters_of_dependencies_and_aliases_count_as_known():
    app = FastAPI(dependencies=[Depends(refuse_unknown_query_parameters)])
    install_error_handlers(app, retry_after=1)
    app.add_middleware(RequestIdMiddleware)

    @app.get("/items")
    def items(size: Annotated[int, Depends(page)], sort: Annotated[str, Query(alias="order")] = "id") -> dict:
        return {"size": size, "sort": sort}

    with TestClient(app) as client:
        assert client.get("/items?size=3&order=name").json() == {"size": 3, "sort": "name"}
        message = refused(client.get("/items?sort=name"))  # the field's name, not the alias FastAPI reads
        assert "'sort': GET /items takes the query parameters order, size" in message


def test_a_parameter_given_twice_is_refused_unless_it_takes_a_list(client):
    for response in (
        segment(client, "intensity=dtype&intensity=range:0,1"),
        segment(client, "nonfinite=propagate&view=labels&nonfinite=refuse"),
        client.post(
            "/v1/jobs?model=cells&chunk=16&chunk=17", content=PNG, headers={"content-type": "image/png"}
        ),
    ):
        assert response.status_code == 422, response.text
        error = response.json()["error"]
        assert error["code"] == "repeated_query_parameter"
        assert "given more than once: '" in error["message"] and "(2 times)" in error["message"]
    app = FastAPI(dependencies=[Depends(refuse_unknown_query_parameters)])
    install_error_handlers(app, retry_after=1)

    @app.get("/items")
    def items(id: Annotated[list[int] | None, Query()] = None, sort: str = "id") -> dict:
        return {"id": id, "sort": sort}

    with TestClient(app) as own:
        assert own.get("/items?id=1&id=2").json() == {"id": [1, 2], "sort": "id"}
        response = own.get("/items?id=1&sort=a&sort=b")
        assert response.status_code == 422 and "'sort' (2 times)" in response.json()["error"]["message"]
