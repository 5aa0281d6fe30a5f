"""Screenshots of napari for docs/napari.md: the densecnn widget after it labelled the nuclei sample, or a Train
panel session (strokes painted on the sample, a new model trained on them, its live labels). Headless on Xvfb
(`make qt-libs` installs it): Qt's offscreen platform has no OpenGL for napari's canvas.

xvfb-run -a -s "-screen 0 1600x1000x24" .venv/bin/python scripts/napari_screenshot.py --out docs/images/napari_widget.png
xvfb-run -a -s "-screen 0 1600x1000x24" .venv/bin/python scripts/napari_screenshot.py --train \
    --out docs/images/napari_training.png
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import napari
import numpy as np
import torch
from qtpy.QtWidgets import QApplication
from scipy import ndimage

import densecnn
from densecnn.napari.train_panel import TrainPanel
from densecnn.napari.widget import DenseCNNWidget

REPO = Path(__file__).resolve().parents[1]


def wait_for(widget, seconds: float = 300) -> bool:
    """Turn the event loop until the widget's worker is done; False if it is still running after ``seconds``."""
    deadline = time.monotonic() + seconds
    while widget.worker is not None and time.monotonic() < deadline:
        QApplication.processEvents()
        time.sleep(0.02)
    return widget.worker is None


def label_session(viewer, args) -> str | None:
    """The widget labels the sample; returns its status line, or None if the run did not finish."""
    (image,) = viewer.open_sample("densecnn", "nuclei")
    widget = DenseCNNWidget(viewer)
    viewer.window.add_dock_widget(widget, name="Label with densecnn", area="right")
    widget._model.value = args.model
    widget._image.reset_choices()
    widget._image.value = image
    widget._max_memory.value = args.max_memory_mib
    widget.run()
    if not wait_for(widget) or len(viewer.layers) < 2:
        return None
    viewer.layers[-1].opacity = 0.6
    return widget._status.value


def strokes_on(image: np.ndarray, model: Path) -> np.ndarray:
    """Strokes a user might paint on the nuclei sample: 3-pixel-wide stretches of every 48th row, value 2 inside the
    nuclei the shipped model finds (its class "nucleus", 3 pixels in from their edges), value 1 on the background
    away from them, 0 elsewhere."""
    loaded = densecnn.load(model)
    x = loaded.normalize(torch.from_numpy(image / 255.0)[None, None].float())  # (1, 1, H, W)
    classes = loaded.dense().predict(x)[0].numpy()  # (H, W)
    nucleus = ndimage.binary_erosion(classes == 1, iterations=3)
    background = ndimage.binary_erosion(classes == 0, iterations=6)
    strokes = np.zeros(image.shape, np.uint8)
    rows = np.zeros(image.shape, bool)
    for row in range(24, image.shape[0], 48):
        rows[row - 1 : row + 2] = True
    strokes[rows & background] = 1
    strokes[rows & nucleus] = 2
    return strokes


def train_session(viewer, args) -> str | None:
    """The Train panel trains a new model on strokes painted on the sample; returns its status line."""
    (image,) = viewer.open_sample("densecnn", "nuclei")
    strokes = viewer.add_labels(strokes_on(image.data, args.model), name="strokes")
    panel = TrainPanel(viewer)
    viewer.window.add_dock_widget(panel, name="Train with densecnn", area="right")
    panel._image.reset_choices()
    panel._strokes.reset_choices()
    panel._image.value, panel._strokes.value = image, strokes
    panel._classes.value = "background #5078ff, nucleus #3cc85a"
    panel._max_seconds.value = args.train_seconds
    panel.train()
    if not wait_for(panel, args.train_seconds + 300) or f"{image.name} live" not in viewer.layers:
        return None
    viewer.layers.move(
        viewer.layers.index(strokes), len(viewer.layers) - 1
    )  # the strokes over the live labels
    return panel._status.value


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", type=Path, default=REPO / "models" / "nuclei")
    parser.add_argument(
        "--max-memory-mib", type=int, default=64, help="the widget's memory cap (several tiles)"
    )
    parser.add_argument(
        "--train", action="store_true", help="a Train panel session instead of the widget's run"
    )
    parser.add_argument("--train-seconds", type=int, default=90, help="the Train panel's time budget")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "images" / "napari_widget.png")
    args = parser.parse_args()

    viewer = napari.Viewer(title="densecnn")
    viewer.window.resize(1400, 900 if args.train else 820)
    status = train_session(viewer, args) if args.train else label_session(viewer, args)
    if status is None:
        print("the run did not finish", file=sys.stderr)
        return 1
    viewer.reset_view()
    for _ in range(20):  # let the canvas draw the new layer
        QApplication.processEvents()
        time.sleep(0.05)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    viewer.screenshot(str(args.out), canvas_only=False)
    print(f"{args.out}: {status}")
    viewer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
