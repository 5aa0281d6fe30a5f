"""A model's fixed layers (the default recipe's filter bank) stay fixed through ``densecnn train --model RUN/model``,
and every run's model file says which they are, so that a later fine-tune leaves them too."""

from __future__ import annotations

import json

import pytest
import torch

import densecnn
from densecnn.cli import main
from densecnn.train import strokes as strokes_module
from densecnn.train.features import fixed_layers
from densecnn.train.recipe import Recipe
from tests.train_support import make_dataset

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture
def short_recipe(monkeypatch):
    """The default recipe's own net (the filter bank and its head), on a short schedule."""
    recipe = Recipe(crop=(16, 16), batch=2, steps=6, val_every=3, min_steps=0, warmup=2)
    monkeypatch.setattr(strokes_module, "default_recipe", lambda *args, **kwargs: recipe)
    return recipe


def _fixed(model_dir) -> int:
    return json.loads((model_dir / "model.json").read_text())["extra"].get("fixed_layers", 0)


def test_fine_tuning_the_recipes_model_leaves_its_filter_bank_and_says_so(tmp_path, short_recipe):
    data = make_dataset(tmp_path / "data", images=2)
    assert main(["train", "--data", str(data), "--out", str(tmp_path / "recipe")]) == 0
    start = densecnn.load(tmp_path / "recipe" / "model")
    fixed = _fixed(tmp_path / "recipe" / "model")
    assert fixed > 0
    tuned_dir = tmp_path / "tuned"
    assert main(["train", "--model", str(tmp_path / "recipe" / "model"), "--data", str(data), "--out",
                 str(tuned_dir), "--epochs", "1", "--crops-per-image", "2", "--batch", "2", "--crop", "20",
                 "--lr", "0.05"]) == 0  # fmt: skip
    tuned = densecnn.load(tuned_dir / "model")
    assert _fixed(tuned_dir / "model") == fixed
    for before, after in zip(list(start.model)[:fixed], list(tuned.model)[:fixed], strict=True):
        for p, q in zip(before.parameters(), after.parameters(), strict=True):
            assert torch.equal(p, q)
    head = [p for layer in list(tuned.model)[fixed:] for p in layer.parameters()]
    start_head = [p for layer in list(start.model)[fixed:] for p in layer.parameters()]
    assert any(not torch.equal(p, q) for p, q in zip(head, start_head, strict=True))  # the head did train


def test_a_fresh_filter_bank_run_saves_its_fixed_layers(tmp_path):
    data = make_dataset(tmp_path / "data", images=2)
    out = tmp_path / "bank"
    assert main(["train", "--model", "filter_bank", "--classes", "3", "--data", str(data), "--out", str(out),
                 "--epochs", "1", "--crops-per-image", "2", "--batch", "2", "--crop", "20"]) == 0  # fmt: skip
    model, _ = densecnn.zoo.filter_bank(in_channels=1, num_classes=3)
    assert _fixed(out / "model") == fixed_layers(model) > 0
