"""Training a per-pixel head on fixed layers (the default ``filter_bank`` net): the filter bank against direct 2-D
Gaussian-derivative convolutions, the gathered features and the head's gradients against the patch model on each
labelled pixel's own patch, the feature permutations of flips and turns, and fixed layers kept through fine-tuning."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import densecnn
from densecnn.filter_bank import derivative_layers, derivatives, gaussian_1d, smoothing_layers
from densecnn.io.annotations import sparse_labels
from densecnn.losses import IGNORE_INDEX
from densecnn.train.crops import pad_spatial
from densecnn.train.features import PixelFeatures, dihedral_permutations, fixed_layers, standardize
from densecnn.train.recipe import Recipe
from densecnn.train.strokes import StrokeTrainer
from tests.tolerances import assert_labels_equal_except_ties
from tests.train_support import discs_and_strokes

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

DERIVATIVES_2D = ((0, 0), (1, 0), (0, 1), (2, 0), (0, 2), (1, 1))  # G, ∂y, ∂x, ∂yy, ∂xx, ∂xy

HEAD = Recipe(crop=(16, 16), batch=2, steps=20, lr=1e-2, warmup=2, pixels=64, intensity_jitter=0.0)


def _apply(layers, x: torch.Tensor) -> torch.Tensor:
    conv = {3: F.conv1d, 4: F.conv2d, 5: F.conv3d}[x.dim()]
    for layer in layers:
        x = conv(x, layer.weight.double(), groups=layer.groups)
    return x


@pytest.mark.parametrize("dims", [1, 2, 3])
def test_the_separable_filter_bank_is_the_gaussian_derivatives(dims):
    sigmas, channels = (1.0, 2.0), 2
    x = torch.rand(1, channels, *(20 if dims == 3 else 40,) * dims, dtype=torch.float64)
    got = _apply(
        derivative_layers(channels, sigmas=sigmas, dims=dims), x
    )  # (1, 2·2·|derivatives|·2, *(n-12))
    radius = math.ceil(3 * max(sigmas))
    conv = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[dims]
    expected = []
    for c in range(channels):
        for sigma in sigmas:
            for orders in derivatives(dims):
                kernel = torch.ones((), dtype=torch.float64)
                for order in orders:  # the outer product of the 1-D filters along each axis
                    kernel = torch.tensordot(kernel, gaussian_1d(sigma, radius, order), dims=0)
                response = conv(x[:, c : c + 1], (kernel * sigma ** sum(orders))[None, None])
                expected += [response, -response]
    expected = torch.cat(expected, 1)
    assert got.shape == expected.shape
    assert torch.allclose(got, expected, atol=1e-6)  # float32 weights


def test_the_derivative_orders_are_the_gaussian_then_first_then_second():
    assert derivatives(2) == list(DERIVATIVES_2D)
    assert derivatives(3)[:4] == [(0, 0, 0), (1, 0, 0), (0, 1, 0), (0, 0, 1)] and len(derivatives(3)) == 10


@pytest.mark.parametrize("dims", [2, 3])
def test_smoothing_keeps_each_map_and_adds_its_gaussian_smoothing(dims):
    x = torch.rand(1, 3, *(30,) * dims, dtype=torch.float64)
    got = _apply(smoothing_layers(3, sigmas=(2.0,), dims=dims), x)  # (1, 6, *(18,)·dims)
    g = gaussian_1d(2.0, 6, 0)
    kernel = g
    for _ in range(dims - 1):
        kernel = torch.tensordot(kernel, g, dims=0)
    conv = {2: F.conv2d, 3: F.conv3d}[dims]
    smooth = conv(x.reshape(3, 1, *x.shape[2:]), kernel[None, None]).reshape(1, 3, *(18,) * dims)
    inner = x[(Ellipsis, *(slice(6, -6),) * dims)]
    expected = torch.stack([inner, smooth], 2).reshape(1, 6, *(18,) * dims)
    assert torch.allclose(got, expected, atol=1e-6)


def test_fixed_layers_are_the_leading_frozen_layers_before_a_per_pixel_head():
    model, _ = densecnn.zoo.filter_bank(in_channels=1, num_classes=2)
    assert fixed_layers(model) == 6
    assert fixed_layers(densecnn.zoo.nuclei()[0]) == 0
    spatial_head = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Conv2d(4, 2, 3))
    spatial_head[0].weight.requires_grad_(False)
    spatial_head[0].bias.requires_grad_(False)
    assert fixed_layers(spatial_head) == 0  # a 3×3 conv after the fixed layer: not a per-pixel head


def _image_and_prefix(channels: int = 2, size: int = 30, seed: int = 0):
    model, patch = densecnn.zoo.filter_bank(in_channels=channels, num_classes=3)
    model.eval()  # the head's batch norm by its statistics, its dropout off: as the dense net runs them
    image = torch.rand(channels, size, size, generator=torch.Generator().manual_seed(seed))
    return model, patch, image, nn.Sequential(*list(model)[: fixed_layers(model)])


def test_gathered_features_are_the_fixed_layers_on_each_pixels_own_patch():
    model, patch, image, prefix = _image_and_prefix()
    margin = (patch // 2 + 2,) * 2
    padded = pad_spatial(image, margin, margin, "reflect")
    features = PixelFeatures(prefix, (patch, patch), "reflect", [padded], margin)
    labels = np.full((30, 30), IGNORE_INDEX, np.int64)
    pixels = [(0, 0), (3, 29), (15, 7), (29, 29)]
    for n, (y, x) in enumerate(pixels):
        labels[y, x] = n % 3
    gathered, targets = features.gather([labels])  # row-major order of the labelled pixels
    reference = pad_spatial(image, (patch // 2,) * 2, (patch // 2,) * 2, "reflect").double()
    for row, (y, x) in enumerate(sorted(pixels)):
        window = reference[None, :, y : y + patch, x : x + patch]  # the pixel's own patch
        expected = prefix.double()(window)[0, :, 0, 0]
        assert torch.allclose(gathered[row].double(), expected, rtol=1e-4, atol=1e-5)
        assert targets[row] == labels[y, x]


def test_the_head_step_has_the_patch_minibatch_gradients_of_the_same_pixels():
    model, patch, image, prefix = _image_and_prefix(channels=1)
    margin = (patch // 2 + 2,) * 2
    padded = pad_spatial(image, margin, margin, "reflect")
    labels = np.full((30, 30), IGNORE_INDEX, np.int64)
    labels[5, 3:20] = 0
    labels[20:25, 12] = 2
    x, y = PixelFeatures(prefix, (patch, patch), "reflect", [padded], margin).gather([labels])
    head = nn.Sequential(*list(model)[fixed_layers(model) :])
    standardize(head[0], x, torch.arange(x.shape[1])[None])  # statistics that change the features
    F.cross_entropy(head(x[:, :, None, None]).flatten(1), y).backward()
    from_features = [p.grad.clone() for p in head.parameters()]
    model.zero_grad()
    reference = pad_spatial(image, (patch // 2,) * 2, (patch // 2,) * 2, "reflect")
    where = np.argwhere(labels != IGNORE_INDEX)
    patches = torch.stack([reference[:, r : r + patch, c : c + patch] for r, c in where])
    F.cross_entropy(model(patches).flatten(1), torch.from_numpy(labels[tuple(where.T)])).backward()
    for got, expected in zip(from_features, [p.grad for p in head.parameters()], strict=True):
        assert torch.allclose(got, expected, rtol=1e-3, atol=1e-6)


def test_flips_and_turns_permute_the_filter_banks_features():
    model, patch, _, prefix = _image_and_prefix(channels=1)
    dense = densecnn.convert(prefix, patch, padding_mode="reflect", verify=False)
    perms = dihedral_permutations(dense, 1)
    assert len(perms) == 8 and torch.equal(perms[0], torch.arange(dense.num_classes))
    image = torch.randn(1, 1, 20 + patch, 20 + patch, dtype=torch.float64)
    features = prefix.double()(image)[0]  # (F, 20, 20), computed on its own
    turned = prefix.double()(torch.rot90(image, 1, (2, 3)))[0]
    expected = torch.rot90(features, 1, (1, 2))
    assert torch.allclose(turned[perms[2]], expected, atol=1e-5)  # one quarter turn, no flip


def test_every_flip_and_turn_of_the_slices_permutes_a_volume_filter_banks_features():
    derivative = derivative_layers(1, sigmas=(1.0,), dims=3)  # kernels of 7: patch 13³
    prefix = nn.Sequential(
        *derivative, nn.ReLU(), *smoothing_layers(derivative[-1].out_channels, sigmas=(1.0,), dims=3)
    )
    dense = densecnn.convert(prefix, (13, 13, 13), padding_mode="reflect", verify=False)
    perms = dihedral_permutations(dense, 1)
    assert len(perms) == 8
    volume = torch.randn(1, 1, 16, 20, 20, dtype=torch.float64)
    features = prefix.double()(volume)[0]  # (40, 4, 8, 8), computed on its own

    def transform(x, turns, flip):
        x = torch.rot90(x, turns, (-2, -1))
        return torch.flip(x, (-1,)) if flip else x

    for perm, (turns, flip) in zip(perms, itertools.product(range(4), (False, True)), strict=True):
        moved = prefix.double()(transform(volume, turns, flip))[0]
        assert torch.allclose(moved[perm], transform(features, turns, flip), atol=1e-5)


def test_an_asymmetric_fixed_layer_has_only_the_identity():
    conv = nn.Conv2d(1, 3, 5, bias=False)
    conv.weight.requires_grad_(False)
    dense = densecnn.convert(nn.Sequential(conv), 5, verify=False)
    assert len(dihedral_permutations(dense, 1)) == 1


def test_the_default_net_learns_from_strokes_and_its_fixed_layers_survive_saving(tmp_path):
    image, truth, labels = discs_and_strokes()
    trainer = StrokeTrainer([image], [labels], class_names=["background", "disc"], recipe=HEAD)
    assert trainer.fixed == 6
    before = [p.clone() for p in trainer.model_net.parameters()]
    for _ in trainer.run():
        pass
    after = list(trainer.model_net.parameters())
    changed = [not torch.equal(b, a) for b, a in zip(before, after, strict=True)]
    assert not any(changed[:5]) and all(changed[5:])  # the filter bank stays, the head learns
    loaded = densecnn.load(trainer.save(tmp_path / "m"))
    predicted = loaded.labels(loaded.normalize(torch.from_numpy(image)[None]))[0]
    assert (np.asarray(predicted) == truth).mean() > 0.9
    again = StrokeTrainer([image], [labels], model=loaded, recipe=HEAD)
    assert again.fixed == 6  # fine-tuning keeps the saved model's fixed layers fixed


def test_a_fresh_net_standardises_the_labelled_pixels_features_as_its_patches_see_them():
    image, _, labels = discs_and_strokes(2)
    trainer = StrokeTrainer([image], [labels], recipe=HEAD)
    norm = trainer.model_net[trainer.fixed]
    # under the flips and turns training draws, the standardised features have mean 0, and those that vary more
    # than the median feature a variance between 1/2 and 1 (the others less)
    augmented = torch.cat([trainer.train_x[:, gather] for gather in trainer._feature_gathers])  # (T·N, F)
    standardised = (augmented.double() - norm.running_mean) / (norm.running_var + norm.eps).sqrt()
    assert torch.allclose(standardised.mean(0), torch.zeros(1, dtype=torch.float64), atol=1e-4)
    variance = augmented.double().var(0, unbiased=False)
    louder = variance > variance.median()
    assert louder.any() and (~louder).any()
    assert (standardised.var(0)[louder] >= 0.49).all() and (standardised.var(0)[~louder] <= 0.51).all()
    assert (standardised.var(0) <= 1.01).all()
    # the head on the gathered features is the patch model on each labelled pixel's own patch
    model = trainer.model
    half = trainer.patch_size[0] // 2
    reference = pad_spatial(
        trainer.loaded.normalize(torch.from_numpy(image)[None])[0], (half, half), (half, half), "reflect"
    )
    labelled = np.argwhere(labels != -1)  # row-major, as the features are gathered
    rows = np.arange(len(labelled))[::7]
    where = labelled[rows]
    patches = torch.stack([reference[:, r : r + 2 * half + 1, c : c + 2 * half + 1] for r, c in where])
    with torch.no_grad():
        expected = model(patches).flatten(1)
        got = trainer._head(trainer.train_x[rows])
    assert torch.allclose(got, expected, rtol=1e-3, atol=1e-4)


def test_standardised_features_permute_as_the_raw_ones_and_fine_tuning_keeps_the_statistics(tmp_path):
    image, _, labels = discs_and_strokes(3)
    trainer = StrokeTrainer([image], [labels], recipe=HEAD)
    norm = trainer.model_net[trainer.fixed]
    x = trainer.train_x[:50]
    for gather in trainer._feature_gathers:
        assert torch.allclose(norm(x[:, gather, None, None]), norm(x[:, :, None, None])[:, gather], atol=1e-6)
    saved = densecnn.load(trainer.save(tmp_path / "m"))
    again = StrokeTrainer([image[:, ::-1].copy()], [labels[::-1].copy()], model=saved, recipe=HEAD)
    assert torch.equal(again.model_net[again.fixed].running_mean, norm.running_mean)


def test_preview_labels_from_the_kept_features_are_the_dense_nets_labels():
    image, _, labels = discs_and_strokes(4)
    trainer = StrokeTrainer([image], [labels], recipe=HEAD)
    list(trainer.run())
    preview = trainer.preview_labels(0)  # (48, 48)
    dense = densecnn.convert(trainer.model, trainer.patch_size, padding_mode="reflect")
    with torch.no_grad():
        scores = dense(trainer.loaded.normalize(torch.from_numpy(image)[None]))  # (1, K, 48, 48)
    assert_labels_equal_except_ties(torch.from_numpy(preview)[None], scores)


@pytest.mark.parametrize("smoothness", [0.0, 2.0])
def test_the_patch_minibatch_baseline_takes_the_same_steps_from_each_pixels_own_patch(smoothness):
    image, _, labels = discs_and_strokes(1)
    recipe = replace(HEAD, steps=3, pixels=8, smoothness=smoothness)
    dense = StrokeTrainer([image], [labels], recipe=recipe)
    patches = StrokeTrainer([image], [labels], recipe=replace(recipe, method="patches"))
    assert (dense.pairs is not None) == (smoothness > 0)
    for _ in range(3):  # the same pixels, pairs, turns and dropout: the same losses, to rounding
        torch.manual_seed(0)
        from_dense = next(dense.run()).loss
        torch.manual_seed(0)
        from_patches = next(patches.run()).loss
        assert from_patches == pytest.approx(from_dense, rel=1e-4, abs=1e-6)


def test_new_strokes_in_one_window_leave_the_other_windows_features_as_they_were():
    (a, _, strokes_a), (b, _, strokes_b), (c, _, strokes_c) = (discs_and_strokes(seed) for seed in (5, 6, 7))
    trainer = StrokeTrainer([a, b], [strokes_a, strokes_b], recipe=HEAD)
    kept_a = trainer.features.kept(0)
    trainer.set_labels([c, a.copy()], [strokes_c, strokes_a])  # b's window gone, c's new, a's the same
    assert trainer.features.kept(1) is kept_a  # not computed again
    prefix = nn.Sequential(*list(trainer.model_net)[: trainer.fixed])
    padded, margin = trainer.crops.padded, trainer.crops.margin
    sparse = [
        sparse_labels(strokes, -1) for strokes in (strokes_c, strokes_a)
    ]  # IGNORE_INDEX where unpainted
    computed, _ = PixelFeatures(prefix, trainer.patch_size, "reflect", padded, margin).gather(sparse)
    assert torch.allclose(trainer.train_x, computed, rtol=1e-4, atol=1e-5)


def test_a_head_step_runs_on_one_thread_and_gives_the_threads_back(monkeypatch):
    image, _, labels = discs_and_strokes(8)
    trainer = StrokeTrainer([image], [labels], recipe=replace(HEAD, steps=3))
    seen, head_loss = [], trainer._head_loss
    monkeypatch.setattr(trainer, "_head_loss", lambda g: seen.append(torch.get_num_threads()) or head_loss(g))
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        list(trainer.run())
        assert seen == [1, 1, 1] and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("block_bytes", [1, 10 * 10 * 4 * 144])
def test_blocks_with_labels_give_the_kept_maps_features(monkeypatch, block_bytes):
    from densecnn.train import features as features_module

    model, patch, image, prefix = _image_and_prefix(size=40)
    margin = (patch // 2 + 2,) * 2
    padded = pad_spatial(image, margin, margin, "reflect")
    labels = np.full((40, 40), IGNORE_INDEX, np.int64)
    labels[[0, 7, 8, 30, 39], [5, 39, 0, 20, 39]] = [0, 1, 2, 0, 1]
    kept = PixelFeatures(prefix, (patch, patch), "reflect", [padded], margin).gather([labels])
    monkeypatch.setattr(features_module, "KEPT_BYTES", 0)
    # one pixel a block (only the 5 labelled ones run), or blocks of 10×10 pixels (of 144 features)
    monkeypatch.setattr(features_module, "BLOCK_BYTES", block_bytes)
    blocked = PixelFeatures(prefix, (patch, patch), "reflect", [padded], margin)
    got = blocked.gather([labels])
    assert not blocked._maps
    assert torch.allclose(got[0], kept[0], rtol=1e-4, atol=1e-5) and torch.equal(got[1], kept[1])


def test_flips_and_turns_are_found_whatever_the_probe_seed():
    model, patch, _, prefix = _image_and_prefix(channels=3)
    dense = densecnn.convert(prefix, patch, padding_mode="reflect", verify=False)
    # seed 102 once left a feature all zero on a plain noise probe, and no permutation was found
    assert [len(dihedral_permutations(dense, 3, seed=seed)) for seed in (0, 102)] == [8, 8]


def test_a_volumes_blocks_split_every_axis_and_give_the_kept_maps_features(monkeypatch):
    from densecnn.train import features as features_module

    model, patch = densecnn.zoo.filter_bank3d(in_channels=1, num_classes=2)
    prefix = nn.Sequential(*list(model)[: fixed_layers(model)])
    volume = torch.rand(1, 6, 8, 8, generator=torch.Generator().manual_seed(0))
    margin = tuple(p // 2 + 1 for p in patch)
    padded = pad_spatial(volume, margin, margin, "reflect")
    labels = np.full((6, 8, 8), IGNORE_INDEX, np.int64)
    labels[[0, 2, 5, 5], [7, 0, 3, 7], [1, 6, 4, 7]] = [0, 1, 1, 0]
    kept = PixelFeatures(prefix, patch, "reflect", [padded], margin).gather([labels])
    monkeypatch.setattr(features_module, "KEPT_BYTES", 0)
    features = prefix[-1].out_channels  # per voxel
    monkeypatch.setattr(features_module, "BLOCK_BYTES", 3 * 4 * 4 * 4 * features)  # blocks of 3×4×4 voxels
    blocked = PixelFeatures(prefix, patch, "reflect", [padded], margin)
    assert blocked._blocks(0)[:2] == [
        (slice(0, 3), slice(0, 4), slice(0, 4)),
        (slice(0, 3), slice(0, 4), slice(4, 8)),
    ]
    assert len(blocked._blocks(0)) == 8
    got = blocked.gather([labels])
    assert torch.allclose(got[0], kept[0], rtol=1e-4, atol=1e-5) and torch.equal(got[1], kept[1])
