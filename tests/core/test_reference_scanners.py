"""The reference scanners themselves, checked against a literal one-patch-at-a-time loop."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

import densecnn
from densecnn.padding import pad_image
from tests.naive import NUMPY_MODES, literal_scan, numpy_pad_for_patches
from tests.tolerances import assert_close_relative

MODES = list(NUMPY_MODES)


def _tiny(in_channels=2, num_classes=3):
    torch.manual_seed(0)
    model, patch = densecnn.zoo.tiny(in_channels=in_channels, num_classes=num_classes)
    return model.double().eval(), patch


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("size", [(1, 1), (2, 5), (5, 3), (13, 11)])
def test_scan_patches_matches_literal_loop(mode, size):
    model, patch = _tiny()
    x = torch.rand(2, 2, *size, dtype=torch.float64)
    expected = literal_scan(model, x, (patch, patch), mode)
    actual = densecnn.scan_patches(model, x, patch, padding_mode=mode, batch_size=7)
    assert_close_relative(actual, expected, 1e-12)


@pytest.mark.parametrize("mode", MODES)
def test_scan_patches_rectangular_even_patch(mode):
    torch.manual_seed(1)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(1, 3, (4, 3)), torch.nn.Tanh(), torch.nn.Conv2d(3, 2, (3, 4))
    ).double()
    x = torch.rand(1, 1, 6, 7, dtype=torch.float64)
    expected = literal_scan(model, x, (6, 6), mode)
    assert_close_relative(densecnn.scan_patches(model, x, (6, 6), padding_mode=mode), expected, 1e-12)


@pytest.mark.parametrize("mode", MODES)
def test_fast_scan_matches_scan_patches(mode):
    model, patch = _tiny()
    x = torch.rand(2, 2, 15, 18, dtype=torch.float64)
    expected = densecnn.scan_patches(model, x, patch, padding_mode=mode)
    assert_close_relative(densecnn.fast_scan(model, x, patch, padding_mode=mode), expected, 1e-12)


@pytest.mark.parametrize("mode", ["reflect", "replicate"])
@pytest.mark.parametrize("length", [1, 2, 3, 7])
def test_padding_matches_numpy_even_when_pad_exceeds_image(mode, length):
    x = torch.rand(1, 1, length, length + 1, dtype=torch.float64)
    expected = numpy_pad_for_patches(x.numpy(), (19, 20), mode)
    actual = pad_image(x, (9, 9), (9, 10), mode)
    assert torch.equal(actual, torch.from_numpy(expected))


def test_scan_patches_rejects_bad_arguments():
    model, patch = _tiny()
    x = torch.rand(1, 2, 4, 4, dtype=torch.float64)
    with pytest.raises(ValueError, match="padding_mode"):
        densecnn.scan_patches(model, x, patch, padding_mode="circular")
    with pytest.raises(ValueError, match="batch_size"):
        densecnn.scan_patches(model, x, patch, batch_size=0)


PAD_PEAK_SCRIPT = """
import sys, torch
from densecnn.padding import pad_image

def status(field):  # kB -> bytes; VmHWM: this process's peak since the reset below
    line = next(line for line in open("/proc/self/status") if line.startswith(field + ":"))
    return int(line.split()[1]) * 1024

x = torch.rand(1, 1, 1, 1_000_000)  # a thin image: padding makes it 40 times larger
open("/proc/self/clear_refs", "w").write("5")
before = status("VmRSS")
padded = pad_image(x, (20, 20), (19, 19), sys.argv[1])
print((status("VmHWM") - before) / padded.nbytes)
"""


@pytest.mark.skipif(
    not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc to measure peak RSS"
)
@pytest.mark.parametrize("mode", ["reflect", "replicate", "zeros"])
def test_padding_makes_one_copy(mode):
    """The memory estimates count one padded copy: on a thin image a per-axis pad would hold two at once."""
    result = subprocess.run(
        [sys.executable, "-c", PAD_PEAK_SCRIPT, mode], capture_output=True, text=True, check=True
    )
    assert float(result.stdout.strip().splitlines()[-1]) < 1.3


def test_scan_patches_refuses_a_patch_the_model_does_not_label_one_pixel_from():
    """At another patch size the patch model outputs a map, not one score vector: flattening it would give as many
    "classes" as the map has values."""
    net = torch.nn.Sequential(
        torch.nn.Conv2d(1, 4, 3), torch.nn.MaxPool2d(2), torch.nn.ReLU(), torch.nn.Conv2d(4, 2, 3)
    )
    x = torch.rand(1, 1, 10, 10)
    assert densecnn.scan_patches(net.eval(), x, 8).shape == (1, 2, 10, 10)
    with pytest.raises(
        densecnn.InvalidInputError, match=r"maps a 12x12 patch to a \(2, 3, 3\) map, not one score"
    ):
        densecnn.scan_patches(net, x, 12)
    with pytest.raises(densecnn.InvalidInputError, match="cannot run on patches of shape \\(3, 8, 8\\)"):
        densecnn.scan_patches(net, torch.rand(1, 3, 10, 10), 8)
    with pytest.raises(
        densecnn.InvalidInputError, match=r"x must be an \(N, C, \*S\) torch tensor .* got ndarray"
    ):
        densecnn.scan_patches(net, x.numpy(), 8)
    with pytest.raises(
        densecnn.InvalidInputError, match=r"x must be an \(N, C, H, W\) torch tensor .* \(1, 10, 10\)"
    ):
        densecnn.fast_scan(net, x[0], 8)
    assert densecnn.scan_patches(net, x[:0], 8).shape == (
        0,
        2,
        10,
        10,
    )  # no image: no pixel, the classes known
