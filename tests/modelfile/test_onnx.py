"""ONNX export: onnxruntime CPU runs the exported dense net: equal to DenseCNN and patch scanning."""

from pathlib import Path

import numpy as np
import pytest
import torch

import densecnn
from densecnn.cli import main
from densecnn.onnx_export import IR_VERSION, export_onnx
from tests.core.test_layer_records import CASES, EXACT, PATCH, _dims, _net

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")


def _session(path):
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("padding_mode", ["zeros", "reflect", "replicate"])
def test_onnx_matches_dense_net_at_dynamic_sizes(tmp_path, padding_mode):
    torch.manual_seed(0)
    model, patch = densecnn.zoo.tiny(in_channels=2, num_classes=4)  # max pool, avg pool, Linear heads
    dense = densecnn.convert(model.eval(), patch, padding_mode=padding_mode, backend="native")
    path = export_onnx(dense, tmp_path / "tiny.onnx")
    session = _session(path)
    for shape in [(1, 2, 37, 29), (2, 2, 50, 61), (1, 2, 3, 2), (1, 2, 1, 1)]:
        x = torch.rand(*shape)
        (scores,) = session.run(None, {"image": x.numpy()})
        expected = dense(x).detach().numpy()
        assert scores.shape == expected.shape == (shape[0], 4, shape[2], shape[3])
        np.testing.assert_allclose(scores, expected, rtol=0, atol=1e-4)


def test_onnx_matches_patch_scanning_for_a_deeper_net(tmp_path):
    torch.manual_seed(1)
    model, patch = densecnn.zoo.stages_46(in_channels=3, num_classes=5)
    model.eval()
    dense = densecnn.convert(model, patch, padding_mode="reflect", backend="native")
    x = torch.rand(1, 3, 21, 18)
    (scores,) = _session(export_onnx(dense, tmp_path / "stages.onnx")).run(None, {"image": x.numpy()})
    expected = densecnn.scan_patches(model, x, patch, padding_mode="reflect").detach().numpy()  # independent
    np.testing.assert_allclose(scores, expected, rtol=0, atol=1e-4)


def test_exported_graph_uses_dilated_ops_and_a_loadable_ir_version(tmp_path):
    model, patch = densecnn.zoo.tiny()
    path = export_onnx(densecnn.convert(model.eval(), patch, backend="native"), tmp_path / "t.onnx")
    graph = onnx.load(str(path))
    assert graph.ir_version == IR_VERSION
    ops = {node.op_type: node for node in graph.graph.node}
    assert "AveragePool" not in ops  # average pooling is a depthwise conv
    dilations = {
        tuple(a.ints)
        for n in graph.graph.node
        if n.op_type == "MaxPool"
        for a in n.attribute
        if a.name == "dilations"
    }
    assert dilations == {(1, 1)}  # the first pool; the later windows are dilated convs
    conv_dilations = {
        tuple(a.ints)
        for n in graph.graph.node
        if n.op_type == "Conv"
        for a in n.attribute
        if a.name == "dilations"
    }
    assert (2, 2) in conv_dilations and (4, 4) in conv_dilations
    dims = graph.graph.input[0].type.tensor_type.shape.dim
    assert [d.dim_param or d.dim_value for d in dims] == ["N", 1, "H", "W"]


def test_export_onnx_command(tmp_path, capsys):
    model, patch = densecnn.zoo.tiny(in_channels=1, num_classes=3)
    normalization = {"mean": [0.5], "std": [0.25]}
    densecnn.save(
        model, tmp_path / "m", patch_size=patch, normalization=normalization, padding_mode="replicate"
    )
    assert main(["export-onnx", str(tmp_path / "m"), str(tmp_path / "m.onnx")]) == 0
    assert "normalise inputs first" in capsys.readouterr().out
    loaded = densecnn.load(tmp_path / "m")
    x = loaded.normalize(torch.rand(1, 1, 30, 40))
    (scores,) = _session(tmp_path / "m.onnx").run(None, {"image": x.numpy()})
    np.testing.assert_allclose(scores, loaded.dense()(x).detach().numpy(), rtol=0, atol=1e-4)


def test_export_onnx_command_reports_a_missing_model(tmp_path, capsys):
    assert main(["export-onnx", str(tmp_path / "nothing"), str(tmp_path / "x.onnx")]) == 2
    assert "model.json is missing" in capsys.readouterr().err


def test_a_net_of_other_weights_than_float32_is_refused_naming_the_fix(tmp_path, capsys):
    torch.manual_seed(0)
    model, patch = densecnn.zoo.tiny(in_channels=1, num_classes=2)
    with pytest.raises(densecnn.errors.OnnxExportError, match=r"torch.float64.*model\.float\(\)"):
        export_onnx(densecnn.convert(model.double().eval(), patch), tmp_path / "x.onnx")
    directory = densecnn.save(model.double().eval(), tmp_path / "f64", patch_size=patch)
    assert main(["export-onnx", str(directory), str(tmp_path / "x.onnx")]) == 2
    assert "ONNX graph takes float32 images" in capsys.readouterr().err


SHIPPED = Path(__file__).resolve().parents[2] / "models" / "nuclei"


@pytest.mark.skipif(
    not (SHIPPED / "model.json").is_file(), reason="models/nuclei is not shipped in this checkout"
)
def test_shipped_model_exports(tmp_path):
    loaded = densecnn.load(SHIPPED)
    dense = loaded.dense(backend="native")
    x = loaded.normalize(torch.rand(1, loaded.in_channels, 64, 80))
    (scores,) = _session(export_onnx(dense, tmp_path / "nuclei.onnx")).run(None, {"image": x.numpy()})
    np.testing.assert_allclose(scores, dense(x).detach().numpy(), rtol=0, atol=1e-4)


@pytest.mark.parametrize(
    ("layer_type", "where", "make", "expected"),
    [case for case in CASES if case.values[3] == EXACT],
)
def test_every_built_in_layer_type_exports(tmp_path, layer_type, where, make, expected):
    torch.manual_seed(0)
    net = _net(where, make()).float().eval()
    dense = densecnn.convert(net, PATCH, backend="native")
    x = torch.randn(2, 2, *(9, 7, 6)[: _dims(where)])  # signals and volumes too
    (scores,) = _session(export_onnx(dense, tmp_path / "layer.onnx")).run(None, {"image": x.numpy()})
    expected_scores = densecnn.scan_patches(net, x, PATCH).numpy()  # independent of the dense net
    np.testing.assert_allclose(scores, expected_scores, rtol=0, atol=1e-4)


class _DenseMean(densecnn.layers.DenseAvgPool):
    """A user's own dense op (here built on densecnn's average pool)."""


class _Mean(torch.nn.Module):
    """The mean of each pixel and its right neighbour."""

    def forward(self, x):
        return torch.nn.functional.avg_pool2d(x, (1, 2), 1)


@densecnn.register_rule(_Mean)
def _mean_rule(module, ctx):
    input_dilation = ctx.dilation
    ctx.slide((1, 2), (1, 1))
    return _DenseMean((1, 2), (1, 1), input_dilation)


def test_a_users_windowed_dense_op_exports_once_its_export_is_registered(tmp_path):
    model = torch.nn.Sequential(
        torch.nn.Conv2d(1, 2, 3), torch.nn.MaxPool2d(2), _Mean(), torch.nn.Conv2d(2, 2, 2)
    )
    dense = densecnn.convert(model.eval(), (6, 8), backend="native")
    with pytest.raises(
        densecnn.OnnxExportError,
        match=r"layer 2 \(_DenseMean\) is a windowed layer with no ONNX export.*register_export",
    ):
        export_onnx(dense, tmp_path / "a.onnx")
    densecnn.onnx_export.register_export(_DenseMean)(densecnn.onnx_export.export_avg_pool)
    x = torch.rand(1, 1, 9, 8)
    (scores,) = _session(export_onnx(dense, tmp_path / "b.onnx")).run(None, {"image": x.numpy()})
    expected = densecnn.scan_patches(model, x, (6, 8)).numpy()  # independent of the export
    np.testing.assert_allclose(scores, expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("dims", [1, 2])
def test_softplus_keeps_its_threshold(tmp_path, dims):
    torch.manual_seed(0)
    conv = (torch.nn.Conv1d, torch.nn.Conv2d)[dims - 1]
    net = torch.nn.Sequential(conv(1, 4, 3), torch.nn.Softplus(beta=2, threshold=1), conv(4, 2, 1)).eval()
    with torch.no_grad():
        net[0].weight.mul_(4)  # pre-activations of ±3: both sides of the threshold
    dense = densecnn.convert(net, 3, backend="native")
    x = torch.randn(1, 1, *(16,) * dims)
    (scores,) = _session(export_onnx(dense, tmp_path / "softplus.onnx")).run(None, {"image": x.numpy()})
    np.testing.assert_allclose(scores, densecnn.scan_patches(net, x, 3).numpy(), rtol=0, atol=1e-5)


def test_a_layer_written_wrongly_is_refused_and_no_file_is_left(tmp_path, monkeypatch):
    net = torch.nn.Sequential(
        torch.nn.Conv2d(1, 4, 3), torch.nn.Softplus(threshold=0.5), torch.nn.Conv2d(4, 2, 1)
    )
    dense = densecnn.convert(net.eval(), 3, backend="native")
    # torch's own export of Softplus, which drops the threshold
    monkeypatch.setitem(densecnn.onnx_export._EXPORTS, torch.nn.Softplus, lambda layer, channels: layer)
    with pytest.raises(
        densecnn.OnnxExportError, match="scores differ from the dense net's by .* written to ONNX"
    ):
        export_onnx(dense, tmp_path / "wrong.onnx")
    assert not (tmp_path / "wrong.onnx").exists()


def test_export_leaves_the_models_modes_and_refuses_a_changed_model(tmp_path):
    net = torch.nn.Sequential(
        torch.nn.Conv2d(1, 3, 3), torch.nn.BatchNorm2d(3), torch.nn.ReLU(), torch.nn.Dropout(0.5),
        torch.nn.Conv2d(3, 2, 3),
    )  # fmt: skip
    dense = densecnn.convert(net.eval(), 5, backend="native")
    net.train()  # a checkpoint exported in the middle of training
    export_onnx(dense, tmp_path / "mid.onnx")
    assert all(module.training for module in net.modules())
    net[2] = torch.nn.Tanh()
    with pytest.raises(densecnn.ModelChangedError):
        export_onnx(dense, tmp_path / "changed.onnx")
