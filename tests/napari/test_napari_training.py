"""Interactive training in napari: strokes read from Labels and Shapes layers (channel axes, pyramid levels, windows
around the strokes of a large plane), the live labels of a region equal to its whole plane's, and a scripted session
in a real viewer that paints, trains, adds strokes, continues, saves, and labels with the saved model as
``densecnn predict`` does; Cancel stops within one step. The widget tests run on Xvfb (pytest-xvfb); skipped where
the ``napari`` extra or Xvfb is missing."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

napari = pytest.importorskip(
    "napari", reason="napari is not installed: pip install -e '.[napari]' (make venv does)"
)

import densecnn  # noqa: E402
from densecnn.io.intensity import Intensity  # noqa: E402
from densecnn.io.pixels import unit_planes  # noqa: E402
from densecnn.napari import engine  # noqa: E402
from densecnn.napari.classes import check_painted, format_classes, fresh_classes, parse_classes  # noqa: E402
from densecnn.napari.sample import nuclei  # noqa: E402
from densecnn.napari.source import LayerSource  # noqa: E402
from densecnn.napari.strokes import UNLABELLED, WHOLE_PLANE_PIXELS, StrokeSet, training_windows  # noqa: E402
from densecnn.napari.training import TrainingSession, TrainingStep, View  # noqa: E402
from tests.tolerances import assert_labels_equal_except_ties  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]

needs_display = pytest.mark.skipif(
    not os.environ.get("DISPLAY"),
    reason="no X display: install Xvfb (make qt-libs), then pytest-xvfb starts one",
)


@pytest.fixture(autouse=True)
def fixed_solver(tmp_path, ops_config):
    """One solver (native NCHW), so tiles and the whole image differ only by torch's shape-dependent rounding."""
    ops_config(cache_dir=tmp_path / "cache", solver="native", memory_format="nchw")


def _cells(size: int = 160) -> np.ndarray:
    """A corner of the nuclei sample: (size, size) uint8."""
    return nuclei()[0][0][:size, :size].copy()


def _strokes(image: np.ndarray, rows: range) -> np.ndarray:
    """Strokes along ``rows``: value 2 (class 1) on bright pixels, value 1 (class 0) on dark ones, 0 elsewhere."""
    strokes = np.zeros(image.shape, np.uint8)
    for row in rows:
        strokes[row] = np.where(image[row] > 120, 2, np.where(image[row] < 30, 1, 0))
    return strokes


def _scores(loaded, image: np.ndarray) -> torch.Tensor:
    """(1, K, H, W) scores of a gray uint8 ``image`` by an untiled dense pass, scaled as the model declares."""
    scaling = loaded.intensity.scaling(image)
    x = loaded.normalize(torch.from_numpy(unit_planes(image, loaded.in_channels, scaling))[None])
    with torch.no_grad():
        return loaded.dense()(x)


def _source(array, **options) -> LayerSource:
    ndim = len((array[0] if options.get("multiscale") else array).shape)
    defaults = dict(rgb=False, multiscale=False, scale=(1,) * ndim, spatial_dims=2, channels=1)
    return LayerSource.of(array, **(defaults | options))


# ---- strokes, classes and windows (no Qt) ----


def test_strokes_drop_the_channel_axis_and_map_to_the_read_level():
    stack = np.zeros((3, 2, 40, 50), np.uint8)  # (T, C, H, W)
    source = _source(stack, channels=2)
    painted = np.zeros(stack.shape, np.uint8)  # napari's new labels layer has the image's every axis
    painted[1, 0, 5, 7], painted[1, 1, 6, 8], painted[2, 0, 30, 40] = 1, 3, 2
    strokes = StrokeSet.of(painted, source, image_shape=stack.shape)
    assert strokes.points.tolist() == [[1, 5, 7], [1, 6, 8], [2, 30, 40]]
    assert strokes.classes.tolist() == [0, 2, 1] and strokes.values == [1, 2, 3]
    assert list(strokes.planes(source)) == [(1,), (2,)]

    levels = [np.zeros((80, 100), np.uint8), np.zeros((40, 50), np.uint8)]
    pyramid = _source(levels, multiscale=True, scale=(0.5, 0.5), pixel_size=(1.0, 1.0))
    assert pyramid.level == 1
    level0 = np.zeros((80, 100), np.uint8)
    level0[10, 21] = 2
    assert StrokeSet.of(level0, pyramid, image_shape=(80, 100)).points.tolist() == [[5, 10]]


def test_a_strokes_layer_of_another_shape_is_explained():
    source = _source(np.zeros((40, 50), np.uint8))
    with pytest.raises(densecnn.InvalidInputError, match="strokes layer is 40x60 but the image is 40x50"):
        StrokeSet.of(np.zeros((40, 60), np.uint8), source, image_shape=(40, 50))


class _Recorded:
    """A uint16 plane computed on read, never held; every read's size is recorded."""

    def __init__(self, shape):
        self.shape, self.dtype, self.ndim, self.reads = shape, np.dtype(np.uint16), len(shape), []

    def __getitem__(self, index):
        rows, cols = (np.arange(n)[i] for n, i in zip(self.shape, index))
        self.reads.append(rows.size * cols.size)
        return ((rows[:, None] * 7 + cols[None, :] * 13) % 4000).astype(np.uint16)


def test_a_large_planes_strokes_are_trained_in_windows_read_around_them():
    plane = _Recorded((3000, 2800))
    assert WHOLE_PLANE_PIXELS < 3000 * 2800
    source = _source(plane)
    points = np.array([[100, 120], [110, 130], [2900, 2700]])
    strokes = StrokeSet(points, np.array([0, 1, 1]))
    intensity = Intensity("range", 0, 4000)
    images, labels, planes = training_windows(source, strokes, intensity, channels=1)
    assert planes == [(), ()]
    assert len(images) == 2 and all(
        i.shape[0] == 1 and i.shape[1:] == m.shape for i, m in zip(images, labels)
    )
    assert max(plane.reads) < 3000 * 2800 / 20  # the intensity sample's windows and the training windows only
    total = sum(int((m != UNLABELLED).sum()) for m in labels)
    assert total == 3 and sorted(np.concatenate([m[m != UNLABELLED] for m in labels]).tolist()) == [0, 1, 1]
    first = labels[0]
    (r, c) = np.argwhere(first == 0)[0]
    # the window's pixel under the stroke is the plane's, scaled by the range
    np.testing.assert_allclose(images[0][0, r, c], ((100 * 7 + 120 * 13) % 4000) / 4000, rtol=1e-6)


def test_the_classes_field_reads_names_and_colours():
    assert parse_classes("background #000000, cell #3cc85a") == (
        ["background", "cell"],
        [[0, 0, 0], [60, 200, 90]],
    )
    names, palette = parse_classes("a, b #ff0000")
    assert names == ["a", "b"] and palette[1] == [255, 0, 0] and len(palette[0]) == 3
    assert parse_classes(format_classes(["x", "y"], [[1, 2, 3], [4, 5, 6]])) == (
        ["x", "y"],
        [[1, 2, 3], [4, 5, 6]],
    )
    assert fresh_classes([1, 3])[0] == ["class_1", "class_2", "class_3"]
    with pytest.raises(densecnn.InvalidInputError, match="class 2 of the classes field"):
        parse_classes("a, #00ff00")


def test_a_new_model_refuses_a_class_no_stroke_paints_in_the_panels_words():
    check_painted(["a", "b", "c"], [1, 2, 3])
    names, _ = fresh_classes([1, 3])  # values 1 and 3 painted, 2 not
    with pytest.raises(densecnn.InvalidInputError, match=r"no strokes are painted with value 2 \(class_2\)"):
        check_painted(names, [1, 3])
    with pytest.raises(
        densecnn.InvalidInputError, match="painted with value 4 but the classes field lists 3"
    ):
        check_painted(["a", "b", "c"], [1, 2, 4])


def test_a_live_region_is_labelled_as_its_whole_plane(tmp_path):
    image = _cells(200)
    source = _source(image)
    session = TrainingSession(source, intensity=Intensity(), start=None, class_names=["bg", "cell"])
    stop = threading.Event()
    updates = list(session.train(StrokeSet.of(_strokes(image, range(10, 190, 30)), source, image_shape=image.shape),
                                 stop=stop, max_memory=1 << 30, max_seconds=1.0))  # fmt: skip
    assert any(isinstance(u, TrainingStep) for u in updates)
    session.view = View((), (slice(37, 121), slice(150, 200)))  # touches the right border
    region, whole = list(session.predict(stop=stop, max_memory=1 << 30))
    assert region.region == session.view.region and whole.labels.shape == image.shape
    loaded = session.model()
    scores = _scores(loaded, image)
    assert_labels_equal_except_ties(torch.from_numpy(whole.labels.astype(np.int64))[None], scores)
    assert_labels_equal_except_ties(
        torch.from_numpy(region.labels.astype(np.int64))[None], scores[..., 37:121, 150:200]
    )
    # while training, the whole plane from the features training keeps: the head alone, the same labels
    assert session.trainer.preview_labels(0) is not None
    (preview,) = session.predict(stop=stop, max_memory=1 << 30, preview=True)
    assert preview.region == (slice(0, 200), slice(0, 200))
    assert_labels_equal_except_ties(torch.from_numpy(preview.labels.astype(np.int64))[None], scores)
    stop.set()
    assert list(session.predict(stop=stop, max_memory=1 << 30)) == []


def _updates_until(updates, stop_after: int, then) -> list:
    """The updates of a run, calling ``then()`` at its ``stop_after``-th step reported; an error ends the list."""
    seen, steps = [], 0
    try:
        for update in updates:
            seen.append(update)
            steps += isinstance(update, TrainingStep)
            if steps == stop_after:
                then()
    except densecnn.DenseCNNError as exc:
        seen.append(exc)
    return seen


def _assert_the_saved_models_labels(update, session, image, tmp_path):
    """``update`` is a live prediction of the whole plane by the weights Save writes."""
    from densecnn.napari.training import LivePrediction

    assert isinstance(update, LivePrediction) and update.region == (slice(0, 160), slice(0, 160)), update
    saved = densecnn.load(session.save(tmp_path / "saved"))
    scores = _scores(saved, image)
    assert_labels_equal_except_ties(torch.from_numpy(update.labels.astype(np.int64))[None], scores)


def test_a_stopped_run_ends_with_the_live_labels_of_the_weights_it_keeps(tmp_path):
    image = _cells()
    source = _source(image)
    session = TrainingSession(source, intensity=Intensity(), start=None, class_names=["bg", "cell"])
    strokes = StrokeSet.of(_strokes(image, range(10, 160, 30)), source, image_shape=image.shape)
    list(session.train(strokes, stop=threading.Event(), max_memory=1 << 30, max_seconds=0.5))
    first = session.trainer.step
    more = StrokeSet.of(_strokes(image, range(10, 160, 15)), source, image_shape=image.shape)
    stop = threading.Event()
    updates = _updates_until(session.train(more, stop=stop, max_memory=1 << 30), stop_after=2, then=stop.set)
    assert session.trainer.step > first and session.trainer.step < session.trainer.total_steps  # stopped
    assert updates[-1].step == session.best_step == session.trainer.step  # no strokes held out: the newest
    _assert_the_saved_models_labels(updates[-1], session, image, tmp_path)


def test_a_failed_run_ends_with_the_live_labels_of_the_weights_it_keeps(tmp_path):
    image = _cells()
    source = _source(image)
    session = TrainingSession(source, intensity=Intensity(), start=None, class_names=["bg", "cell"])
    strokes = _strokes(image, range(10, 160, 30))
    stop = threading.Event()
    unknown = np.where(strokes == 2, 3, strokes)  # value 3: a class the two-class model does not have

    def offer_unknown_strokes():
        session.offer(StrokeSet.of(unknown, source, image_shape=image.shape))

    run = session.train(StrokeSet.of(strokes, source, image_shape=image.shape), stop=stop, max_memory=1 << 30)
    updates = _updates_until(run, stop_after=2, then=offer_unknown_strokes)
    assert isinstance(updates[-1], densecnn.TrainingError) and "keeps its model's classes" in str(updates[-1])
    _assert_the_saved_models_labels(updates[-2], session, image, tmp_path)


# ---- the Train panel in a viewer ----


@pytest.fixture
def viewer_and_panel(make_napari_viewer):
    from densecnn.napari.train_panel import TrainPanel

    viewer = make_napari_viewer()
    panel = TrainPanel(viewer)
    viewer.window.add_dock_widget(panel)
    return viewer, panel


def _choose(panel, image, strokes, *, max_seconds):
    panel._image.reset_choices()
    panel._strokes.reset_choices()
    panel._image.value, panel._strokes.value = image, strokes
    panel._max_seconds.value = max_seconds


def _train(panel, qtbot):
    assert panel.train() is not None, panel._status.value
    qtbot.waitUntil(lambda: panel.worker is None, timeout=180_000)


@needs_display
def test_strokes_that_skip_a_value_are_refused_before_training(viewer_and_panel):
    viewer, panel = viewer_and_panel
    image_data = _cells()
    image = viewer.add_image(image_data, name="cells")
    painted = _strokes(image_data, range(5, 160, 40))
    strokes = viewer.add_labels(
        np.where(painted == 2, 3, painted).astype(np.uint8), name="strokes"
    )  # 1 and 3
    _choose(panel, image, strokes, max_seconds=3)
    assert panel.train() is None and panel.worker is None
    assert panel._status.value.startswith("no strokes are painted with value 2 (class_2)"), (
        panel._status.value
    )


@needs_display
def test_a_run_that_fails_with_a_runtime_error_is_explained_and_the_buttons_come_back(
    viewer_and_panel, qtbot, monkeypatch
):
    # torch's errors are RuntimeErrors, which superqt's workers drop without a signal: the panel would wait forever
    viewer, panel = viewer_and_panel

    def out_of_memory(self, strokes, **options):
        raise RuntimeError("DefaultCPUAllocator: not enough memory")
        yield

    monkeypatch.setattr(TrainingSession, "train", out_of_memory)
    image_data = _cells()
    image = viewer.add_image(image_data, name="cells")
    strokes = viewer.add_labels(_strokes(image_data, range(5, 160, 40)), name="strokes")
    _choose(panel, image, strokes, max_seconds=3)
    _train(panel, qtbot)
    assert panel._status.value == "training failed: DefaultCPUAllocator: not enough memory", (
        panel._status.value
    )
    assert panel._train.enabled and not panel._cancel.enabled


@needs_display
def test_a_session_trains_continues_saves_and_its_model_labels_like_predict(
    viewer_and_panel, qtbot, tmp_path
):
    from PIL import Image

    from densecnn.cli import main

    viewer, panel = viewer_and_panel
    image_data = _cells()
    image = viewer.add_image(image_data, name="cells")
    strokes = viewer.add_labels(np.zeros(image_data.shape, np.uint8), name="strokes")
    strokes.data = _strokes(image_data, range(5, 160, 40))  # paint
    _choose(panel, image, strokes, max_seconds=3)
    panel._classes.value = "background #202020, nucleus #3cc85a"
    _train(panel, qtbot)
    session, first = panel.session, panel.session.trainer.step
    assert first > 0 and panel._status.value.startswith("step"), panel._status.value
    assert panel.live_updates and viewer.layers["cells live"].data.shape == image_data.shape

    strokes.data = np.maximum(strokes.data, _strokes(image_data, range(25, 160, 40)))  # more strokes
    _train(panel, qtbot)
    assert (
        panel.session is session and session.trainer.start_step == first < session.trainer.step
    )  # continued

    saved = tmp_path / "cells_model"
    panel.save(saved)
    qtbot.waitUntil(lambda: panel.worker is None, timeout=60_000)
    assert panel._status.value == f"saved the model to {saved}"
    loaded = densecnn.load(saved)
    assert loaded.class_names == ["background", "nucleus"] and loaded.palette == [[32, 32, 32], [60, 200, 90]]

    Image.fromarray(image_data).save(tmp_path / "cells.png")
    assert main(["predict", str(saved), str(tmp_path / "cells.png"), str(tmp_path / "labels.npy")]) == 0
    predicted = np.load(tmp_path / "labels.npy")
    source = _source(image_data)
    reloaded = engine.predict_layer(densecnn.load(saved), source, max_memory=1 << 30)
    while True:
        try:
            next(reloaded)
        except StopIteration as done:
            labels = done.value.labels
            break
    np.testing.assert_array_equal(labels, predicted)
    scores = _scores(loaded, image_data)  # the independent reference for both
    assert_labels_equal_except_ties(torch.from_numpy(predicted.astype(np.int64))[None], scores)
    live = viewer.layers["cells live"].data  # the last live labels: the saved weights over the whole plane
    assert_labels_equal_except_ties(torch.from_numpy(live.astype(np.int64))[None], scores)


@needs_display
def test_cancel_stops_within_one_step_and_keeps_the_best_weights(viewer_and_panel, qtbot, tmp_path):
    viewer, panel = viewer_and_panel
    image_data = _cells()
    image = viewer.add_image(image_data, name="cells")
    strokes = viewer.add_labels(_strokes(image_data, range(5, 160, 20)), name="strokes")
    _choose(panel, image, strokes, max_seconds=120)
    worker = panel.train()
    cancelled_at = []  # the trainer's step when Cancel is clicked (steps of ~1 ms run on while the update queues)

    def cancel_after_a_few_steps(update):
        if isinstance(update, TrainingStep) and update.step >= 3 and not cancelled_at:
            cancelled_at.append(panel.session.trainer.step)
            panel._cancel.clicked.emit()

    worker.yielded.connect(cancel_after_a_few_steps)
    qtbot.waitUntil(lambda: panel.worker is None, timeout=120_000)
    trainer = panel.session.trainer
    assert trainer.step <= cancelled_at[0] + 1 < trainer.total_steps
    assert panel._status.value.startswith(f"cancelled after step {trainer.step}")
    panel.save(tmp_path / "kept")
    qtbot.waitUntil(lambda: panel.worker is None, timeout=60_000)
    assert panel._status.value == f"saved the model to {tmp_path / 'kept'}"  # not the cancel's message again
    kept = densecnn.load(tmp_path / "kept")
    best = trainer.model.state_dict()
    for name, tensor in kept.model.state_dict().items():
        torch.testing.assert_close(tensor, best[name], rtol=0, atol=0)
    record = json.loads((tmp_path / "kept" / "model.json").read_text())["extra"]["training"]
    assert record["best_val_miou"] == trainer.best_val_miou


@needs_display
def test_a_continued_run_cancelled_shows_the_labels_of_the_model_it_saves(viewer_and_panel, qtbot, tmp_path):
    viewer, panel = viewer_and_panel
    image_data = _cells()
    image = viewer.add_image(image_data, name="cells")
    strokes = viewer.add_labels(_strokes(image_data, range(5, 160, 30)), name="strokes")
    _choose(panel, image, strokes, max_seconds=1)
    _train(panel, qtbot)
    strokes.data = np.maximum(strokes.data, _strokes(image_data, range(20, 160, 30)))  # more strokes
    panel._max_seconds.value = 120
    worker = panel.train()  # continues the session's weights
    worker.yielded.connect(lambda u: panel.cancel() if isinstance(u, TrainingStep) else None)
    qtbot.waitUntil(lambda: panel.worker is None, timeout=120_000)
    trainer = panel.session.trainer
    assert trainer.step < trainer.total_steps and not panel._cancel.enabled
    assert panel._status.value.startswith(f"cancelled after step {trainer.step}"), panel._status.value
    panel.save(tmp_path / "kept")
    qtbot.waitUntil(lambda: panel.worker is None, timeout=60_000)
    assert panel._status.value == f"saved the model to {tmp_path / 'kept'}"
    scores = _scores(densecnn.load(tmp_path / "kept"), image_data)
    live = viewer.layers["cells live"].data  # the run's last live labels: the saved model's
    assert_labels_equal_except_ties(torch.from_numpy(live.astype(np.int64))[None], scores)


@needs_display
def test_closing_the_viewer_stops_the_run_and_touches_no_deleted_widget(make_napari_viewer, qtbot):
    from densecnn.napari.train_panel import TrainPanel

    viewer = make_napari_viewer()  # closed below, as a user closes it; the fixture copes with a closed viewer
    try:
        panel = TrainPanel(viewer)
        viewer.window.add_dock_widget(panel)
        image_data = _cells()
        image = viewer.add_image(image_data, name="cells")
        strokes = viewer.add_labels(_strokes(image_data, range(5, 160, 20)), name="strokes")
        _choose(panel, image, strokes, max_seconds=120)
        worker = panel.train()
        qtbot.waitUntil(lambda: panel.last_step is not None, timeout=60_000)
    finally:
        viewer.close()  # pytest-qt fails the test on an exception a Qt signal's slot raises from here on
    qtbot.waitUntil(lambda: not worker.is_running, timeout=10_000)
    qtbot.wait(100)  # the signals queued before the worker ended
    trainer = panel.session.trainer
    assert trainer.step < trainer.total_steps  # stopped, not run to the end of its schedule


@needs_display
def test_shapes_are_painted_into_the_strokes_layer(viewer_and_panel):
    viewer, panel = viewer_and_panel
    image = viewer.add_image(_cells(100), name="cells")
    strokes = viewer.add_labels(np.zeros((100, 100), np.uint8), name="strokes")
    shapes = viewer.add_shapes(
        [np.array([[10, 10], [10, 40], [40, 40], [40, 10]]), np.array([[70, 5], [70, 95]])],
        shape_type=["polygon", "line"],
        edge_width=1,
        name="outlines",
    )
    _choose(panel, image, strokes, max_seconds=1)
    panel._shapes.reset_choices()
    panel._shapes.value = shapes
    panel._shape_value.value = 2
    assert panel.add_shapes() > 900
    assert strokes.data[25, 25] == 2 and strokes.data[70, 50] == 2 and strokes.data[55, 50] == 0


@needs_display
def test_geojson_annotations_are_painted_with_their_classes(viewer_and_panel, tmp_path):
    viewer, panel = viewer_and_panel
    image = viewer.add_image(np.zeros((2, 60, 80), np.uint8), name="stack")
    strokes = viewer.add_labels(np.zeros((2, 60, 80), np.uint8), name="strokes")
    _choose(panel, image, strokes, max_seconds=1)
    panel._classes.value = "background #000000"
    viewer.dims.set_point(0, 1)  # the second slice is shown
    feature = {
        "type": "Feature",
        "geometry": {"type": "Polygon", "coordinates": [[[10, 5], [30, 5], [30, 20], [10, 20], [10, 5]]]},
        "properties": {"classification": {"name": "Tumor", "color": [200, 0, 0]}},
    }
    line = {
        "type": "Feature",
        "geometry": {"type": "LineString", "coordinates": [[0, 40], [79, 40]]},
        "properties": {"classification": {"name": "background"}},
    }
    path = tmp_path / "regions.geojson"
    path.write_text(json.dumps({"type": "FeatureCollection", "features": [feature, line]}))
    assert panel.add_geojson(path) > 300
    assert not strokes.data[0].any()
    assert strokes.data[1, 10, 20] == 2 and strokes.data[1, 40, 50] == 1 and strokes.data[1, 50, 50] == 0
    assert panel._classes.value == "background #000000, Tumor #c80000"


@needs_display
def test_a_shipped_model_is_fine_tuned_on_strokes_of_one_slice(viewer_and_panel, qtbot, tmp_path):
    viewer, panel = viewer_and_panel
    cells = _cells(128)
    stack = np.stack([cells, np.roll(cells, 20, 1), cells[::-1]])  # (T, H, W)
    image = viewer.add_image(stack, name="stack")
    painted = np.zeros(stack.shape, np.uint8)
    painted[1] = _strokes(stack[1], range(4, 128, 16))
    painted[1, 60, 3:9] = 3  # a few boundary pixels (class 2)
    strokes = viewer.add_labels(painted, name="strokes")
    _choose(panel, image, strokes, max_seconds=0)  # no budget: until the first validation below
    viewer.dims.set_point(0, 0)  # slice 0 shown, strokes on slice 1
    panel._start.value = next(v for v in panel._start.choices if getattr(v, "name", None) == "nuclei")
    worker = panel.train()
    worker.yielded.connect(
        lambda u: panel.cancel() if isinstance(u, TrainingStep) and u.val_miou is not None else None
    )
    qtbot.waitUntil(lambda: panel.worker is None, timeout=180_000)
    assert panel._classes.value.startswith("background #000000, nucleus #3cc85a, boundary")
    trainer = panel.session.trainer
    assert trainer.step > 0 and trainer.loaded.num_classes == 3
    live = viewer.layers["stack live"].data
    assert live.shape == stack.shape and live[0].any() and not live[1:].any()  # the slice shown, slice 0
    panel.save(tmp_path / "tuned")
    qtbot.waitUntil(lambda: panel.worker is None, timeout=60_000)
    tuned, shipped = densecnn.load(tmp_path / "tuned"), densecnn.load(ROOT / "models" / "nuclei")
    assert tuned.class_names == shipped.class_names and tuned.patch_size == shipped.patch_size
    assert tuned.normalization == shipped.normalization
    assert not torch.equal(
        tuned.model[0].weight, shipped.model[0].weight
    )  # the weights of the first validation


@needs_display
def test_a_new_3d_model_trains_on_strokes_of_one_slice_of_a_volume(viewer_and_panel, qtbot):
    viewer, panel = viewer_and_panel
    cells = _cells(64)
    volume = np.stack([np.roll(cells, k, 0) for k in range(16)])  # (D, H, W)
    image = viewer.add_image(volume, name="volume")
    painted = np.zeros(volume.shape, np.uint8)
    painted[8] = _strokes(volume[8], range(2, 64, 6))
    strokes = viewer.add_labels(painted, name="strokes")
    _choose(panel, image, strokes, max_seconds=3)
    panel._volume.value = True
    _train(panel, qtbot)
    trainer = panel.session.trainer
    assert trainer.step > 0 and len(trainer.patch_size) == 3, panel._status.value
    assert panel.session.source.labels_shape == volume.shape and panel.live_updates


def test_a_plane_too_large_for_live_labels_gets_the_centre_of_the_view(monkeypatch):
    from densecnn.napari import training

    image = _cells(200)
    source = _source(image)
    session = TrainingSession(source, intensity=Intensity(), start=None, class_names=["bg", "cell"])
    stop = threading.Event()
    strokes = StrokeSet.of(_strokes(image, range(10, 190, 30)), source, image_shape=image.shape)
    for _ in session.train(strokes, stop=stop, max_memory=1 << 30, max_seconds=0.5):
        pass
    monkeypatch.setattr(training, "LIVE_PLANE_PIXELS", 60 * 60)
    assert not session.labels_whole_planes
    session.view = View((), (slice(0, 200), slice(40, 160)))
    (live,) = session.predict(stop=stop, max_memory=1 << 30)
    # 77x46: the view's centre, shrunk alike on both axes
    assert live.region == (slice(61, 138), slice(77, 123))
    scores = _scores(session.model(), image)
    assert_labels_equal_except_ties(
        torch.from_numpy(live.labels.astype(np.int64))[None], scores[..., 61:138, 77:123]
    )


@pytest.mark.parametrize("layout", ["rgb", "two channels"])
def test_rgb_and_multichannel_stacks_train_a_model_of_their_channels(layout):
    cells = _cells(96)
    if layout == "rgb":
        pixels = np.stack([cells, np.roll(cells, 5, 1), cells // 2], -1)  # (H, W, 3)
        source = _source(pixels, rgb=True, channels=3)
        painted, plane = _strokes(cells, range(4, 96, 12)), ()
    else:
        pixels = np.stack([np.stack([cells, cells[::-1]])] * 2)  # (T, C, H, W)
        source = _source(pixels, channels=2)
        painted = np.zeros(pixels.shape, np.uint8)  # the image's every axis, channel included
        painted[1, 0] = _strokes(cells, range(4, 96, 12))
        plane = (1,)
    strokes = StrokeSet.of(painted, source, image_shape=pixels.shape)
    session = TrainingSession(source, intensity=Intensity(), start=None, class_names=["bg", "cell"])
    session.view = View(plane, (slice(0, 96), slice(0, 96)))
    stop = threading.Event()
    updates = list(session.train(strokes, stop=stop, max_memory=1 << 30, max_seconds=0.5))
    assert session.trainer.loaded.in_channels == (3 if layout == "rgb" else 2)
    (live,) = [u for u in updates if not isinstance(u, TrainingStep)][-1:]
    assert live.plane == plane and live.labels.shape == (96, 96)
