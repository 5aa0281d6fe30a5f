"""A user's layer registered once with register_rule(..., args=...) converts, saves, loads and exports to ONNX."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import densecnn
from densecnn.modelfile.spec import from_spec, layer_types, to_spec
from densecnn.rules import fused_activation
from tests.tolerances import assert_close_relative


class ScaledTanh(nn.Module):
    """tanh(beta · x): pointwise."""

    def __init__(self, beta: float = 1.0):
        super().__init__()
        self.beta = beta

    def forward(self, x):
        return torch.tanh(self.beta * x)


class ChannelScale(nn.Module):
    """A learnt scale per channel of a (B, C, h, w) map."""

    def __init__(self, channels: int):
        super().__init__()
        self.channels = channels
        self.scale = nn.Parameter(torch.ones(channels))

    def forward(self, x):
        return x * self.scale.view(1, -1, 1, 1)


densecnn.register_rule(ScaledTanh, args=["beta"])  # pointwise: runs unchanged on the dense map


@densecnn.register_rule(ChannelScale, args=["channels"])
def _channel_scale(module, ctx):
    ctx.require_map("ChannelScale")
    ctx.expect_channels(module.channels, "channels")
    return module


def _model():
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(1, 3, 3), ChannelScale(3), ScaledTanh(0.5), nn.MaxPool2d(2), nn.Conv2d(3, 2, 2)
    ).eval()
    with torch.no_grad():
        model[1].scale.uniform_(0.5, 2.0)
    return model, 6


def test_custom_layers_convert_exactly():
    model, patch = _model()
    x = torch.rand(2, 1, 9, 10)
    dense = densecnn.convert(model, patch)
    with torch.no_grad():
        assert_close_relative(dense(x), densecnn.scan_patches(model, x, patch), 1e-5, floor=1.0)


def test_custom_layers_save_and_load(tmp_path):
    model, patch = _model()
    densecnn.save(model, tmp_path / "m", patch_size=patch)
    layers = json.loads((tmp_path / "m" / "model.json").read_text())["layers"]
    assert layers[1] == {"type": "ChannelScale", "channels": 3} and layers[2] == {
        "type": "ScaledTanh",
        "beta": 0.5,
    }
    loaded = densecnn.load(tmp_path / "m")
    assert [type(m) for m in loaded.model] == [type(m) for m in model]
    assert torch.equal(loaded.model[1].scale, model[1].scale)
    x = torch.rand(1, 1, 12, 7)
    with torch.no_grad():
        assert_close_relative(loaded.dense()(x), densecnn.convert(model, patch)(x), 1e-6, floor=1.0)


def test_custom_layers_build_on_the_meta_device():
    with torch.device("meta"):
        built = from_spec([{"type": "ChannelScale", "channels": 4}, {"type": "ScaledTanh", "beta": 2.0}])
    assert built[0].scale.is_meta and built[1].beta == 2.0
    assert layer_types()["ScaledTanh"] == (ScaledTanh, ("beta",))


def test_custom_layers_export_to_onnx(tmp_path):
    pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    from densecnn.onnx_export import export_onnx

    model, patch = _model()
    dense = densecnn.convert(model, patch, backend="native")
    path = export_onnx(dense, tmp_path / "custom.onnx")
    x = torch.rand(1, 1, 20, 17)
    (scores,) = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(
        None, {"image": x.numpy()}
    )
    np.testing.assert_allclose(scores, dense(x).detach().numpy(), rtol=0, atol=1e-5)


def test_loading_never_imports_the_code_a_file_names(tmp_path):
    model, patch = _model()
    densecnn.save(model, tmp_path / "m", patch_size=patch)
    script = f"import densecnn\ntry:\n    densecnn.load({str(tmp_path / 'm')!r})\nexcept densecnn.ModelFileError as e:\n    print(e)"
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
        cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip
    assert "ChannelScale" in result.stdout and result.returncode == 0, result.stderr


def test_a_saved_name_cannot_be_taken_by_another_class():
    class Conv2d(nn.Module):
        pass

    with pytest.raises(densecnn.ConversionError, match="already names torch.nn.modules.conv.Conv2d"):
        densecnn.register_rule(Conv2d, args=[])
    assert layer_types()["Conv2d"][0] is nn.Conv2d


def test_unsaveable_layers_name_the_fix():
    class Unsaved(nn.Module):
        def forward(self, x):
            return x

    densecnn.register_rule(Unsaved)
    with pytest.raises(densecnn.ModelFileError, match=r"register_rule\(MyLayer, args="):
        to_spec(nn.Sequential(nn.Conv2d(1, 2, 3), Unsaved()))


def test_registered_arguments_must_be_attributes():
    class Hidden(nn.Module):
        def __init__(self, beta: float = 1.0):
            super().__init__()
            self._beta = beta

        def forward(self, x):
            return x * self._beta

    densecnn.register_rule(Hidden, args=["beta"])
    with pytest.raises(densecnn.ModelFileError, match=r"'beta' is not an attribute.*self.beta = beta"):
        to_spec(nn.Sequential(nn.Conv2d(1, 2, 3), Hidden(2.0)))


def test_fused_activations_come_from_the_records():
    assert fused_activation(nn.ReLU()) == "relu" and fused_activation(nn.Tanh()) == "tanh"

    class MyReLU(nn.ReLU):  # may compute something else: never fused under the base class's name
        pass

    assert fused_activation(MyReLU()) is None and fused_activation(ScaledTanh()) is None
    assert fused_activation(None) is None
