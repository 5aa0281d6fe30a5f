"""The napari plugin's no-data box: a layer with NaN/±Inf pixels is refused unticked (the status names the box);
ticked, the labels are the library's dense predict on the whole image with no-data as the label type's maximum
(drawn transparent), exact across tiles, and the probabilities NaN there."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

pytest.importorskip("napari", reason="napari is not installed: pip install -e '.[napari]' (make venv does)")

import densecnn  # noqa: E402
from densecnn.errors import NonFiniteInputError  # noqa: E402
from densecnn.napari import engine  # noqa: E402
from densecnn.napari.source import LayerSource  # noqa: E402
from tests.nonfinite_support import assert_no_data_labels, holed_image, library_no_data_scores  # noqa: E402

MIB = 1 << 20
HOLES = [(slice(40, 52), slice(60, 66)), (slice(100, 101), slice(20, 21))]


@pytest.fixture(autouse=True)
def fixed_solver(tmp_path, ops_config):
    ops_config(cache_dir=tmp_path / "cache", solver="native", memory_format="nchw")


@pytest.fixture
def model_dir(tmp_path):
    torch.manual_seed(0)
    model, patch = densecnn.zoo.tiny(in_channels=1, num_classes=3)
    return densecnn.save(model.eval(), tmp_path / "tiny", patch_size=patch, padding_mode="reflect")


PIXELS = holed_image(120, 130, HOLES)  # (H, W) float32


def _drain(generator):
    progress = []
    while True:
        try:
            progress.append(next(generator))
        except StopIteration as stop:
            return progress, stop.value


def _source() -> LayerSource:
    return LayerSource.of(PIXELS, rgb=False, multiscale=False, scale=(1, 1), spatial_dims=2, channels=1)


def test_unticked_a_holed_layer_is_refused_naming_the_box(model_dir):
    with pytest.raises(NonFiniteInputError) as refused:
        _drain(engine.predict_layer(densecnn.load(model_dir), _source(), max_memory=20 * MIB))
    assert f'the "{engine.NO_DATA_BOX}" box ticked' in refused.value.render(engine.napari_option)


@pytest.mark.parametrize("max_memory", [64, 1], ids=["one-tile", "tiles"])
def test_ticked_the_labels_are_the_whole_image_predict_with_no_data(model_dir, max_memory):
    loaded = densecnn.load(model_dir)
    progress, result = _drain(
        engine.predict_layer(
            loaded, _source(), max_memory=max_memory * MIB, probabilities=True, nonfinite="propagate"
        )
    )
    if max_memory == 1:
        assert progress[-1].total > 1  # the holes reach across tile borders
    scores, library = library_no_data_scores(model_dir, PIXELS)
    assert result.labels.dtype == np.uint8
    assert_no_data_labels(result.labels, scores, library, no_data=255)
    np.testing.assert_array_equal(np.isnan(result.probabilities).all(0), (library == -1).numpy())


@pytest.mark.skipif(not os.environ.get("DISPLAY"), reason="no X display: install Xvfb (make qt-libs)")
def test_the_widget_passes_its_box(make_napari_viewer, qtbot, model_dir):
    from densecnn.napari.widget import DenseCNNWidget

    viewer = make_napari_viewer()
    widget = DenseCNNWidget(viewer)
    layer = viewer.add_image(PIXELS, name="holes")
    widget._model.value = model_dir
    widget._image.reset_choices()
    widget._image.value = layer
    widget._no_data.value = False
    assert widget.run() is not None
    qtbot.waitUntil(lambda: widget.worker is None, timeout=120_000)
    assert (
        f'the "{engine.NO_DATA_BOX}" box ticked' in widget._status.value
        and "holes labels (tiny)" not in viewer.layers
    )
    widget._no_data.value = True
    assert widget.run() is not None
    qtbot.waitUntil(lambda: widget.worker is None, timeout=120_000)
    labels = viewer.layers["holes labels (tiny)"].data
    scores, library = library_no_data_scores(model_dir, PIXELS)
    assert_no_data_labels(labels, scores, library, no_data=255)
