"""masked_cross_entropy through a dense net == mean cross-entropy of the patches at the selected pixels.

The reference cuts the patches itself (numpy.pad with the padding convention + indexing) and runs the PATCH model
on them, so it shares no code with the dense path. Signals and volumes take the same test as images.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

import densecnn
from densecnn.losses import MIN_CLASSES_LAST, masked_cross_entropy_terms, pixel_cross_entropy

IGNORE = 255


LAYERS = {  # spatial axes -> (conv, max pool, avg pool)
    1: (nn.Conv1d, nn.MaxPool1d, nn.AvgPool1d),
    2: (nn.Conv2d, nn.MaxPool2d, nn.AvgPool2d),
    3: (nn.Conv3d, nn.MaxPool3d, nn.AvgPool3d),
}
NUMPY_PADDING = {"zeros": "constant", "reflect": "reflect", "replicate": "edge"}


@st.composite
def architectures(draw, dims=2):
    """A random patch classifier with ``dims`` spatial axes: conv/pool stages, then a conv or FC head. P is solved
    backwards from the head, with random floor slack so that even, odd and R < P patch sizes all occur."""
    conv, max_pool, avg_pool = LAYERS[dims]
    in_channels = draw(st.integers(1, 3))
    num_classes = draw(st.integers(2, 4))
    n_stages = draw(st.integers(1, 2))
    stages = [
        (
            draw(st.integers(1, 3)),  # conv kernel
            draw(st.sampled_from(["max", "avg"])),
            draw(st.integers(1, 3)),  # pool kernel
            draw(st.integers(1, 2)),  # pool stride
            draw(st.integers(0, 1)),  # floor slack
            draw(st.integers(2, 4)),  # channels
        )
        for _ in range(n_stages)
    ]
    head = draw(st.sampled_from(["conv", "fc"]))
    final = draw(st.integers(1, 2))  # map size the head reads
    size, layers, channels = final, [], in_channels
    for conv_k, _, pool_k, pool_s, slack, _ in reversed(stages):
        size = (size - 1) * pool_s + pool_k + min(slack, pool_s - 1)  # pool input
        size = size + conv_k - 1  # conv input
    patch = size
    for conv_k, pool, pool_k, pool_s, _, out in stages:
        pool_layer = max_pool(pool_k, pool_s) if pool == "max" else avg_pool(pool_k, pool_s)
        layers += [conv(channels, out, conv_k), pool_layer, nn.Tanh()]
        channels = out
    if head == "conv":
        layers.append(conv(channels, num_classes, final))
    else:
        layers += [nn.Flatten(), nn.Linear(channels * final**dims, 5), nn.ReLU(), nn.Linear(5, num_classes)]
    return nn.Sequential(*layers), patch, in_channels, num_classes


def patch_minibatch_loss(model, x, labels, mask, patch, padding_mode, class_weights):
    """The classical step: cut the selected pixels' patches, run the patch model, mean cross-entropy.

    Any number of spatial axes: x (N, C, *spatial), labels and mask (N, *spatial), a P×...×P patch."""
    counted = mask & (labels != IGNORE)  # (N, *spatial)
    widths = [(0, 0), (0, 0)] + [((patch - 1) // 2, patch // 2)] * (x.dim() - 2)
    padded = torch.from_numpy(np.pad(x.numpy(), widths, mode=NUMPY_PADDING[padding_mode]))  # (N, C, *(S+P-1))
    where = counted.nonzero().tolist()
    patches = torch.stack(
        [padded[(n, slice(None), *(slice(i, i + patch) for i in position))] for n, *position in where]
    )  # (B, C, P, ..., P)
    scores = model(patches).reshape(len(patches), -1)  # (B, K)
    targets = torch.stack([labels[tuple(index)] for index in where])  # (B,)
    return F.cross_entropy(scores, targets, weight=class_weights)


def grads(model, loss):
    model.zero_grad()
    loss.backward()
    return [p.grad.clone() for p in model.parameters()]


def relative_error(got, want):
    return max(((g - w).norm() / w.norm().clamp(min=1e-12)).item() for g, w in zip(got, want, strict=True))


def random_problem(draw, in_channels, num_classes, dtype, dims=2):
    n = draw(st.integers(1, 2))
    spatial = tuple(
        draw(st.integers(3, 9 if dims < 3 else 5)) for _ in range(dims)
    )  # (H, W), (L,), (D, H, W)
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, in_channels, *spatial, generator=g, dtype=dtype)
    labels = torch.randint(0, num_classes, (n, *spatial), generator=g)
    labels[torch.rand(n, *spatial, generator=g) < 0.2] = IGNORE
    mask = torch.rand(n, *spatial, generator=g) < draw(st.sampled_from([0.1, 0.5, 1.0]))
    if not (mask & (labels != IGNORE)).any():  # at least one counted pixel, else the patch mean is undefined
        first = (0,) * (dims + 1)
        labels[first], mask[first] = 0, True
    return x, labels, mask


@pytest.mark.parametrize(
    "dims",
    [1, 2, 3],
    ids=["signal", "image", "volume"],
)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_gradient_equals_patch_minibatch_gradient_float64(dims, data):
    model, patch, in_channels, num_classes = data.draw(architectures(dims))
    model = model.double().eval()
    x, labels, mask = random_problem(data.draw, in_channels, num_classes, torch.float64, dims)
    padding_mode = data.draw(st.sampled_from(["zeros", "reflect", "replicate"]))
    class_weights = data.draw(st.sampled_from([None, "random"]))
    if class_weights == "random":
        class_weights = torch.rand(num_classes, dtype=torch.float64) + 0.1

    dense = densecnn.convert(model, patch, padding_mode=padding_mode)
    dense_loss = densecnn.masked_cross_entropy(dense(x), labels, mask, class_weights=class_weights)
    dense_grads = grads(model, dense_loss)
    patch_loss = patch_minibatch_loss(model, x, labels, mask, patch, padding_mode, class_weights)
    patch_grads = grads(model, patch_loss)

    assert dense_loss.dtype == torch.float64
    assert abs(dense_loss.item() - patch_loss.item()) <= 1e-10 * max(1.0, abs(patch_loss.item()))
    assert relative_error(dense_grads, patch_grads) <= 1e-8


def test_gradient_equals_patch_minibatch_gradient_float32():
    torch.manual_seed(0)
    model, patch = densecnn.zoo.tiny(in_channels=2, num_classes=3)
    model.eval()
    x = torch.randn(2, 2, 20, 17)
    labels = torch.randint(0, 3, (2, 20, 17))
    labels[:, :3] = IGNORE
    mask = densecnn.masks.random(30)(labels, generator=torch.Generator().manual_seed(1))
    dense = densecnn.convert(model, patch)
    dense_grads = grads(model, densecnn.masked_cross_entropy(dense(x), labels, mask))
    patch_grads = grads(model, patch_minibatch_loss(model, x, labels, mask, patch, "zeros", None))
    assert relative_error(dense_grads, patch_grads) <= 1e-4


def test_loss_is_float32_for_bfloat16_scores():
    scores = torch.randn(1, 3, 4, 4).bfloat16()
    labels = torch.randint(0, 3, (1, 4, 4))
    loss = densecnn.masked_cross_entropy(scores, labels)
    assert loss.dtype == torch.float32
    assert torch.allclose(loss, F.cross_entropy(scores.float(), labels))


def test_no_counted_pixel_gives_zero_loss_and_zero_gradient():
    scores = torch.randn(1, 3, 4, 4, requires_grad=True)
    labels = torch.full((1, 4, 4), IGNORE)
    loss = densecnn.masked_cross_entropy(scores, labels)
    loss.backward()
    assert loss.item() == 0.0
    assert torch.count_nonzero(scores.grad) == 0


def test_terms_sum_over_counted_pixels():
    scores = torch.randn(2, 3, 5, 5, dtype=torch.float64)
    labels = torch.randint(0, 3, (2, 5, 5))
    mask = torch.zeros(2, 5, 5, dtype=torch.bool)
    mask[0, 1, 2] = mask[1, 4, 4] = True
    weights = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    loss_sum, weight_sum = masked_cross_entropy_terms(scores, labels, mask, class_weights=weights)
    picked = scores[[0, 1], :, [1, 4], [2, 4]]  # (2, K)
    targets = labels[[0, 1], [1, 4], [2, 4]]
    expected = F.cross_entropy(picked, targets, weight=weights, reduction="sum")
    assert torch.allclose(loss_sum, expected)
    assert weight_sum.item() == pytest.approx(weights[targets].sum().item())


def test_pixel_cross_entropy_is_zero_at_ignored_pixels():
    scores = torch.randn(1, 3, 4, 4)
    labels = torch.randint(0, 3, (1, 4, 4))
    labels[0, 0] = IGNORE
    loss = pixel_cross_entropy(scores, labels)
    assert loss.shape == (1, 4, 4) and not loss.requires_grad
    assert (loss[0, 0] == 0).all() and (loss[0, 1:] > 0).all()


@pytest.mark.parametrize(
    "scores, labels, mask, match",
    [
        (torch.randn(1, 3), torch.zeros(1, dtype=torch.long), None, "scores must be"),
        (
            torch.randn(1, 3, 2, 2, 2, 2),
            torch.zeros(1, 2, 2, 2, 2, dtype=torch.long),
            None,
            "1 to 3 spatial axes",
        ),
        (
            torch.randn(1, 3, 4, 4, 4),
            torch.zeros(1, 4, 4, dtype=torch.long),
            None,
            r"labels must be \(N, D, H, W\)",
        ),
        (torch.randn(1, 3, 4, 4), torch.zeros(1, 4, 5, dtype=torch.long), None, "labels must be"),
        (torch.randn(1, 3, 4, 4), torch.zeros(1, 4, 4), None, "integer tensor"),
        (torch.randn(1, 3, 4, 4), torch.full((1, 4, 4), 3), None, "label 3 is out of range for 3 classes"),
        (torch.randn(1, 3, 4, 4), torch.zeros(1, 4, 4, dtype=torch.long), torch.ones(1, 4, 4), "bool tensor"),
    ],
)
def test_bad_arguments_are_named(scores, labels, mask, match):
    with pytest.raises((ValueError, TypeError), match=match):
        densecnn.masked_cross_entropy(scores, labels, mask)


# --- signals (N, K, L) and volumes (N, K, D, H, W): the same loss, one code path ---------------------------------


def per_pixel_reference(scores, labels, mask, class_weights):
    """The loss written out element by element: gather each counted pixel's score vector, then F.cross_entropy."""
    counted = mask & (labels != IGNORE)  # (N, *spatial)
    where = counted.nonzero().tolist()
    picked = torch.stack([scores[(n, slice(None), *position)] for n, *position in where])  # (M, K)
    targets = torch.stack([labels[tuple(index)] for index in where])  # (M,)
    return F.cross_entropy(picked, targets, weight=class_weights)


@pytest.mark.parametrize("spatial", [(23,), (4, 5, 6)], ids=["signal", "volume"])
@pytest.mark.parametrize("spec", ["all", "random:7", "balanced:3", "hard:9:0.3"])
@pytest.mark.parametrize("weighted", [False, True])
def test_masked_loss_and_gradient_equal_the_per_pixel_reference_in_1d_and_3d(spatial, spec, weighted):
    g = torch.Generator().manual_seed(len(spatial) * 100 + len(spec))
    n, k = 2, 3
    scores = torch.randn(n, k, *spatial, generator=g, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, k, (n, *spatial), generator=g)
    labels[torch.rand(n, *spatial, generator=g) < 0.25] = IGNORE
    class_weights = torch.rand(k, generator=g, dtype=torch.float64) + 0.1 if weighted else None
    strategy = densecnn.masks.parse(spec)
    mask = strategy(labels, pixel_loss=pixel_cross_entropy(scores, labels), generator=g)
    assert mask.shape == labels.shape and not mask[labels == IGNORE].any()

    loss = densecnn.masked_cross_entropy(scores, labels, mask, class_weights=class_weights)
    (got,) = torch.autograd.grad(loss, scores)
    reference = per_pixel_reference(scores, labels, mask, class_weights)
    (want,) = torch.autograd.grad(reference, scores)
    assert abs(loss.item() - reference.item()) <= 1e-12 * max(1.0, abs(reference.item()))
    assert ((got - want).norm() / want.norm()).item() <= 1e-8
    assert torch.count_nonzero(got.sum(1)[~mask].abs() > 0) == 0  # unselected pixels get no gradient


@pytest.mark.parametrize("shape", [(1, 3, 5), (1, 3, 2, 3, 4)], ids=["signal", "volume"])
def test_pixel_cross_entropy_keeps_the_spatial_shape(shape):
    scores = torch.randn(*shape)
    labels = torch.randint(0, 3, (shape[0], *shape[2:]))
    labels.view(-1)[0] = IGNORE
    loss = pixel_cross_entropy(scores, labels)
    assert loss.shape == labels.shape and loss.view(-1)[0] == 0 and (loss.view(-1)[1:] > 0).all()


# --- the loss's own gradient: any layout, class weights and focal weighting --------------------------------------

CHANNELS_LAST = {4: torch.channels_last, 5: torch.channels_last_3d}


def focal_reference(scores, labels, mask, class_weights, gamma):
    """Σ w·(1 - p_y)^γ·(-log p_y) / Σ w written out pixel by pixel from the softmax's definition."""
    counted = mask & (labels != IGNORE)
    total, weights = 0, 0
    for n, *position in counted.nonzero().tolist():
        z = scores[(n, slice(None), *position)]  # (K,)
        y = labels[(n, *position)]
        p_y = torch.exp(z[y]) / torch.exp(z).sum()
        w = 1.0 if class_weights is None else class_weights[y]
        total = total + w * (1 - p_y) ** gamma * -torch.log(p_y)
        weights = weights + w
    return total / weights


@pytest.mark.parametrize("spatial", [(9,), (5, 6), (3, 4, 5)], ids=["signal", "image", "volume"])
@pytest.mark.parametrize("channels_last", [False, True], ids=["nc*", "channels-last"])
@pytest.mark.parametrize("gamma", [0.0, 0.5, 2.0])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("k", [4, 17], ids=["few-classes", "classes-last"])
def test_loss_and_gradient_in_any_layout_equal_the_pixel_by_pixel_formula(
    spatial, channels_last, gamma, weighted, k
):
    """The loss computes its gradient with the softmax it already has; both equal autograd through the formula
    written pixel by pixel (17 classes: the softmax along channels-last rows, the gradient written in them; 4:
    on the map moved to NC*)."""
    g = torch.Generator().manual_seed(len(spatial) * 10 + int(gamma * 2) + k)
    n = 2
    scores = 3 * torch.randn(n, k, *spatial, generator=g, dtype=torch.float64)
    if channels_last and scores.dim() in CHANNELS_LAST:
        scores = scores.contiguous(memory_format=CHANNELS_LAST[scores.dim()])
    scores.requires_grad_()
    labels = torch.randint(0, k, (n, *spatial), generator=g)
    labels[torch.rand(n, *spatial, generator=g) < 0.2] = IGNORE
    mask = torch.rand(n, *spatial, generator=g) < 0.7
    class_weights = torch.rand(k, generator=g, dtype=torch.float64) + 0.1 if weighted else None

    loss = densecnn.masked_cross_entropy(scores, labels, mask, class_weights=class_weights, focal_gamma=gamma)
    (got,) = torch.autograd.grad(loss, scores)
    reference = focal_reference(scores, labels, mask, class_weights, gamma)
    (want,) = torch.autograd.grad(reference, scores)
    assert abs(loss.item() - reference.item()) <= 1e-12 * max(1.0, abs(reference.item()))
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    if k >= MIN_CLASSES_LAST:
        assert got.stride() == scores.stride()  # read, and written, as (N, *S, K) rows
    assert torch.autograd.gradcheck(
        lambda s: densecnn.masked_cross_entropy(
            s, labels, mask, class_weights=class_weights, focal_gamma=gamma
        ),
        (scores,),
    )


def test_a_certain_pixel_has_a_finite_focal_gradient():
    """p_y = 1 in float64 (a score margin of 200): (1 - p_y)^(γ-1) would be infinite for γ < 1; its term is 0."""
    scores = (
        torch.tensor([[[100.0, 0.0]], [[-100.0, 0.0]]], dtype=torch.float64).unsqueeze(0).requires_grad_()
    )
    labels = torch.zeros(1, 1, 2, dtype=torch.long)
    densecnn.masked_cross_entropy(scores, labels, focal_gamma=0.5).backward()
    assert torch.isfinite(scores.grad).all() and scores.grad[0, :, 0, 0].abs().max() < 1e-40


def test_a_double_backward_through_the_loss_is_refused_clearly():
    scores = torch.randn(1, 3, 4, 4, requires_grad=True)
    labels = torch.zeros(1, 4, 4, dtype=torch.long)
    with pytest.raises(NotImplementedError, match="differentiable once"):
        torch.autograd.grad(densecnn.masked_cross_entropy(scores, labels), scores, create_graph=True)
