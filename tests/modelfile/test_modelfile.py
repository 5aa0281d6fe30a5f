"""Model directories (save/load), the JSON layer spec and the zoo."""

import json
import os
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError
from safetensors.torch import load_file
from torch import nn

import densecnn
from densecnn.modelfile.format import _layer_model, parse_config
from densecnn.modelfile.spec import from_spec, layer_types, to_spec
from tests.tolerances import assert_close_relative

SHIPPED = Path(__file__).resolve().parents[2] / "models" / "nuclei"


@pytest.fixture
def saved(tmp_path):
    torch.manual_seed(0)
    model, patch = densecnn.zoo.tiny(in_channels=1, num_classes=3)
    path = densecnn.save(
        model.eval(),
        tmp_path / "tiny",
        patch_size=patch,
        class_names=["background", "cell", "edge"],
        palette=[[0, 0, 0], [255, 0, 0], [0, 255, 0]],
        normalization={"mean": [0.5], "std": [0.25]},
        padding_mode="reflect",
    )
    return model, patch, path


def test_save_load_round_trip(saved):
    model, patch, path = saved
    assert sorted(p.name for p in path.iterdir()) == ["model.json", "weights.safetensors"]
    loaded = densecnn.load(path)
    assert loaded.patch_size == (patch, patch) and loaded.padding_mode == "reflect"
    assert (loaded.in_channels, loaded.num_classes) == (1, 3)
    assert loaded.class_names == ["background", "cell", "edge"] and loaded.palette[1] == [255, 0, 0]
    assert not loaded.model.training
    x = torch.rand(2, 1, 10, 13)
    with torch.no_grad():
        patches = torch.rand(4, 1, patch, patch)
        assert torch.equal(loaded.model(patches), model(patches))
        expected = densecnn.scan_patches(model, loaded.normalize(x), patch, padding_mode="reflect")
        assert_close_relative(loaded.dense()(loaded.normalize(x)), expected, 1e-5)
    assert torch.allclose(loaded.normalize(torch.full((1, 1, 1, 1), 0.75)), torch.tensor(1.0))


def test_save_of_fx_traced_model_loads_as_sequential(tmp_path):
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(2, 3, 3)
            self.fc = nn.Linear(3 * 2 * 2, 2)

        def forward(self, x):
            return self.fc(torch.relu(self.conv(x)).view(x.size(0), -1))

    net = Net().eval()
    loaded = densecnn.load(densecnn.save(net, tmp_path / "net", patch_size=4))
    x = torch.rand(3, 2, 4, 4)
    assert torch.equal(loaded.model(x), net(x))
    assert [layer["type"] for layer in json.loads((tmp_path / "net" / "model.json").read_text())["layers"]] == [
        "Conv2d", "ReLU", "Flatten", "Linear"
    ]  # fmt: skip


def test_default_metadata(tmp_path):
    model, patch = densecnn.zoo.stages_46(in_channels=3, num_classes=4)
    loaded = densecnn.load(densecnn.save(model, tmp_path / "m", patch_size=patch))
    assert loaded.class_names == ["class_0", "class_1", "class_2", "class_3"]
    assert len({tuple(c) for c in loaded.palette}) == 4 and loaded.normalization is None
    x = torch.rand(1, 3, 4, 4)
    assert torch.equal(loaded.normalize(x), x)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16])
def test_saved_dtype_is_kept(tmp_path, dtype):
    torch.manual_seed(0)
    model, patch = densecnn.zoo.tiny(in_channels=2, num_classes=3)
    model = model.to(dtype).eval()
    loaded = densecnn.load(
        densecnn.save(
            model, tmp_path / "m", patch_size=patch, normalization={"mean": [0.5, 0.4], "std": [0.2, 0.3]}
        )
    )
    assert loaded.dtype == dtype
    for (name, saved), kept in zip(
        model.state_dict().items(), loaded.model.state_dict().values(), strict=True
    ):
        assert kept.dtype == saved.dtype and torch.equal(kept, saved), name  # the stored numbers, not a cast
    x = torch.rand(2, 2, 9, 11)  # float32 images
    assert loaded.normalize(x).dtype == dtype
    patches = torch.rand(3, 2, patch, patch, dtype=dtype)
    with torch.no_grad():
        assert torch.equal(loaded.model(patches), model(patches))  # same kernels on the same data


def test_float64_model_stays_exact_after_loading(tmp_path):
    torch.manual_seed(0)
    model, patch = densecnn.zoo.tiny(in_channels=1, num_classes=3)
    model = model.double().eval()
    loaded = densecnn.load(densecnn.save(model, tmp_path / "m", patch_size=patch, padding_mode="replicate"))
    x = loaded.normalize(torch.rand(1, 1, 10, 13))
    assert x.dtype == torch.float64
    with torch.no_grad():
        expected = densecnn.scan_patches(model, x, patch, padding_mode="replicate")
        assert_close_relative(loaded.dense()(x), expected, 1e-10)


def test_the_shipped_model_loads_unchanged():
    loaded = densecnn.load(SHIPPED)
    config = json.loads((SHIPPED / "model.json").read_text())
    assert loaded.patch_size == (40, 40) and (loaded.in_channels, loaded.num_classes) == (1, 3)
    assert loaded.class_names == ["background", "nucleus", "boundary"] and loaded.padding_mode == "reflect"
    assert loaded.dtype == torch.float32 and to_spec(loaded.model) == config["layers"]
    stored = load_file(SHIPPED / "weights.safetensors")
    assert loaded.model.state_dict().keys() == stored.keys()
    assert all(torch.equal(loaded.model.state_dict()[name], tensor) for name, tensor in stored.items())
    x = loaded.normalize(torch.rand(1, 1, 24, 30))
    with torch.no_grad():
        expected = densecnn.scan_patches(loaded.model, x, 40, padding_mode="reflect")
        assert_close_relative(loaded.dense()(x), expected, 1e-5)


class _UserLayer(nn.Module):
    def __init__(self, beta: float, steps: "UndefinedType", scale=2, **options):  # noqa: F821
        super().__init__()


def test_the_format_checks_what_a_user_layer_signature_says():
    layer = _layer_model("UserLayer", _UserLayer, ("beta", "steps", "scale", "colour"))
    layer.model_validate({"type": "UserLayer", "beta": 1, "steps": [1, 2], "colour": "red"})
    with pytest.raises(ValidationError, match="expected a number"):
        layer.model_validate({"type": "UserLayer", "beta": "1"})
    with pytest.raises(ValidationError, match="beta"):
        layer.model_validate({"type": "UserLayer"})  # no default: required


def test_save_rejects_unconvertible_models_before_writing(tmp_path):
    with pytest.raises(densecnn.ConversionError):
        densecnn.save(nn.Sequential(nn.Conv2d(1, 2, 3, padding=1)), tmp_path / "bad", patch_size=3)
    assert not (tmp_path / "bad").exists()


# the built-in layer types (other test modules register their own layers, which need their own examples)
BUILT_IN = [t for t, _ in layer_types().values() if t.__module__.startswith("torch.nn")]


def _instance(layer_type):
    examples = {
        nn.Conv2d: nn.Conv2d(2, 4, (3, 2), stride=2, dilation=(1, 2), groups=2, bias=False),
        nn.Linear: nn.Linear(3, 2),
        nn.MaxPool2d: nn.MaxPool2d(3, 2, dilation=2),
        nn.AvgPool2d: nn.AvgPool2d(2, divisor_override=3),
        nn.AdaptiveMaxPool2d: nn.AdaptiveMaxPool2d((1, 2)),
        nn.AdaptiveAvgPool2d: nn.AdaptiveAvgPool2d(1),
        nn.BatchNorm1d: nn.BatchNorm1d(3, eps=1e-3),
        nn.BatchNorm2d: nn.BatchNorm2d(3, momentum=0.2),
        nn.PReLU: nn.PReLU(3),
        nn.Softmax: nn.Softmax(dim=1),
        nn.LogSoftmax: nn.LogSoftmax(dim=1),
        nn.Threshold: nn.Threshold(0.1, 0.0),
        nn.LocalResponseNorm: nn.LocalResponseNorm(3, alpha=2e-4),
        nn.RReLU: nn.RReLU(0.1, 0.2),
        nn.InstanceNorm2d: nn.InstanceNorm2d(3, affine=True, track_running_stats=True),
        nn.LayerNorm: nn.LayerNorm(4, eps=1e-3, bias=False),
        # signals and volumes
        nn.Conv1d: nn.Conv1d(2, 4, 3, stride=2, dilation=2, groups=2),
        nn.Conv3d: nn.Conv3d(2, 4, (1, 3, 2), stride=(1, 2, 2), dilation=(2, 1, 1), bias=False),
        nn.MaxPool1d: nn.MaxPool1d(3, 2, dilation=2),
        nn.MaxPool3d: nn.MaxPool3d((1, 2, 2), dilation=(1, 2, 1)),
        nn.AvgPool1d: nn.AvgPool1d(3, 2),
        nn.AvgPool3d: nn.AvgPool3d(2, 1, divisor_override=5),
        nn.AdaptiveMaxPool1d: nn.AdaptiveMaxPool1d(2),
        nn.AdaptiveAvgPool3d: nn.AdaptiveAvgPool3d((1, None, 2)),
        nn.AdaptiveMaxPool3d: nn.AdaptiveMaxPool3d(1),
        nn.AdaptiveAvgPool1d: nn.AdaptiveAvgPool1d(1),
        nn.BatchNorm3d: nn.BatchNorm3d(3, eps=1e-4),
        nn.InstanceNorm1d: nn.InstanceNorm1d(3, affine=True, track_running_stats=True),
        nn.InstanceNorm3d: nn.InstanceNorm3d(3, track_running_stats=True),
    }
    return examples.get(layer_type) or layer_type()


@pytest.mark.parametrize("layer_type", BUILT_IN, ids=lambda t: t.__name__)
def test_spec_round_trip_of_every_layer_type(layer_type):
    layer = _instance(layer_type)
    spec = to_spec(nn.Sequential(layer))
    json.dumps(spec)
    rebuilt = from_spec(json.loads(json.dumps(spec)))[0]
    assert type(rebuilt) is layer_type and to_spec(nn.Sequential(rebuilt)) == spec


@pytest.mark.parametrize("layer_type", BUILT_IN, ids=lambda t: t.__name__)
def test_every_layer_type_passes_the_format_and_loads_from_meta(layer_type):
    """What load does per layer: the spec passes the format's schema, the layer is built on the meta device, and
    assigning its state leaves no meta tensor behind."""
    layer = _instance(layer_type).eval()
    spec = to_spec(nn.Sequential(layer))
    config = {
        "format": "densecnn-model",
        "format_version": 1,
        "patch_size": [1, 1],
        "in_channels": 1,
        "num_classes": 1,
        "class_names": ["a"],
        "palette": [[0, 0, 0]],
        "padding_mode": "zeros",
        "layers": spec,
    }
    assert parse_config(json.dumps(config), where="test").layers[0].type == layer_type.__name__
    with torch.device("meta"):
        rebuilt = from_spec(spec).eval()
    rebuilt.load_state_dict(nn.Sequential(layer).state_dict(), assign=True)
    assert not any(t.is_meta for t in (*rebuilt.parameters(), *rebuilt.buffers()))


def test_spec_errors():
    with pytest.raises(densecnn.ModelFileError, match="non-empty list"):
        from_spec([])
    with pytest.raises(densecnn.ModelFileError, match="must be an object with a 'type'"):
        from_spec([{"kernel_size": 3}])
    with pytest.raises(densecnn.ModelFileError, match="invalid arguments"):
        from_spec([{"type": "Conv2d", "in_channels": 1}])
    with pytest.raises(densecnn.ModelFileError, match="has no spec entry"):
        to_spec(nn.Sequential(nn.Upsample(scale_factor=2)))


@pytest.mark.parametrize("name", densecnn.zoo.list_models())
def test_zoo_models_convert_and_match(name):
    torch.manual_seed(0)
    model, patch = densecnn.zoo.create(name, in_channels=2, num_classes=3)
    model = model.double().eval()
    size = (6, 7) if densecnn.zoo.spatial_dims(name) == 2 else (2, 3, 4)  # (H, W) or (D, H, W)
    x = torch.rand(1, 2, *size, dtype=torch.float64)
    dense = densecnn.convert(model, patch, padding_mode="reflect")
    with torch.no_grad():
        assert_close_relative(dense(x), densecnn.scan_patches(model, x, patch, padding_mode="reflect"), 1e-10)


def test_zoo_registry():
    assert densecnn.zoo.list_models("*_46") == ["stages_46"]
    with pytest.raises(ValueError, match="Unknown model 'vgg'"):
        densecnn.zoo.create("vgg", in_channels=3, num_classes=2)
    plain, patch = densecnn.zoo.plain_133()
    assert patch == 133 and [type(m).__name__ for m in plain] == [
        "Conv2d", "MaxPool2d", "Tanh", "Conv2d", "MaxPool2d", "Tanh", "Conv2d"
    ]  # fmt: skip


def test_saved_files_get_the_umask_permissions(saved):
    _, _, path = saved
    umask = os.umask(0)
    os.umask(umask)
    for name in ("model.json", "weights.safetensors"):
        assert (path / name).stat().st_mode & 0o777 == 0o666 & ~umask
    assert not list(path.glob(".*tmp"))
