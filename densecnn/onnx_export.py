"""Export a DenseCNN to ONNX: image (N, C, H, W) -> scores (N, K, H, W) for any H and W, padding included.

The graph holds the dense net's stride-1 dilated ops: ``Conv`` with ``dilations`` (convs and Linear heads),
``MaxPool`` with ``dilations`` (opset >= 10), average pooling as a depthwise ``Conv`` with constant
weights, and the image padding as ``Pad`` (zeros) or a ``Gather`` of mirrored/clamped row and column indices
(reflect, replicate), so the ONNX model maps images to scores exactly like ``DenseCNN.forward``.

>>> loaded = densecnn.load("models/nuclei")
>>> export_onnx(loaded.dense(), "nuclei.onnx")          # normalisation is NOT in the graph: apply it first
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from .dense import DenseCNN
from .errors import OnnxExportError
from .layers import WindowLayer
from .padding import patch_offsets

OPSET = 17  # dilated MaxPool needs >= 10
IR_VERSION = 8  # the IR version that goes with opset 17; onnxruntime >= 1.14 loads it


class _IndexPad(nn.Module):
    """Reflect/replicate padding as a gather of row and column indices from the input's dynamic size."""

    def __init__(self, before: tuple[int, int], after: tuple[int, int], padding_mode: str):
        super().__init__()
        self.before, self.after, self.padding_mode = before, after, padding_mode

    def _indices(self, length: torch.Tensor, before: int, after: int) -> torch.Tensor:
        positions = torch.arange(-before, length + after)  # (before + length + after,)
        if self.padding_mode == "replicate":
            return torch.minimum(positions.clamp(min=0), length - 1)
        period = torch.clamp(2 * (length - 1), min=1)  # a 1-pixel axis reflects onto itself
        folded = positions.remainder(period)
        return torch.where(folded < length, folded, period - folded)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (N, C, H, W) -> (N, C, top+H+bottom, left+W+right)
        size = torch._shape_as_tensor(x)  # traced as Shape, so H and W stay dynamic in the graph
        rows = self._indices(size[2], self.before[0], self.after[0])
        cols = self._indices(size[3], self.before[1], self.after[1])
        return x.index_select(2, rows).index_select(3, cols)


class _ZeroPad(nn.Module):
    def __init__(self, before: tuple[int, int], after: tuple[int, int]):
        super().__init__()
        self.pads = (before[1], after[1], before[0], after[0])  # (left, right, top, bottom)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.pad(x, self.pads)


class _DilatedConv(nn.Module):
    """A stride-1 dilated conv with fixed weights (a dense conv, Linear head or average pool)."""

    def __init__(
        self, weight: torch.Tensor, bias: torch.Tensor | None, dilation: tuple[int, int], groups: int
    ):
        super().__init__()
        self.register_buffer("weight", weight.detach().clone())  # (K, C/groups, kh, kw)
        self.register_buffer("bias", None if bias is None else bias.detach().clone())
        self.dilation, self.groups = dilation, groups

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.conv2d(x, self.weight, self.bias, 1, 0, self.dilation, self.groups)


class _DilatedMaxPool(nn.Module):
    def __init__(self, kernel: tuple[int, int], dilation: tuple[int, int]):
        super().__init__()
        self.kernel, self.dilation = kernel, dilation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.max_pool2d(x, self.kernel, 1, 0, self.dilation)


def export_conv(layer: WindowLayer, channels: int) -> nn.Module:
    """A dense conv or Linear head: a dilated ``Conv``."""
    spec = layer.spec()
    return _DilatedConv(spec.weight, spec.bias, spec.dilation, spec.groups)


def export_max_pool(layer: WindowLayer, channels: int) -> nn.Module:
    """A dense max pool: a ``MaxPool`` with ``dilations``."""
    spec = layer.spec()
    return _DilatedMaxPool(spec.kernel, spec.dilation)


def export_avg_pool(layer: WindowLayer, channels: int) -> nn.Module:
    """A dense average pool: a depthwise dilated ``Conv`` with constant weights (ONNX's AveragePool has no
    dilations before opset 19)."""
    spec = layer.spec()
    weight = torch.full(
        (channels, 1, *spec.kernel), 1.0 / (spec.divisor or math.prod(spec.kernel))
    )  # (C, 1, kh, kw)
    return _DilatedConv(weight, None, spec.dilation, channels)


class _RunningNorm(nn.Module):
    """Per-channel normalisation with fixed running statistics (exported as ``BatchNormalization``)."""

    def __init__(self, norm: nn.Module):
        super().__init__()
        self.norm = norm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        norm = self.norm
        return F.batch_norm(
            x, norm.running_mean, norm.running_var, norm.weight, norm.bias, False, 0.0, norm.eps
        )


def export_running_norm(layer: nn.Module, channels: int) -> nn.Module:
    """An eval-mode InstanceNorm2d with running statistics: the same normalisation as a BatchNorm in eval mode."""
    return _RunningNorm(layer)


class _Threshold(nn.Module):
    def __init__(self, threshold: float, value: float):
        super().__init__()
        self.threshold, self.value = threshold, value

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.where(x > self.threshold, x, torch.full_like(x, self.value))


def export_threshold(layer: nn.Threshold, channels: int) -> nn.Module:
    """``nn.Threshold`` as a ``Where`` (torch exports only threshold 0)."""
    return _Threshold(layer.threshold, layer.value)


def exportable(dense: DenseCNN) -> nn.Sequential:
    """The dense net rebuilt from ONNX-friendly modules (padding first); same outputs as ``dense.forward``.

    Each dense layer is written as its layer type's record says (:class:`densecnn.rules.LayerRecord`, ``export``);
    layers without an export function (activations, per-pixel BatchNorm, channel softmax) are written as they are.
    """
    if dense.in_channels is None:
        raise OnnxExportError(
            "the dense net does not know its input channels; convert a model that starts with Conv2d"
        )
    exports = getattr(dense, "onnx_exports", None)
    if exports is None or len(exports) != len(dense.features):
        raise OnnxExportError(
            "this DenseCNN was not made by densecnn.convert(); convert the patch model to export it"
        )
    (top, bottom), (left, right) = (patch_offsets(p) for p in dense.patch_size)
    # the dense ops consume receptive_field - 1 pixels per axis; pad exactly as DenseCNN.pad does
    bottom, right = dense.receptive_field[0] - 1 - top, dense.receptive_field[1] - 1 - left
    if dense.padding_mode == "zeros":
        modules: list[nn.Module] = [_ZeroPad((top, left), (bottom, right))]
    else:
        modules = [_IndexPad((top, left), (bottom, right), dense.padding_mode)]
    channels = dense.in_channels
    for index, (layer, export) in enumerate(zip(dense.features, exports)):
        if export is not None:
            modules.append(export(layer, channels))
        elif isinstance(layer, WindowLayer):
            raise OnnxExportError(
                f"layer {index} ({type(layer).__name__}) is a windowed layer whose rule names no ONNX export; "
                "register its layer type with densecnn.register_rule(..., export=...)"
            )
        else:
            modules.append(layer)
        spec = layer.spec() if isinstance(layer, WindowLayer) else None
        channels = spec.weight.shape[0] if spec is not None and hasattr(spec, "weight") else channels
    return nn.Sequential(*modules).eval()


def export_onnx(dense: DenseCNN, path) -> Path:
    """Write ``dense`` as an ONNX model with input ``image`` (N, C, H, W) and output ``scores`` (N, K, H, W).

    N, H and W are dynamic. The graph includes the padding (``dense.padding_mode``) but not the model file's
    normalisation: feed it ``loaded.normalize(images)``.

    >>> export_onnx(densecnn.load("models/nuclei").dense(), "nuclei.onnx")
    PosixPath('nuclei.onnx')
    """
    try:
        import onnx
    except ImportError:
        raise OnnxExportError("ONNX export needs the onnx package: pip install onnx") from None
    module = exportable(dense)
    rf_h, rf_w = dense.receptive_field
    example = torch.zeros(1, dense.in_channels, max(rf_h, 8), max(rf_w, 8))
    out = Path(path)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter(
            "ignore"
        )  # the TorchScript exporter's deprecation notice; it is the one that works here
        torch.onnx.export(
            module,
            (example,),
            str(out),
            dynamo=False,
            opset_version=OPSET,
            input_names=["image"],
            output_names=["scores"],
            dynamic_axes={"image": {0: "N", 2: "H", 3: "W"}, "scores": {0: "N", 2: "H", 3: "W"}},
        )
    model = onnx.load(str(out))
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    onnx.save(model, str(out))
    return out
