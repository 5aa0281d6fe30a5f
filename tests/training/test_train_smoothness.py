"""The smoothness term of training from strokes: neighbour pairs, their contrast weights, the relaxed Potts penalty,
and its weight in the trainer's step (its patch-minibatch baseline: tests/training/test_train_features.py); the
head's dropout, which shrinks with the labelled share as the term's weight does."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch
from torch import nn

from densecnn.train.recipe import Recipe, default_recipe
from densecnn.train.smoothness import NeighbourPairs, potts
from densecnn.train.strokes import StrokeTrainer
from tests.train_support import discs_and_strokes

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

SMOOTH = Recipe(
    crop=(16, 16), batch=2, steps=3, lr=1e-2, warmup=2, pixels=16, intensity_jitter=0.0, smoothness=2.0
)


def _coordinates(flat: torch.Tensor, shape: tuple[int, ...]) -> np.ndarray:
    return np.stack(np.unravel_index(flat.numpy(), shape), 1)  # (n, dims)


@pytest.mark.parametrize("shape", [(9, 7), (4, 6, 5), (1, 8)])
def test_pairs_are_neighbours_inside_the_image_with_their_contrast_weights(shape):
    image = torch.rand(2, *shape, dtype=torch.float64)
    pairs = NeighbourPairs([image])
    ((index, p, q, weights),) = pairs.draw(500, torch.Generator().manual_seed(1))
    a, b = _coordinates(p, shape), _coordinates(q, shape)
    assert index == 0 and len(p) == 500
    chebyshev = np.abs(a - b).max(1)
    assert np.all(chebyshev <= 1) and np.all((b >= 0) & (b < np.array(shape)))
    if min(shape) > 1:  # every pixel has a neighbour (an axis of one pixel has none along it)
        assert np.all(chebyshev == 1)
    # β from the definition: half the inverse of the mean squared difference of neighbours along each axis
    squares = [
        np.mean(np.sum(np.diff(image.numpy(), axis=axis) ** 2, 0))
        for axis in range(1, image.dim())
        if image.shape[axis] > 1
    ]
    beta = 1 / (2 * np.mean(squares))
    values = image.flatten(1).numpy()
    expected = np.exp(-beta * np.sum((values[:, p.numpy()] - values[:, q.numpy()]) ** 2, 0))
    np.testing.assert_allclose(weights.numpy(), expected, rtol=1e-6)


def test_pairs_are_drawn_over_the_images_by_their_pixels():
    pairs = NeighbourPairs([torch.rand(1, 10, 10), torch.rand(1, 30, 30)])
    drawn = {index: len(p) for index, p, _, _ in pairs.draw(10_000, torch.Generator().manual_seed(0))}
    assert sum(drawn.values()) == 10_000
    assert drawn[1] / 10_000 == pytest.approx(900 / 1000, abs=0.02)


def test_a_flat_image_weighs_every_pair_fully():
    ((_, _, _, weights),) = NeighbourPairs([torch.ones(3, 8, 8)]).draw(64, torch.Generator().manual_seed(0))
    assert torch.equal(weights, torch.ones(64))


def test_potts_is_the_weighted_chance_that_neighbours_disagree():
    p = torch.tensor([[0.5, 0.5], [1.0, 0.0], [0.2, 0.8]])
    q = torch.tensor([[0.5, 0.5], [0.0, 1.0], [0.2, 0.8]])
    weights = torch.tensor([1.0, 0.5, 2.0])
    disagree = [1 - 0.5, 1 - 0.0, 1 - (0.04 + 0.64)]
    expected = sum(w * d for w, d in zip(weights.tolist(), disagree, strict=True)) / 3
    assert float(potts(p, q, weights)) == pytest.approx(expected)


def test_the_default_recipe_smooths_images_and_not_volumes():
    assert default_recipe([(64, 64)], labelled_pixels=100, per_pixel_head=True).smoothness > 0
    assert default_recipe([(16, 32, 32)], labelled_pixels=100, per_pixel_head=True).smoothness == 0


def test_the_smoothness_term_adds_to_the_labelled_pixels_loss():
    image, _, labels = discs_and_strokes(2)
    smooth = StrokeTrainer([image], [labels], recipe=SMOOTH)
    plain = StrokeTrainer([image], [labels], recipe=replace(SMOOTH, smoothness=0.0))
    assert plain.pairs is None
    for trainer in (smooth, plain):  # no dropout: the labelled pixels' loss is the same in both
        for layer in trainer.model_net:
            if isinstance(layer, nn.Dropout):
                layer.p = 0.0
    with_term = float(smooth._head_loss(torch.Generator().manual_seed(5)))
    without = float(plain._head_loss(torch.Generator().manual_seed(5)))
    # the same labelled pixels (drawn first from the same generator), and a Potts term in (0, weight]
    assert without < with_term <= without + SMOOTH.smoothness * (1 + 1e-6)
    assert not math.isclose(with_term, without)


def test_label_smoothing_moves_a_share_of_each_target_to_all_classes_evenly():
    image, _, labels = discs_and_strokes(2)
    recipe = replace(SMOOTH, smoothness=0.0)
    plain = StrokeTrainer([image], [labels], recipe=recipe)
    smoothed = StrokeTrainer([image], [labels], recipe=replace(recipe, label_smoothing=0.1))
    for trainer in (plain, smoothed):
        for layer in trainer.model_net:
            if isinstance(layer, nn.Dropout):
                layer.p = 0.0
    generator = torch.Generator().manual_seed(5)  # the step's draws: its pixels, then their flips and turns
    picked = torch.randint(len(plain.train_y), (recipe.pixels,), generator=generator)
    turn = torch.randint(len(plain._feature_gathers), (recipe.pixels,), generator=generator)
    features = torch.gather(plain.train_x[picked], 1, plain._feature_gathers[turn])  # (B, F)
    log_p = plain._head(features, training=True).log_softmax(1)  # (B, K)
    uniform = float(-log_p.mean())  # the cross-entropy against every class evenly
    without = float(plain._head_loss(torch.Generator().manual_seed(5)))
    assert without == pytest.approx(float(-log_p.gather(1, plain.train_y[picked, None]).mean()), rel=1e-5)
    assert float(smoothed._head_loss(torch.Generator().manual_seed(5))) == pytest.approx(
        0.9 * without + 0.1 * uniform, rel=1e-5
    )


def test_the_terms_weight_shrinks_with_the_labelled_share():
    image, _, labels = discs_and_strokes(3)
    trainer = StrokeTrainer([image], [labels], recipe=SMOOTH)
    unlabelled = np.mean(labels == -1)
    assert 0 < unlabelled < 1
    assert trainer.smoothness == pytest.approx(SMOOTH.smoothness * unlabelled**3)
    dense = np.where(labels == -1, 0, labels)  # every pixel labelled: the labels show every border
    every = StrokeTrainer([image], [dense], recipe=SMOOTH)
    assert every.smoothness == 0 and every.pairs is None


def test_the_heads_dropout_shrinks_with_the_labelled_share():
    image, _, labels = discs_and_strokes(3)
    unlabelled = float(np.mean(labels == -1))
    sparse = StrokeTrainer([image], [labels], recipe=SMOOTH)
    dense = StrokeTrainer([image], [np.where(labels == -1, 0, labels)], recipe=SMOOTH)  # every pixel labelled
    assert sparse.regularisation == pytest.approx(unlabelled**3) and dense.regularisation == 0
    dropout = next(layer for layer in sparse.model_net if isinstance(layer, nn.Dropout))
    assert dropout.p * unlabelled**6 > 0.05  # strokes: a rate the test can see
    for trainer, rate in ((sparse, dropout.p * unlabelled**6), (dense, 0.0)):
        features = trainer.train_x[:256]  # (256, F)
        # the head up to its dropout: the standardised features, a share ``rate`` of them zeroed
        trainer.model_net = trainer.model_net[: trainer.fixed + 2]
        assert isinstance(trainer.model_net[-1], nn.Dropout)
        dropped = trainer._head(features, training=True)  # (256, F)
        zeroed = float((dropped == 0).float().mean()) - float((trainer._head(features) == 0).float().mean())
        assert zeroed == pytest.approx(rate, abs=0.02)


def test_the_default_recipe_draws_more_pixels_a_step_from_more_labels():
    def pixels(labelled: int) -> int:
        return default_recipe([(384, 384)], labelled_pixels=labelled, per_pixel_head=True).pixels

    assert pixels(100) == pixels(16_384) == 256  # a few strokes
    assert pixels(32_768) == 512
    assert pixels(73_728) == pixels(10**7) == 1024  # half the image labelled, or more
