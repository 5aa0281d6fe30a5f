"""Fixtures of the training tests."""

from __future__ import annotations

import pytest

from densecnn.train import strokes as strokes_module
from densecnn.train.recipe import Recipe


@pytest.fixture
def tiny_recipe(monkeypatch):
    recipe = Recipe(crop=(16, 16), batch=2, steps=8, val_every=2, min_steps=0, warmup=2)
    monkeypatch.setattr(strokes_module, "default_recipe", lambda *args, **kwargs: recipe)
    monkeypatch.setattr(strokes_module, "default_model", lambda **kwargs: "tiny")
    return recipe
