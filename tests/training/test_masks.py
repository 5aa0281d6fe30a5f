"""Pixel-selection strategies: counts, ignore label, hard pixels, determinism, CLI spec parsing."""

from __future__ import annotations

import pytest
import torch

from densecnn import masks

IGNORE = 255


def labels_with_ignore(seed=0, n=2, height=12, width=10, classes=3):
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, classes, (n, height, width), generator=g)
    labels[:, :2] = IGNORE
    return labels


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def test_all_selects_every_labelled_pixel():
    labels = labels_with_ignore()
    assert torch.equal(masks.all()(labels), labels != IGNORE)


@pytest.mark.parametrize(
    "strategy", [masks.random(7), masks.hard(7, mix=0.4), masks.hard(7, mix=0.0), masks.proportional(7)]
)
def test_k_pixels_per_image_never_ignored(strategy):
    labels = labels_with_ignore()
    loss = torch.rand(labels.shape)
    mask = strategy(labels, pixel_loss=loss, generator=gen())
    assert mask.sum(dim=(1, 2)).tolist() == [7, 7]
    assert not mask[labels == IGNORE].any()


def test_fewer_eligible_pixels_than_k_selects_them_all():
    labels = torch.full((1, 4, 4), IGNORE)
    labels[0, 1, 1], labels[0, 2, 3] = 0, 1
    for strategy in (masks.random(10), masks.balanced(10), masks.hard(10, mix=0.5)):
        mask = strategy(labels, pixel_loss=torch.rand(1, 4, 4), generator=gen())
        assert torch.equal(mask, labels != IGNORE)


def test_balanced_takes_k_per_class_present():
    labels = torch.zeros(1, 10, 10, dtype=torch.long)
    labels[0, :2, :2] = 1  # 4 pixels of class 1
    labels[0, 5, :] = IGNORE
    mask = masks.balanced(6)(labels, generator=gen())
    assert mask[labels == 0].sum() == 6
    assert mask[labels == 1].sum() == 4
    assert mask.sum() == 10


def test_hard_takes_the_largest_losses_and_random_others():
    labels = labels_with_ignore(n=1)
    loss = torch.rand(labels.shape, generator=gen(3))
    loss[labels == IGNORE] = 100.0  # huge losses at ignored pixels must still never be selected
    mask = masks.hard(8, mix=0.25)(labels, pixel_loss=loss, generator=gen())
    eligible_losses = loss[labels != IGNORE]
    top6 = eligible_losses.topk(6).values
    assert torch.equal(loss[mask].sort(descending=True).values[:6], top6)
    assert mask.sum() == 8 and not mask[labels == IGNORE].any()
    only_hard = masks.hard(8, mix=0.0)(labels, pixel_loss=loss, generator=gen())
    assert torch.equal(loss[only_hard].sort(descending=True).values, eligible_losses.topk(8).values)


def test_hard_needs_the_pixel_loss():
    with pytest.raises(ValueError, match="needs pixel_loss"):
        masks.hard(4)(labels_with_ignore(), generator=gen())
    with pytest.raises(ValueError, match="proportional\\(k\\) needs pixel_loss"):
        masks.proportional(4)(labels_with_ignore(), generator=gen())


def test_proportional_draws_pixels_in_proportion_to_their_loss():
    """One pixel drawn per image from losses 1, 2, 3 and 4 (and ignored pixels with a huge one): over many draws,
    each is picked about loss / 10 of the time, the ignored ones never."""
    labels = torch.full((1, 2, 4), IGNORE)
    labels[0, 0] = 0
    loss = torch.tensor([[[1.0, 2.0, 3.0, 4.0], [100.0, 100.0, 100.0, 100.0]]])
    generator = gen(11)
    counts = torch.zeros(4)
    draws = 4000
    for _ in range(draws):
        counts += masks.proportional(1)(labels, pixel_loss=loss, generator=generator)[0, 0]
    # binomial standard deviation at p = 0.4 over 4000 draws is 0.0077: 4 of them is far beyond chance
    assert torch.allclose(counts / draws, torch.tensor([0.1, 0.2, 0.3, 0.4]), atol=0.031)


@pytest.mark.parametrize("spec", ["random:9", "balanced:3", "hard:9:0.5", "proportional:9"])
def test_deterministic_under_a_generator(spec):
    strategy = masks.parse(spec)
    labels = labels_with_ignore()
    loss = torch.rand(labels.shape, generator=gen(5))
    first = strategy(labels, pixel_loss=loss, generator=gen(42))
    again = strategy(labels, pixel_loss=loss, generator=gen(42))
    other = strategy(labels, pixel_loss=loss, generator=gen(43))
    assert torch.equal(first, again)
    assert not torch.equal(first, other)


@pytest.mark.parametrize(
    "spec, expected",
    [
        ("all", masks.all()),
        ("random:64", masks.random(64)),
        ("balanced:16", masks.balanced(16)),
        ("hard:32", masks.hard(32)),
        ("hard:32:0.25", masks.hard(32, mix=0.25)),
        (" HARD:32:1 ", masks.hard(32, mix=1.0)),
        ("proportional:12", masks.proportional(12)),
    ],
)
def test_parse(spec, expected):
    assert masks.parse(spec) == expected
    assert masks.parse(str(expected)) == expected


@pytest.mark.parametrize(
    "spec, match",
    [
        ("everything", "unknown mask strategy"),
        ("random", "wrong number of arguments"),
        ("all:3", "wrong number of arguments"),
        ("random:1:2", "wrong number of arguments"),
        ("random:abc", "K must be an integer"),
        ("random:0", "positive integer"),
        ("hard:8:1.5", "mix is the share"),
    ],
)
def test_parse_errors_say_the_syntax(spec, match):
    with pytest.raises(ValueError, match=match):
        masks.parse(spec)


# --- signals (N, L) and volumes (N, D, H, W): K per sample ------------------------------------------------------

SPATIAL = [(40,), (5, 6, 7)]


def nd_labels(spatial, seed=0, n=3, classes=3):
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, classes, (n, *spatial), generator=g)
    labels[torch.rand(n, *spatial, generator=g) < 0.3] = IGNORE
    return labels


@pytest.mark.parametrize("spatial", SPATIAL, ids=["signal", "volume"])
@pytest.mark.parametrize("strategy", [masks.random(7), masks.hard(7, mix=0.4), masks.hard(7, mix=0.0)])
def test_k_pixels_per_sample_in_1d_and_3d(spatial, strategy):
    labels = nd_labels(spatial)
    loss = torch.rand(labels.shape, generator=gen(1))
    loss[labels == IGNORE] = 100.0  # never picked, however hard
    mask = strategy(labels, pixel_loss=loss, generator=gen())
    assert mask.shape == labels.shape
    assert mask.reshape(3, -1).sum(1).tolist() == [7, 7, 7]
    assert not mask[labels == IGNORE].any()
    if (
        strategy.kind == "hard" and strategy.mix == 0.0
    ):  # pure hard: per sample, the 7 largest eligible losses
        for sample_loss, sample_labels, sample_mask in zip(loss, labels, mask, strict=True):
            eligible = sample_loss[sample_labels != IGNORE]
            assert torch.equal(sample_loss[sample_mask].sort().values, eligible.topk(7).values.sort().values)


@pytest.mark.parametrize("spatial", SPATIAL, ids=["signal", "volume"])
def test_all_and_balanced_in_1d_and_3d(spatial):
    labels = nd_labels(spatial, seed=2)
    assert torch.equal(masks.all()(labels), labels != IGNORE)
    mask = masks.balanced(4)(labels, generator=gen())
    for sample_labels, sample_mask in zip(labels, mask, strict=True):
        for value in range(3):
            present = int((sample_labels == value).sum())
            assert int((sample_mask & (sample_labels == value)).sum()) == min(4, present)
    assert not mask[labels == IGNORE].any()


@pytest.mark.parametrize("spatial", SPATIAL, ids=["signal", "volume"])
@pytest.mark.parametrize("spec", ["random:9", "balanced:3", "hard:9:0.5"])
def test_deterministic_under_a_generator_in_1d_and_3d(spatial, spec):
    strategy, labels = masks.parse(spec), nd_labels(spatial, seed=4)
    loss = torch.rand(labels.shape, generator=gen(5))
    first = strategy(labels, pixel_loss=loss, generator=gen(42))
    assert torch.equal(first, strategy(labels, pixel_loss=loss, generator=gen(42)))
    assert not torch.equal(first, strategy(labels, pixel_loss=loss, generator=gen(43)))


def test_labels_with_too_many_axes_are_refused():
    with pytest.raises(ValueError, match=r"\(N, L\), \(N, H, W\) or \(N, D, H, W\)"):
        masks.all()(torch.zeros(1, 2, 2, 2, 2, dtype=torch.long))
