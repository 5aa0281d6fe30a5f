"""Exact or refused, over a table of idioms: functional forwards with the module's own weights, TorchScript and
compiled models, noise and state updates in forward, quantized, meta and lazy models, normalisations in 1-D and 3-D
nets, kernels a backend lacks. Each idiom either converts to a dense net equal to patch scanning, or raises a
DenseCNNError whose message names the layer's dotted path (or the model) and says what to do."""

from __future__ import annotations

import re
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import densecnn
from densecnn import ops
from tests.functional_support import Functional
from tests.tolerances import assert_equal_to_rounding

FIX = re.compile(
    r"(^|[.:;(] ?)(use|pass|write|remove|convert|run|register|give|update|train|move|flatten|call|put|set|keep|load|"
    r"replace|apply|correct|cast)\b",
    re.IGNORECASE,
)


def P(*shape):  # noqa: N802 - a parameter, as the table reads
    return nn.Parameter(torch.randn(*shape) * 0.5)


def B(*shape, positive=False):  # noqa: N802 - a buffer
    values = torch.rand(*shape) + 0.5 if positive else torch.randn(*shape)
    return values


def head(x, channels):
    return x.flatten(1)


# ---- idioms that convert exactly: (model factory, patch size)
EXACT = {
    "conv2d self weight and bias": (
        lambda: Functional(lambda s, x: F.conv2d(x, s.w, s.b).flatten(1), w=P(3, 2, 5, 5), b=P(3)),
        5,
    ),
    "conv2d without bias": (lambda: Functional(lambda s, x: F.conv2d(x, s.w).flatten(1), w=P(3, 2, 5, 5)), 5),
    "conv2d bias keyword": (
        lambda: Functional(lambda s, x: F.conv2d(x, s.w, bias=s.b).flatten(1), w=P(3, 2, 5, 5), b=P(3)),
        5,
    ),
    "conv2d stride 2 then conv": (
        lambda: Functional(
            lambda s, x: F.conv2d(torch.relu(F.conv2d(x, s.w, s.b, stride=2)), s.v).flatten(1),
            w=P(4, 2, 3, 3),
            b=P(4),
            v=P(3, 4, 2, 2),
        ),
        6,
    ),  # fmt: skip
    "conv2d dilation 2": (
        lambda: Functional(lambda s, x: F.conv2d(x, s.w, None, 1, 0, 2).flatten(1), w=P(3, 2, 3, 3)),
        5,
    ),
    "conv2d groups 2": (
        lambda: Functional(
            lambda s, x: F.conv2d(F.conv2d(x, s.w, groups=2), s.v).flatten(1),
            w=P(4, 1, 3, 3),
            v=P(3, 4, 3, 3),
        ),
        5,
    ),
    "torch.conv2d": (
        lambda: Functional(lambda s, x: torch.conv2d(x, s.w, s.b).flatten(1), w=P(3, 2, 5, 5), b=P(3)),
        5,
    ),
    "conv2d weight a buffer": (
        lambda: Functional(lambda s, x: F.conv2d(x, s.w).flatten(1), w=B(3, 2, 5, 5)),
        5,
    ),
    "conv2d submodule's weight": (
        lambda: Functional(
            lambda s, x: F.conv2d(x, s.inner.weight, s.inner.bias).flatten(1), inner=nn.Conv2d(2, 3, 5)
        ),
        5,
    ),
    "conv2d pool relu functional": (
        lambda: Functional(
            lambda s, x: F.conv2d(F.relu(F.max_pool2d(F.conv2d(x, s.w, s.b), 2)), s.v).flatten(1),
            w=P(4, 2, 3, 3),
            b=P(4),
            v=P(3, 4, 2, 2),
        ),
        6,
    ),  # fmt: skip
    "conv2d shared weight twice": (
        lambda: Functional(
            lambda s, x: F.conv2d(torch.tanh(F.conv2d(x, s.w)), s.w).flatten(1), w=P(2, 2, 3, 3)
        ),
        5,
    ),
    "conv1d signal": (
        lambda: Functional(
            lambda s, x: F.conv1d(F.relu(F.conv1d(x, s.w, s.b)), s.v).flatten(1),
            w=P(4, 2, 3),
            b=P(4),
            v=P(3, 4, 3),
        ),
        5,
    ),  # fmt: skip
    "conv3d volume": (
        lambda: Functional(lambda s, x: F.conv3d(x, s.w, s.b).flatten(1), w=P(3, 2, 3, 3, 3), b=P(3)),
        3,
    ),
    "conv module then F.linear": (
        lambda: Functional(lambda s, x: F.linear(s.c(x).flatten(1), s.w), c=nn.Conv2d(2, 3, 3), w=P(4, 27)),
        5,
    ),
    "F.linear with bias": (
        lambda: Functional(
            lambda s, x: F.linear(s.c(x).flatten(1), s.w, s.b), c=nn.Conv2d(2, 3, 3), w=P(4, 27), b=P(4)
        ),
        5,
    ),  # fmt: skip
    "matmul transpose plus bias": (
        lambda: Functional(
            lambda s, x: s.c(x).flatten(1) @ s.w.t() + s.b, c=nn.Conv2d(2, 3, 3), w=P(4, 27), b=P(4)
        ),
        5,
    ),
    "matmul transpose no bias": (
        lambda: Functional(lambda s, x: s.c(x).flatten(1) @ s.w.t(), c=nn.Conv2d(2, 3, 3), w=P(4, 27)),
        5,
    ),
    "bias plus matmul": (
        lambda: Functional(
            lambda s, x: s.b + s.c(x).flatten(1) @ s.w.t(), c=nn.Conv2d(2, 3, 3), w=P(4, 27), b=P(4)
        ),
        5,
    ),
    "torch.matmul plus bias": (
        lambda: Functional(
            lambda s, x: torch.matmul(s.c(x).flatten(1), s.w.t()) + s.b,
            c=nn.Conv2d(2, 3, 3),
            w=P(4, 27),
            b=P(4),
        ),
        5,
    ),  # fmt: skip
    "addmm": (
        lambda: Functional(
            lambda s, x: torch.addmm(s.b, s.c(x).flatten(1), s.w.t()),
            c=nn.Conv2d(2, 3, 3),
            w=P(4, 27),
            b=P(4),
        ),
        5,
    ),  # fmt: skip
    "mm method": (
        lambda: Functional(lambda s, x: s.c(x).flatten(1).mm(s.w.t()), c=nn.Conv2d(2, 3, 3), w=P(4, 27)),
        5,
    ),
    "batch_norm buffers affine": (
        lambda: Functional(
            lambda s, x: s.h(F.batch_norm(s.c(x), s.m, s.v, s.w, s.b, s.training)).flatten(1),
            c=nn.Conv2d(2, 4, 3),
            h=nn.Conv2d(4, 3, 3),
            m=B(4),
            v=B(4, positive=True),
            w=P(4),
            b=P(4),
        ),
        5,
    ),  # fmt: skip
    "batch_norm no affine": (
        lambda: Functional(
            lambda s, x: s.h(F.batch_norm(s.c(x), s.m, s.v, training=False)).flatten(1),
            c=nn.Conv2d(2, 4, 3),
            h=nn.Conv2d(4, 3, 3),
            m=B(4),
            v=B(4, positive=True),
        ),
        5,
    ),  # fmt: skip
    "batch_norm eps and momentum": (
        lambda: Functional(
            lambda s, x: s.h(F.batch_norm(s.c(x), s.m, s.v, s.w, s.b, False, 0.3, 1e-3)).flatten(1),
            c=nn.Conv2d(2, 4, 3),
            h=nn.Conv2d(4, 3, 3),
            m=B(4),
            v=B(4, positive=True),
            w=P(4),
            b=P(4),
        ),
        5,
    ),  # fmt: skip
    "batch_norm of features": (
        lambda: Functional(
            lambda s, x: F.batch_norm(s.c(x).flatten(1), s.m, s.v, s.w, s.b, s.training),
            c=nn.Conv2d(2, 4, 5),
            m=B(4),
            v=B(4, positive=True),
            w=P(4),
            b=P(4),
        ),
        5,
    ),  # fmt: skip
    "batch_norm signal": (
        lambda: Functional(
            lambda s, x: s.h(F.batch_norm(s.c(x), s.m, s.v, s.w, s.b, s.training)).flatten(1),
            c=nn.Conv1d(2, 4, 3),
            h=nn.Conv1d(4, 3, 3),
            m=B(4),
            v=B(4, positive=True),
            w=P(4),
            b=P(4),
        ),
        5,
    ),  # fmt: skip
    "buffer counter not read": (
        lambda: Functional(
            lambda s, x: (s.n.add_(0), s.c(x).flatten(1))[1], c=nn.Conv2d(2, 3, 5), n=torch.zeros(())
        ),
        5,
    ),
    "noise only in training": (
        lambda: Functional(
            lambda s, x: s.c(x + torch.randn_like(x) if s.training else x).flatten(1), c=nn.Conv2d(2, 3, 5)
        ),
        5,
    ),
    "dropout functional training=self.training": (
        lambda: Functional(lambda s, x: F.dropout(s.c(x), 0.5, s.training).flatten(1), c=nn.Conv2d(2, 3, 5)),
        5,
    ),
}


def _op(name: str) -> str:
    return rf"op '{name}'"


# scripted when the tests are collected: torch's script compiler refused to compile nn.Conv2d ("builtin cannot be used
# as a value") in a process where other tests had run first
SCRIPTED_SEQUENTIAL = torch.jit.script(nn.Sequential(nn.Conv2d(2, 3, 3), nn.ReLU(), nn.Conv2d(3, 3, 3)))

# ---- idioms refused: (model factory, patch size, convert keyword arguments, the path or model its message names)
REFUSED = {
    "a constant minus the map": (
        lambda: Functional(
            lambda s, x: s.b(1.0 - s.a(x)).flatten(1), a=nn.Conv2d(2, 4, 3), b=nn.Conv2d(4, 3, 3)
        ),
        5,
        {},
        "takes the map as another argument than its input",
    ),  # fmt: skip
    "conv2d computed weight": (
        lambda: Functional(lambda s, x: F.conv2d(x, s.w * 2).flatten(1), w=P(3, 2, 5, 5)),
        5,
        {},
        _op("conv2d"),
    ),
    "conv2d padding 1": (
        lambda: Functional(lambda s, x: F.conv2d(x, s.w, padding=1).flatten(1), w=P(3, 2, 5, 5)),
        5,
        {},
        "'conv2d'",
    ),
    "matmul untransposed": (
        lambda: Functional(lambda s, x: s.c(x).flatten(1) @ s.w, c=nn.Conv2d(2, 3, 3), w=P(27, 4)),
        5,
        {},
        _op("matmul"),
    ),  # fmt: skip
    "addmm beta": (
        lambda: Functional(
            lambda s, x: torch.addmm(s.b, s.c(x).flatten(1), s.w.t(), beta=0.5),
            c=nn.Conv2d(2, 3, 3),
            w=P(4, 27),
            b=P(4),
        ),
        5,
        {},
        _op("addmm"),
    ),  # fmt: skip
    "bias added to a conv map": (
        lambda: Functional(lambda s, x: (F.conv2d(x, s.w) + s.b).flatten(1), w=P(3, 2, 5, 5), b=P(3, 1, 1)),
        5,
        {},
        _op("add"),
    ),  # fmt: skip
    "scaled by a parameter": (
        lambda: Functional(lambda s, x: (s.c(x) * s.g).flatten(1), c=nn.Conv2d(2, 3, 5), g=P(1)),
        5,
        {},
        _op("mul"),
    ),
    "batch_norm training=True in eval": (
        lambda: Functional(
            lambda s, x: s.h(F.batch_norm(s.c(x), s.m, s.v, training=True)).flatten(1),
            c=nn.Conv2d(2, 4, 3),
            h=nn.Conv2d(4, 3, 3),
            m=B(4),
            v=B(4, positive=True),
        ),
        5,
        {},
        _op("batch_norm"),
    ),  # fmt: skip
    "batch_norm batch statistics": (
        lambda: Functional(
            lambda s, x: s.h(F.batch_norm(s.c(x), None, None, training=True)).flatten(1),
            c=nn.Conv2d(2, 4, 3),
            h=nn.Conv2d(4, 3, 3),
        ),
        5,
        {},
        _op("batch_norm"),
    ),  # fmt: skip
    "randn_like noise": (
        lambda: Functional(lambda s, x: s.c(x + 0.1 * torch.randn_like(x)).flatten(1), c=nn.Conv2d(2, 3, 5)),
        5,
        {},
        _op("randn_like"),
    ),  # fmt: skip
    "rand_like mask": (
        lambda: Functional(lambda s, x: s.c(x * (torch.rand_like(x) > 0.1)).flatten(1), c=nn.Conv2d(2, 3, 5)),
        5,
        {},
        _op("rand_like"),
    ),  # fmt: skip
    "randn of the shape": (
        lambda: Functional(lambda s, x: s.c(x + torch.randn(x.shape)).flatten(1), c=nn.Conv2d(2, 3, 5)),
        5,
        {},
        _op("randn"),
    ),  # fmt: skip
    "rand of the size": (
        lambda: Functional(lambda s, x: s.c(x * torch.rand(x.size())).flatten(1), c=nn.Conv2d(2, 3, 5)),
        5,
        {},
        _op("rand"),
    ),  # fmt: skip
    "bernoulli": (
        lambda: Functional(
            lambda s, x: s.c(torch.bernoulli(torch.sigmoid(x))).flatten(1), c=nn.Conv2d(2, 3, 5)
        ),
        5,
        {},
        _op("bernoulli"),
    ),  # fmt: skip
    "normal around the input": (
        lambda: Functional(lambda s, x: s.c(torch.normal(x, 0.1)).flatten(1), c=nn.Conv2d(2, 3, 5)),
        5,
        {},
        _op("normal"),
    ),  # fmt: skip
    "in-place normal_": (
        lambda: Functional(lambda s, x: s.c(x.clone().normal_()).flatten(1), c=nn.Conv2d(2, 3, 5)),
        5,
        {},
        _op("normal_"),
    ),  # fmt: skip
    "poisson": (
        lambda: Functional(lambda s, x: s.c(torch.poisson(x.abs())).flatten(1), c=nn.Conv2d(2, 3, 5)),
        5,
        {},
        _op("poisson"),
    ),  # fmt: skip
    "dropout training=True": (
        lambda: Functional(lambda s, x: F.dropout(s.c(x), 0.5, True).flatten(1), c=nn.Conv2d(2, 3, 5)),
        5,
        {},
        _op("dropout"),
    ),  # fmt: skip
    "dropout2d training=True": (
        lambda: Functional(lambda s, x: F.dropout2d(s.c(x), 0.5, True).flatten(1), c=nn.Conv2d(2, 3, 5)),
        5,
        {},
        _op("dropout2d"),
    ),  # fmt: skip
    "alpha_dropout training=True": (
        lambda: Functional(lambda s, x: F.alpha_dropout(s.c(x), 0.5, True).flatten(1), c=nn.Conv2d(2, 3, 5)),
        5,
        {},
        _op("alpha_dropout"),
    ),  # fmt: skip
    "buffer copied from the map": (
        lambda: Functional(
            lambda s, x: (s.m.copy_(x.mean()), s.c(x).flatten(1))[1], c=nn.Conv2d(2, 3, 5), m=torch.zeros(())
        ),
        5,
        {},
        _op("copy_"),
    ),  # fmt: skip
    "functional conv on a parametrised layer's weight": (
        lambda: Functional(
            lambda s, x: F.conv2d(x, s.c.weight, s.c.bias).flatten(1),
            c=torch.nn.utils.parametrizations.weight_norm(nn.Conv2d(2, 3, 5)),
        ),
        5,
        {},
        "the parametrised weight of layer 'c'",
    ),  # fmt: skip
    "buffer updated by a constant and read": (
        lambda: Functional(
            lambda s, x: s.c(x + s.m.add_(1.0)).flatten(1), c=nn.Conv2d(2, 3, 5), m=torch.zeros(())
        ),
        5,
        {},
        _op("add_"),
    ),  # fmt: skip
    "branch on a buffer's value": (
        lambda: Functional(
            lambda s, x: (F.relu(s.c(x)) if s.flag else s.c(x)).flatten(1),
            c=nn.Conv2d(2, 3, 5),
            flag=torch.tensor(True),
        ),
        5,
        {},
        "branches on a tensor's value",
    ),  # fmt: skip
    "buffer updated by the map": (
        lambda: Functional(
            lambda s, x: (s.m.add_(x.sum()), s.c(x).flatten(1))[1], c=nn.Conv2d(2, 3, 5), m=torch.zeros(())
        ),
        5,
        {},
        _op("add_"),
    ),  # fmt: skip
    "skip connection": (
        lambda: Functional(
            lambda s, x: (s.c(x) + s.d(x)).flatten(1), c=nn.Conv2d(2, 3, 5), d=nn.Conv2d(2, 3, 5)
        ),
        5,
        {},
        _op("d"),
    ),  # fmt: skip
    "torch.jit.script sequential": (
        lambda: SCRIPTED_SEQUENTIAL,
        5,
        {},
        "the model",
    ),  # fmt: skip
    "torch.jit.trace sequential": (
        lambda: torch.jit.trace(
            nn.Sequential(nn.Conv2d(2, 3, 3), nn.ReLU(), nn.Conv2d(3, 3, 3)), torch.rand(1, 2, 5, 5)
        ),
        5,
        {},
        "the model",
    ),  # fmt: skip
    "torch.jit.script custom module": (lambda: torch.jit.script(Scriptable()), 5, {}, "the model"),
    "a scripted layer inside": (
        lambda: nn.Sequential(nn.Conv2d(2, 3, 3), torch.jit.script(nn.ReLU()), nn.Conv2d(3, 3, 3)),
        5,
        {},
        "'1'",
    ),
    "a traced layer inside": (
        lambda: nn.Sequential(
            torch.jit.trace(nn.Conv2d(2, 3, 3), torch.rand(1, 2, 5, 5)), nn.Conv2d(3, 3, 3)
        ),
        5,
        {},
        "'0'",
    ),  # fmt: skip
    "torch.compile sequential": (
        lambda: torch.compile(nn.Sequential(nn.Conv2d(2, 3, 3), nn.ReLU(), nn.Conv2d(3, 3, 3))),
        5,
        {},
        "_orig_mod",
    ),
    "torch.compile custom module": (lambda: torch.compile(Scriptable()), 5, {}, "_orig_mod"),
    "quantize_dynamic linear head": (
        lambda: torch.ao.quantization.quantize_dynamic(
            nn.Sequential(nn.Conv2d(2, 3, 5), nn.Flatten(), nn.Linear(3, 3)), {nn.Linear}
        ),
        5,
        {},
        "'2'",
    ),  # fmt: skip
    "quantize_dynamic nested": (
        lambda: torch.ao.quantization.quantize_dynamic(
            nn.Sequential(
                nn.Conv2d(2, 3, 5), nn.Sequential(nn.Flatten(), nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 3))
            )
        ),
        5,
        {},
        "'1.1'",
    ),  # fmt: skip
    "meta device model": (
        lambda: _on_meta(lambda: nn.Sequential(nn.Conv2d(2, 3, 3), nn.ReLU(), nn.Conv2d(3, 3, 3))),
        5,
        {},
        "'0.weight'",
    ),  # fmt: skip
    "meta buffers only": (
        lambda: _meta_buffers(nn.Sequential(nn.Conv2d(2, 3, 3), nn.BatchNorm2d(3), nn.Conv2d(3, 3, 3))),
        5,
        {},
        "'1.running_mean'",
    ),  # fmt: skip
    "meta nested": (
        lambda: nn.Sequential(
            nn.Conv2d(2, 3, 3), _on_meta(lambda: nn.Sequential(nn.ReLU(), nn.Conv2d(3, 3, 3)))
        ),
        5,
        {},
        "'1.1.weight'",
    ),  # fmt: skip
    "lazy conv not run": (
        lambda: nn.Sequential(nn.LazyConv2d(3, 3), nn.ReLU(), nn.Conv2d(3, 3, 3)),
        5,
        {},
        "'0'",
    ),
    "lazy linear not run": (
        lambda: nn.Sequential(nn.Conv2d(2, 3, 5), nn.Flatten(), nn.LazyLinear(3)),
        5,
        {},
        "'2'",
    ),
    # a diverged training run's weights: the scores they feed are NaN, every pixel no-data (verification agrees)
    "NaN weights": (
        lambda: _poisoned(
            nn.Sequential(nn.Conv2d(2, 3, 3), nn.ReLU(), nn.Conv2d(3, 3, 3)), "0.weight", "nan"
        ),
        5,
        {},
        "'0.weight' has 54 NaN values (of 54)",
    ),
    "infinite batch norm statistics": (
        lambda: _poisoned(
            nn.Sequential(nn.Conv2d(2, 3, 3), nn.BatchNorm2d(3), nn.Conv2d(3, 3, 3)), "1.running_var", "inf"
        ),
        5,
        {},
        "buffer '1.running_var' has 3 infinite values",
    ),
    "one NaN in a nested layer's bias": (
        lambda: _poisoned(
            nn.Sequential(nn.Conv2d(2, 3, 3), nn.Sequential(nn.ReLU(), nn.Conv2d(3, 3, 3))),
            "1.1.bias",
            "nan",
            1,
        ),
        5,
        {},
        "'1.1.bias' has 1 NaN value (of 3)",
    ),
    "group norm in a signal net": (
        lambda: nn.Sequential(nn.Conv1d(2, 4, 3), nn.GroupNorm(2, 4), nn.Conv1d(4, 3, 3)),
        5,
        {},
        "'1'",
    ),
    "group norm in a volume net": (
        lambda: nn.Sequential(nn.Conv3d(2, 4, 2), nn.GroupNorm(2, 4), nn.Conv3d(4, 3, 2)),
        3,
        {},
        "'1'",
    ),
    "instance norm in a signal net": (
        lambda: nn.Sequential(nn.Conv1d(2, 4, 3), nn.InstanceNorm1d(4), nn.Conv1d(4, 3, 3)),
        5,
        {},
        "'1'",
    ),
    "layer norm over a signal map": (
        lambda: nn.Sequential(nn.Conv1d(2, 4, 3), nn.LayerNorm([4, 3]), nn.Conv1d(4, 3, 3)),
        5,
        {},
        "'1'",
    ),
    "backend ext on 1x1 and 1-D convs": (
        lambda: nn.Sequential(nn.Conv1d(2, 5, 1), nn.Conv1d(5, 4, 2)),
        2,
        {"backend": "ext"},
        "'",
    ),
}


class Scriptable(nn.Module):
    def __init__(self):
        super().__init__()
        self.c = nn.Conv2d(2, 3, 5)

    def forward(self, x):
        return torch.relu(self.c(x)).flatten(1)


def _on_meta(factory):
    with torch.device("meta"):
        return factory()


def _poisoned(model: nn.Module, name: str, value: str, count: int | None = None) -> nn.Module:
    """``model`` with the first ``count`` values (None: all) of its parameter or buffer ``name`` set to ``value``."""
    tensor = dict([*model.named_parameters(), *model.named_buffers()])[name]
    with torch.no_grad():
        tensor.view(-1)[:count].fill_(float(value))
    return model


def _meta_buffers(model: nn.Module) -> nn.Module:
    for module in model.modules():
        for name, buffer in list(module._buffers.items()):
            if buffer is not None:
                module._buffers[name] = buffer.to("meta")
    return model


DIMS = {"conv1d signal": 1, "batch_norm signal": 1, "conv3d volume": 3}


@pytest.mark.parametrize("name", sorted(EXACT))
def test_idiom_converts_exactly(name):
    factory, patch = EXACT[name]
    torch.manual_seed(0)
    model = factory().double().eval()
    dims = DIMS.get(name, 2)
    dense = densecnn.convert(model, patch)
    x = torch.rand(2, 2, *(7, 9, 6)[:dims], dtype=torch.float64)
    with torch.no_grad():
        assert_equal_to_rounding(dense(x), densecnn.scan_patches(model, x, patch), name)


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_idiom_is_refused_naming_the_layer_and_a_fix(name):
    factory, patch, options, where = REFUSED[name]
    if options.get("backend") == "ext" and not ops.ext_available():
        pytest.skip("densecnn's kernels are not built")
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = factory()
        model.eval()
        with pytest.raises(densecnn.DenseCNNError) as info:
            densecnn.convert(model, patch, **options)
    message = str(info.value)
    assert where in message, message
    assert FIX.search(message), f"no fix in: {message}"


@pytest.mark.parametrize("dims, suggestion", [(1, "BatchNorm1d"), (3, "BatchNorm3d")])
def test_group_norm_suggests_the_batch_norm_of_the_net_s_dimension(dims, suggestion):
    factory = REFUSED[f"group norm in a {'signal' if dims == 1 else 'volume'} net"][0]
    with pytest.raises(densecnn.ConversionError, match=suggestion) as info:
        densecnn.convert(factory().eval(), 5 if dims == 1 else 3)
    assert "BatchNorm2d" not in str(info.value)


def test_jit_compile_and_random_refusals_say_what_the_model_is():
    for name, words in {
        "torch.jit.script sequential": "torch.jit.script",
        "torch.jit.trace sequential": "torch.jit.trace",
        "torch.compile sequential": "torch.compile",
        "randn_like noise": "random",
        "dropout training=True": "random",
        "quantize_dynamic linear head": "quantized",
        "meta device model": "meta device",
        "backend ext on 1x1 and 1-D convs": "backend='auto'",
    }.items():
        factory, patch, options, _ = REFUSED[name]
        if options.get("backend") == "ext" and not ops.ext_available():
            continue
        with pytest.raises(densecnn.DenseCNNError, match=re.escape(words)):
            densecnn.convert(factory().eval(), patch, **options)


def test_functional_weights_are_shared_not_copied():
    factory, patch = EXACT["matmul transpose plus bias"]
    model = factory().double().eval()
    dense = densecnn.convert(model, patch)
    x = torch.rand(1, 2, 8, 8, dtype=torch.float64)
    with torch.no_grad():
        model.w.mul_(-2)
        model.b.add_(1)
        assert_equal_to_rounding(dense(x), densecnn.scan_patches(model, x, patch))
    dense(x).sum().backward()
    assert model.w.grad is not None and model.b.grad is not None


def test_a_rule_that_fails_is_reported_naming_the_layer():
    class Broken(nn.Module):
        def forward(self, x):
            return x

    @densecnn.register_rule(Broken)
    def _(module, ctx):
        raise KeyError("oops")

    model = nn.Sequential(nn.Conv2d(1, 2, 3), Broken(), nn.Conv2d(2, 2, 3))
    with pytest.raises(
        densecnn.ConversionError, match=r"layer '1' \(Broken\): its conversion rule .* KeyError"
    ):
        densecnn.convert(model.eval(), 5)


def test_the_table_is_large():
    assert len(EXACT) + len(REFUSED) >= 60


class LinearThenBias(nn.Module):
    """``self.fc(h) + self.bias`` with a bias-less nn.Linear: the add is read as the Linear's bias."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 5)
        self.fc = nn.Linear(4, 3, bias=False)
        self.bias = nn.Parameter(torch.randn(3))

    def forward(self, x):
        return self.fc(torch.relu(self.conv(x)).flatten(1)) + self.bias


def test_a_bias_added_after_a_bias_less_linear_leaves_the_model_as_it_was():
    torch.manual_seed(0)
    model = LinearThenBias().double().eval()
    patches = torch.rand(4, 2, 5, 5, dtype=torch.float64)
    with torch.no_grad():
        before = model(patches)
    keys = list(model.state_dict())
    dense = densecnn.convert(model, 5)
    assert model.fc.bias is None and list(model.state_dict()) == keys
    x = torch.rand(1, 2, 9, 11, dtype=torch.float64)
    with torch.no_grad():
        assert torch.equal(model(patches), before)
        model.bias.add_(1.5)  # the shared bias, trained on
        model.fc.weight.mul_(-1)
        assert_equal_to_rounding(dense(x), densecnn.scan_patches(model, x, 5))


def test_a_model_that_is_not_a_module_is_refused_by_type():
    with pytest.raises(densecnn.errors.InvalidTypeError, match="not a torch.nn.Module"):
        densecnn.convert(lambda x: x, 5)
