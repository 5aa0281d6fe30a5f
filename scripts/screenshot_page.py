"""Screenshot of the web page after an upload, for the README (needs Debian's chromium: `make browser`).

.venv/bin/python scripts/screenshot_page.py --image nuclei.png --out docs/images/service_page.png
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from local_server import REPO, running_server
from playwright.sync_api import sync_playwright

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model-dir", type=Path, default=REPO / "models")
    parser.add_argument("--model", help="model to select (default: the server's default)")
    parser.add_argument("--image", type=Path, required=True)
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "images" / "service_page.png")
    args = parser.parse_args()

    with running_server(args.model_dir) as (url, _), sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 760})
        page.goto(url + "/")
        page.wait_for_selector("#model:not([disabled])")
        if args.model:
            page.select_option("#model", args.model)
        page.set_input_files("#file", str(args.image))
        page.wait_for_selector("#result:not([hidden])", timeout=120_000)
        page.wait_for_function("document.getElementById('overlay-image').naturalWidth > 0")
        args.out.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(args.out), full_page=True)
        browser.close()
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
