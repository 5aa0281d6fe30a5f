"""Exact tiling under a memory cap: tiles with an R−1 halo stitch to the untiled result, and memory stays bounded."""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import densecnn
from densecnn import tiling
from densecnn.errors import ScoresNotFiniteError
from densecnn.nonfinite import NO_DATA_LABEL
from densecnn.padding import dense_padding, pad_image, padded_window
from tests.tolerances import assert_equal_to_rounding, assert_labels_equal_except_ties


@pytest.fixture(autouse=True)
def fixed_solver(tmp_path, ops_config):
    """Native NCHW everywhere: one solver, so tiled and untiled runs differ only by torch's shape-dependent rounding."""
    ops_config(cache_dir=tmp_path / "cache", solver="native", memory_format="nchw")


def _dense(name="tiny", padding_mode="zeros", **kwargs):
    torch.manual_seed(0)
    model, patch = densecnn.zoo.create(name, **kwargs)
    return (
        model.double().eval(),
        patch,
        densecnn.convert(model.double().eval(), patch, padding_mode=padding_mode),
    )


def _tile(dense, shape, itemsize, max_memory, labels=False, train=False):
    estimate = dense.memory_estimate(shape, itemsize, labels=labels, train=train)
    return tiling.choose_tile(shape, max_memory, estimate, labels=labels)


def _bytes(dense, shape, itemsize, tile, labels=False, train=False) -> int:
    """Held bytes plus the estimated peak of one ``tile``: the least max_memory that admits that tile."""
    estimate = dense.memory_estimate(shape, itemsize, labels=labels, train=train)
    return estimate.held + estimate.tile(tile)


def _tiles(dense, x, max_memory, labels=False, train=False) -> int:
    th, tw = _tile(dense, x.shape, x.element_size(), max_memory, labels, train)
    return len(tiling.tile_starts(x.shape[2], th)) * len(tiling.tile_starts(x.shape[3], tw))


@pytest.mark.parametrize("padding_mode", ["zeros", "reflect", "replicate"])
@pytest.mark.parametrize("size", [(23, 31), (40, 17), (1, 5)])
def test_tiled_forward_equals_untiled_and_patch_scanning(padding_mode, size):
    model, patch, dense = _dense("tiny", padding_mode, in_channels=2, num_classes=3)
    x = torch.rand(2, 2, *size, dtype=torch.float64)
    with torch.no_grad():
        untiled = dense(x)
        torch.testing.assert_close(untiled, densecnn.scan_patches(model, x, patch, padding_mode=padding_mode))
        whole = _bytes(dense, x.shape, 8, size)
        counts = set()
        for max_memory in (whole, whole // 2, whole // 5, whole // 20):
            try:
                tiled = dense(x, max_memory=max_memory)
            except ValueError as exc:
                assert "too small" in str(exc)
                continue
            counts.add(_tiles(dense, x, max_memory))
            assert_equal_to_rounding(tiled, untiled, f"max_memory={max_memory}")
    assert 1 in counts and (max(counts) > 4 or size == (1, 5))


def test_many_tiles_on_a_deep_net_with_autograd_and_labels():
    model, patch, dense = _dense("stages_46", "reflect", in_channels=1, num_classes=4)
    x = torch.rand(1, 1, 75, 61, dtype=torch.float64, requires_grad=True)
    untiled = dense(x)
    max_memory = _bytes(dense, x.shape, 8, (25, 25), train=True)
    assert _tiles(dense, x.detach(), max_memory, train=True) >= 9
    tiled = dense(x, max_memory=max_memory)
    assert_equal_to_rounding(tiled, untiled)
    (grad_untiled,) = torch.autograd.grad(untiled.sum(), x)
    (grad_tiled,) = torch.autograd.grad(tiled.sum(), x)
    torch.testing.assert_close(grad_tiled, grad_untiled)
    max_memory = _bytes(dense, x.shape, 8, (20, 20), labels=True)
    labels = dense.predict(x.detach(), max_memory=max_memory)
    assert _tiles(dense, x.detach(), max_memory, labels=True) >= 9
    assert labels.dtype == torch.int64
    assert_labels_equal_except_ties(labels, untiled)


def test_bad_max_memory_is_explained():
    _, _, dense = _dense("tiny", in_channels=1, num_classes=3)
    x = torch.rand(1, 1, 30, 30, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"too small for a 1x1x30x30 input: it needs at least [\d,]+ bytes"):
        dense(x, max_memory=1000)
    for bad in (0, -5, 1.5e9, True):
        with pytest.raises(ValueError, match="positive number of bytes"):
            dense.predict(x, max_memory=bad)
    assert torch.equal(
        dense.predict(x, max_memory=np.int64(10**8)), dense.predict(x)
    )  # numpy's ints are ints


def test_tile_estimate_grows_with_the_tile_and_the_cap_bounds_it():
    _, _, dense = _dense("plain_133", in_channels=3, num_classes=32)
    shape = (1, 3, 1000, 800)
    small = dense.memory_estimate(shape, 4, labels=False, train=False).tile((64, 64))
    large = dense.memory_estimate(shape, 4, labels=False, train=False).tile((256, 256))
    assert small < large
    assert dense.memory_estimate(shape, 4, labels=False, train=True).tile((64, 64)) > small
    th, tw = _tile(dense, shape, 4, 300_000_000, labels=True)
    assert th < 1000 and tw < 800
    assert _bytes(dense, shape, 4, (th, tw), labels=True) <= 300_000_000


PEAK_SCRIPT = textwrap.dedent(
    """
    import json, sys, torch, densecnn

    def status(field):  # kB -> bytes; VmHWM is this process's own peak (ru_maxrss survives exec from pytest)
        line = next(line for line in open("/proc/self/status") if line.startswith(field + ":"))
        return int(line.split()[1]) * 1024

    torch.manual_seed(0)
    model, patch = densecnn.zoo.plain_133(in_channels=3, num_classes=32)
    dense = densecnn.convert(model.eval(), patch)
    dense.solver, dense.memory_format = "native", "nhwc"
    x = torch.rand(1, 3, 640, 640)
    with torch.no_grad():
        dense.predict(x[:, :, :160, :160], max_memory=10**9)  # warm up allocator and kernels
    open("/proc/self/clear_refs", "w").write("5")  # reset the peak to the current RSS
    before = status("VmRSS")
    max_memory = None if sys.argv[1] == "none" else int(sys.argv[1])
    dense.predict(x, max_memory=max_memory)
    print(json.dumps({"growth": status("VmHWM") - before}))
    """
)


def _peak_growth(max_memory) -> int:
    result = subprocess.run(
        [sys.executable, "-c", PEAK_SCRIPT, str(max_memory)],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return json.loads(result.stdout.strip().splitlines()[-1])["growth"]


@pytest.mark.slow
@pytest.mark.skipif(
    not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc to measure peak RSS"
)
def test_peak_memory_follows_the_cap():
    """Measured peak RSS growth of a whole process: untiled vs capped predict of plain_133 on a 640x640 image."""
    untiled = _peak_growth("none")
    capped = _peak_growth(150_000_000)
    print(f"peak RSS growth: untiled {untiled:,} bytes, capped at 150 MB {capped:,} bytes")
    assert capped <= 150_000_000, f"capped predict grew the process by {capped:,} bytes"
    assert untiled > 2 * capped, f"untiled {untiled:,} vs capped {capped:,}"


def test_bfloat16_inference_through_tiles(ops_config):
    """A bfloat16 image runs the net in bfloat16 (conv weights cast on the fly); labels mostly agree with float32."""
    ops_config(memory_format=None)
    torch.manual_seed(0)
    model, patch = densecnn.zoo.create("stages_46", in_channels=1, num_classes=3)
    dense = densecnn.convert(model.eval(), patch)
    x = torch.rand(1, 1, 40, 36)
    reference = dense.predict(x)
    labels = dense.predict(x.bfloat16(), max_memory=3_000_000)
    assert labels.dtype == torch.int64 and (labels == reference).float().mean() > 0.9
    assert next(model.parameters()).dtype == torch.float32  # the model itself is untouched
    with pytest.raises(TypeError, match="backend='native' computes in the model's dtype"):
        densecnn.convert(model, patch, backend="native").predict(x.bfloat16())


def test_class_labels_are_argmax_with_ties_and_no_data_at_nan():
    scores = torch.randint(0, 3, (2, 4, 9, 7)).double()  # many ties
    scores[0, 1, 0, 0] = float("nan")
    expected = scores.argmax(1)
    expected[0, 0, 0] = NO_DATA_LABEL
    assert torch.equal(tiling.class_labels(scores, no_data=True), expected)
    assert torch.equal(tiling.class_labels(scores.float(), no_data=True), expected)
    with pytest.raises(ScoresNotFiniteError, match="at 1 of the 126 pixels scored at once"):
        tiling.class_labels(scores)  # a finite input: NaN scores are the net overflowing
    assert torch.equal(tiling.class_labels(scores.nan_to_num()), scores.nan_to_num().argmax(1))


def _anisotropic(kernel_d: int, kernel_hw: int):
    """A volume net with a patch (kernel_d, 2·kernel_hw + 1, 2·kernel_hw + 1): deep in the plane, shallow in D."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv3d(1, 3, (kernel_d, kernel_hw, kernel_hw)),
        torch.nn.MaxPool3d((1, 2, 2)),
        torch.nn.ReLU(),
        torch.nn.Conv3d(3, 2, (1, kernel_hw // 2 + 1, kernel_hw // 2 + 1)),
    ).double()
    patch = (kernel_d, 2 * kernel_hw + 1, 2 * kernel_hw + 1)
    return model.eval(), patch, densecnn.convert(model.eval(), patch)


def test_tiles_of_an_anisotropic_volume_follow_the_halo_under_the_cap():
    """A (9, 65, 65) patch on a 64×2048×2048 stack: the tile is shaped like the halo (flat), fits the cap, and
    computes fewer input voxels in all than the largest cube that fits the same cap."""
    _, patch, dense = _anisotropic(9, 32)
    assert dense.receptive_field == patch == (9, 65, 65)
    shape = (1, 1, 64, 2048, 2048)
    estimate = dense.memory_estimate(shape, 4, labels=True, train=False)
    for budget in (50_000_000, 400_000_000, 2_000_000_000):
        max_memory = estimate.held + budget
        tile = tiling.choose_tile(shape, max_memory, estimate, labels=True)
        cube = tiling.choose_tile(shape, max_memory, dataclasses.replace(estimate, halo=()), labels=True)
        assert estimate.held + estimate.tile(tile) <= max_memory
        assert tile[1] > tile[0] and tile[2] > tile[0], tile
        halo = tuple(r - 1 for r in patch)
        assert tiling.halo_cost(shape[2:], tile, halo) < tiling.halo_cost(shape[2:], cube, halo), (tile, cube)


def test_anisotropic_tiles_stitch_to_the_untiled_volume():
    model, patch, dense = _anisotropic(3, 4)
    x = torch.rand(1, 1, 7, 26, 23, dtype=torch.float64)
    estimate = dense.memory_estimate(x.shape, 8, labels=False, train=False)
    max_memory = estimate.held + estimate.tile((7, 9, 9))
    tile = tiling.choose_tile(x.shape, max_memory, estimate, labels=False)
    assert tile != tuple(x.shape[2:]) and estimate.held + estimate.tile(tile) <= max_memory
    with torch.no_grad():
        assert_equal_to_rounding(dense(x, max_memory=max_memory), dense(x))
        assert_labels_equal_except_ties(dense.predict(x, max_memory=max_memory), dense(x))


@settings(max_examples=60, deadline=None)
@given(
    mode=st.sampled_from(["zeros", "reflect", "replicate"]),
    shape=st.lists(st.integers(1, 7), min_size=1, max_size=3),
    data=st.data(),
)
def test_a_padded_window_is_the_window_of_the_padded_image(mode, shape, data):
    """A tile's padded input is made from the image alone, and equals slicing the whole padded image."""
    x = torch.arange(2 * math.prod(shape), dtype=torch.float32).view(1, 2, *shape)
    before = tuple(data.draw(st.integers(0, 5)) for _ in shape)
    after = tuple(data.draw(st.integers(0, 5)) for _ in shape)
    padded = pad_image(x, before, after, mode)
    window = []
    for n in padded.shape[2:]:
        start = data.draw(st.integers(0, n - 1))
        window.append((start, data.draw(st.integers(start + 1, n))))
    expected = padded[(slice(None), slice(None), *(slice(a, b) for a, b in window))]
    assert torch.equal(padded_window(x, before, tuple(window), mode), expected)


def test_a_thin_image_is_tiled_without_a_padded_copy_of_it(monkeypatch):
    """1 x 20,000 pixels padded by R-1 = 11 rows would be 12 times the image; the tiles read their windows."""
    model, patch = densecnn.zoo.tiny(in_channels=1, num_classes=3)
    dense = densecnn.convert(model.eval(), patch, padding_mode="reflect")
    x = torch.rand(1, 1, 1, 20_000)
    estimate = dense.memory_estimate(x.shape, 4, labels=True, train=False)
    assert estimate.held == 20_000 * 8  # the labels: no padded image
    with torch.no_grad():
        whole = dense(x)  # one untiled pass: the reference
        monkeypatch.setattr(densecnn.dense.DenseCNN, "pad", lambda self, x: pytest.fail("padded whole"))
        labels = dense.predict(x, max_memory=estimate.held + estimate.tile((1, 2_000)))
    assert_labels_equal_except_ties(labels, whole)


def test_tiles_come_one_at_a_time_and_stitch_to_run_tiled():
    _, _, dense = _dense("tiny", "reflect", in_channels=1, num_classes=3)
    x = torch.rand(1, 1, 37, 29, dtype=torch.float64)
    size, tile = (37, 29), (12, 10)
    before, _ = dense_padding(dense.patch_size, dense.receptive_field)
    window_of = functools.partial(padded_window, x, before, padding_mode="reflect")
    calls = []

    def run(padded):
        calls.append(padded.shape)
        return dense.run_padded(padded)

    with torch.no_grad():
        whole = tiling.run_tiled(run, window_of, size, tile, dense.receptive_field, labels=True)
        assert len(calls) == tiling.tile_count(size, tile) == 4 * 3
        calls.clear()
        stream = tiling.tiles(run, window_of, size, tile, dense.receptive_field, labels=True)
        stitched = torch.full_like(whole, -1)
        for done, (region, labels) in enumerate(stream, 1):
            assert len(calls) == done  # lazy: each tile is computed when it is asked for, not before
            stitched[(slice(None), *region)] = labels
    torch.testing.assert_close(stitched, whole)
    torch.testing.assert_close(whole, dense.predict(x))


def test_a_consumer_that_stops_stops_the_tiles():
    _, _, dense = _dense("tiny", "zeros", in_channels=1, num_classes=3)
    x = torch.rand(1, 1, 30, 30, dtype=torch.float64)
    before, _ = dense_padding(dense.patch_size, dense.receptive_field)
    window_of = functools.partial(padded_window, x, before, padding_mode="zeros")
    calls = []

    def run(padded):
        calls.append(padded.shape)
        return dense.run_padded(padded)

    with torch.no_grad():
        stream = tiling.tiles(run, window_of, (30, 30), (10, 10), dense.receptive_field, labels=False)
        region, scores = next(stream)
        stream.close()
    assert len(calls) == 1 and region == (slice(0, 10), slice(0, 10)) and scores.shape == (1, 3, 10, 10)
