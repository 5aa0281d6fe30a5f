"""The napari plugin: the manifest validates, the widget labels a layer in a worker thread exactly as
``LoadedModel.dense().predict`` labels the same pixels (2-D, RGB, multi-channel stacks, volumes, dask pyramids),
and Cancel stops it within one tile. Headless, on Xvfb (pytest-xvfb); skipped where the ``napari`` extra or Xvfb
is missing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

napari = pytest.importorskip(
    "napari", reason="napari is not installed: pip install -e '.[napari]' (make venv does)"
)
if not os.environ.get("DISPLAY"):  # Qt's offscreen platform has no OpenGL, which napari's canvas needs
    pytest.skip(
        "no X display: install Xvfb (make qt-libs), then pytest-xvfb starts one", allow_module_level=True
    )

import densecnn  # noqa: E402
from densecnn.errors import ScoresNotFiniteError  # noqa: E402
from densecnn.io.pixels import unit_planes  # noqa: E402
from densecnn.napari import engine  # noqa: E402
from densecnn.napari.sample import nuclei  # noqa: E402
from densecnn.napari.source import LayerSource  # noqa: E402
from densecnn.napari.widget import MIB, DenseCNNWidget  # noqa: E402
from tests.tolerances import assert_labels_equal_except_ties  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
NUCLEI, NUCLEI3D = ROOT / "models" / "nuclei", ROOT / "models" / "nuclei3d"


@pytest.fixture(autouse=True)
def fixed_solver(tmp_path, ops_config):
    """One solver (native NCHW), so tiles and the whole image differ only by torch's shape-dependent rounding."""
    ops_config(cache_dir=tmp_path / "cache", solver="native", memory_format="nchw")


def _expected(loaded, planes: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """(labels, scores) of ``planes`` ((N, *S, colours) raw pixels) by an untiled ``dense().predict`` call."""
    scaling = loaded.intensity.scaling(planes)
    unit = np.stack([unit_planes(p.reshape(-1, *p.shape[-2:]), loaded.in_channels, scaling) for p in planes])
    x = loaded.normalize(torch.from_numpy(unit.reshape(len(planes), loaded.in_channels, *planes.shape[1:-1])))
    dense = loaded.dense()
    with torch.no_grad():
        return dense.predict(x), dense(x)


def _run(widget, qtbot, layer, max_memory_mib: float, *, probabilities=False):
    widget._image.reset_choices()
    widget._image.value = layer
    widget._max_memory.value = max_memory_mib
    widget._probabilities.value = probabilities
    assert widget.run() is not None
    # the widget's state, not the worker's finished signal: a worker that fails at once may emit it before a
    # signal blocker connects
    qtbot.waitUntil(lambda: widget.worker is None, timeout=120_000)
    return widget


@pytest.fixture
def viewer_and_widget(make_napari_viewer):
    viewer = make_napari_viewer()
    widget = DenseCNNWidget(viewer)
    viewer.window.add_dock_widget(widget)
    return viewer, widget


def test_the_manifest_validates_and_names_the_widget_and_sample():
    npe2 = Path(sys.executable).parent / "npe2"
    done = subprocess.run([str(npe2), "validate", "densecnn"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    from npe2 import PluginManifest

    manifest = PluginManifest.from_distribution("densecnn")
    assert [w.display_name for w in manifest.contributions.widgets] == [
        "Label with densecnn",
        "Train with densecnn",
    ]
    assert [s.key for s in manifest.contributions.sample_data] == ["nuclei"]


def test_the_sample_opens_and_labels_like_predict_with_the_palette_and_class_names(viewer_and_widget, qtbot):
    viewer, widget = viewer_and_widget
    (image,) = viewer.open_sample("densecnn", "nuclei")
    assert image.data.shape == (512, 512)
    _run(widget, qtbot, image, 4096)  # one tile: the very same computation as predict
    loaded = densecnn.load(NUCLEI)
    labels = viewer.layers["nuclei labels (nuclei)"]
    assert isinstance(labels, napari.layers.Labels)
    expected, _ = _expected(loaded, image.data[None, ..., None])
    np.testing.assert_array_equal(labels.data, expected[0].numpy())
    assert widget.last_progress == engine.Progress(1, 1)
    assert list(labels.features["class"]) == ["background", "nucleus", "boundary"]
    np.testing.assert_allclose(labels.colormap.map(np.array([1]))[0], [60 / 255, 200 / 255, 90 / 255, 1])
    assert "512x512" in widget._status.value


def test_tiles_under_a_small_cap_stitch_to_predict_with_probabilities(viewer_and_widget, qtbot):
    viewer, widget = viewer_and_widget
    (image,) = viewer.open_sample("densecnn", "nuclei")
    _run(widget, qtbot, image, 24, probabilities=True)
    assert widget.last_progress.total > 4
    loaded = densecnn.load(NUCLEI)
    labels = viewer.layers["nuclei labels (nuclei)"].data
    _, scores = _expected(loaded, image.data[None, ..., None])
    assert_labels_equal_except_ties(torch.from_numpy(labels.astype(np.int64))[None], scores)
    nucleus = viewer.layers["nuclei p(nucleus) (nuclei)"].data
    np.testing.assert_allclose(nucleus, torch.softmax(scores.float(), 1)[0, 1].numpy(), atol=1e-5)


def test_cancel_stops_within_one_tile_and_adds_no_layer(viewer_and_widget, qtbot):
    viewer, widget = viewer_and_widget
    (image,) = viewer.open_sample("densecnn", "nuclei")
    widget._image.reset_choices()
    widget._image.value = image
    widget._max_memory.value = 16
    worker = widget.run()
    seen = []

    def cancel_after_the_first_tile(progress):
        seen.append(progress.done)
        if progress.done == 1:
            widget._cancel.clicked.emit()

    worker.yielded.connect(cancel_after_the_first_tile)
    qtbot.waitUntil(lambda: widget.worker is None, timeout=120_000)
    assert widget.last_progress.total > 8
    assert widget.last_progress.done <= 2, seen  # the tile under way when Cancel came, at most
    assert [layer.name for layer in viewer.layers] == ["nuclei"]
    assert widget._status.value.startswith("cancelled after")
    assert widget._run.enabled and not widget._cancel.enabled


def test_a_labelling_that_fails_with_a_runtime_error_is_explained_and_the_buttons_come_back(
    viewer_and_widget, qtbot, monkeypatch
):
    # ScoresNotFiniteError is a RuntimeError, which superqt's workers drop without a signal: the widget waited forever
    viewer, widget = viewer_and_widget

    def overflowing(*args, **kwargs):  # what labelling with a model whose activations overflow raises
        yield engine.Progress(0, 1)
        raise ScoresNotFiniteError("the model's scores are NaN at 10000 of the 10000 pixels")

    monkeypatch.setattr(engine, "predict_layer", overflowing)
    image = viewer.add_image(nuclei()[0][0][:100, :100], name="corner")
    widget._image.reset_choices()
    widget._image.value = image
    assert widget.run() is not None
    qtbot.waitUntil(lambda: widget.worker is None, timeout=30_000)
    assert widget._status.value.startswith("labelling failed: the model's scores are NaN"), (
        widget._status.value
    )
    assert widget._run.enabled and not widget._cancel.enabled
    assert [layer.name for layer in viewer.layers] == ["corner"]


def test_closing_the_viewer_cancels_the_run_and_touches_no_deleted_widget(make_napari_viewer, qtbot):
    viewer = make_napari_viewer()  # closed below, as a user closes it; the fixture copes with a closed viewer
    try:
        widget = DenseCNNWidget(viewer)
        viewer.window.add_dock_widget(widget)
        (image,) = viewer.open_sample("densecnn", "nuclei")
        widget._image.reset_choices()
        widget._image.value = image
        widget._max_memory.value = 16
        worker = widget.run()
        qtbot.waitUntil(lambda: widget.last_progress is not None, timeout=60_000)
    finally:
        viewer.close()  # pytest-qt fails the test on an exception a Qt signal's slot raises from here on
    qtbot.waitUntil(lambda: not worker.is_running, timeout=10_000)
    qtbot.wait(100)  # the signals queued before the worker ended
    assert widget._stop.is_set() and worker.abort_requested


def test_an_rgb_layer_is_read_as_the_model_reads_rgb(viewer_and_widget, qtbot):
    viewer, widget = viewer_and_widget
    gray = nuclei()[0][0][:200, :150]
    rgb = np.stack([gray, np.roll(gray, 7, 0), gray // 2], -1)  # (H, W, 3) uint8
    layer = viewer.add_image(rgb, rgb=True, name="rgb")
    _run(widget, qtbot, layer, 16)
    _, scores = _expected(densecnn.load(NUCLEI), rgb[None])
    assert_labels_equal_except_ties(
        torch.from_numpy(viewer.layers["rgb labels (nuclei)"].data.astype(np.int64))[None], scores
    )


@pytest.mark.parametrize("padding_mode", ["zeros", "replicate"])
def test_a_channel_axis_is_found_and_every_plane_is_labelled(
    viewer_and_widget, qtbot, tmp_path, padding_mode
):
    torch.manual_seed(0)
    model, patch = densecnn.zoo.tiny(in_channels=2, num_classes=3)
    model_dir = densecnn.save(model.eval(), tmp_path / "two", patch_size=patch, padding_mode=padding_mode)
    viewer, widget = viewer_and_widget
    stack = np.random.default_rng(0).random((3, 2, 301, 283), dtype=np.float32)  # (T, C, H, W)
    layer = viewer.add_image(stack, name="stack", scale=(1, 1, 0.5, 0.5))
    widget._model.value = model_dir
    _run(widget, qtbot, layer, 1)
    labels = viewer.layers["stack labels (two)"]
    assert labels.data.shape == (3, 301, 283) and tuple(labels.scale) == (1, 0.5, 0.5)
    assert widget.last_progress.total > 3
    _, scores = _expected(densecnn.load(model_dir), np.moveaxis(stack, 1, -1))
    assert_labels_equal_except_ties(torch.from_numpy(labels.data.astype(np.int64)), scores)


def test_a_volume_model_labels_a_3d_layer(viewer_and_widget, qtbot):
    viewer, widget = viewer_and_widget
    gray = nuclei()[0][0]
    volume = np.stack([gray[k * 6 : k * 6 + 48, 100:148] for k in range(10)])  # (D, H, W) uint8
    layer = viewer.add_image(volume, name="volume")
    widget._shipped.value = NUCLEI3D.resolve()  # a shipped model, picked from the list
    assert Path(widget._model.value) == NUCLEI3D.resolve()
    _run(widget, qtbot, layer, 8)
    assert widget.last_progress.total > 1
    _, scores = _expected(densecnn.load(NUCLEI3D), volume[None, ..., None])
    labels = viewer.layers["volume labels (nuclei3d)"].data
    assert labels.shape == volume.shape
    assert_labels_equal_except_ties(torch.from_numpy(labels.astype(np.int64))[None], scores)


def _pyramid(tmp_path) -> tuple[Path, list, np.ndarray]:
    """The nuclei model saved with a pixel size of 0.5 um, and a two-level dask pyramid whose level 1 is the nuclei
    image: (model directory, levels, the image)."""
    da = pytest.importorskip("dask.array")
    loaded = densecnn.load(NUCLEI)
    model_dir = densecnn.save(
        loaded.model, tmp_path / "half", patch_size=loaded.patch_size, palette=loaded.palette,
        class_names=loaded.class_names, normalization=loaded.normalization, padding_mode=loaded.padding_mode,
        pixel_size=(0.5, 0.5),
    )  # fmt: skip
    gray = nuclei()[0][0]
    levels = [
        da.from_array(np.kron(gray, np.ones((2, 2), np.uint8)), chunks=128),
        da.from_array(gray, chunks=64),
    ]
    return model_dir, levels, gray


def test_a_dask_pyramid_is_read_at_the_level_of_the_models_pixel_size(tmp_path):
    model_dir, levels, gray = _pyramid(tmp_path)
    source = LayerSource.of(
        levels, rgb=False, multiscale=True, scale=(0.25, 0.25), spatial_dims=2, channels=1, pixel_size=(0.5, 0.5)
    )  # fmt: skip
    assert source.level == 1 and source.scale == (0.5, 0.5) and source.labels_shape == (512, 512)
    loaded = densecnn.load(model_dir)
    progress, result = _drain(engine.predict_layer(loaded, source, max_memory=20 * MIB))
    assert progress[0] == engine.Progress(0, progress[-1].total) and progress[-1].total > 4
    _, scores = _expected(loaded, gray[None, ..., None])
    assert_labels_equal_except_ties(torch.from_numpy(result.labels.astype(np.int64))[None], scores)
    flat = LayerSource.of(levels, rgb=False, multiscale=True, scale=(1, 1), spatial_dims=2, channels=1,
                          pixel_size=(0.5, 0.5))  # fmt: skip
    assert flat.level == 0  # no level near 0.5 um: the full resolution


def test_the_widget_labels_a_pyramid_layer_at_the_matching_level(viewer_and_widget, qtbot, tmp_path):
    model_dir, levels, gray = _pyramid(tmp_path)
    viewer, widget = viewer_and_widget
    layer = viewer.add_image(levels, multiscale=True, scale=(0.25, 0.25), name="pyramid")
    widget._model.value = model_dir
    _run(widget, qtbot, layer, 20)
    labels = viewer.layers["pyramid labels (half)"]
    assert tuple(labels.scale) == (0.5, 0.5) and "(level 1)" in widget._status.value
    _, scores = _expected(densecnn.load(model_dir), gray[None, ..., None])
    assert_labels_equal_except_ties(torch.from_numpy(labels.data.astype(np.int64))[None], scores)


class _Synthetic:
    """A uint8 image of any size that is never held: each read computes its window, and the largest is recorded."""

    def __init__(self, shape: tuple[int, int]):
        self.shape, self.dtype, self.ndim, self.largest_read = shape, np.dtype(np.uint8), 2, 0

    def __getitem__(self, index: tuple[slice, slice]) -> np.ndarray:
        rows, cols = (np.arange(n)[i] for n, i in zip(self.shape, index))
        self.largest_read = max(self.largest_read, rows.size * cols.size)
        return ((rows[:, None] * 7 + cols[None, :] * 3) % 251).astype(np.uint8)


def test_a_layer_is_read_one_window_at_a_time(tmp_path):
    torch.manual_seed(0)
    model, patch = densecnn.zoo.tiny(in_channels=1, num_classes=3)
    loaded = densecnn.load(
        densecnn.save(model.eval(), tmp_path / "tiny", patch_size=patch, padding_mode="reflect")
    )
    image = _Synthetic((2500, 2300))
    source = LayerSource.of(image, rgb=False, multiscale=False, scale=(1, 1), spatial_dims=2, channels=1)
    progress, result = _drain(engine.predict_layer(loaded, source, max_memory=40 * MIB))
    assert progress[-1].total > 4 and result.labels.shape == (2500, 2300)
    assert image.largest_read < 2500 * 2300 / 4  # the intensity sample's windows and the tiles' windows only
    corner = image[:300, :280]
    _, scores = _expected(loaded, corner[None, ..., None])  # the corner's labels, away from its cut border
    assert_labels_equal_except_ties(
        torch.from_numpy(result.labels[None, :250, :230].astype(np.int64)), scores[..., :250, :230]
    )


def test_a_layer_with_too_few_axes_is_explained_and_adds_nothing(viewer_and_widget, qtbot):
    viewer, widget = viewer_and_widget
    (image,) = viewer.open_sample("densecnn", "nuclei")
    widget._model.value = NUCLEI3D
    _run(widget, qtbot, image, 16)
    assert "labels 3-D volumes but the layer has 2 axes (512x512)" in widget._status.value
    assert [layer.name for layer in viewer.layers] == ["nuclei"]
    assert widget._run.enabled


def test_a_channel_axis_among_the_volumes_axes_is_refused_and_adds_nothing(viewer_and_widget, qtbot):
    viewer, widget = viewer_and_widget
    zcyx = np.zeros((6, 2, 40, 40), np.uint8)  # read unnamed, its C would be the volume's depth
    layer = viewer.add_image(zcyx, name="zcyx", axis_labels=("z", "c", "y", "x"))
    widget._model.value = NUCLEI3D
    _run(widget, qtbot, layer, 16)
    assert "channel axis 'c' is among the last 3 axes" in widget._status.value
    assert [layer.name for layer in viewer.layers] == ["zcyx"]


def test_a_named_channel_axis_is_the_models_channels():
    """Of two axes as long as the model's channels, the one named 'c' holds them; unnamed, the one nearest space."""
    czyx = np.zeros((2, 2, 16, 16))
    options = dict(rgb=False, multiscale=False, scale=(1, 1, 1, 1), spatial_dims=2, channels=2)
    assert LayerSource.of(czyx, **options, axis_labels=("c", "z", "y", "x")).channel_axis == 0
    assert LayerSource.of(czyx, **options, axis_labels=("-4", "-3", "-2", "-1")).channel_axis == 1
    with pytest.raises(
        densecnn.InvalidInputError, match="it has 3 channels on axis 'channel' but the model reads 2"
    ):
        LayerSource.of(
            np.zeros((3, 16, 16)), **options | dict(scale=(1, 1, 1)), axis_labels=("channel", "y", "x")
        )
    with pytest.raises(
        densecnn.InvalidInputError, match="split the layer's channels into layers of their own"
    ):
        LayerSource.of(czyx, **options | dict(channels=1), axis_labels=("c", "z", "y", "x"))
    one = LayerSource.of(czyx[:1], **options | dict(channels=1), axis_labels=("c", "z", "y", "x"))
    assert one.channel_axis is None and one.labels_shape == (1, 2, 16, 16)


def test_a_cap_below_the_labels_and_one_tile_is_explained():
    source = LayerSource.of(
        nuclei()[0][0], rgb=False, multiscale=False, scale=(1, 1), spatial_dims=2, channels=1
    )
    with pytest.raises(
        densecnn.InvalidInputError, match="max_memory=300,000 bytes is too small for a 1x1x512x512"
    ):
        next(engine.predict_layer(densecnn.load(NUCLEI), source, max_memory=300_000))


def _drain(steps) -> tuple[list, object]:
    """The progress a generator yields, and the value it returns."""
    progress = []
    while True:
        try:
            progress.append(next(steps))
        except StopIteration as stop:
            return progress, stop.value
