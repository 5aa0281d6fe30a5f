"""Class probabilities of a dense net are the patch model's own: its softmax output when it ends in a softmax (dropout
after it, the identity in eval mode, changes nothing), the exp of its log-softmax, else the softmax of its scores."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import densecnn
from densecnn.io.labels import class_probabilities, score_kind
from tests.naive import literal_scan
from tests.tolerances import assert_close_relative

PATCH = 5
TAILS = {
    "logits": ([], lambda out: out.softmax(1)),
    "softmax": ([nn.Softmax(1)], lambda out: out),
    "softmax, dropout": ([nn.Softmax(1), nn.Dropout(0.2)], lambda out: out),
    "softmax, dropouts, identity": (
        [nn.Softmax(1), nn.Dropout(0.5), nn.AlphaDropout(0.1), nn.Identity()],
        lambda out: out,
    ),
    "log-softmax, dropout": ([nn.LogSoftmax(1), nn.Dropout(0.3)], lambda out: out.exp()),
    "softmax, then a layer that changes it": (
        [nn.Softmax(1), nn.Dropout(0.2), nn.Tanh()],
        lambda out: out.softmax(1),
    ),
}


def _model(tail: list[nn.Module]) -> nn.Module:
    torch.manual_seed(0)
    layers = [nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Conv2d(4, 3, 3), nn.Flatten(), *tail]
    return nn.Sequential(*layers).double().eval()


@pytest.mark.parametrize("tail", TAILS)
def test_class_probabilities_are_the_patch_models_own(tail):
    layers, probabilities_of = TAILS[tail]
    model = _model(layers)
    dense = densecnn.convert(model, PATCH)
    x = 5 * torch.randn(1, 1, 9, 8, dtype=torch.float64)
    want = probabilities_of(literal_scan(model, x, (PATCH, PATCH)))  # (1, K, 9, 8)
    with torch.no_grad():
        got = class_probabilities(dense(x), dense)
    assert_close_relative(got, want, 1e-12, 1.0)
    assert_close_relative(got.sum(1), torch.ones(1, 9, 8, dtype=torch.float64), 1e-12, 1.0)


def test_score_kind_looks_through_the_layers_that_are_the_identity_in_eval_mode():
    kinds = {tail: score_kind(densecnn.convert(_model(TAILS[tail][0]), PATCH)) for tail in TAILS}
    assert kinds == {
        "logits": "logits",
        "softmax": "probabilities",
        "softmax, dropout": "probabilities",
        "softmax, dropouts, identity": "probabilities",
        "log-softmax, dropout": "log-probabilities",
        "softmax, then a layer that changes it": "logits",
    }


def test_a_loaded_model_ending_in_softmax_and_dropout_gives_its_own_probabilities(tmp_path):
    model = _model([nn.Softmax(1), nn.Dropout(0.2)]).float()
    densecnn.save(model, tmp_path / "model", patch_size=PATCH)
    x = 5 * torch.randn(1, 1, 9, 8)
    want = literal_scan(model, x, (PATCH, PATCH))  # the model's softmax output at each pixel
    got = densecnn.load(tmp_path / "model").probabilities(x)
    assert_close_relative(got, want, 1e-5, 1.0)
