"""The service in-process (``with TestClient(app)``, lifespan running): every endpoint and every error path.

After each error the next good request must still succeed.
"""

from __future__ import annotations

import asyncio
import base64
import io
import re
import resource
import struct
import threading
import time
import zlib
from functools import partial

import numpy as np
import pytest
import tifffile
import torch
from densecnn_app import Settings, create_app
from densecnn_app.segmentation import SegmentResult
from fastapi.testclient import TestClient
from PIL import Image
from pydantic import ValidationError

import densecnn
from tests.app_support import (
    CLASS_NAMES,
    assert_library_labels,
    blobs,
    encode,
    save_brightness_model,
    wait_ready,
)

MAX_PIXELS = 1_000_000
MAX_BYTES = 300_000


@pytest.fixture(scope="module")
def model_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    save_brightness_model(root, "cells")
    save_brightness_model(root, "gray", in_channels=1, normalization={"mean": [0.2], "std": [0.5]})
    torch.manual_seed(0)
    many, patch = densecnn.zoo.tiny(in_channels=3, num_classes=300)
    densecnn.save(many, root / "many", patch_size=patch, padding_mode="reflect")
    (root / "not-a-model").mkdir()  # ignored: no model.json
    return root


def make_app(model_root, **overrides):
    settings = dict(
        model_dir=model_root,
        default_model="cells",
        torch_threads=1,
        backend="native",  # no solver timing on each new image size: fast, deterministic tests
        warm_sizes=[],  # start at once (the warm-up has its own test)
        max_image_pixels=MAX_PIXELS,
        max_upload_bytes=MAX_BYTES,
    )
    return create_app(Settings(**{**settings, **overrides}))


@pytest.fixture(scope="module")
def client(model_root):
    with TestClient(make_app(model_root)) as client:
        wait_ready(client.get)
        yield client


IMAGE = blobs(40, 52)
PNG = encode(IMAGE)


def png_labels(body: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(body)))


def post_raw(client, data: bytes, content_type: str = "image/png", model: str = "cells", **kwargs):
    headers = {"content-type": content_type, **kwargs.pop("headers", {})}
    return client.post(f"/v1/models/{model}/segment", content=data, headers=headers, **kwargs)


def assert_error(response, status: int, code: str | None = None) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message", "request_id"}
    assert body["error"]["request_id"] == response.headers["x-request-id"]
    assert body["error"]["message"]
    if code:
        assert body["error"]["code"] == code
    return body["error"]


def assert_next_request_succeeds(client) -> None:
    response = post_raw(client, PNG)
    assert response.status_code == 200
    assert_library_labels(png_labels(response.content), client.model_root / "cells", PNG)


@pytest.fixture(autouse=True)
def _remember_root(request, model_root):
    if "client" in request.fixturenames:
        request.getfixturevalue("client").model_root = model_root


# --- health, models, page, metrics, OpenAPI ---


def test_health_and_readiness(client):
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200
    assert sorted(ready.json()["models"]) == ["cells", "gray", "many"]


def test_model_list_and_details(client):
    listing = client.get("/v1/models").json()
    assert listing["default"] == "cells"
    assert [m["name"] for m in listing["models"]] == ["cells", "gray", "many"]
    info = client.get("/v1/models/gray").json()
    assert info["patch_size"] == [12, 12] and info["in_channels"] == 1 and info["num_classes"] == 3
    assert [c["name"] for c in info["classes"]] == CLASS_NAMES
    assert info["classes"][2]["color"] == [255, 200, 0]
    assert info["padding_mode"] == "zeros" and info["normalization"] == {"mean": [0.2], "std": [0.5]}
    assert client.get("/v1/models/many").json()["padding_mode"] == "reflect"


def test_unknown_model_is_404(client):
    assert "cells" in assert_error(client.get("/v1/models/nope"), 404, "unknown_model")["message"]
    assert_error(post_raw(client, PNG, model="nope"), 404, "unknown_model")
    assert_next_request_succeeds(client)


def test_a_channel_last_npy_is_refused_saying_arrays_are_read_channel_first(client):
    array = io.BytesIO()
    np.save(array, blobs(16, 20))  # (H, W, 3): read as 16 channels of 20x3
    error = assert_error(client.post("/v1/models/cells/segment", files={"image": ("hwc.npy", array.getvalue())}),
                         400, "invalid_image")  # fmt: skip
    assert error["message"].startswith("hwc.npy: the array has 16 channels and the model takes 3")
    assert "read channel first, (C, H, W)" in error["message"]
    assert "channel_axis" not in error["message"] and "channel-axis" not in error["message"]
    assert_next_request_succeeds(client)


def test_framework_errors_use_the_error_shape(client):
    assert_error(client.get("/no/such/path"), 404, "not_found")
    assert_error(client.delete("/healthz"), 405, "method_not_allowed")
    assert_error(post_raw(client, PNG, params={"view": "sideways"}), 422, "invalid_request")
    assert_next_request_succeeds(client)


def test_page_and_static_files(client):
    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "/static/app.js" in page.text
    assert "segment?view=overlay" in client.get("/static/app.js").text
    assert 'rel="icon"' in page.text


def test_favicon(client):
    response = client.get("/favicon.ico")
    assert response.status_code == 200 and response.headers["content-type"] == "image/x-icon"
    assert Image.open(io.BytesIO(response.content)).format == "ICO"


def test_openapi_declares_binary_responses_and_the_image_body(client):
    spec = client.get("/openapi.json").json()
    operation = spec["paths"]["/v1/models/{name}/segment"]["post"]
    ok = operation["responses"]["200"]["content"]
    assert ok["image/png"]["schema"] == {"type": "string", "format": "binary"}
    assert ok["application/x-npy"]["schema"]["format"] == "binary"
    assert ok["application/json"]["schema"]["$ref"].endswith("/SegmentJson")
    body = operation["requestBody"]["content"]
    assert "image" in body["multipart/form-data"]["schema"]["properties"] and "image/png" in body
    assert "TIFF Orientation tag" in operation["description"] and "displayed" in operation["description"]
    for status in ("400", "404", "406", "413", "415", "503"):
        assert operation["responses"][status]["content"]["application/json"]["schema"]["$ref"].endswith(
            "ErrorBody"
        )


def test_metrics_count_routes_statuses_and_inference(client):
    post_raw(client, PNG)
    post_raw(client, b"x" * (MAX_BYTES + 1))
    text = client.get("/metrics").text
    assert (
        'densecnn_http_requests_total{method="POST",route="/v1/models/{name}/segment",status="200"}' in text
    )
    assert 'route="/v1/models/{name}/segment",status="413"' in text
    assert 'densecnn_inference_seconds_count{model="cells"}' in text
    assert "densecnn_inference_queue_depth 0.0" in text
    assert "densecnn_image_pixels_count" in text
    assert 'densecnn_http_request_duration_seconds_count{route="/v1/models/{name}/segment"}' in text


def test_metrics_series_stay_bounded_whatever_methods_and_paths_clients_send(client):
    def series() -> set[str]:
        text = client.get("/metrics").text
        return {
            line.rsplit(" ", 1)[0] for line in text.splitlines() if line.startswith("densecnn_http_requests")
        }

    client.request("M000001X", "/healthz")
    client.get("/no/such/path/1")
    series()  # /metrics itself counted
    before = series()
    for i in range(2, 12):
        assert client.request(f"M{i:06d}X", "/healthz").status_code == 405
        assert client.get(f"/no/such/path/{i}").status_code == 404
    added = series() - before
    assert not added, added
    text = client.get("/metrics").text
    assert 'method="other",route="/healthz",status="405"' in text
    assert 'method="GET",route="unmatched",status="404"' in text
    assert "M000001X" not in text and "/no/such/path" not in text


def test_metrics_report_the_process_memory(client):
    lines = [line for line in client.get("/metrics").text.splitlines() if line.startswith("process_resident")]
    assert lines and float(lines[0].split()[-1]) > 50 * 2**20  # torch and a model: well above 50 MiB


@pytest.mark.parametrize("path", ["/healthz", "/readyz"])
def test_health_probes_answer_head(client, path):
    response = client.head(path)
    assert response.status_code == 200 and response.content == b""


# --- the segment endpoint: formats ---


def test_default_answer_is_a_palette_png_equal_to_library_predict(client, model_root):
    response = client.post("/v1/models/cells/segment", files={"image": ("blobs.png", PNG, "image/png")})
    assert response.status_code == 200 and response.headers["content-type"] == "image/png"
    image = Image.open(io.BytesIO(response.content))
    assert image.mode == "P" and image.size == (52, 40)
    assert image.getpalette()[:9] == [0, 0, 0, 40, 120, 255, 255, 200, 0]
    labels = np.asarray(image)
    assert_library_labels(labels, model_root / "cells", PNG)
    assert set(np.unique(labels)) == {0, 1, 2}  # the test image has all three classes
    timing = response.headers["server-timing"]
    assert all(f"{step};dur=" in timing for step in ("decode", "infer", "encode"))


def test_raw_body_equals_multipart(client):
    multipart = client.post("/v1/models/cells/segment", files={"image": ("b.png", PNG, "image/png")})
    assert post_raw(client, PNG).content == multipart.content
    assert post_raw(client, PNG, "application/octet-stream").content == multipart.content


def test_json_answer(client, model_root):
    response = post_raw(client, PNG, headers={"accept": "application/json"})
    assert response.status_code == 200 and response.headers["content-type"] == "application/json"
    body = response.json()
    assert (body["width"], body["height"]) == (52, 40)
    assert [c["name"] for c in body["classes"]] == CLASS_NAMES
    labels = png_labels(base64.b64decode(body["labels_png_base64"]))
    assert_library_labels(labels, model_root / "cells", PNG)
    assert body["pixel_counts"] == np.bincount(labels.ravel(), minlength=3).tolist()
    assert "overlay_png_base64" not in body or body["overlay_png_base64"] is None


def test_npy_probabilities(client, model_root):
    response = post_raw(client, PNG, headers={"accept": "application/x-npy"})
    assert response.status_code == 200 and response.headers["content-type"] == "application/x-npy"
    probabilities = np.load(io.BytesIO(response.content), allow_pickle=False)
    assert probabilities.dtype == np.float32 and probabilities.shape == (3, 40, 52)
    np.testing.assert_allclose(probabilities.sum(0), 1, atol=1e-5)
    assert_library_labels(probabilities.argmax(0), model_root / "cells", PNG)


def test_overlay_view_blends_the_class_colours(client, model_root):
    response = post_raw(client, PNG, params={"view": "overlay"})
    assert response.status_code == 200
    overlay = Image.open(io.BytesIO(response.content))
    assert overlay.mode == "RGB" and overlay.size == (52, 40)
    labels = png_labels(post_raw(client, PNG).content)  # the same computation as the overlay's
    palette = np.array([[0, 0, 0], [40, 120, 255], [255, 200, 0]], np.float32)
    expected = np.round(0.5 * IMAGE + 0.5 * palette[labels])
    assert np.abs(np.asarray(overlay).astype(np.float32) - expected).max() <= 1
    with_json = post_raw(
        client, PNG, params={"view": "overlay"}, headers={"accept": "application/json"}
    ).json()
    assert base64.b64decode(with_json["overlay_png_base64"]) == response.content


def test_more_than_256_classes_give_a_16_bit_png(client, model_root):
    response = post_raw(client, PNG, model="many")
    image = Image.open(io.BytesIO(response.content))
    assert image.mode == "I;16"
    assert_library_labels(np.asarray(image), model_root / "many", PNG)


@pytest.mark.parametrize(
    ("accept", "media_type"),
    [
        (None, "image/png"),
        ("*/*", "image/png"),
        ("image/*", "image/png"),
        ("application/json;q=0.5, application/x-npy", "application/x-npy"),
        ("text/html, application/json", "application/json"),
        ("image/png;q=0, application/*", "application/json"),
        ("application/npy", "application/x-npy"),  # the name uploads take too
        ("image/png;q=0, */*", "application/json"),  # q=0 refuses PNG, even where */* would take it
        ("image/png; Q=0, application/json", "application/json"),  # parameter names in any case
        ("image/*;q=0, image/png", "image/png"),  # the most specific range decides
        ("*/*;q=0.1, application/x-npy;q=0.5", "application/x-npy"),
    ],
)
def test_accept_negotiation(client, accept, media_type):
    headers = {"accept": accept} if accept else {}
    response = post_raw(client, PNG, headers=headers)
    assert response.status_code == 200 and response.headers["content-type"] == media_type
    assert response.headers["vary"] == "Accept"


def test_unacceptable_accept_is_406_with_vary(client):
    response = post_raw(client, PNG, headers={"accept": "text/html"})
    assert_error(response, 406, "not_acceptable")
    assert response.headers["vary"] == "Accept"
    overlay_npy = post_raw(client, PNG, params={"view": "overlay"}, headers={"accept": "application/x-npy"})
    assert_error(overlay_npy, 406)
    assert_next_request_succeeds(client)


def test_406_quotes_a_long_accept_header_truncated(client):
    accept = "text/html;q=0.9, " * 6000  # 102 kB
    message = assert_error(post_raw(client, PNG, headers={"accept": accept}), 406, "not_acceptable")[
        "message"
    ]
    assert len(message) < 500 and f"({len(accept):,} characters)" in message


# --- image inputs ---


@pytest.mark.parametrize("shape", [(0, 5), (5, 0), (0, 0)])
def test_a_tiff_of_no_pixels_is_empty_not_a_stack(client, shape):
    tiff = io.BytesIO()
    tifffile.imwrite(tiff, np.zeros(shape, np.uint8))
    error = assert_error(client.post("/v1/models/cells/segment", files={"image": ("empty.tif", tiff.getvalue())}),
                         400, "invalid_image")  # fmt: skip
    assert error["message"].startswith("empty.tif: the image is empty") and "stack" not in error["message"]
    assert_next_request_succeeds(client)


def test_one_pixel_image(client, model_root):
    one = encode(np.full((1, 1, 3), 240, np.uint8))
    response = post_raw(client, one)
    assert response.status_code == 200
    assert png_labels(response.content).shape == (1, 1)
    assert_library_labels(png_labels(response.content), model_root / "cells", one)


def test_rgba_drops_alpha(client):
    rgba = np.concatenate([IMAGE, np.full((*IMAGE.shape[:2], 1), 77, np.uint8)], axis=2)
    assert post_raw(client, encode(rgba)).content == post_raw(client, PNG).content


def test_grayscale_into_rgb_and_rgb_into_gray_models(client, model_root):
    gray = encode(IMAGE[:, :, 0])
    response = post_raw(client, gray)
    assert response.status_code == 200
    replicated = encode(np.repeat(IMAGE[:, :, :1], 3, axis=2))
    assert_library_labels(png_labels(response.content), model_root / "cells", replicated)
    to_gray = post_raw(client, PNG, model="gray")  # luminance, then the model's normalisation
    assert_library_labels(png_labels(to_gray.content), model_root / "gray", PNG)


def test_16_bit_png_and_tiff(client, model_root):
    deep = (IMAGE[:, :, 0].astype(np.uint16) * 257).astype(np.uint16)
    out = io.BytesIO()
    tifffile.imwrite(out, deep)
    tiff = out.getvalue()
    response = post_raw(client, tiff, "image/tiff", model="gray")
    assert response.status_code == 200
    assert_library_labels(png_labels(response.content), model_root / "gray", tiff)
    eight_bit = post_raw(client, encode(IMAGE[:, :, 0]), model="gray")
    assert response.content == eight_bit.content  # v * 257 / 65535 == v / 255
    png16 = post_raw(client, encode(deep), model="gray")
    assert png16.content == eight_bit.content


def test_float_tiff(client, model_root):
    out = io.BytesIO()
    tifffile.imwrite(out, IMAGE.astype(np.float32) / 255, photometric="rgb")
    response = post_raw(client, out.getvalue(), "image/tiff")
    assert response.status_code == 200
    assert_library_labels(png_labels(response.content), model_root / "cells", PNG)


def tiff_bytes(array: np.ndarray, **kwargs) -> bytes:
    out = io.BytesIO()
    tifffile.imwrite(out, array, **kwargs)
    return out.getvalue()


def test_a_tiff_stack_is_422_saying_what_was_received(client):
    stack = tiff_bytes(np.stack([IMAGE[:, :, 0]] * 5))
    assert len(tifffile.TiffFile(io.BytesIO(stack)).pages) == 5
    error = assert_error(post_raw(client, stack, "image/tiff", model="gray"), 422, "image_is_a_stack")
    assert "stack of 5 slices" in error["message"] and "2-D image" in error["message"]
    volume = tiff_bytes(np.stack([IMAGE] * 3), volumetric=True, tile=(16, 16), photometric="rgb")
    error = assert_error(post_raw(client, volume, "image/tiff"), 422, "image_is_a_stack")
    assert "stack of 3 slices" in error["message"]
    assert_next_request_succeeds(client)


@pytest.mark.parametrize("compression", ["lzw", "zlib", "jpeg", "packbits"])
def test_compressed_tiff(client, model_root, compression):
    tiff = tiff_bytes(IMAGE, compression=compression, photometric="rgb")
    response = post_raw(client, tiff, "image/tiff")
    assert response.status_code == 200, response.text
    labels = png_labels(response.content)
    assert_library_labels(labels, model_root / "cells", tiff)
    if compression != "jpeg":  # lossless: the same pixels as the PNG, so the same computation
        assert response.content == post_raw(client, PNG).content


@pytest.mark.parametrize("orientation", [3, 6, 8])
def test_tiff_orientation_tag_is_applied(client, orientation):
    """The label map of a TIFF stored rotated equals that of the image as displayed (Orientation tag 274)."""
    stored = {3: np.rot90(IMAGE, 2), 6: np.rot90(IMAGE, 1), 8: np.rot90(IMAGE, -1)}[orientation]
    tiff = tiff_bytes(
        np.ascontiguousarray(stored), photometric="rgb", extratags=[(274, "H", 1, orientation, True)]
    )
    response = post_raw(client, tiff, "image/tiff")
    assert response.status_code == 200
    assert png_labels(response.content).shape == IMAGE.shape[:2]  # (H, W) as displayed
    assert response.content == post_raw(client, PNG).content  # the displayed pixels, the same computation


def test_every_orientation_reads_as_pillow_displays_it():
    """TIFF Orientation 1-8 is read as Pillow's exif_transpose shows the same EXIF orientation."""
    from densecnn.io import decode_array

    for orientation in range(1, 9):
        exif = Image.Exif()
        exif[0x0112] = orientation
        png = encode(IMAGE, exif=exif.tobytes())
        tiff = tiff_bytes(IMAGE, photometric="rgb", extratags=[(274, "H", 1, orientation, True)])
        displayed = decode_array(png)
        assert displayed.shape[:2] == (IMAGE.shape[:2] if orientation <= 4 else IMAGE.shape[1::-1])
        assert np.array_equal(decode_array(tiff), displayed), orientation


def test_exif_orientation_is_applied(client, model_root):
    exif = Image.Exif()
    exif[0x0112] = 6  # stored landscape, displayed rotated 90 degrees clockwise
    jpeg = encode(IMAGE, "JPEG", quality=95, exif=exif.tobytes())
    response = post_raw(client, jpeg, "image/jpeg")
    assert response.status_code == 200
    labels = png_labels(response.content)
    assert labels.shape == (52, 40)  # (H, W) of the displayed image
    assert_library_labels(labels, model_root / "cells", jpeg)


# --- bad inputs ---


def test_truncated_png_is_400(client):
    assert_error(post_raw(client, PNG[: len(PNG) // 2]), 400, "invalid_image")
    assert_error(post_raw(client, PNG[:20]), 400, "invalid_image")
    assert_next_request_succeeds(client)


def test_tiffs_a_viewer_shows_otherwise_are_read_as_shown_or_refused(client):
    """White-is-zero gray is labelled as the same picture stored black-is-zero; CMYK and complex samples are 400."""
    gray = (IMAGE[..., 0] if IMAGE.ndim == 3 else IMAGE).astype(np.uint8)
    stored = [io.BytesIO(), io.BytesIO()]
    tifffile.imwrite(stored[0], gray, photometric="minisblack")
    tifffile.imwrite(stored[1], 255 - gray, photometric="miniswhite")
    black, white = (png_labels(post_raw(client, s.getvalue(), "image/tiff").content) for s in stored)
    np.testing.assert_array_equal(white, black)
    for data, photometric, why in [
        (np.stack([gray] * 4, -1), "separated", "separated \\(CMYK\\)"),
        (gray.astype(np.complex64), "minisblack", "holds complex64 values"),
    ]:
        tiff = io.BytesIO()
        tifffile.imwrite(tiff, data, photometric=photometric)
        error = assert_error(post_raw(client, tiff.getvalue(), "image/tiff"), 400, "invalid_image")
        assert re.search(why, error["message"]), error["message"]
    assert_next_request_succeeds(client)


def test_corrupt_tiff_is_400(client):
    assert_error(post_raw(client, b"II*\x00" + b"\xff" * 40, "image/tiff"), 400, "invalid_image")
    assert_next_request_succeeds(client)


def test_text_file_is_415(client):
    text = b"this is not an image\n" * 10
    multipart = client.post("/v1/models/cells/segment", files={"image": ("notes.txt", text, "text/plain")})
    assert_error(multipart, 415, "unsupported_image_type")
    assert_error(
        post_raw(client, text, "image/png"), 415, "unsupported_image_type"
    )  # bytes decide, not the label
    assert_error(post_raw(client, text, "text/plain"), 415, "unsupported_media_type")
    assert_next_request_succeeds(client)


def multipart(boundary: str, data: bytes, *, closed: bool = True) -> bytes:
    head = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="image"; filename="b.png"\r\n'
        "Content-Type: image/png\r\n\r\n"
    ).encode()
    return head + data + (f"\r\n--{boundary}--\r\n".encode() if closed else b"")


def test_cut_off_multipart_body_is_400_saying_so(client):
    content_type = "multipart/form-data; boundary=XyZ"
    assert post_raw(client, multipart("XyZ", PNG), content_type).content == post_raw(client, PNG).content
    for cut in (multipart("XyZ", PNG, closed=False), multipart("XyZ", PNG[: len(PNG) // 2], closed=False)):
        error = assert_error(post_raw(client, cut, content_type), 400, "incomplete_multipart")
        assert "cut off" in error["message"]
    assert_next_request_succeeds(client)


def test_a_multipart_body_with_another_boundary_is_named_as_such_not_as_cut_off(client):
    body = multipart("AAA", PNG)  # the body divided by AAA, the header declaring BBB
    error = assert_error(
        post_raw(client, body, "multipart/form-data; boundary=BBB"), 400, "multipart_boundary_mismatch"
    )
    assert "'BBB'" in error["message"] and "disagree" in error["message"]
    assert_next_request_succeeds(client)


def test_malformed_multipart_bodies_get_the_codes_job_uploads_give(client):
    two = [("image", ("a.png", PNG, "image/png")), ("image", ("b.png", PNG, "image/png"))]
    assert_error(client.post("/v1/models/cells/segment", files=two), 400, "too_many_files")
    nameless = b'--B\r\nContent-Disposition: form-data; name="image"\r\n\r\n' + PNG + b"\r\n--B--\r\n"
    answer = post_raw(
        client, nameless, "multipart/form-data; boundary=B"
    )  # a part without filename=, as jobs take
    assert answer.status_code == 200, answer.text
    no_boundary = post_raw(client, PNG, "multipart/form-data")
    assert no_boundary.status_code == 400 and no_boundary.json()["error"]["code"] != "bad_request"
    assert_next_request_succeeds(client)


def test_messages_name_the_uploaded_file(client):
    broken = ("../../etc/scan.png", b"\x89PNG\r\n\x1a\n" + b"\x00" * 40, "image/png")
    error = assert_error(
        client.post("/v1/models/cells/segment", files={"image": broken}), 400, "invalid_image"
    )
    assert error["message"].startswith("scan.png: not a readable image")
    error = assert_error(post_raw(client, b"\x89PNG\r\n\x1a\n" + b"\x00" * 40), 400, "invalid_image")
    assert error["message"].startswith("the upload: not a readable image")


def test_a_lossless_webp_is_labelled_like_the_png(client):
    buffer = io.BytesIO()
    Image.fromarray(IMAGE).save(buffer, format="WEBP", lossless=True)
    response = post_raw(client, buffer.getvalue(), "image/webp")
    assert response.status_code == 200, response.text
    np.testing.assert_array_equal(png_labels(response.content), png_labels(post_raw(client, PNG).content))


def test_missing_field_and_empty_body_are_400(client):
    wrong_field = client.post("/v1/models/cells/segment", files={"file": ("b.png", PNG, "image/png")})
    assert_error(wrong_field, 400, "missing_image")
    assert_error(post_raw(client, b""), 400, "empty_image")
    assert_next_request_succeeds(client)


def png_header_only(width: int, height: int) -> bytes:
    """A PNG that declares width x height but holds no pixel data."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(b"\x00" * 16))
        + chunk(b"IEND", b"")
    )


def with_size(fmt: str, width: int, height: int) -> bytes:
    """A small image in ``fmt`` whose header is rewritten to declare width x height (its pixel data stays small)."""
    if fmt == "PNG":
        return png_header_only(width, height)
    data = bytearray(encode(IMAGE, fmt))
    if fmt == "BMP":
        data[18:26] = struct.pack("<ii", width, height)
    elif fmt == "GIF":
        data[6:10] = struct.pack("<HH", width, height)  # the logical screen: Pillow's size
    elif fmt == "JPEG":
        sof = data.index(b"\xff\xc0")
        data[sof + 5 : sof + 9] = struct.pack(">HH", height, width)
    return bytes(data)


@pytest.mark.parametrize("fmt", ["PNG", "BMP", "GIF", "JPEG"])
@pytest.mark.parametrize("size", [(2000, 1000), (60_000, 60_000)])  # over our limit; also over Pillow's guard
def test_huge_declared_dimensions_are_413_before_decoding_quoting_our_limit(client, fmt, size):
    started = time.perf_counter()
    error = assert_error(post_raw(client, with_size(fmt, *size)), 413, "image_too_large")
    assert time.perf_counter() - started < 2  # decided from the header: nothing was decoded
    assert f"limit of {MAX_PIXELS:,} pixels" in error["message"]  # the server's limit, not Pillow's
    assert f"{size[0] * size[1]:,} pixels" in error["message"] or f"{size[0]}x{size[1]}" in error["message"]
    assert_next_request_succeeds(client)


def sample_bomb_tiff(width: int = 4000, height: int = 4000, samples: int = 64) -> bytes:
    """A ~1 MB deflate TIFF of width x height x samples zeros: small on the wire, 1 GB once decoded."""
    tile = zlib.compress(bytes(256 * 256 * samples))  # one encoded tile, written for every tile position
    count = -(-width // 256) * -(-height // 256)
    return tiff_bytes(
        (tile for _ in range(count)), shape=(height, width, samples), dtype=np.uint8, tile=(256, 256),
        compression="zlib", photometric="minisblack", planarconfig="contig",
    )  # fmt: skip


def test_decompression_bomb_through_samples_per_pixel_is_413_fast(model_root):
    """16 M pixels pass the pixel limit, but x 64 samples is 1 GB decoded: refused from the header, in < 5 s."""
    bomb = sample_bomb_tiff()
    assert len(bomb) < 1_100_000
    with TestClient(make_app(model_root, max_upload_bytes=2_000_000, max_image_pixels=16_000_000)) as big:
        wait_ready(big.get)
        rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        started = time.perf_counter()
        error = assert_error(post_raw(big, bomb, "image/tiff"), 413, "image_too_large")
        assert time.perf_counter() - started < 5
        assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - rss_before < 100_000_000
        default = Settings.model_fields["max_decode_bytes"].default
        assert "64 samples" in error["message"] and f"limit of {default:,} bytes" in error["message"]
        assert post_raw(big, PNG).status_code == 200


def test_read_header_describes_an_image_without_decoding_it():
    from densecnn.io import read_header

    started = time.perf_counter()
    header = read_header(sample_bomb_tiff())
    assert (header.format, header.width, header.height, header.samples, header.planes) == (
        "tiff",
        4000,
        4000,
        64,
        1,
    )
    assert header.decoded_bytes == 4000 * 4000 * 64
    rgba = read_header(encode(np.dstack([IMAGE, IMAGE[:, :, :1]])))
    assert (rgba.format, rgba.width, rgba.height, rgba.samples, rgba.bytes_per_sample) == (
        "png",
        52,
        40,
        4,
        1,
    )
    assert read_header(tiff_bytes(np.stack([IMAGE[:, :, 0]] * 5))).planes == 5
    assert time.perf_counter() - started < 5


def test_decoded_bytes_over_the_budget_are_413_for_every_format(model_root):
    """width x height x samples x bytes per sample, from the header, against max_decode_bytes (40x52 images)."""
    gray16, rgb16 = IMAGE[:, :, 0].astype(np.uint16) * 257, IMAGE.astype(np.uint16) * 257
    cases = [  # (what, bytes, decoded bytes)
        ("gray PNG", encode(IMAGE[:, :, 0]), 2080),
        ("RGB PNG", PNG, 6240),
        ("RGBA PNG", encode(np.dstack([IMAGE, IMAGE[:, :, :1]])), 8320),
        ("RGB JPEG", encode(IMAGE, "JPEG"), 6240),
        ("RGB BMP", encode(IMAGE, "BMP"), 6240),
        ("GIF (palette, decoded to RGB)", encode(IMAGE, "GIF"), 6240),
        ("16-bit gray TIFF", tiff_bytes(gray16), 4160),
        ("16-bit RGB LZW TIFF", tiff_bytes(rgb16, photometric="rgb", compression="lzw"), 12480),
    ]
    budget = 5000
    with TestClient(make_app(model_root, max_decode_bytes=budget)) as small:
        wait_ready(small.get)
        for what, data, decoded in cases:
            response = post_raw(small, data, "application/octet-stream")
            if decoded <= budget:
                assert response.status_code == 200, what
            else:
                message = assert_error(response, 413, "image_too_large")["message"]
                assert f"take {decoded:,} bytes" in message and f"limit of {budget:,} bytes" in message, what
        assert post_raw(small, encode(IMAGE[:, :, 0])).status_code == 200


def test_tiff_over_the_pixel_limit_is_413(model_root):
    out = io.BytesIO()
    tifffile.imwrite(out, np.zeros((40, 52), np.uint8))
    with TestClient(make_app(model_root, max_image_pixels=1000)) as small:
        wait_ready(small.get)
        assert_error(post_raw(small, out.getvalue(), "image/tiff"), 413, "image_too_large")
        assert_error(post_raw(small, PNG), 413, "image_too_large")
        assert post_raw(small, encode(IMAGE[:20, :20])).status_code == 200


def test_tiles_under_the_memory_budget_and_refuses_what_cannot_fit(model_root):
    # labels (16,640 bytes held) tile in what is left of 32,000; probabilities (24,960 held) leave too little for
    # the smallest tile (9,984 bytes with its padded input)
    with TestClient(make_app(model_root, max_inference_memory=32_000)) as small:
        wait_ready(small.get)
        tiled = post_raw(small, PNG)
        assert tiled.status_code == 200
        assert_library_labels(png_labels(tiled.content), model_root / "cells", PNG)
        error = assert_error(
            post_raw(small, PNG, headers={"accept": "application/x-npy"}), 413, "image_too_large"
        )
        assert "max_inference_memory" in error["message"]
        assert post_raw(small, PNG).status_code == 200


def test_oversized_body_is_413(client):
    assert_error(post_raw(client, PNG + b"\x00" * MAX_BYTES), 413, "payload_too_large")
    big = ("big.png", PNG + b"\x00" * MAX_BYTES, "image/png")
    assert_error(client.post("/v1/models/cells/segment", files={"image": big}), 413, "payload_too_large")
    assert_next_request_succeeds(client)


def test_oversized_chunked_body_is_413(client):
    sent = []

    def chunks():
        for _ in range(100):  # 100 x 10 kB > the 300 kB limit; no Content-Length
            sent.append(1)
            yield b"\x00" * 10_000

    response = client.post(
        "/v1/models/cells/segment", content=chunks(), headers={"content-type": "image/png"}
    )
    assert "content-length" not in response.request.headers
    assert_error(response, 413, "payload_too_large")
    assert_next_request_succeeds(client)


# --- lifecycle and load ---


def test_readiness_is_503_while_loading(model_root, monkeypatch):
    import densecnn_app.main

    release = threading.Event()
    real_load = densecnn_app.main.load_models

    def slow_load(root, **kwargs):
        release.wait(10)
        return real_load(root, **kwargs)

    monkeypatch.setattr(densecnn_app.main, "load_models", slow_load)
    with TestClient(make_app(model_root)) as client:
        assert client.get("/healthz").status_code == 200
        response = client.get("/readyz")
        assert_error(response, 503, "not_ready")
        assert "loading" in response.json()["error"]["message"] and response.headers["retry-after"] == "1"
        assert_error(post_raw(client, PNG), 503, "not_ready")
        release.set()
        wait_ready(client.get)
        assert post_raw(client, PNG).status_code == 200


def test_readiness_is_503_when_no_model_loads(tmp_path):
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "model.json").write_text("{not json")
    with TestClient(create_app(Settings(model_dir=tmp_path, torch_threads=1, backend="native"))) as client:
        deadline = time.monotonic() + 10
        while "loading" in client.get("/readyz").text and time.monotonic() < deadline:
            time.sleep(0.02)
        error = assert_error(client.get("/readyz"), 503, "not_ready")
        assert "broken" in error["message"] and "not valid JSON" in error["message"]
        assert client.get("/healthz").status_code == 200


def test_readiness_is_503_while_draining(model_root):
    with TestClient(make_app(model_root)) as client:
        wait_ready(client.get)
        client.app.state.service.draining = True  # what SIGTERM does (tested with a real server elsewhere)
        assert "shutting down" in assert_error(client.get("/readyz"), 503, "not_ready")["message"]
        assert_error(post_raw(client, PNG), 503, "not_ready")


def blocking_segment(started: threading.Event, release: threading.Event):
    def segment(served, data, output, **kwargs) -> SegmentResult:
        started.set()
        release.wait(10)
        return SegmentResult(b"done", "image/png", (1, 1), {"infer": 0.0})

    return segment


def test_full_queue_is_503_with_retry_after_at_once(model_root, monkeypatch):
    import densecnn_app.routers.segment

    started, release = threading.Event(), threading.Event()
    monkeypatch.setattr(densecnn_app.routers.segment, "segment", blocking_segment(started, release))
    with TestClient(make_app(model_root, max_concurrent_inferences=1, queue_size=0, retry_after=3)) as client:
        wait_ready(client.get)
        first = []
        worker = threading.Thread(target=lambda: first.append(post_raw(client, PNG)))
        worker.start()
        assert started.wait(10)
        t0 = time.perf_counter()
        busy = post_raw(client, PNG)
        assert time.perf_counter() - t0 < 1  # refused at once, not after waiting
        assert_error(busy, 503, "overloaded")
        assert busy.headers["retry-after"] == "3"
        assert 'status="503"' in client.get("/metrics").text
        release.set()
        worker.join(10)
        assert first[0].status_code == 200 and first[0].content == b"done"
        monkeypatch.undo()
        assert post_raw(client, PNG).status_code == 200


def test_clients_sending_slowly_hold_no_inference_place(model_root, monkeypatch):
    """Bodies still arriving take receiving places (two per address), not the one inference place."""
    import densecnn_app.routers.segment

    arrived, release = threading.Semaphore(0), threading.Event()
    read_upload = densecnn_app.routers.segment.read_upload

    async def slow_read_upload(request, *, timeout):
        if "x-slow" in request.headers:  # a client still sending its body
            arrived.release()
            await asyncio.to_thread(release.wait, 10)
        return await read_upload(request, timeout=timeout)

    monkeypatch.setattr(densecnn_app.routers.segment, "read_upload", slow_read_upload)
    settings = dict(max_concurrent_inferences=1, queue_size=0, max_receiving_per_client=2)
    with TestClient(make_app(model_root, **settings)) as client:
        wait_ready(client.get)
        slow = [
            threading.Thread(target=lambda: post_raw(client, PNG, headers={"X-Slow": "1"})) for _ in range(2)
        ]
        for thread in slow:
            thread.start()
        assert arrived.acquire(timeout=10) and arrived.acquire(timeout=10)
        third = assert_error(post_raw(client, PNG, headers={"X-Slow": "1"}), 503, "overloaded")
        assert "2 uploads from your address are being received" in third["message"]
        release.set()  # (a client from another address would have been received meanwhile)
        for thread in slow:
            thread.join(10)
        assert post_raw(client, PNG).status_code == 200


def test_slow_inference_times_out_with_503(model_root, monkeypatch):
    import densecnn_app.routers.segment

    started, release = threading.Event(), threading.Event()
    monkeypatch.setattr(densecnn_app.routers.segment, "segment", blocking_segment(started, release))
    with TestClient(make_app(model_root, request_timeout=0.2)) as client:
        wait_ready(client.get)
        response = post_raw(client, PNG)
        assert_error(response, 503, "timeout")
        assert "retry-after" in response.headers
        release.set()


async def asgi_post(app, body: bytes, *, cut_after: int | None = None, leave_after: float | None = None):
    """POST ``body`` to the ASGI app as a client that leaves: after ``cut_after`` bytes of the body, or
    ``leave_after`` seconds after sending all of it. Returns the status the app answered with (None if none)."""
    import asyncio

    path = "/v1/models/cells/segment"
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
        "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "", "client": ("127.0.0.1", 5),
        "server": ("testserver", 80), "headers": [(b"content-type", b"image/png"), (b"content-length", b"%d" % len(body))],
    }  # fmt: skip
    sent = [{"type": "http.request", "body": body[:cut_after], "more_body": cut_after is not None}]
    statuses = []

    async def receive():
        if sent:
            return sent.pop(0)
        if leave_after is not None:
            await asyncio.sleep(leave_after)
        return {"type": "http.disconnect"}

    async def send(message):
        if message["type"] == "http.response.start":
            statuses.append(message["status"])

    await app(scope, receive, send)
    return statuses[0] if statuses else None


def test_client_leaving_mid_upload_is_counted_as_499_with_one_log_line(client, caplog):
    caplog.set_level("INFO", logger="densecnn.app")
    status = client.portal.call(partial(asgi_post, client.app, PNG, cut_after=100))
    assert status == 499
    lines = [r for r in caplog.records if "closed the connection" in r.getMessage()]
    assert len(lines) == 1 and lines[0].exc_info is None
    assert not any(r.exc_info for r in caplog.records)  # no traceback
    text = client.get("/metrics").text
    assert 'route="/v1/models/{name}/segment",status="499"' in text
    assert_next_request_succeeds(client)


def test_queued_job_of_a_client_that_left_never_starts(model_root, monkeypatch):
    import densecnn_app.routers.segment

    started, release = threading.Event(), threading.Event()
    calls = []
    blocking = blocking_segment(started, release)
    monkeypatch.setattr(
        densecnn_app.routers.segment, "segment", lambda *a, **k: (calls.append(1), blocking(*a, **k))[1]
    )
    with TestClient(make_app(model_root, max_concurrent_inferences=1, queue_size=2)) as client:
        wait_ready(client.get)
        first = []
        worker = threading.Thread(target=lambda: first.append(post_raw(client, PNG)))
        worker.start()
        assert started.wait(10)
        t0 = time.perf_counter()
        assert client.portal.call(partial(asgi_post, client.app, PNG, leave_after=0.2)) == 499
        assert time.perf_counter() - t0 < 5  # answered when the client left, not when the first job ended
        release.set()
        worker.join(10)
        assert first[0].status_code == 200
        pool = client.app.state.service.pool
        deadline = time.monotonic() + 5
        while pool.dropped == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert pool.dropped == 1 and len(calls) == 1  # the second job was dropped before it started
        assert 'densecnn_inferences_abandoned_total{reason="client_gone"} 1.0' in client.get("/metrics").text


def test_running_job_past_the_deadline_gives_its_slot_back(model_root, monkeypatch):
    import densecnn_app.routers.segment

    from densecnn.errors import Cancelled

    stopped = threading.Event()

    def cancellable_segment(served, data, output, *, cancel, **kwargs):
        assert cancel.wait(10)  # the dense net would stop at its next layer or tile
        stopped.set()
        raise Cancelled("stopped")

    monkeypatch.setattr(densecnn_app.routers.segment, "segment", cancellable_segment)
    with TestClient(make_app(model_root, request_timeout=0.3, queue_size=0)) as client:
        wait_ready(client.get)
        assert_error(post_raw(client, PNG), 503, "timeout")
        assert stopped.wait(5)
        pool = client.app.state.service.pool
        deadline = time.monotonic() + 5
        while pool.running and time.monotonic() < deadline:
            time.sleep(0.01)
        assert pool.running == 0 and pool.queued == 0
        monkeypatch.undo()
        assert post_raw(client, PNG).status_code == 200  # the slot is free again


class CancelAfter(threading.Event):
    """An event that reads as set from its (checks + 1)-th check on: counts the boundaries the dense net checks."""

    def __init__(self, checks: int):
        super().__init__()
        self.checks = 0
        self.limit = checks

    def is_set(self) -> bool:
        self.checks += 1
        return self.checks > self.limit


@pytest.mark.parametrize("max_memory", [None, 70_000])  # untiled; 6x6 tiles
def test_dense_net_stops_between_layers_and_tiles_once_cancelled(model_root, max_memory):
    from densecnn.errors import Cancelled

    loaded = densecnn.load(model_root / "cells")
    dense = loaded.dense(backend="native")
    x = torch.rand(1, 3, 40, 52)
    never = CancelAfter(10**9)
    labels = dense.predict(x, max_memory=max_memory, cancel=never)
    assert torch.equal(labels, dense.predict(x, max_memory=max_memory))  # the same computation
    with torch.no_grad():
        steps = len(dense.plan(dense.pad(x)).steps)  # layers, a pool and its activation counting as one step
    assert never.checks >= steps  # checked before every step (of every tile)
    soon = CancelAfter(2)
    with pytest.raises(Cancelled):
        dense.predict(x, max_memory=max_memory, cancel=soon)
    assert soon.checks == 3  # stopped at the first boundary after the event was set


def test_sigterm_marks_the_service_draining_then_calls_the_servers_handler():
    import os
    import signal

    from densecnn_app.state import ServiceState, drain_on_signals

    state, calls = ServiceState(), []
    original = signal.signal(signal.SIGTERM, lambda sig, frame: calls.append(sig))  # stands in for uvicorn's
    try:
        drain_on_signals(state)
        os.kill(os.getpid(), signal.SIGTERM)
        deadline = time.monotonic() + 5
        while not calls and time.monotonic() < deadline:
            time.sleep(0.01)
        assert state.draining and calls == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, original)


# --- settings ---


def test_settings_from_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("DENSECNN_MODEL_DIR", str(tmp_path))
    monkeypatch.setenv("DENSECNN_MAX_UPLOAD_BYTES", "1234")
    monkeypatch.setenv("DENSECNN_QUEUE_SIZE", "7")
    settings = Settings()
    assert (settings.model_dir, settings.max_upload_bytes, settings.queue_size) == (tmp_path, 1234, 7)
    assert settings.max_image_pixels == 16_000_000 and settings.default_model == "nuclei"


def test_serve_command_fails_fast_without_models(tmp_path, monkeypatch, capsys):
    from densecnn.cli import main

    monkeypatch.delenv("DENSECNN_MODEL_DIR", raising=False)
    assert main(["serve", "--model-dir", str(tmp_path)]) == 2
    assert "no models in" in capsys.readouterr().err
    assert main(["serve", "--model-dir", str(tmp_path / "missing")]) == 2
    assert "is not a directory" in capsys.readouterr().err


def test_settings_take_the_librarys_vocabulary(tmp_path):
    from densecnn.ops import BACKENDS

    for backend in BACKENDS:
        assert Settings(model_dir=tmp_path, backend=backend).backend == backend
    with pytest.raises(ValidationError, match="'auto', 'native' or 'ext'|auto.*native.*ext"):
        Settings(model_dir=tmp_path, backend="fast")


def test_default_limits_bound_one_request_under_1_gib(tmp_path):
    assert Settings(model_dir=tmp_path).request_memory_bound(in_channels=3) <= 1 << 30


def test_settings_fail_fast(tmp_path):
    with pytest.raises(ValidationError, match="is not a directory"):
        Settings(model_dir=tmp_path / "missing")
    with pytest.raises(ValidationError, match="greater than 0"):
        Settings(model_dir=tmp_path, max_upload_bytes=0)


def test_models_are_warmed_for_their_sizes_before_ready(model_root, monkeypatch):
    warmed = []
    monkeypatch.setattr(
        densecnn.DenseCNN, "warm", lambda self, shape, **kwargs: warmed.append((shape, kwargs["max_memory"]))
    )
    with TestClient(
        make_app(model_root, warm_sizes=[[32, 40], [4, 8, 8]], max_inference_memory=10**8)
    ) as client:
        wait_ready(client.get)
        models = client.get("/v1/models").json()["models"]
    images = [m for m in models if m["dims"] == 2]
    assert images and len(warmed) == len(images)  # once per image model; no model takes the 3-D size
    assert {shape[2:] for shape, _ in warmed} == {(32, 40)}
    assert all(max_memory == 10**8 for _, max_memory in warmed)


def test_a_warm_up_that_cannot_fit_is_logged_and_the_service_starts(model_root, caplog):
    with TestClient(make_app(model_root, warm_sizes=[[64, 64]], max_inference_memory=1000)) as client:
        wait_ready(client.get)
        assert client.get("/readyz").status_code == 200
    assert "cannot warm model" in caplog.text


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_the_api_docs_load_their_assets_from_the_service_not_a_cdn(client, page):
    html = client.get(page).text
    scripts = re.findall(r'src="([^"]+\.js)"', html)
    assert scripts and all(src.startswith("/") for src in scripts), scripts  # no https://cdn...
    assert "cdn." not in html and "googleapis" not in html
    for src in scripts:
        response = client.get(src)
        assert response.status_code == 200 and len(response.content) > 100_000


@pytest.mark.parametrize(
    "bad", [np.nan, np.inf, -np.inf, 1e308], ids=["nan", "inf", "-inf", "beyond-float32"]
)
def test_non_finite_inputs_are_refused_naming_count_and_position(client, bad):
    image = np.full((20, 30), 0.5)
    image[3, 7] = image[11, 2] = bad
    buffer = io.BytesIO()
    np.save(buffer, image)
    error = assert_error(post_raw(client, buffer.getvalue(), "application/x-npy"), 400, "non_finite_input")
    assert "2 pixels holding NaN or infinite values" in error["message"] and "(3, 7)" in error["message"]


def test_the_service_bounds_the_caches_that_grow_with_new_sizes(model_root):
    settings = Settings(
        model_dir=model_root, worker_output_cache_mb=0, worker_plan_cache_size=3, warm_sizes=[]
    )
    before = densecnn.ops.get_config()
    try:
        with TestClient(create_app(settings)) as client:
            wait_ready(client.get)
            config = densecnn.ops.get_config()
            assert (config.output_cache_mb, config.plan_cache_size) == (0, 3)
            for width in range(20, 26):  # six sizes: the model keeps three plans
                post_raw(client, encode(blobs(20, width)))
            served = client.app.state.service.models["cells"]
            assert len(served.dense._plans) == 3
    finally:
        densecnn.ops.set_config(before)


def _tile_bomb(shape=(16, 16), tile=(4096, 4112)) -> bytes:
    """A tiny image stored in one huge zlib tile: a few KB on the wire, the whole tile on decoding."""
    buffer = io.BytesIO()
    tifffile.imwrite(
        buffer, np.zeros(shape, np.uint8), tile=tile, compression="zlib", photometric="minisblack"
    )
    return buffer.getvalue()


def test_a_tiff_tile_far_larger_than_its_image_is_refused_before_decoding(client):
    bomb = _tile_bomb()
    assert len(bomb) < 100_000
    error = assert_error(post_raw(client, bomb, "image/tiff"), 413, "image_too_large")
    assert "4096x4112 tiles of 16,842,752 decoded bytes" in error["message"]


def test_a_tiff_stack_with_a_tile_bomb_is_refused_too():
    from densecnn.errors import ImageTooLargeError
    from densecnn.io import read_nd

    bomb = _tile_bomb(shape=(5, 16, 16), tile=(4096, 4112))  # five pages, each one huge tile
    with pytest.raises(ImageTooLargeError, match="page 0 is stored in 4096x4112 tiles"):
        read_nd(bomb, 3, max_pixels=10**6, max_bytes=64 * 2**20)


def test_the_service_reads_its_own_cache_variables_and_leaves_the_librarys_to_the_library(monkeypatch):
    monkeypatch.setenv("DENSECNN_OUTPUT_CACHE_MB", "7")  # the library's variable: not the service's setting
    monkeypatch.setenv("DENSECNN_WORKER_PLAN_CACHE_SIZE", "5")
    settings = Settings()
    assert (settings.worker_output_cache_mb, settings.worker_plan_cache_size) == (256, 5)
