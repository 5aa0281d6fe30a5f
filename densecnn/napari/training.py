"""Interactive training behind the Train panel, as generators a napari worker thread runs (no Qt here).

A :class:`TrainingSession` trains a :class:`densecnn.train.strokes.StrokeTrainer` on the windows around a layer's
strokes (:mod:`~densecnn.napari.strokes`) and, whenever its best weights changed (at most every
:data:`REFRESH_SECONDS`), labels the region the viewer shows and then the rest of its plane with them (the best on
the held-out strokes, the ones Save writes); while a head on fixed layers trains, a plane that trains whole is
relabelled from the features training keeps. However training ended (its schedule, its time, a stop, a failure),
the run then labels the view from the pixels with the weights Save writes. Strokes added while it trains are taken up
between two steps: the run continues from the current weights on the new strokes.

>>> session = TrainingSession(source, intensity=Intensity(), start=None, class_names=["background", "cell"])
>>> for update in session.train(strokes, stop=threading.Event(), max_memory=1 << 30):
...     update                      # TrainingStep(step=1, total_steps=150, ...), LivePrediction(...), ...
>>> session.save("models/my_cells", palette=[[0, 0, 0], [255, 0, 0]])
PosixPath('models/my_cells')
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import Cancelled, DenseCNNError
from ..io.intensity import Intensity
from ..modelfile import LoadedModel
from ..padding import dense_padding
from ..train.strokes import StrokeTrainer
from . import engine
from .source import LayerSource
from .strokes import UNLABELLED, WHOLE_PLANE_PIXELS, StrokeSet, plane_scaling, training_windows

REFRESH_SECONDS = 2.0  # the least time between two live predictions while training
# the least time between two steps reported (validations and a run's last step always are)
REPORT_SECONDS = 0.1
LIVE_PLANE_PIXELS = 4096 * 4096  # a plane up to this size is labelled whole after its visible region


@dataclass(frozen=True)
class TrainingStep:
    """One training step: ``loss`` of its labelled pixels, ``val_miou`` of the held-out strokes when it validated
    (else None), the best so far, and the seconds since Train."""

    step: int
    total_steps: int
    loss: float
    val_miou: float | None
    best_val_miou: float | None
    seconds: float


@dataclass(frozen=True)
class View:
    """What the viewer shows: a plane of the source and a box of it (a slice per spatial axis)."""

    plane: tuple[int, ...]
    region: tuple[slice, ...]


@dataclass(frozen=True)
class LivePrediction:
    """The labels (class ids, the region's shape) of ``region`` of ``plane`` by the best weights, those after
    ``step``."""

    plane: tuple[int, ...]
    region: tuple[slice, ...]
    labels: np.ndarray
    step: int


class TrainingSession:
    """Strokes -> a model, continued over several runs (see the module's docs).

    Args:
        source: the image layer's pixels as the model reads them.
        intensity: how its raw values are scaled to [0, 1] (a fine-tuned model's own rule).
        start: the model to fine-tune, or None for a new one (the default recipe's net for the channels and axes).
        class_names: one per class (their number is the new model's number of classes).
        seed: the trainer's seed.

    Attributes:
        view: the region the next live prediction labels first (the widget keeps it up to date).
        best_step: the step after which the best weights so far were taken.
        trainer: the :class:`StrokeTrainer`, once :meth:`train` has read the strokes.
    """

    def __init__(
        self,
        source: LayerSource,
        *,
        intensity: Intensity,
        start: LoadedModel | None,
        class_names: list[str],
        seed: int = 0,
    ):
        self.source, self.intensity, self.start = source, intensity, start
        self.class_names, self.seed = list(class_names), seed
        self.channels = start.in_channels if start is not None else _layer_channels(source)
        self.view = View(next(source.planes()), tuple(slice(0, n) for n in source.spatial_shape))
        self.trainer: StrokeTrainer | None = None
        self.best_step = 0
        self._pending: StrokeSet | None = None
        self._lock = threading.Lock()
        self._scalings: dict[tuple[int, ...], Intensity] = {}
        self._whole_planes: dict[tuple[int, ...], int] = {}

    def offer(self, strokes: StrokeSet) -> None:
        """New strokes (from the main thread): the run under way takes them up after its current step."""
        with self._lock:
            self._pending = strokes

    def train(
        self,
        strokes: StrokeSet,
        *,
        stop: threading.Event,
        max_memory: int,
        max_seconds: float | None = None,
        refresh_seconds: float = REFRESH_SECONDS,
        abort: threading.Event | None = None,
    ) -> Iterator[TrainingStep | LivePrediction]:
        """Train on ``strokes`` (continuing from the current weights after a first run), yielding its steps (at most
        every :data:`REPORT_SECONDS`, and every validation and last step of a schedule) and the live predictions of
        :meth:`predict` whenever the best weights or the view changed, at most every ``refresh_seconds``; training
        ends when the schedule or early stopping ends it, ``max_seconds`` pass, ``stop`` is set (between two steps,
        or within a tile of a prediction) or it fails (a diverged run, strokes refused). Strokes :meth:`offer`-ed
        meanwhile restart the schedule on them from the current weights.

        Whatever ended training, the run ends with a :meth:`predict` of the view by the weights :meth:`save` writes,
        so the last live labels are the saved model's; only ``abort`` (the panel was closed) stops that too."""
        abort = abort or threading.Event()
        self._read(strokes)
        try:
            yield from self._steps(
                stop=stop, max_memory=max_memory, max_seconds=max_seconds, refresh_seconds=refresh_seconds
            )
        except DenseCNNError:  # the weights kept, as Save writes them, labelled before the error goes on
            yield from self.predict(stop=abort, max_memory=max_memory)
            raise
        yield from self.predict(stop=abort, max_memory=max_memory)

    def _steps(
        self, *, stop: threading.Event, max_memory: int, max_seconds: float | None, refresh_seconds: float
    ) -> Iterator[TrainingStep | LivePrediction]:
        """The training of :meth:`train` once its strokes are read, up to its last prediction."""
        started = refreshed = time.monotonic()
        reported = -math.inf
        shown = (self.best_step, self.view)  # what the live labels show: the weights' step and the view
        while not stop.is_set():
            left = None if max_seconds is None else max(0.0, max_seconds - (time.monotonic() - started))
            for progress in self.trainer.run(max_seconds=left, stop=stop):
                now = time.monotonic()
                last = progress.val_miou is not None or progress.step == progress.total_steps
                if last or now - reported >= REPORT_SECONDS:  # steps of a millisecond: not each to the UI
                    reported = now
                    yield TrainingStep(
                        progress.step, progress.total_steps, progress.loss, progress.val_miou,
                        progress.best_val_miou, now - started,
                    )  # fmt: skip
                if not self.trainer.has_val or progress.val_miou == progress.best_val_miou:
                    # new best weights (each step's when no strokes are held out)
                    self.best_step = progress.step
                if (self.best_step, self.view) != shown and time.monotonic() - refreshed >= refresh_seconds:
                    shown = (self.best_step, self.view)
                    yield from self.predict(stop=stop, max_memory=max_memory, preview=True)
                    refreshed = time.monotonic()
                if self._has_pending():
                    break
            if not self._has_pending():
                break
            with self._lock:
                strokes, self._pending = self._pending, None
            self._read(strokes)

    def predict(
        self, *, stop: threading.Event, max_memory: int, preview: bool = False
    ) -> Iterator[LivePrediction]:
        """Label :attr:`view` (its centre, up to :data:`LIVE_PLANE_PIXELS` pixels) with the best weights so far, then
        its whole plane when that has at most :data:`LIVE_PLANE_PIXELS` pixels; each region's labels equal those of
        its whole plane (the window read around it holds the receptive field, the plane's scaling is the one
        training used). Nothing once ``stop`` is set.

        A ``preview`` (while training) of a plane that trains whole labels it from the features training keeps
        (:meth:`StrokeTrainer.preview_labels`: the head alone, equal to the dense net's labels up to float
        rounding) where the net is a head on fixed layers."""
        whole = tuple(slice(0, n) for n in self.source.spatial_shape)
        index = self._whole_planes.get(self.view.plane)
        labels = self.trainer.preview_labels(index) if preview and index is not None else None
        if labels is not None:
            yield LivePrediction(self.view.plane, whole, labels, self.best_step)
            return
        view, loaded = self.view, self.model()
        regions = [_centre(view.region, LIVE_PLANE_PIXELS)]
        if view.region != whole and self.labels_whole_planes:
            regions.append(whole)
        for region in regions:
            try:
                labels = self._label_region(loaded, view.plane, region, stop=stop, max_memory=max_memory)
            except Cancelled:
                return
            if stop.is_set():
                return
            yield LivePrediction(view.plane, region, labels, self.best_step)

    @property
    def labels_whole_planes(self) -> bool:
        """Whether live predictions cover whole planes (planes of at most :data:`LIVE_PLANE_PIXELS` pixels), or only
        the region on the canvas."""
        return math.prod(self.source.spatial_shape) <= LIVE_PLANE_PIXELS

    def model(self) -> LoadedModel:
        """The best weights so far with the metadata Save writes (a copy: training goes on without touching it)."""
        return dataclasses.replace(self.trainer.loaded, model=self.trainer.model)

    def save(self, directory, *, class_names: list[str] | None = None, palette=None) -> Path:
        """Write the best weights to the model directory ``directory`` (``densecnn predict``, the service and the
        bioimage.io export read it)."""
        return self.trainer.save(directory, class_names=class_names, palette=palette)

    def _has_pending(self) -> bool:
        with self._lock:
            return self._pending is not None

    def _read(self, strokes: StrokeSet) -> None:
        """The windows around ``strokes`` -> a new trainer, or the current one's new labels."""
        images, labels, planes = training_windows(
            self.source, strokes, self.intensity, channels=self.channels
        )
        # planes trained whole (one window each): their training image's index
        whole = math.prod(self.source.spatial_shape) <= WHOLE_PLANE_PIXELS
        self._whole_planes = {plane: n for n, plane in enumerate(planes)} if whole else {}
        if self.trainer is None:
            self.trainer = StrokeTrainer(
                images, labels, unlabelled=UNLABELLED, model=self.start, class_names=self.class_names,
                seed=self.seed,
            )  # fmt: skip
            self.trainer.loaded.intensity = self.intensity  # the saved model scales pixels as training did
        else:
            self.trainer.set_labels(images, labels, unlabelled=UNLABELLED)
        self.best_step = self.trainer.step  # the best weights are the current ones until a step or validation

    def _label_region(self, loaded, plane, region, *, stop, max_memory) -> np.ndarray:
        """The labels of ``region`` of ``plane``: its window widened by the receptive field (clipped to the plane,
        whose border the model pads as it pads the whole plane) labelled, then cut back to ``region``."""
        dense = loaded.dense()
        before, after = dense_padding(dense.patch_size, dense.receptive_field)
        spans = [
            (max(0, s.start - b), min(n, s.stop + a))
            for s, b, a, n in zip(region, before, after, self.source.spatial_shape)
        ]
        window = _Window.of(self.source, plane, spans)
        steps = engine.predict_layer(
            loaded, window, max_memory=max_memory, intensity=self._plane_range(plane), cancel=stop
        )
        result = _drain(steps)
        inner = tuple(slice(s.start - lo, s.stop - lo) for s, (lo, _) in zip(region, spans))
        return result.labels[(0,) * len(plane) + inner]

    def _plane_range(self, plane: tuple[int, ...]) -> Intensity:
        """The plane's scaling as a fixed range, so that a region is scaled as its whole plane."""
        if plane not in self._scalings:
            scaling = plane_scaling(self.intensity, self.source, plane)
            self._scalings[plane] = Intensity("range", scaling.low, scaling.high)
        return self._scalings[plane]


def _centre(region: tuple[slice, ...], pixels: int) -> tuple[slice, ...]:
    """``region`` shrunk about its centre, by the same factor along every axis, to at most ``pixels`` pixels."""
    sizes = [s.stop - s.start for s in region]
    if math.prod(sizes) <= pixels:
        return region
    factor = (pixels / math.prod(sizes)) ** (1 / len(sizes))
    kept = [max(1, int(n * factor)) for n in sizes]
    return tuple(
        slice(s.start + (n - k) // 2, s.start + (n - k) // 2 + k) for s, n, k in zip(region, sizes, kept)
    )


def _layer_channels(source: LayerSource) -> int:
    """The channels a new model takes from the layer: its colours (RGB), its channel axis, or one."""
    if source.rgb:
        return source.array.shape[-1]
    return source.array.shape[source.channel_axis] if source.channel_axis is not None else 1


def _drain(steps):
    """Run a labelling generator to its end; its return value."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value


class _Window:
    """A lazy window of a layer's array: each plane axis one index, each spatial axis a span; indexing it reads only
    the pixels asked for from the array underneath (numpy, dask or zarr)."""

    def __init__(self, array, spans: tuple[slice, ...]):
        self.array, self.spans = array, spans
        self.shape = tuple(len(range(*s.indices(n))) for s, n in zip(spans, array.shape))
        self.dtype, self.ndim = array.dtype, len(self.shape)

    @classmethod
    def of(cls, source: LayerSource, plane: tuple[int, ...], spans) -> LayerSource:
        """``source`` restricted to one plane (kept as axes of length 1) and ``spans`` ([start, stop) per spatial
        axis)."""
        axes = [slice(None)] * source.array.ndim
        for axis, index in zip(source.plane_axes, plane):
            axes[axis] = slice(index, index + 1)
        for axis, (start, stop) in zip(source.spatial_axes, spans):
            axes[axis] = slice(start, stop)
        return dataclasses.replace(source, array=cls(source.array, tuple(axes)))

    def __getitem__(self, index: tuple) -> np.ndarray:
        index = index + (slice(None),) * (self.ndim - len(index))
        outer = []
        for i, s, n in zip(index, self.spans, self.array.shape):
            start = s.indices(n)[0]
            if isinstance(i, slice):
                lo, hi, _ = i.indices(len(range(*s.indices(n))))
                outer.append(slice(start + lo, start + hi))
            else:
                outer.append(start + int(i))
        return self.array[tuple(outer)]
