"""The Train panel of the dock widget: paint strokes in a Labels layer, train a densecnn model on them in a worker
thread, watch a live layer of its labels refresh every few seconds, add strokes where it is wrong (the run takes
them up from its current weights), save the model directory.

Everything long (reading the windows around the strokes, training steps, live labelling, saving) runs in
:meth:`densecnn.napari.training.TrainingSession.train` on a napari worker; the main thread only copies the strokes'
coordinates and writes the live labels into their layer. Cancel stops the training between two steps (or within a
tile of a live prediction) and keeps the best weights, which the run's last live labels then show. Closing the panel
or the viewer stops the run, its last labelling too.

>>> panel = TrainPanel(viewer)
>>> viewer.window.add_dock_widget(panel)           # or Plugins > densecnn > Train with densecnn
>>> panel.train()                                   # what the Train button does
>>> panel.save("models/my_cells")                   # what Save does (in a worker too)
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import napari
import numpy as np
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
from qtpy.QtCore import QTimer

from ..errors import DenseCNNError, InvalidInputError, WorkerFailed
from ..io.intensity import Intensity
from ..modelfile import LoadedModel, load
from .classes import check_painted, format_classes, fresh_classes, parse_classes
from .models import shipped_models
from .source import LayerSource
from .strokes import StrokeSet, paint_geojson, paint_shapes
from .training import LivePrediction, TrainingSession, TrainingStep, View
from .widget import DEFAULT_MAX_MEMORY_MIB, MIB, palette_colormap, while_open

NEW_MODEL = "new model"
MODEL_DIRECTORY = "model directory below"
STROKES_SETTLE_MS = 300  # strokes are read once painting has paused this long


class TrainPanel(Container):
    """Train a model from strokes (see the module's docs).

    Attributes:
        session: the :class:`~densecnn.napari.training.TrainingSession` being trained, kept between runs.
        worker: the run in progress, or None.
        last_step: the last :class:`~densecnn.napari.training.TrainingStep` reported.
        live_updates: (time.perf_counter(), step, region) of every live prediction written to the live layer.
    """

    def __init__(self, viewer: napari.viewer.Viewer):
        super().__init__(labels=True)
        self._viewer = viewer
        self._image = create_widget(annotation=napari.layers.Image, label="image")
        self._strokes = create_widget(annotation=napari.layers.Labels, label="strokes")
        starts = [
            (NEW_MODEL, NEW_MODEL),
            *((p.name, p) for p in shipped_models()),
            (MODEL_DIRECTORY, MODEL_DIRECTORY),
        ]
        self._start = ComboBox(label="start from", choices=starts, value=NEW_MODEL)
        self._model_dir = FileEdit(label="model directory", mode="d")
        self._channels = SpinBox(label="channels (new model)", min=1, max=64, value=1)
        self._volume = CheckBox(text="3-D model (new model)", value=False)
        self._classes = LineEdit(label="classes", value="")
        self._classes.tooltip = (
            "one 'name #rrggbb' per stroke value 1, 2, ... (empty: from the strokes or the model)"
        )
        self._max_seconds = SpinBox(label="time budget (s)", min=0, max=86400, value=120)
        self._max_memory = SpinBox(label="memory cap (MiB)", min=1, max=1 << 20, value=DEFAULT_MAX_MEMORY_MIB)
        self._train = PushButton(text="Train")
        self._cancel = PushButton(text="Cancel", enabled=False)
        self._progress = ProgressBar(label="steps", value=0, min=0, max=1)
        self._shapes = create_widget(annotation=napari.layers.Shapes, label="shapes")
        self._shape_value = SpinBox(label="shapes' stroke value", min=1, max=255, value=1)
        self._add_shapes = PushButton(text="Add shapes to strokes")
        self._geojson = FileEdit(label="GeoJSON", mode="r", filter="*.geojson *.json")
        self._add_geojson = PushButton(text="Add GeoJSON to strokes")
        self._save_dir = FileEdit(label="save to", mode="d")
        self._save = PushButton(text="Save model")
        self._status = Label(value="")
        self.extend(
            [
                self._image, self._strokes, self._start, self._model_dir, self._channels, self._volume,
                self._classes, self._max_seconds, self._max_memory, self._train, self._cancel, self._progress,
                self._shapes, self._shape_value, self._add_shapes, self._geojson, self._add_geojson, self._save_dir, self._save, self._status,
            ]
        )  # fmt: skip
        self._train.changed.connect(self.train)
        self._cancel.changed.connect(self.cancel)
        self._add_shapes.changed.connect(self.add_shapes)
        self._add_geojson.changed.connect(lambda: self.add_geojson(self._geojson.value))
        self._save.changed.connect(lambda: self.save(self._save_dir.value))
        self._strokes.changed.connect(self._watch_strokes)
        self._classes.changed.connect(self._recolour)
        self.session: TrainingSession | None = None
        self.worker: GeneratorWorker | None = None
        self.last_step: TrainingStep | None = None
        self.live_updates: list[tuple[float, int, tuple[slice, ...]]] = []
        self._key: tuple | None = None
        self._stop = threading.Event()
        self._closed = threading.Event()
        self.native.destroyed.connect(lambda *_: self._close())
        self._watched = None
        self._settle = QTimer()
        self._settle.setSingleShot(True)
        self._settle.setInterval(STROKES_SETTLE_MS)
        self._settle.timeout.connect(self._offer_strokes)

    def train(self) -> GeneratorWorker | None:
        """Start training on the strokes (the Train button), continuing the session's weights when the image,
        strokes layer and starting model are those of its last run; returns the worker, or None when nothing could
        start (the reason is in the status line)."""
        image, strokes_layer = self._image.value, self._strokes.value
        if image is None or strokes_layer is None:
            self._status.value = (
                "choose an image layer and a Labels layer of strokes (Layers > New Labels layer)"
            )
            return None
        try:
            key = (id(image), id(strokes_layer), str(self._start.value), self._model_dir.value,
                   self._channels.value, self._volume.value)  # fmt: skip
            if self.session is None or key != self._key:
                self.session, self._key = self._new_session(image, strokes_layer), key
            strokes = StrokeSet.of(strokes_layer.data, self.session.source, image_shape=_level0_shape(image))
            if len(strokes.values) < 2 and self.session.trainer is None:
                raise InvalidInputError(
                    "the strokes hold fewer than two classes: paint strokes of at least two values (1, 2, ...)"
                )
            if self.session.start is None:
                check_painted(self.session.class_names, strokes.values)
        except DenseCNNError as exc:
            self._status.value = str(exc)
            return None
        self._stop = threading.Event()
        self.session.view = self._shown_view()
        max_seconds = self._max_seconds.value or None
        self.worker = create_worker(
            _train_job, self.session, strokes, stop=self._stop, max_memory=self._max_memory.value * MIB,
            max_seconds=max_seconds, abort=self._closed, _ignore_errors=True,
        )  # fmt: skip
        self.worker.yielded.connect(self._show)
        self.worker.returned.connect(self._trained)
        self.worker.errored.connect(self._show_error)
        self.worker.finished.connect(self._idle)
        self._train.enabled, self._cancel.enabled, self._save.enabled = False, True, False
        self._status.value = f"training on {len(strokes.points)} labelled pixels of {image.name} ..."
        self.worker.start()
        return self.worker

    def cancel(self) -> None:
        """Stop the training between two steps (the Cancel button); the best weights so far are kept, and the run
        ends by labelling the live layer with them."""
        self._stop.set()
        if not self._closed.is_set():
            self._cancel.enabled = False

    def add_shapes(self) -> int:
        """Paint the chosen Shapes layer into the strokes layer (the button); returns the pixels painted."""
        shapes, strokes_layer = self._shapes.value, self._strokes.value
        if shapes is None or strokes_layer is None:
            self._status.value = "choose a Shapes layer and the strokes layer to paint it into"
            return 0
        painted = paint_shapes(shapes, strokes_layer.data, self._shape_value.value)
        strokes_layer.refresh()
        self._strokes_changed()
        self._status.value = f"painted {painted} pixels of {shapes.name} into {strokes_layer.name}"
        return painted

    def add_geojson(self, path) -> int:
        """Paint a QuPath GeoJSON file's annotations into the plane of the strokes layer the viewer shows (the
        button), classes by name: a name of the classes field keeps its value, a new one is added to the field with
        its colour. Returns the pixels painted."""
        strokes_layer = self._strokes.value
        if strokes_layer is None:
            self._status.value = "choose the strokes layer to paint the annotations into"
            return 0
        try:
            names, palette = self._class_list()
            point = strokes_layer.world_to_data(self._viewer.dims.point)
            plane = tuple(int(round(p)) for p in point[: strokes_layer.ndim - 2])
            painted, names, colours = paint_geojson(path, strokes_layer.data[plane], names)
        except DenseCNNError as exc:
            self._status.value = str(exc)
            return 0
        fallback = fresh_classes([len(names)])[1]
        palette += [
            list(c) if c is not None else fallback[k] for k, c in enumerate(colours, start=len(palette))
        ]
        self._classes.value = format_classes(names, palette)
        strokes_layer.refresh()
        self._strokes_changed()
        self._status.value = f"painted {painted} pixels of {Path(path).name} into {strokes_layer.name}"
        return painted

    def save(self, directory) -> GeneratorWorker | None:
        """Write the best model so far to ``directory`` in a worker (the Save button); returns the worker."""
        if self.session is None or self.session.trainer is None:
            self._status.value = "nothing to save yet: train first"
            return None
        try:
            names, palette = self._class_list()
        except DenseCNNError as exc:
            self._status.value = str(exc)
            return None
        self.worker = create_worker(
            self.session.save, Path(directory), class_names=names, palette=palette, _ignore_errors=True
        )
        self.worker.returned.connect(self._saved)
        self.worker.errored.connect(self._show_error)
        self.worker.finished.connect(self._idle)
        self._train.enabled = self._save.enabled = False
        self.worker.start()
        return self.worker

    def _new_session(self, image, strokes_layer) -> TrainingSession:
        start = self._start_model()
        spatial_dims = len(start.patch_size) if start else 3 if self._volume.value else 2
        channels = start.in_channels if start else 3 if image.rgb else self._channels.value
        source = LayerSource.of(
            image.data, rgb=image.rgb, multiscale=image.multiscale, scale=image.scale, spatial_dims=spatial_dims,
            channels=channels, pixel_size=start.pixel_size if start else None, axis_labels=image.axis_labels,
        )  # fmt: skip
        strokes = StrokeSet.of(strokes_layer.data, source, image_shape=_level0_shape(image))
        if not self._classes.value.strip():
            names, palette = (start.class_names, start.palette) if start else fresh_classes(strokes.values)
            self._classes.value = format_classes(names, palette)
        names, _ = self._class_list()
        intensity = start.intensity if start else _intensity_for(image)
        return TrainingSession(source, intensity=intensity, start=start, class_names=names)

    def _start_model(self) -> LoadedModel | None:
        choice = self._start.value
        if choice == NEW_MODEL:
            return None
        return load(self._model_dir.value if choice == MODEL_DIRECTORY else choice)

    def _class_list(self) -> tuple[list[str], list[list[int]]]:
        return parse_classes(self._classes.value)

    def _shown_view(self) -> View:
        """The plane the viewer shows and the box of it on the canvas, in the source's pixels."""
        image, source = self._image.value, self.session.source
        point = np.asarray(image.world_to_data(self._viewer.dims.point))  # level 0, the layer's axes
        level0 = _level0_shape(image)[: len(point)]
        factor = np.array(level0) / np.array(source.array.shape[: len(point)])
        plane = tuple(
            int(np.clip(point[a] / factor[a], 0, source.array.shape[a] - 1)) for a in source.plane_axes
        )
        corners = np.asarray(image.corner_pixels, dtype=float)  # (2, ndim) in the displayed level's pixels
        shown = image.data_level if image.multiscale else 0
        shown_factor = (
            np.array(level0) / np.array(image.data[shown].shape[: len(point)]) if image.multiscale else 1
        )
        corners = corners * shown_factor / factor  # the source's level
        region = []
        for axis, n in zip(source.spatial_axes, source.spatial_shape):
            lo, hi = int(max(0, np.floor(corners[0, axis]))), int(min(n, np.ceil(corners[1, axis]) + 1))
            region.append(slice(lo, hi) if hi > lo else slice(0, n))
        return View(plane, tuple(region))

    @while_open
    def _show(self, update) -> None:
        if isinstance(update, TrainingStep):
            self.last_step = update
            self._progress.max, self._progress.value = max(update.total_steps, 1), update.step
            best = "" if update.best_val_miou is None else f", held-out mIoU {update.best_val_miou:.3f}"
            self._status.value = f"step {update.step}/{update.total_steps}, loss {update.loss:.3f}{best}"
            self.session.view = self._shown_view()
        elif isinstance(update, LivePrediction):
            layer = self._live_layer()
            if self.session.labels_whole_planes:
                layer.data[(*update.plane, *update.region)] = update.labels
                layer.refresh()
            else:  # the layer holds the last region's labels only, placed where they belong
                layer.data = update.labels.reshape((1,) * len(update.plane) + update.labels.shape)
                starts = (*update.plane, *(s.start for s in update.region))
                layer.translate = [t + o * s for t, o, s in zip(self._image_translate(), starts, layer.scale)]
            self.live_updates.append((time.perf_counter(), update.step, update.region))

    def _live_layer(self) -> napari.layers.Labels:
        image, source = self._image.value, self.session.source
        name = f"{image.name} live"
        if name in self._viewer.layers:
            return self._viewer.layers[name]
        _, palette = self._class_list()
        shape = source.labels_shape if self.session.labels_whole_planes else (1,) * len(source.labels_shape)
        return self._viewer.add_labels(
            np.zeros(shape, np.uint8 if len(palette) <= 256 else np.uint16),
            name=name,
            scale=source.scale,
            translate=self._image_translate(),
            colormap=palette_colormap(palette),
            opacity=0.5,
        )

    def _image_translate(self) -> list[float]:
        """The image layer's translation along the labels' axes (its channel axis left out)."""
        channel_axis = self.session.source.channel_axis
        return [t for a, t in enumerate(self._image.value.translate) if a != channel_axis]

    def _recolour(self) -> None:
        """The classes field's colours on the strokes layer (value v: class v-1) and the live layer."""
        try:
            _, palette = self._class_list()
        except DenseCNNError:
            return  # still being typed
        strokes_layer = self._strokes.value
        if strokes_layer is not None and palette:
            strokes_layer.colormap = stroke_colormap(palette)
        if self._image.value is not None and f"{self._image.value.name} live" in self._viewer.layers:
            self._viewer.layers[f"{self._image.value.name} live"].colormap = palette_colormap(palette)

    def _watch_strokes(self, layer) -> None:
        if self._watched is not None:
            for event in (self._watched.events.paint, self._watched.events.data):
                event.disconnect(self._strokes_changed)
        self._watched = layer
        if layer is not None:
            layer.events.paint.connect(self._strokes_changed)
            layer.events.data.connect(self._strokes_changed)
            self._recolour()

    @while_open
    def _strokes_changed(self, event=None) -> None:
        if self.worker is not None and self.session is not None:
            self._settle.start()  # read once painting pauses

    @while_open
    def _offer_strokes(self) -> None:
        if self.worker is None or self.session is None or self._strokes.value is None:
            return
        try:
            strokes = StrokeSet.of(
                self._strokes.value.data, self.session.source, image_shape=_level0_shape(self._image.value)
            )
        except DenseCNNError as exc:
            self._status.value = str(exc)
            return
        self.session.offer(strokes)

    @while_open
    def _show_error(self, exc: Exception) -> None:
        if isinstance(exc, DenseCNNError):
            self._status.value = str(exc)
        else:
            self._status.value = f"failed: {type(exc).__name__}: {exc}"

    @while_open
    def _saved(self, path: Path) -> None:
        self._status.value = f"saved the model to {path}"

    @while_open
    def _trained(self, _=None) -> None:
        """A run ended without an error: say so when Cancel ended it (the last step's status stands otherwise)."""
        if self._stop.is_set():
            trainer = self.session.trainer
            kept = "" if trainer.best_val_miou is None else f" (held-out mIoU {trainer.best_val_miou:.3f})"
            self._status.value = f"cancelled after step {trainer.step}; the best weights are kept{kept}"

    @while_open
    def _idle(self) -> None:
        """No run or save under way: the buttons as they start one."""
        self._train.enabled, self._cancel.enabled, self._save.enabled = True, False, True
        self.worker = None

    def _close(self) -> None:
        """The panel's Qt widgets are deleted (its dock widget or the viewer closed): stop the run, its last
        labelling too, whose signals then touch nothing, and stop watching the strokes."""
        self._closed.set()
        self.cancel()
        self._settle.stop()
        self._watch_strokes(None)


def _train_job(session: TrainingSession, strokes: StrokeSet, **options):
    """The worker's generator: the session's steps and live predictions."""
    try:
        yield from session.train(strokes, **options)
    except RuntimeError as exc:  # torch's errors are RuntimeErrors, which superqt drops without any signal
        raise WorkerFailed.passing_on(exc, "training") from exc


def stroke_colormap(palette: list[list[int]]) -> DirectLabelColormap:
    """Stroke value v drawn in ``palette[v - 1]`` (class v-1's colour, RGB 0-255); 0 (unlabelled) transparent."""
    colours = {v: [c / 255 for c in rgb] + [1.0] for v, rgb in enumerate(palette, start=1)}
    return DirectLabelColormap(color_dict={None: [0.0, 0.0, 0.0, 0.0], 0: [0.0, 0.0, 0.0, 0.0], **colours})


def _level0_shape(image) -> tuple[int, ...]:
    """The image layer's full-resolution shape (colours included)."""
    return tuple((image.data[0] if image.multiscale else image.data).shape)


def _intensity_for(image) -> Intensity:
    """A new model's input scaling: by the dtype's range when the layer's pixels fill enough of it (8-bit images,
    floats in [0, 1]), otherwise its 1st to 99.8th percentiles."""
    level = image.data[-1] if image.multiscale else image.data  # the smallest level: a sample of the pixels
    sample = np.asarray(level[tuple(slice(None, None, max(1, n // 256)) for n in level.shape)])
    try:
        Intensity().scaling(sample)
    except DenseCNNError:
        return Intensity("percentiles", 1, 99.8)
    return Intensity()
