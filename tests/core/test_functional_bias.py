"""Biases of functional ops in a traced ``forward``: added with ``torch.add(..., alpha=...)``, given to
``F.batch_norm`` without a weight (or a weight without a bias), or given to ``F.linear``/``torch.addmm``/``+`` in a
shape that broadcasts to the scores (``(1, K)``, a scalar). Each converts to a dense net whose scores equal the patch
model's, patch by patch, and whose gradients (the bias's included) equal the patch model's, and saves and loads to the
same scores; or it is refused naming the problem and the fix."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import densecnn
from tests.functional_support import Functional
from tests.naive import literal_scan, numpy_pad_for_patches
from tests.tolerances import assert_equal_to_rounding

PATCH = (5, 5)


def conv_then(head_fn, **tensors) -> Functional:
    """A conv (4 channels, 3×3) then ``head_fn(self, conv_output)``, with the tensors the head reads."""
    return Functional(lambda model, x: head_fn(model, model.conv(x)), conv=nn.Conv2d(2, 4, 3), **tensors)


def _zeros(*shape):
    return nn.Parameter(torch.zeros(*shape))


def _weight():
    return nn.Parameter(torch.randn(3, 36) * 0.3)


def _statistics():
    return {"m": torch.randn(4), "v": torch.rand(4) + 0.5, "h": nn.Conv2d(4, 3, 3)}


def _trained(model: nn.Module) -> nn.Module:
    """``model`` in float64 and eval mode, its zero-initialised tensors given values (as training would)."""
    model = model.double().eval()
    with torch.no_grad():
        for parameter in model.parameters():
            if not parameter.any():
                parameter.copy_(torch.randn_like(parameter))
    return model


def patch_gradients(model: nn.Module, x: torch.Tensor, weights: torch.Tensor) -> list[torch.Tensor]:
    """The gradients of ``sum(weights · scores)`` with the patch model run on each position's patch, cut from the
    numpy-padded input (``weights``: (N, K, *S), one per score)."""
    padded = torch.from_numpy(numpy_pad_for_patches(x.numpy(), PATCH, "zeros"))
    model.zero_grad()
    n, _, *size = x.shape
    for b in range(n):
        for position in itertools.product(*(range(s) for s in size)):
            window = tuple(slice(i, i + p) for i, p in zip(position, PATCH, strict=True))
            scores = model(padded[(slice(b, b + 1), slice(None), *window)]).reshape(-1)
            (scores * weights[(b, slice(None), *position)]).sum().backward()
    return [parameter.grad.clone() for parameter in model.parameters()]


def dense_gradients(model: nn.Module, dense, x: torch.Tensor, weights: torch.Tensor) -> list[torch.Tensor]:
    """The gradients of ``sum(weights · scores)`` through the dense net."""
    model.zero_grad()
    (dense(x) * weights).sum().backward()
    return [parameter.grad.clone() for parameter in model.parameters()]


def assert_exact_and_trains_like_the_patch_model(factory) -> None:
    """Converted while its biases are 0 (their usual initial value), then given values: the dense net's scores and
    gradients equal the patch model's, patch by patch."""
    torch.manual_seed(0)
    model = factory().double().eval()
    dense = densecnn.convert(model, PATCH)
    model = _trained(model)
    x = torch.rand(1, 2, 7, 6, dtype=torch.float64)
    assert_equal_to_rounding(dense(x), literal_scan(model, x, PATCH))
    weights = torch.randn(1, 3, 7, 6, dtype=torch.float64)
    for got, want in zip(
        dense_gradients(model, dense, x, weights), patch_gradients(model, x, weights), strict=True
    ):
        assert_equal_to_rounding(got, want)


def assert_saves_and_loads_to_the_patch_model_s_scores(factory, directory) -> None:
    torch.manual_seed(1)
    model = _trained(factory())
    densecnn.save(model, directory, patch_size=PATCH)
    loaded = densecnn.load(directory)
    x = torch.rand(1, 2, 7, 6, dtype=torch.float64)
    with torch.no_grad():
        assert_equal_to_rounding(loaded.dense()(x), literal_scan(model, x, PATCH))


# ---- torch.add's alpha scales an operand: refused; alpha=1 is a plain bias
SCALED_ADDS = {
    "torch.add alpha 2": lambda s, h: torch.add(h.flatten(1) @ s.w.t(), s.b, alpha=2),
    "method add alpha 0.5": lambda s, h: (h.flatten(1) @ s.w.t()).add(s.b, alpha=0.5),
    "alpha scaling the map": lambda s, h: torch.add(s.b, F.linear(h.flatten(1), s.w), alpha=2),
    "after a bias-less nn.Linear": lambda s, h: torch.add(s.fc(h.flatten(1)), s.b, alpha=-1),
}


@pytest.mark.parametrize("name", SCALED_ADDS)
def test_an_add_with_alpha_is_refused_naming_alpha_and_the_fix(name):
    model = conv_then(SCALED_ADDS[name], w=_weight(), b=_zeros(3), fc=nn.Linear(36, 3, bias=False))
    with pytest.raises(densecnn.ConversionError, match=r"op 'add.*alpha other than 1 .* Write it"):
        densecnn.convert(model.eval(), PATCH)


def test_an_add_into_out_is_refused_naming_the_argument():
    model = conv_then(
        lambda s, h: torch.add(h.flatten(1) @ s.w.t(), s.b, out=s.scores),
        w=_weight(),
        b=_zeros(3),
        scores=torch.zeros(1, 3),
    )
    with pytest.raises(densecnn.ConversionError, match=r"out= is not a bias .* without those arguments"):
        densecnn.convert(model.eval(), PATCH)


def test_an_add_with_alpha_1_is_the_bias_and_trains_like_the_patch_model():
    assert_exact_and_trains_like_the_patch_model(
        lambda: conv_then(
            lambda s, h: torch.add(h.flatten(1) @ s.w.t(), s.b, alpha=1), w=_weight(), b=_zeros(3)
        )
    )


# ---- F.batch_norm with a bias and no weight, or a weight and no bias
BATCH_NORMS = {
    "bias without weight": lambda: conv_then(
        lambda s, h: s.h(F.batch_norm(h, s.m, s.v, None, s.b, s.training)).flatten(1),
        b=_zeros(4),
        **_statistics(),
    ),
    "bias by keyword": lambda: conv_then(
        lambda s, h: s.h(F.batch_norm(h, s.m, s.v, bias=s.b, training=False)).flatten(1),
        b=_zeros(4),
        **_statistics(),
    ),
    "weight without bias": lambda: conv_then(
        lambda s, h: s.h(F.batch_norm(h, s.m, s.v, s.g, None, s.training)).flatten(1),
        g=_zeros(4),
        **_statistics(),
    ),
    "weight and bias": lambda: conv_then(
        lambda s, h: s.h(F.batch_norm(h, s.m, s.v, s.g, s.b, s.training)).flatten(1),
        g=_zeros(4),
        b=_zeros(4),
        **_statistics(),
    ),
    "of features, bias without weight": lambda: conv_then(
        lambda s, h: F.batch_norm(F.linear(h.flatten(1), s.w), s.f, s.u, None, s.b, s.training),
        w=_weight(),
        f=torch.randn(3),
        u=torch.rand(3) + 0.5,
        b=_zeros(3),
    ),
}


@pytest.mark.parametrize("name", BATCH_NORMS)
def test_a_functional_batch_norm_s_bias_and_weight_act_and_train_like_the_patch_model(name):
    assert_exact_and_trains_like_the_patch_model(BATCH_NORMS[name])


@pytest.mark.parametrize("name", BATCH_NORMS)
def test_a_functional_batch_norm_saves_and_loads_to_the_same_scores(name, tmp_path):
    assert_saves_and_loads_to_the_patch_model_s_scores(BATCH_NORMS[name], tmp_path / "model")


# ---- a Linear's bias in a shape that broadcasts to the scores
BROADCAST_BIASES = {
    "F.linear (1, K)": lambda: conv_then(
        lambda s, h: F.linear(h.flatten(1), s.w, s.b), w=_weight(), b=_zeros(1, 3)
    ),
    "F.linear scalar": lambda: conv_then(
        lambda s, h: F.linear(h.flatten(1), s.w, s.b), w=_weight(), b=_zeros(())
    ),
    "F.linear (1,)": lambda: conv_then(
        lambda s, h: F.linear(h.flatten(1), s.w, s.b), w=_weight(), b=_zeros(1)
    ),
    "F.linear (1, 1) buffer": lambda: conv_then(
        lambda s, h: F.linear(h.flatten(1), s.w, s.b), w=_weight(), b=torch.randn(1, 1)
    ),
    "addmm (1, K)": lambda: conv_then(
        lambda s, h: torch.addmm(s.b, h.flatten(1), s.w.t()), w=_weight(), b=_zeros(1, 3)
    ),
    "matmul plus (1, K)": lambda: conv_then(
        lambda s, h: h.flatten(1) @ s.w.t() + s.b, w=_weight(), b=_zeros(1, 3)
    ),
    "bias-less nn.Linear plus scalar": lambda: conv_then(
        lambda s, h: s.fc(h.flatten(1)) + s.b, fc=nn.Linear(36, 3, bias=False), b=_zeros(())
    ),
}


@pytest.mark.parametrize("name", BROADCAST_BIASES)
def test_a_bias_that_broadcasts_to_the_scores_acts_and_trains_like_the_patch_model(name):
    assert_exact_and_trains_like_the_patch_model(BROADCAST_BIASES[name])


@pytest.mark.parametrize("name", ["F.linear (1, K)", "F.linear scalar", "matmul plus (1, K)"])
def test_a_bias_that_broadcasts_saves_and_loads_to_the_same_scores(name, tmp_path):
    assert_saves_and_loads_to_the_patch_model_s_scores(BROADCAST_BIASES[name], tmp_path / "model")


def test_a_broadcast_bias_replaced_after_conversion_is_followed():
    torch.manual_seed(2)
    model = BROADCAST_BIASES["F.linear (1, K)"]().double().eval()
    dense = densecnn.convert(model, PATCH)
    model.b = nn.Parameter(torch.randn(1, 3, dtype=torch.float64))
    x = torch.rand(1, 2, 6, 5, dtype=torch.float64)
    with torch.no_grad():
        assert_equal_to_rounding(dense(x), literal_scan(model, x, PATCH))


@pytest.mark.parametrize(
    "forward",
    [
        lambda s, h: F.linear(h.flatten(1), s.w, s.b),
        lambda s, h: torch.addmm(s.b, h.flatten(1), s.w.t()),
    ],
    ids=["F.linear", "addmm"],
)
def test_a_bias_that_does_not_broadcast_to_the_scores_is_refused_naming_its_shape(forward):
    model = conv_then(forward, w=_weight(), b=_zeros(3, 1))
    with pytest.raises(
        densecnn.ConversionError, match=r"bias has shape \(3, 1\).* Give the bias shape \(3,\)"
    ):
        densecnn.convert(model.eval(), PATCH)
