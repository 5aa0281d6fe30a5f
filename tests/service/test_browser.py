"""The web page in a real browser (Debian's chromium driven by playwright): upload, overlay, legend, errors."""

from __future__ import annotations

import base64
import contextlib
import io
import shutil

import httpx
import numpy as np
import pytest
from PIL import Image

import densecnn
from tests.app_support import CLASS_NAMES, Server, assert_library_labels, blobs, encode, save_brightness_model
from tests.service.test_app_volumes import volume_model

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

sync_api = pytest.importorskip("playwright.sync_api")


@contextlib.contextmanager
def chromium_page(timeout_ms: int, **page_options):
    """A page of Debian's headless chromium, driven by playwright, closed on exit."""
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        page = browser.new_page(**page_options)
        page.set_default_timeout(timeout_ms)
        yield page
        browser.close()


pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.xdist_group("browser"),  # one server and one browser for the module
    pytest.mark.skipif(shutil.which("chromium") is None, reason="needs Debian's chromium: `make browser`"),
]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    save_brightness_model(root, "cells")
    model, patch = volume_model()
    densecnn.save(model, root / "stack", patch_size=patch)
    server = Server(root, tmp_path_factory.mktemp("log") / "server.log", default_model="cells")
    yield server, root
    server.stop()


@pytest.fixture(scope="module")
def page(served):
    with chromium_page(30_000, viewport={"width": 1280, "height": 800}) as page:
        yield page


def test_upload_shows_overlay_legend_and_counts(served, page, tmp_path):
    server, root = served
    image = blobs(120, 160, seed=11)
    path = tmp_path / "blobs.png"
    path.write_bytes(encode(image))

    page.goto(server.url + "/")
    page.wait_for_selector("#model:not([disabled])")
    assert page.input_value("#model") == "cells"
    assert "3 classes" in page.inner_text("#model-info")
    page.set_input_files("#file", str(path))
    page.wait_for_selector("#result:not([hidden])")
    page.wait_for_function("document.getElementById('overlay-image').naturalWidth > 0")

    # the overlay the page shows is the service's overlay of this image
    src = page.get_attribute("#overlay-image", "src")
    assert src.startswith("data:image/png;base64,")
    api_overlay = httpx.post(
        f"{server.url}/v1/models/cells/segment",
        params={"view": "overlay"},
        files={"image": ("b.png", path.read_bytes())},
    ).content
    assert base64.b64decode(src.split(",", 1)[1]) == api_overlay
    assert page.evaluate("document.getElementById('overlay-image').naturalWidth") == 160
    assert (
        page.evaluate("document.getElementById('input-image').naturalWidth") == 160
    )  # the image, side by side

    rows = page.locator("#legend tbody tr")
    assert rows.count() == 3
    names = [rows.nth(k).locator("td").nth(1).inner_text() for k in range(3)]
    counts = [int(rows.nth(k).locator("td").nth(2).inner_text().replace(",", "")) for k in range(3)]
    assert names == CLASS_NAMES
    answer = httpx.post(f"{server.url}/v1/models/cells/segment", headers={"accept": "application/json"},
                        files={"image": ("b.png", path.read_bytes())}).json()  # fmt: skip
    assert counts == answer["pixel_counts"]  # the page shows the service's answer
    labels = np.asarray(Image.open(io.BytesIO(base64.b64decode(answer["labels_png_base64"]))))
    assert_library_labels(labels, root / "cells", path.read_bytes())
    status = page.inner_text("#status")
    assert "Server time" in status and "160×120" in status
    assert page.is_hidden("#error")
    page.screenshot(path=str(tmp_path / "page.png"), full_page=True)
    assert (tmp_path / "page.png").stat().st_size > 10_000


def test_errors_are_shown_in_words(served, page, tmp_path):
    server, _ = served
    text = tmp_path / "notes.txt"
    text.write_text("this is not an image\n")
    page.goto(server.url + "/")
    page.wait_for_selector("#model:not([disabled])")
    page.set_input_files("#file", str(text))
    page.wait_for_selector("#error:not([hidden])")
    message = page.inner_text("#error")
    assert "not an image" in message and "415" in message
    page.screenshot(path=str(tmp_path / "error.png"))


def test_a_volume_model_is_described_and_sent_to_the_api(served, page, tmp_path):
    server, _ = served
    path = tmp_path / "blobs.png"
    path.write_bytes(encode(blobs(40, 40)))
    page.goto(server.url + "/")
    page.wait_for_selector("#model:not([disabled])")
    page.select_option("#model", "stack")
    assert "patch 5×14×14" in page.inner_text("#model-info")
    assert "volume model" in page.inner_text("#model-info")
    page.set_input_files("#file", str(path))
    page.wait_for_selector("#error:not([hidden])")
    assert "multi-page TIFF or .npy) to the API" in page.inner_text("#error")


def test_the_label_map_downloads_and_a_new_model_clears_what_the_last_one_showed(served, page, tmp_path):
    server, root = served
    path = tmp_path / "cells.png"
    path.write_bytes(encode(blobs(50, 70, seed=2)))
    page.goto(server.url + "/")
    page.wait_for_selector("#model:not([disabled])")
    page.select_option("#model", "cells")
    page.set_input_files("#file", str(path))
    page.wait_for_selector("#result:not([hidden])")
    with page.expect_download() as download:
        page.click("#download")
    assert download.value.suggested_filename == "cells-labels.png"
    labels = np.asarray(Image.open(download.value.path()))
    assert_library_labels(labels, root / "cells", path.read_bytes())  # the map itself, not a picture of it

    page.select_option("#model", "stack")  # a volume model: the upload is refused with an error
    page.set_input_files("#file", str(path))
    page.wait_for_selector("#error:not([hidden])")
    page.select_option("#model", "cells")
    assert page.is_hidden("#error") and page.is_hidden("#result")  # nothing stale stays on the page


def test_the_api_docs_render_without_the_internet(served, page):
    server, _ = (
        served  # this machine reaches no CDN: the page renders from the service's own assets or not at all
    )
    page.goto(server.url + "/docs")
    page.wait_for_selector(".opblock")  # Swagger UI drew the operations
    assert "/v1/models/{name}/segment" in page.inner_text("body")
