"""save -> load round-trips every model save accepts, whatever the length of the safetensors header: the weights file
is recognised by its own header (an 8-byte little-endian length, then that many bytes of JSON), whose first bytes
may read as any other format's magic (a length of 0x280 starts with the bytes a pickle does)."""

from __future__ import annotations

import json
import struct
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import densecnn
from densecnn.modelfile.check import read_weights_header
from tests.tolerances import assert_equal_to_rounding

CONV = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}
BATCH_NORM = {1: nn.BatchNorm1d, 2: nn.BatchNorm2d, 3: nn.BatchNorm3d}
ACTIVATIONS = [nn.ReLU, nn.Tanh, lambda: nn.CELU(0.5), lambda: nn.LeakyReLU(0.2), nn.Identity]


def _round_trip(model: nn.Module, patch, tmp_path) -> None:
    """Save, load, and compare the loaded model's dense net with the original's patch scanning."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", densecnn.PatchSizeWarning)
        path = densecnn.save(model, tmp_path / "model", patch_size=patch)
        loaded = densecnn.load(path)
    dims = len(patch) if isinstance(patch, tuple) else 1
    dtype = next(model.parameters()).dtype
    x = torch.rand(1, loaded.in_channels, *(5, 6, 4)[:dims], dtype=dtype)
    with torch.no_grad():
        assert_equal_to_rounding(loaded.dense()(x), densecnn.scan_patches(model, x, patch), "loaded")


def test_the_header_that_starts_like_a_pickle_loads(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv1d(1, 5, 2), nn.BatchNorm1d(5), nn.CELU(0.5), nn.Conv1d(5, 4, 3))
    model = model.double().eval()
    with torch.no_grad():
        model[1].running_var.uniform_(0.5, 2)
    _round_trip(model, (4,), tmp_path)
    start = (tmp_path / "model" / "weights.safetensors").read_bytes()[:9]
    assert start[:2] == b"\x80\x02" and struct.unpack("<Q", start[:8])[0] == 0x280 and start[8:] == b"{"


@pytest.mark.parametrize("length", [0x280, 0x380, 0x480, 0x580, 0x1380, 0x8A50, 0x504B, 0x4C46])
def test_any_header_length_reads(tmp_path, length):
    """A header padded (with spaces, as safetensors pads it) to lengths whose bytes spell other formats' magic."""
    header = json.dumps({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    header += b" " * (length - len(header))
    path = tmp_path / "weights.safetensors"
    path.write_bytes(struct.pack("<Q", length) + header + struct.pack("<2f", 1.0, 2.0))
    assert read_weights_header(path) == {"w": (torch.float32, (2,))}


@st.composite
def saveable_nets(draw):
    """(model, patch): a conv net of 1-3 spatial axes reaching one output, in float32 or float64."""
    torch.manual_seed(draw(st.integers(0, 2**31 - 1), label="weights seed"))
    dims = draw(st.sampled_from([1, 2, 3]))
    channels = draw(st.integers(1, 4))
    layers, size = [], draw(st.integers(3, 7 if dims < 3 else 4))
    patch = size
    for _ in range(draw(st.integers(0, 2))):
        kernel = draw(st.integers(1, max(1, size - 1)))
        out = draw(st.integers(1, 9))
        layers += [CONV[dims](channels, out, kernel), draw(st.sampled_from(ACTIVATIONS))()]
        if draw(st.booleans()):
            layers.append(BATCH_NORM[dims](out))
        channels, size = out, size - kernel + 1
    layers.append(CONV[dims](channels, draw(st.integers(1, 6)), size))
    model = nn.Sequential(*layers).to(draw(st.sampled_from([torch.float32, torch.float64]))).eval()
    return model, (patch,) * dims


@settings(max_examples=40)
@given(net=saveable_nets())
def test_save_load_round_trips_random_nets(net, tmp_path_factory):
    model, patch = net
    _round_trip(model, patch, tmp_path_factory.mktemp("net"))


def test_a_loaded_model_keeps_its_weights_when_its_file_is_written_over(tmp_path):
    # a weights file mapped into memory lends its tensors the file's pages: a copy over it changed a loaded model
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Conv2d(4, 2, 3))
    first = densecnn.save(model, tmp_path / "first", patch_size=5)
    with torch.no_grad():
        model[0].weight.mul_(3)
    second = densecnn.save(model, tmp_path / "second", patch_size=5)
    loaded = densecnn.load(first)
    kept = {name: tensor.clone() for name, tensor in loaded.model.state_dict().items()}
    with open(first / "weights.safetensors", "r+b") as weights:  # in place, as cp or shutil.copyfile write
        weights.write((second / "weights.safetensors").read_bytes())
    for name, tensor in loaded.model.state_dict().items():
        assert torch.equal(tensor, kept[name]), name
