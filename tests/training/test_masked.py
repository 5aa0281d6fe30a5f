"""dense.masked_loss: every method (the dense pass, the region pass, the patch pass, and the automatic choice) gives
the loss and the gradients of the patch minibatch of the selected pixels, run through the patch model itself."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import densecnn
from densecnn import masked
from tests.tolerances import assert_close_relative

CONV = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}
POOL = {1: nn.MaxPool1d, 2: nn.MaxPool2d, 3: nn.AvgPool3d}
SIZE = {1: (23,), 2: (13, 11), 3: (6, 7, 5)}


def _net(dims: int) -> tuple[nn.Module, int]:
    torch.manual_seed(dims)
    model = nn.Sequential(
        CONV[dims](2, 4, 3), nn.Tanh(), POOL[dims](2), CONV[dims](4, 4, 2), nn.ReLU(), nn.Flatten(),
        nn.Linear(4 * 2**dims, 3),
    )  # fmt: skip
    return model.double().eval(), 8


def _patch_minibatch_loss(model, x, labels, chosen, patch, class_weights=None):
    """The reference: patches cut at the chosen pixels (zero padding, ⌊(P-1)/2⌋ before), through the model."""
    before = (patch - 1) // 2
    padded = F.pad(x, [before, patch - 1 - before] * (x.dim() - 2))
    index = chosen.nonzero().tolist()
    patches = torch.stack([padded[(i[0], slice(None), *(slice(p, p + patch) for p in i[1:]))] for i in index])
    targets = torch.stack([labels[tuple(i)] for i in index])
    return F.cross_entropy(model(patches).flatten(1), targets, weight=class_weights)


def _grads(model, loss):
    model.zero_grad(set_to_none=True)
    loss.backward()
    return [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("dims", [1, 2, 3])
@pytest.mark.parametrize("method", ["dense", "region", "patches", "auto"])
@pytest.mark.parametrize("selection", ["few", "many", "all"])
def test_every_method_gives_the_patch_minibatch_loss_and_gradients(dims, method, selection):
    model, patch = _net(dims)
    dense = densecnn.convert(model, patch)
    generator = torch.Generator().manual_seed(7)
    x = torch.randn(2, 2, *SIZE[dims], dtype=torch.float64, generator=generator)
    labels = torch.randint(0, 3, (2, *SIZE[dims]), generator=generator)
    labels.view(-1)[::5] = 255  # ignored pixels never count
    share = {"few": 0.02, "many": 0.5, "all": 1.0}[selection]
    mask = torch.rand(labels.shape, generator=generator) < share
    mask.view(-1)[3] = True
    labels.view(-1)[3] = 1  # at least one pixel counts
    weights = torch.tensor([1.0, 2.0, 0.5], dtype=torch.float64)
    got = dense.masked_loss(x, labels, mask, method=method, class_weights=weights)
    got_grads = _grads(model, got)
    want = _patch_minibatch_loss(model, x, labels, masked.selected(labels, mask), patch, weights)
    want_grads = _grads(model, want)
    assert_close_relative(got.detach(), want.detach(), 1e-10, 1.0)
    for a, b in zip(got_grads, want_grads, strict=True):
        assert_close_relative(a, b, 1e-9, 1.0)


@pytest.mark.parametrize("method", ["dense", "region", "patches", "auto"])
def test_the_focal_loss_of_every_method_is_the_patch_minibatchs(method):
    """Focal weighting (γ = 2) by each method equals the focal loss of the patch minibatch, Σ w·(1-p)²·CE / Σ w."""
    model, patch = _net(2)
    dense = densecnn.convert(model, patch)
    generator = torch.Generator().manual_seed(9)
    x = torch.randn(2, 2, *SIZE[2], dtype=torch.float64, generator=generator)
    labels = torch.randint(0, 3, (2, *SIZE[2]), generator=generator)
    mask = torch.rand(labels.shape, generator=generator) < 0.3
    weights = torch.tensor([1.0, 2.0, 0.5], dtype=torch.float64)
    got = dense.masked_loss(x, labels, mask, method=method, class_weights=weights, focal_gamma=2.0)
    got_grads = _grads(model, got)
    before = (patch - 1) // 2
    padded = F.pad(x, [before, patch - 1 - before] * 2)
    index = mask.nonzero().tolist()
    patches = torch.stack([padded[i[0], :, i[1] : i[1] + patch, i[2] : i[2] + patch] for i in index])
    targets = torch.stack([labels[tuple(i)] for i in index])
    scores = model(patches).flatten(1)  # (M, K)
    p_true = scores.softmax(1).gather(1, targets[:, None])[:, 0]
    w = weights[targets]
    want = (w * (1 - p_true) ** 2 * -p_true.log()).sum() / w.sum()
    want_grads = _grads(model, want)
    assert_close_relative(got.detach(), want.detach(), 1e-10, 1.0)
    for a, b in zip(got_grads, want_grads, strict=True):
        assert_close_relative(a, b, 1e-9, 1.0)


def test_no_counted_pixel_gives_a_zero_loss_and_zero_gradients():
    model, patch = _net(2)
    dense = densecnn.convert(model, patch)
    x = torch.randn(1, 2, 9, 9, dtype=torch.float64)
    labels = torch.full((1, 9, 9), 255)
    for method in ("dense", "region", "patches", "auto"):
        loss = dense.masked_loss(x, labels, method=method)
        grads = _grads(model, loss)
        assert loss.item() == 0.0 and all((g == 0).all() for g in grads)


def test_auto_takes_the_patches_or_region_for_a_few_pixels_and_the_dense_pass_for_all():
    model, patch = densecnn.zoo.create("plain_133", in_channels=3, num_classes=4)
    dense = densecnn.convert(model.eval(), patch)
    padded_shape = (1, 3, 256 + 132, 256 + 132)
    labels = torch.zeros(1, 256, 256, dtype=torch.long)
    one = torch.zeros(1, 256, 256, dtype=torch.bool)
    one[0, 100, 100] = True
    few = masked.costs(dense, padded_shape, one)
    assert min(few, key=few.__getitem__) != "dense"
    every = masked.costs(dense, padded_shape, masked.selected(labels, None))
    assert min(every, key=every.__getitem__) == "dense"
    two = one.clone()
    two[0, 200, 30] = True
    assert masked.costs(dense, padded_shape, two)["patches"] == 2 * few["patches"]  # one patch pass per pixel
    assert masked.costs(dense, padded_shape, two)["region"] > few["region"]  # a larger box


def test_masked_loss_refuses_an_unknown_method_and_mismatched_labels():
    model, patch = _net(2)
    dense = densecnn.convert(model, patch)
    x = torch.randn(1, 2, 9, 9, dtype=torch.float64)
    with pytest.raises(
        densecnn.InvalidInputError, match="method must be 'auto' or one of dense, region, patches"
    ):
        dense.masked_loss(x, torch.zeros(1, 9, 9, dtype=torch.long), method="fastest")
    with pytest.raises(densecnn.InvalidInputError, match=r"labels must be \(N, H, W\) = \(1, 9, 9\)"):
        dense.masked_loss(x, torch.zeros(1, 9, 8, dtype=torch.long))


def _bad_targets(name):
    """(labels, mask) for a 1x9x9 input of a 3-class net, wrong in the way ``name`` says."""
    labels, mask = torch.zeros(1, 9, 9, dtype=torch.long), torch.zeros(1, 9, 9, dtype=torch.bool)
    mask[0, 2, 3] = mask[0, 7, 1] = True  # a sparse selection: "auto" takes the patch pass
    return {
        "int mask of 0 and 2": (labels, mask.long() * 2),
        "float mask": (labels, mask.double()),
        "mask of another shape": (labels, mask[:, :, :8]),
        "float labels": (labels.double(), mask),
        "labels of another shape": (labels[:, :8], mask),
        "label out of range where unselected": (
            labels.index_put((torch.tensor([0]),) * 3, torch.tensor(7)),
            mask,
        ),
        "numpy labels": (labels.numpy(), mask),
    }[name]


BAD_TARGETS = [
    "int mask of 0 and 2",
    "float mask",
    "mask of another shape",
    "float labels",
    "labels of another shape",
    "label out of range where unselected",
    "numpy labels",
]


def _refused_by_masked_cross_entropy(bad: str):
    """A dense net, an input, the ``bad`` labels and mask, and the error densecnn.masked_cross_entropy raises for
    them on the net's scores: the refusal every masked_loss method must give alike."""
    model, patch = _net(2)
    dense = densecnn.convert(model, patch)
    x = torch.randn(1, 2, 9, 9, dtype=torch.float64)
    labels, mask = _bad_targets(bad)
    with pytest.raises(densecnn.DenseCNNError) as reference:
        densecnn.masked_cross_entropy(dense(x), labels, mask)
    return dense, x, labels, mask, reference.value


@pytest.mark.parametrize("method", ["dense", "region", "patches", "auto"])
@pytest.mark.parametrize("bad", BAD_TARGETS)
def test_every_method_refuses_the_labels_and_masks_masked_cross_entropy_refuses(method, bad):
    """Each method checks labels and mask up front, as densecnn.masked_cross_entropy does on the scores: the same
    error, never a raw torch error or a mask read differently by one method (a mask of 2s selecting nothing)."""
    dense, x, labels, mask, reference = _refused_by_masked_cross_entropy(bad)
    with pytest.raises(type(reference)) as got:
        dense.masked_loss(x, labels, mask, method=method)
    assert str(got.value) == str(reference)


@pytest.mark.parametrize("bad", ["int mask of 0 and 2", "float mask", "mask of another shape"])
def test_a_bad_mask_is_refused_alike_when_no_data_pixels_leave_the_mask(bad):
    dense, x, labels, mask, reference = _refused_by_masked_cross_entropy(bad)
    x[0, 0, 4, 4] = float("nan")
    with pytest.raises(type(reference)) as got:
        dense.masked_loss(x, labels, mask, nonfinite="propagate")
    assert str(got.value) == str(reference)
