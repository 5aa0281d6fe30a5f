"""The jobs panel of the page in a real browser (Debian's chromium): submit an upload, watch its progress bar fill,
download its labels; cancel a running job and delete it."""

from __future__ import annotations

import json
import shutil

import httpx
import numpy as np
import pytest
import tifffile
from PIL import Image

from tests.app_support import Server, blobs, save_brightness_model
from tests.jobs_support import reference_labels, write_zarr
from tests.service.test_browser import chromium_page

pytest.importorskip("playwright.sync_api")
pytest.importorskip("sqlalchemy")
pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.xdist_group("browser"),
    pytest.mark.skipif(shutil.which("chromium") is None, reason="needs Debian's chromium: `make browser`"),
]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    save_brightness_model(root, "cells")
    data = tmp_path_factory.mktemp("data")
    write_zarr(data / "big.zarr", 384, 384, chunks=16)  # 576 chunks: long enough to cancel
    server = Server(root, tmp_path_factory.mktemp("log") / "server.log", default_model="cells",
                    data_dir=tmp_path_factory.mktemp("service"), data_roots=json.dumps([str(data)]),
                    job_block=16, job_poll_seconds=0.5)  # fmt: skip
    yield server, root
    server.stop()


@pytest.fixture(scope="module")
def page(served):
    with chromium_page(60_000, viewport={"width": 1280, "height": 900}, accept_downloads=True) as page:
        yield page


def test_an_uploaded_job_shows_its_progress_and_downloads_its_labels(served, page, tmp_path):
    server, root = served
    pixels = blobs(120, 100, seed=4)
    path = tmp_path / "field.tif"
    tifffile.imwrite(path, pixels, tile=(16, 16))
    page.goto(server.url + "/")
    page.wait_for_selector("#model:not([disabled])")
    page.set_input_files("#job-file", str(path))
    row = page.locator("#job-table tbody tr", has_text="field.tif")
    row.locator("td.state", has_text="succeeded").wait_for()
    assert row.locator("progress").evaluate("bar => bar.value === bar.max")
    with page.expect_download() as download:
        row.locator("button", has_text="Download PNG").click()
    saved = tmp_path / "labels.png"
    download.value.save_as(saved)
    np.testing.assert_array_equal(np.asarray(Image.open(saved)), reference_labels(root / "cells", pixels))
    assert page.is_hidden("#job-error")
    page.screenshot(path=str(tmp_path / "jobs.png"), full_page=True)


def test_a_running_job_is_cancelled_from_the_page(served, page):
    server, _ = served
    job = httpx.post(
        f"{server.url}/v1/jobs", json={"model": "cells", "input": "big.zarr", "chunk": 16}
    ).json()
    page.goto(server.url + "/")
    row = page.locator(f"#job-table tbody tr[data-job='{job['id']}']")
    row.locator("button", has_text="Cancel").click()
    row.locator("td.state", has_text="cancelled").wait_for()
    final = httpx.get(f"{server.url}/v1/jobs/{job['id']}").json()
    assert final["state"] == "cancelled" and final["progress"]["blocks_done"] < 576
    row.locator("button", has_text="Delete").click()
    row.wait_for(state="detached")
    assert httpx.get(f"{server.url}/v1/jobs/{job['id']}").status_code == 404
