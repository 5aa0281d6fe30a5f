"""Screenshot of napari after the densecnn widget labelled the nuclei sample, for docs/napari.md. Headless on Xvfb
(`make qt-libs` installs it): Qt's offscreen platform has no OpenGL for napari's canvas.

xvfb-run -a -s "-screen 0 1600x1000x24" .venv/bin/python scripts/napari_screenshot.py --out docs/images/napari_widget.png
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import napari
from qtpy.QtWidgets import QApplication

from densecnn.napari.widget import DenseCNNWidget

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", type=Path, default=REPO / "models" / "nuclei")
    parser.add_argument(
        "--max-memory-mib", type=int, default=64, help="the widget's memory cap (several tiles)"
    )
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "images" / "napari_widget.png")
    args = parser.parse_args()

    viewer = napari.Viewer(title="densecnn")
    viewer.window.resize(1400, 820)
    (image,) = viewer.open_sample("densecnn", "nuclei")
    widget = DenseCNNWidget(viewer)
    viewer.window.add_dock_widget(widget, name="Label with densecnn", area="right")
    widget._model.value = args.model
    widget._image.reset_choices()
    widget._image.value = image
    widget._max_memory.value = args.max_memory_mib
    widget.run()
    deadline = time.monotonic() + 300
    while widget.worker is not None and time.monotonic() < deadline:
        QApplication.processEvents()
        time.sleep(0.02)
    if widget.worker is not None or len(viewer.layers) < 2:
        print(f"the run did not finish: {widget._status.value}", file=sys.stderr)
        return 1
    viewer.layers[-1].opacity = 0.6
    viewer.reset_view()
    for _ in range(20):  # let the canvas draw the new layer
        QApplication.processEvents()
        time.sleep(0.05)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    viewer.screenshot(str(args.out), canvas_only=False)
    print(f"{args.out}: {widget._status.value}")
    viewer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
