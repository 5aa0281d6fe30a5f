"""Fixtures of the training tests."""

from __future__ import annotations

import signal
import types

import pytest

from densecnn.train import strokes as strokes_module
from densecnn.train.recipe import Recipe


@pytest.fixture
def tiny_recipe(monkeypatch):
    recipe = Recipe(crop=(16, 16), batch=2, steps=8, val_every=2, min_steps=0, warmup=2)
    monkeypatch.setattr(strokes_module, "default_recipe", lambda *args, **kwargs: recipe)
    monkeypatch.setattr(strokes_module, "default_model", lambda **kwargs: "tiny")
    return recipe


@pytest.fixture
def sigterm_counter():
    """A SIGTERM handler of the test's own while it runs, counting the signals it gets: a run that did not take
    SIGTERM over leaves them to it (instead of this process ending), and a run that did must have put it back."""
    received: list[int] = []

    def count(signum, frame) -> None:
        received.append(signum)

    previous = signal.signal(signal.SIGTERM, count)
    yield types.SimpleNamespace(handler=count, received=received)
    signal.signal(signal.SIGTERM, previous)
