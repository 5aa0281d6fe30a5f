"""The dock widget: pick a model directory and an image layer, label the layer in a worker thread with a progress
bar counting tiles and a Cancel button, and add the labels (coloured with the model's palette, the class names in
the layer's features) and optionally one probability layer per class.

The work runs in :func:`densecnn.napari.engine.predict_layer` on a napari worker: it reads the layer's pixels one tile
window at a time under the memory cap (the widget's field, in MiB), and Cancel stops it within one tile (at the
next layer of the tile being computed); a cancelled or failed run adds no layer, and a failure's message is the
status line. Closing the widget or the viewer cancels the run.

>>> widget = DenseCNNWidget(viewer)
>>> viewer.window.add_dock_widget(widget)           # or Plugins > densecnn > Label with densecnn
>>> widget.run()                                    # what the Run button does
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from pathlib import Path

import napari
from magicgui.widgets import (
    CheckBox,
    ComboBox,
    Container,
    FileEdit,
    Label,
    LineEdit,
    ProgressBar,
    PushButton,
    SpinBox,
    create_widget,
)
from napari.qt.threading import GeneratorWorker, create_worker
from napari.utils.colormaps import DirectLabelColormap

from ..errors import Cancelled, DenseCNNError, WorkerFailed
from ..io.intensity import Intensity
from ..modelfile import LoadedModel, load
from . import engine
from .models import shipped_models
from .source import LayerSource

MIB = 1 << 20
DEFAULT_MAX_MEMORY_MIB = 2048


def while_open(method: Callable) -> Callable:
    """``method`` of a dock widget (a magicgui Container with a ``_closed`` event, set when its Qt widgets are
    deleted) made to do nothing once they are: a worker's signals still arrive after the widget or viewer closed."""

    @functools.wraps(method)
    def guarded(widget, *args):
        if not widget._closed.is_set():
            method(widget, *args)

    return guarded


class DenseCNNWidget(Container):
    """Label the selected image layer with a densecnn model (see the module's docs).

    Attributes:
        worker: the run in progress, or None.
        last_progress: the last :class:`~densecnn.napari.engine.Progress` reported (tiles done, of total).
    """

    def __init__(self, viewer: napari.viewer.Viewer):
        super().__init__(labels=True)
        self._viewer = viewer
        shipped = shipped_models()
        self._shipped = ComboBox(label="shipped model", choices=[(p.name, p) for p in shipped], nullable=True)
        self._model = FileEdit(label="model directory", mode="d", value=shipped[0] if shipped else None)
        self._image = create_widget(annotation=napari.layers.Image, label="image")
        self._max_memory = SpinBox(label="memory cap (MiB)", min=1, max=1 << 20, value=DEFAULT_MAX_MEMORY_MIB)
        self._probabilities = CheckBox(text="add probabilities", value=False)
        self._intensity = LineEdit(label="intensity", value="")  # empty: as the model declares
        self._intensity.tooltip = (
            "dtype, range:LOW,HIGH or percentiles:LOW,HIGH; empty: as the model declares"
        )
        self._no_data = CheckBox(text=engine.NO_DATA_BOX, value=False)
        self._no_data.tooltip = (
            "unticked: an image holding NaN or infinite values is refused; ticked: every pixel whose patch reads "
            "one gets the no-data label (255, or 65535 past 255 classes), drawn transparent, and NaN probabilities"
        )
        self._run = PushButton(text="Run")
        self._cancel = PushButton(text="Cancel", enabled=False)
        self._progress = ProgressBar(label="tiles", value=0, min=0, max=1)
        self._status = Label(value="")
        self.extend(
            [
                self._shipped,
                self._model,
                self._image,
                self._max_memory,
                self._probabilities,
                self._intensity,
                self._no_data,
                self._run,
                self._cancel,
                self._progress,
                self._status,
            ]
        )
        self._shipped.value = shipped[0] if shipped else None
        self._shipped.changed.connect(self._pick_shipped)
        self._run.changed.connect(self.run)
        self._cancel.changed.connect(self.cancel)
        self.worker: GeneratorWorker | None = None
        self.last_progress: engine.Progress | None = None
        self._stop = threading.Event()
        self._closed = threading.Event()
        self.native.destroyed.connect(lambda *_: self._close())

    def run(self) -> GeneratorWorker | None:
        """Start labelling the selected layer (the Run button); returns the worker, or None when nothing could
        start (the reason is in the status line)."""
        layer = self._image.value
        if layer is None:
            self._status.value = "no image layer: open one (File > Open Sample > densecnn > Nuclei)"
            return None
        self._stop = threading.Event()
        self.last_progress = None
        self.worker = create_worker(
            _job,
            Path(self._model.value),
            layer,
            max_memory=self._max_memory.value * MIB,
            probabilities=self._probabilities.value,
            intensity=self._intensity.value.strip() or None,
            nonfinite="propagate" if self._no_data.value else "refuse",
            cancel=self._stop,
            _ignore_errors=True,  # shown in the status line, not raised again in the main thread
        )
        started = time.perf_counter()
        self.worker.yielded.connect(self._show_progress)
        self.worker.returned.connect(
            lambda done: self._finished_run(layer, done, time.perf_counter() - started)
        )
        self.worker.errored.connect(self._show_error)
        self.worker.finished.connect(self._finish)
        self._run.enabled, self._cancel.enabled = False, True
        self._status.value = f"labelling {layer.name} with {Path(self._model.value).name} ..."
        self.worker.start()
        return self.worker

    def cancel(self) -> None:
        """Stop the run within one tile (the Cancel button): no layer is added."""
        self._stop.set()
        if self.worker is not None:
            self.worker.quit()

    def _close(self) -> None:
        """The widget's Qt widgets are deleted (its dock widget or the viewer closed): cancel the run, whose signals
        then touch nothing."""
        self._closed.set()
        self.cancel()

    def _pick_shipped(self, path: Path | None) -> None:
        if path is not None:
            self._model.value = path

    @while_open
    def _show_progress(self, progress: engine.Progress) -> None:
        self.last_progress = progress
        self._progress.max = max(progress.total, 1)
        self._progress.value = progress.done

    @while_open
    def _finished_run(self, image, done: tuple | None, seconds: float) -> None:
        if done is not None:  # None: cancelled
            self._add_layers(image, *done, seconds)

    def _add_layers(
        self, image, loaded: LoadedModel, source: LayerSource, result: engine.Result, seconds: float
    ):
        translate = [t for a, t in enumerate(image.translate) if a != source.channel_axis]
        model = loaded.path.name
        self._viewer.add_labels(
            result.labels,
            name=f"{image.name} labels ({model})",
            scale=source.scale,
            translate=translate,
            colormap=palette_colormap(loaded.palette),
            features={"index": list(range(loaded.num_classes)), "class": list(loaded.class_names)},
        )
        if result.probabilities is not None:
            for probabilities, class_name in zip(result.probabilities, loaded.class_names):
                self._viewer.add_image(
                    probabilities,
                    name=f"{image.name} p({class_name}) ({model})",
                    scale=source.scale,
                    translate=translate,
                    contrast_limits=(0.0, 1.0),
                    blending="additive",
                    visible=False,
                )
        tiles = self.last_progress.total if self.last_progress else 0
        shape = "x".join(map(str, source.labels_shape))
        self._status.value = "; ".join(
            [f"labelled {shape} (level {source.level}) in {tiles} tiles, {seconds:.1f} s", *result.warnings]
        )

    @while_open
    def _show_error(self, exc: Exception) -> None:
        if isinstance(exc, DenseCNNError):
            self._status.value = exc.render(engine.napari_option)
        else:
            self._status.value = f"failed: {type(exc).__name__}: {exc}"

    @while_open
    def _finish(self) -> None:
        if self._stop.is_set():
            progress = self.last_progress or engine.Progress(0, 0)
            self._status.value = f"cancelled after {progress.done} of {progress.total} tiles"
        self._run.enabled, self._cancel.enabled = True, False
        self.worker = None


def palette_colormap(palette: list[list[int]]) -> DirectLabelColormap:
    """Class k drawn in ``palette[k]`` (RGB 0-255); class 0 is napari's background, drawn transparent."""
    colours = {k: [c / 255 for c in rgb] + [1.0] for k, rgb in enumerate(palette)}
    return DirectLabelColormap(color_dict={None: [0.0, 0.0, 0.0, 0.0], **colours})


def _job(model_dir: Path, layer, intensity: str | None, **options):
    """The worker's generator: load the model, pick the layer's pixels, label them (``intensity``: the field's
    text, None: as the model declares); returns what the layers need, or None once cancelled. Raises no
    RuntimeError (see :class:`~densecnn.errors.WorkerFailed`)."""
    try:
        loaded = load(model_dir)
        options["intensity"] = None if intensity is None else Intensity.parse(intensity)
        source = LayerSource.of(
            layer.data,
            rgb=layer.rgb,
            multiscale=layer.multiscale,
            scale=layer.scale,
            spatial_dims=len(loaded.patch_size),
            channels=loaded.in_channels,
            pixel_size=loaded.pixel_size,
            axis_labels=layer.axis_labels,
        )
        result = yield from engine.predict_layer(loaded, source, **options)
    except Cancelled:
        return None
    # torch's and some of densecnn's errors, which superqt drops without any signal
    except RuntimeError as exc:
        raise WorkerFailed.passing_on(exc, "labelling") from exc
    return loaded, source, result
