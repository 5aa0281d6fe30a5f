"""Model directories (save/load), the JSON layer spec and the zoo."""

import json
import os

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

import densecnn
from densecnn.spec import from_spec, layer_types, to_spec
from tests.tolerances import assert_close_relative


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


def _edit_config(path, **changes):
    config = json.loads((path / "model.json").read_text())
    config.update(changes)
    (path / "model.json").write_text(json.dumps(config))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"format_version": 99}, "format_version 99 is not supported"),
        ({"format": "other"}, "not a densecnn model file"),
        ({"class_names": ["a"]}, "1 class_names for 3 classes"),
        ({"palette": [[0, 0, 0]] * 3 + [[1, 2, 3]]}, "palette must be 3"),
        ({"normalization": {"mean": [0.5, 0.5], "std": [1, 1]}}, "normalization must be"),
        ({"padding_mode": "circular"}, "padding_mode='circular'"),
        ({"layers": [{"type": "Conv3d"}]}, "unknown type 'Conv3d'"),
        ({"layers": [{"type": "Conv2d", "in_channels": 1, "out_channels": 2, "kernel_size": 3, "colour": 1}]},
         "unknown arguments: colour"),
    ],
)  # fmt: skip
def test_load_rejects_bad_config(saved, changes, message):
    _, _, path = saved
    _edit_config(path, **changes)
    with pytest.raises(densecnn.ModelFileError, match=message):
        densecnn.load(path)


def test_load_rejects_missing_or_corrupt_files(saved, tmp_path):
    _, _, path = saved
    with pytest.raises(densecnn.ModelFileError, match="model.json is missing"):
        densecnn.load(tmp_path / "nowhere")
    save_file({"0.weight": torch.zeros(1)}, path / "weights.safetensors")
    with pytest.raises(densecnn.ModelFileError, match="does not match the layers"):
        densecnn.load(path)
    (path / "weights.safetensors").write_bytes(b"\x80\x04pickle?")
    with pytest.raises(densecnn.ModelFileError, match="cannot read"):
        densecnn.load(path)
    (path / "model.json").write_text("{not json")
    with pytest.raises(densecnn.ModelFileError, match="not valid JSON"):
        densecnn.load(path)


def test_save_rejects_unconvertible_models_before_writing(tmp_path):
    with pytest.raises(densecnn.ConversionError):
        densecnn.save(nn.Sequential(nn.Conv2d(1, 2, 3, padding=1)), tmp_path / "bad", patch_size=3)
    assert not (tmp_path / "bad").exists()


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
    }
    return examples.get(layer_type) or layer_type()


@pytest.mark.parametrize("layer_type", [t for t, _ in layer_types().values()], ids=lambda t: t.__name__)
def test_spec_round_trip_of_every_layer_type(layer_type):
    layer = _instance(layer_type)
    spec = to_spec(nn.Sequential(layer))
    json.dumps(spec)
    rebuilt = from_spec(json.loads(json.dumps(spec)))[0]
    assert type(rebuilt) is layer_type and to_spec(nn.Sequential(rebuilt)) == spec


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
    x = torch.rand(1, 2, 6, 7, dtype=torch.float64)
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
