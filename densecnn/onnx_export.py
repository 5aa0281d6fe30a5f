"""Export a DenseCNN to ONNX: image (N, C, H, W) -> scores (N, K, H, W) for any H and W, padding included.

The graph holds the dense net's stride-1 dilated ops: ``Conv`` with ``dilations`` (convs and Linear heads),
``MaxPool`` with ``dilations`` (opset >= 10), average pooling as a depthwise ``Conv`` with constant
weights, and the image padding as ``Pad`` (zeros) or a ``Gather`` of mirrored/clamped row and column indices
(reflect, replicate), so the ONNX model maps images to scores exactly like ``DenseCNN.forward``. ONNX's Conv and
MaxPool are N-d, so nets for signals (N, C, L) and volumes (N, C, D, H, W) export the same way, every spatial axis
dynamic.

>>> loaded = densecnn.load("models/nuclei")
>>> export_onnx(loaded.dense(), "nuclei.onnx")          # normalisation is NOT in the graph: apply it first
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from .atomic import atomic_write
from .dense import DenseCNN
from .errors import OnnxExportError
from .layers import DenseAvgPool, DenseConv, DenseLinear, DenseMaxPool, WindowLayer, functional
from .padding import dense_padding, source_index

OPSET = 17  # dilated MaxPool needs >= 10
SCORE_TOLERANCE = 1e-4  # the exported graph's scores against the dense net's, relative to the largest score
IR_VERSION = 8  # the IR version that goes with opset 17; onnxruntime >= 1.14 loads it


class _IndexPad(nn.Module):
    """Reflect/replicate padding as a gather of indices along each spatial axis, from the input's dynamic size."""

    def __init__(self, before: tuple[int, ...], after: tuple[int, ...], padding_mode: str):
        super().__init__()
        self.before, self.after, self.padding_mode = before, after, padding_mode

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (N, C, *S) -> (N, C, *(before + S + after))
        size = torch._shape_as_tensor(x)  # traced as Shape, so the spatial sizes stay dynamic in the graph
        for axis, (before, after) in enumerate(zip(self.before, self.after), start=2):
            positions = torch.arange(-before, size[axis] + after)  # (before + length + after,)
            x = x.index_select(axis, source_index(positions, size[axis], self.padding_mode))
        return x


class _ZeroPad(nn.Module):
    def __init__(self, before: tuple[int, ...], after: tuple[int, ...]):
        super().__init__()
        self.pads = tuple(
            w for b, a in zip(reversed(before), reversed(after)) for w in (b, a)
        )  # last axis first

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.pad(x, self.pads)


class _DilatedConv(nn.Module):
    """A stride-1 dilated conv with fixed weights (a dense conv, Linear head or average pool)."""

    def __init__(
        self, weight: torch.Tensor, bias: torch.Tensor | None, dilation: tuple[int, ...], groups: int
    ):
        super().__init__()
        self.register_buffer("weight", weight.detach().clone())  # (K, C/groups, *k)
        self.register_buffer("bias", None if bias is None else bias.detach().clone())
        self.dilation, self.groups = dilation, groups

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return functional("conv", len(self.dilation))(
            x, self.weight, self.bias, 1, 0, self.dilation, self.groups
        )


class _DilatedMaxPool(nn.Module):
    def __init__(self, kernel: tuple[int, ...], dilation: tuple[int, ...]):
        super().__init__()
        self.kernel, self.dilation = kernel, dilation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return functional("max_pool", len(self.kernel))(x, self.kernel, 1, 0, self.dilation)


def export_conv(layer: WindowLayer, channels: int) -> nn.Module:
    """A dense conv or Linear head: a dilated ``Conv``."""
    op = layer.dense_op()
    return _DilatedConv(op.weight, op.bias, op.dilation, op.groups)


def export_max_pool(layer: WindowLayer, channels: int) -> nn.Module:
    """A dense max pool: a ``MaxPool`` with ``dilations``."""
    op = layer.dense_op()
    return _DilatedMaxPool(op.kernel, op.dilation)


def export_avg_pool(layer: WindowLayer, channels: int) -> nn.Module:
    """A dense average pool: a depthwise dilated ``Conv`` with constant weights (ONNX's AveragePool has no
    dilations before opset 19)."""
    op = layer.dense_op()
    weight = torch.full((channels, 1, *op.kernel), 1.0 / (op.divisor or math.prod(op.kernel)))  # (C, 1, *k)
    return _DilatedConv(weight, None, op.dilation, channels)


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
    """An eval-mode InstanceNorm1d/2d/3d with running statistics: the same normalisation as a BatchNorm in eval
    mode."""
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


class _Softplus(nn.Module):
    def __init__(self, beta: float, threshold: float):
        super().__init__()
        self.beta, self.threshold = beta, threshold

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.where(x * self.beta > self.threshold, x, F.softplus(x, self.beta))


def export_softplus(layer: nn.Softplus, channels: int) -> nn.Module:
    """``nn.Softplus`` with its linear part above ``threshold`` as a ``Where`` (torch's export drops the threshold)."""
    return _Softplus(layer.beta, layer.threshold)


# dense layer type -> (dense layer, channels entering it) -> an ONNX-friendly module; a layer of another type is
# written as it is (torch.onnx traces its forward: activations, per-pixel BatchNorm, channel softmax)
Export = Callable[[nn.Module, int], nn.Module]
_EXPORTS: dict[type, Export] = {
    DenseConv: export_conv,
    DenseLinear: export_conv,
    DenseMaxPool: export_max_pool,
    DenseAvgPool: export_avg_pool,
    nn.InstanceNorm1d: export_running_norm,
    nn.InstanceNorm2d: export_running_norm,
    nn.InstanceNorm3d: export_running_norm,
    nn.Threshold: export_threshold,
    nn.Softplus: export_softplus,
}


def register_export(layer_type: type) -> Callable[[Export], Export]:
    """Register how a dense layer type of your own (what your conversion rule returns) is written to ONNX: the
    decorated ``export(layer, channels) -> nn.Module`` returns a module of ONNX-friendly ops computing the same. A
    windowed layer (a :class:`~densecnn.layers.WindowLayer`) needs one; other layers are exported as they are.

    >>> @densecnn.onnx_export.register_export(DenseMedianPool)
    ... def _(layer, channels):
    ...     return MedianPoolForOnnx(layer.kernel, layer.dilation)
    """

    def decorator(export: Export) -> Export:
        _EXPORTS[layer_type] = export
        return export

    return decorator


def exportable(dense: DenseCNN) -> nn.Sequential:
    """The dense net rebuilt from ONNX-friendly modules (padding first); same outputs as ``dense.forward``.

    Each dense layer is written by the export registered for its type (:func:`register_export`); layers without
    one (activations, per-pixel BatchNorm, channel softmax) are written as they are, shared with the patch model:
    run it under :func:`evaluating`, which leaves their modes as it found them.

    Raises:
        OnnxExportError: the net does not know its input channels, or a windowed layer has no export.
        ModelChangedError: the patch model changed since conversion (as ``dense(x)`` raises).
    """
    dense.check_model()
    if dense.in_channels is None:
        raise OnnxExportError(
            "the dense net does not know its input channels; convert a model that starts with Conv2d"
        )
    # the dense ops consume receptive_field - 1 pixels per axis; pad exactly as DenseCNN.pad does
    before, after = dense_padding(dense.patch_size, dense.receptive_field)
    if dense.padding_mode == "zeros":
        modules: list[nn.Module] = [_ZeroPad(before, after)]
    else:
        modules = [_IndexPad(before, after, dense.padding_mode)]
    channels = dense.in_channels
    for index, layer in enumerate(dense.features):
        export = _EXPORTS.get(type(layer))
        if export is not None:
            modules.append(export(layer, channels))
        elif isinstance(layer, WindowLayer):
            raise OnnxExportError(
                f"layer {index} ({type(layer).__name__}) is a windowed layer with no ONNX export; register one "
                "with @densecnn.onnx_export.register_export"
            )
        else:
            modules.append(layer)
        op = layer.dense_op() if isinstance(layer, WindowLayer) else None
        channels = op.weight.shape[0] if op is not None and hasattr(op, "weight") else channels
    return nn.Sequential(*modules)


@contextlib.contextmanager
def evaluating(module: nn.Module) -> Iterator[nn.Module]:
    """``module`` and its submodules in eval mode inside the block, each back in its own mode after it (an
    exportable net shares layers with the patch model, which may be in the middle of training)."""
    modes = [(m, m.training) for m in module.modules()]
    module.eval()
    try:
        yield module
    finally:
        for m, training in modes:
            m.training = training


def export_onnx(dense: DenseCNN, path) -> Path:
    """Write ``dense`` as an ONNX model with input ``image`` (N, C, H, W) and output ``scores`` (N, K, H, W)
    ((N, C, D, H, W) -> (N, K, D, H, W) for a volume net, (N, C, L) -> (N, K, L) for a signal net).

    N and the spatial axes are dynamic. The graph includes the padding (``dense.padding_mode``) but not the model file's
    normalisation: feed it ``loaded.normalize(images)``.

    >>> export_onnx(densecnn.load("models/nuclei").dense(), "nuclei.onnx")
    PosixPath('nuclei.onnx')

    Raises:
        OnnxExportError: onnx is missing, the net's weights are not float32, or (where onnxruntime is
            installed) the graph's scores on a test image differ from the net's (:func:`check_scores`).
        ModelChangedError: the patch model changed since conversion.
    """
    try:
        import onnx
    except ImportError:
        raise OnnxExportError("ONNX export needs the onnx package: pip install onnx") from None
    dtypes = {t.dtype for t in (*dense.parameters(), *dense.buffers()) if t.is_floating_point()}
    if dtypes - {torch.float32}:
        raise OnnxExportError(
            f"the net's weights are {', '.join(sorted(map(str, dtypes)))}, and the ONNX graph takes float32 images: "
            "export a float32 copy (model.float(), then convert or save it again)"
        )
    example = torch.zeros(1, dense.in_channels, *(max(r, 8) for r in dense.receptive_field))
    axes = {0: "N", **dict(zip(range(2, dense.dims + 2), {1: "L", 2: "HW", 3: "DHW"}[dense.dims]))}
    out = Path(path)

    def write(tmp: Path) -> None:
        # the graph is written and checked beside ``out`` and then moved over it: a failed or interrupted export
        # (a full disk, Ctrl-C) leaves the file that was there, never a cut-off one
        with evaluating(exportable(dense)) as module, warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter(
                "ignore"
            )  # the TorchScript exporter's deprecation notice; it is the one that works here
            torch.onnx.export(
                module,
                (example,),
                str(tmp),
                dynamo=False,
                opset_version=OPSET,
                input_names=["image"],
                output_names=["scores"],
                dynamic_axes={"image": axes, "scores": axes},
            )
        model = onnx.load(str(tmp))
        model.ir_version = IR_VERSION
        onnx.checker.check_model(model)
        onnx.save(model, str(tmp))
        check_scores(dense, tmp)

    atomic_write(out, write)
    return out


def check_scores(dense: DenseCNN, path: Path) -> None:
    """Run the ONNX model at ``path`` with onnxruntime (where it is installed) on a random image and compare its
    scores with ``dense``'s: a layer that torch's exporter writes wrongly is refused, not shipped.

    Raises:
        OnnxExportError: the scores differ beyond float32 rounding (the file is removed).
    """
    try:
        import onnxruntime
    except ImportError:
        return
    generator = torch.Generator().manual_seed(0)
    image = torch.randn(2, dense.in_channels, *(r + 5 for r in dense.receptive_field), generator=generator)
    with evaluating(dense), torch.no_grad():
        expected = dense(image)
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = torch.from_numpy(session.run(None, {"image": image.numpy()})[0])
    scale = max(1.0, expected.abs().max().item())
    difference = (got - expected).abs().max().item() if got.shape == expected.shape else math.inf
    if not difference <= SCORE_TOLERANCE * scale:
        path.unlink(missing_ok=True)
        raise OnnxExportError(
            f"the exported graph's scores differ from the dense net's by {difference:.3g} (largest score "
            f"{scale:.3g}) on a test image: a layer is written to ONNX wrongly. Register an export for it with "
            "@densecnn.onnx_export.register_export, or report it"
        )
