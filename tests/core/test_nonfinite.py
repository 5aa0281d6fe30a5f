"""Non-finite input pixels: refused by default; with ``nonfinite="propagate"``, NaN scores exactly where patch
scanning's are for NaN inputs, every other pixel equal to patch scanning, on every solver, dimensionality and tiling;
label -1 there; masked losses leave those pixels out."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import densecnn
from densecnn import ops
from densecnn.errors import NonFiniteInputError, ScoresNotFiniteError
from densecnn.nonfinite import NO_DATA_LABEL, all_finite
from densecnn.ops import solvers
from tests.tolerances import assert_equal_to_rounding

pytestmark = pytest.mark.filterwarnings("ignore::densecnn.PatchSizeWarning")

BAD_VALUES = {"nan": float("nan"), "+inf": float("inf"), "-inf": float("-inf")}


def _signal_net():
    return nn.Sequential(nn.Conv1d(2, 4, 3), nn.ReLU(), nn.MaxPool1d(2), nn.Conv1d(4, 3, 3)), 8


def _image_net():
    # the 1x1 stride-2 conv reads every other pooled position: the footprint has holes
    layers = [nn.Conv2d(2, 4, 3), nn.Tanh(), nn.MaxPool2d(2), nn.Conv2d(4, 3, 1, stride=2), nn.Flatten()]
    return nn.Sequential(*layers, nn.Linear(12, 3), nn.LogSoftmax(1)), 10


def _volume_net():
    return nn.Sequential(nn.Conv3d(2, 3, 2), nn.ReLU(), nn.AvgPool3d(2), nn.Conv3d(3, 2, 2)), 5


NETS = {1: (_signal_net, (17,)), 2: (_image_net, (12, 15)), 3: (_volume_net, (6, 7, 8))}


def _setup(dims: int, bad: str, count: int = 3, seed: int = 0):
    """(model, patch, x holding ``count`` non-finite values, the same x with them as NaN) in float64."""
    torch.manual_seed(seed)
    make, size = NETS[dims]
    model, patch = make()
    model = model.double().eval()
    x = torch.rand(2, 2, *size, dtype=torch.float64)
    generator = torch.Generator().manual_seed(seed)
    flat = x.view(-1)
    picks = torch.randperm(flat.numel(), generator=generator)[:count]
    flat[picks] = BAD_VALUES[bad]
    return model, patch, x, torch.where(torch.isfinite(x), x, torch.nan)


def _assert_matches_nan_scan(actual: torch.Tensor, reference: torch.Tensor) -> None:
    """NaN at the same pixels (every class), the other pixels equal to rounding."""
    nan_pixels = reference.isnan().any(1)  # (N, *S)
    assert nan_pixels.any(), "the test input taints no pixel"
    assert (~nan_pixels).any(), "the test input taints every pixel"
    assert torch.equal(actual.isnan().all(1), nan_pixels)
    assert torch.equal(actual.isnan().any(1), nan_pixels)
    finite = ~nan_pixels.unsqueeze(1).expand_as(reference)
    assert_equal_to_rounding(actual[finite], reference[finite])


@pytest.mark.parametrize("dims", [1, 2, 3])
def test_non_finite_input_is_refused_by_default_naming_count_and_position(dims):
    model, patch, x, _ = _setup(dims, "nan", count=2)
    dense = densecnn.convert(model, patch)
    first = [int(i) for i in (~torch.isfinite(x)).nonzero()[0]]
    labels = torch.zeros(x.shape[0], *x.shape[2:], dtype=torch.long)
    calls = {
        "forward": lambda: dense(x),
        "tiled forward": lambda: dense(x, max_memory=200_000),
        "predict": lambda: dense.predict(x),
        "tiled predict": lambda: dense.predict(x, max_memory=200_000),
        "masked_loss": lambda: dense.masked_loss(x, labels),
    }
    for what, call in calls.items():
        with pytest.raises(
            NonFiniteInputError, match=rf"2 non-finite value\(s\).*at {re.escape(str(first))}.*propagate"
        ):
            call()
        assert isinstance(NonFiniteInputError("x"), densecnn.InvalidInputError), what


def test_an_unknown_policy_is_refused():
    model, patch, x, _ = _setup(2, "nan")
    with pytest.raises(densecnn.InvalidInputError, match="nonfinite must be 'refuse'.*'propagate'"):
        densecnn.convert(model, patch)(x, nonfinite="zero")


@pytest.mark.parametrize("padding_mode", ["zeros", "reflect"])
@pytest.mark.parametrize("bad", sorted(BAD_VALUES))
@pytest.mark.parametrize("dims", [1, 2, 3])
def test_propagate_gives_nan_exactly_where_patch_scanning_does(dims, bad, padding_mode):
    model, patch, x, x_nan = _setup(dims, bad, seed=dims)
    dense = densecnn.convert(model, patch, padding_mode=padding_mode)
    reference = densecnn.scan_patches(model, x_nan, patch, padding_mode=padding_mode)
    with torch.no_grad():
        _assert_matches_nan_scan(dense(x, nonfinite="propagate"), reference)
        _assert_matches_nan_scan(dense(x, max_memory=60_000, nonfinite="propagate"), reference)


@pytest.mark.parametrize("dims", [1, 2, 3])
def test_propagate_labels_no_data_pixels_minus_one(dims):
    model, patch, x, x_nan = _setup(dims, "nan", seed=5)
    dense = densecnn.convert(model, patch)
    reference = densecnn.scan_patches(model, x_nan, patch)
    expected = reference.nan_to_num(-torch.inf).argmax(1).masked_fill(reference.isnan().any(1), NO_DATA_LABEL)
    for max_memory in (None, 60_000):
        labels = dense.predict(x, max_memory=max_memory, nonfinite="propagate")
        assert labels.dtype == torch.int64
        assert torch.equal(labels, expected), max_memory


def test_a_finite_input_gives_the_same_scores_under_both_policies():
    model, patch, _, _ = _setup(2, "nan")
    x = torch.rand(1, 2, 9, 11, dtype=torch.float64)
    dense = densecnn.convert(model, patch)
    with torch.no_grad():
        assert torch.equal(dense(x), dense(x, nonfinite="propagate"))


def _zoo(name: str):
    torch.manual_seed(0)
    model, patch = densecnn.zoo.create(name, in_channels=2, num_classes=3)
    return model.eval(), patch


@pytest.mark.parametrize(
    "name, solver",
    [
        ("stages_46", "fft"),
        ("tiny", "fft"),
        ("nuclei", "fft"),
        ("nuclei", "winograd"),
        ("nuclei3d", "winograd"),
    ],
)
def test_forced_fast_solvers_keep_non_finite_pixels_local(name, solver, ops_config, tmp_path):
    if solvers.SOLVERS[solver].needs_ext and not ops.ext_available():
        pytest.skip("densecnn's kernels are not built")
    ops_config(cache_dir=tmp_path, solver=None, memory_format=None, tune=False)
    model, patch = _zoo(name)
    sizes = (patch,) * 2 if isinstance(patch, int) else patch
    x = torch.rand(1, 2, *(p + 10 + 3 * axis for axis, p in enumerate(sizes)))
    x[(0, 1, *(2 + axis for axis in range(len(sizes))))] = float("nan")
    x[(0, 0, *(p + 7 for p in sizes))] = float("inf")
    dense = densecnn.convert(model, patch)
    dense.solver = solver
    used = {step.solver for step in dense.plan(dense.pad(x.nan_to_num())).steps}
    assert solver in used, used
    reference = densecnn.scan_patches(model, torch.where(torch.isfinite(x), x, torch.nan), patch)
    with torch.no_grad():
        _assert_matches_nan_scan(dense(x, nonfinite="propagate"), reference)


@pytest.mark.parametrize("method", ["dense", "region", "patches"])
@pytest.mark.parametrize("dims", [1, 2, 3])
def test_masked_loss_leaves_no_data_pixels_out(dims, method):
    model, patch, x, x_nan = _setup(dims, "nan", count=2, seed=7)
    dense = densecnn.convert(model, patch)
    generator = torch.Generator().manual_seed(dims)
    classes = {1: 3, 2: 3, 3: 2}[dims]
    labels = torch.randint(0, classes, (x.shape[0], *x.shape[2:]), generator=generator)
    mask = torch.rand(labels.shape, generator=generator) < 0.6
    tainted = densecnn.scan_patches(model, x_nan, patch).isnan().any(1)
    kept = mask & ~tainted
    assert kept.any() and (mask & tainted).any()

    loss = dense.masked_loss(x, labels, mask, method=method, nonfinite="propagate")
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()

    # the patch minibatch of the kept pixels, cut one by one from the zero-padded input with its no-data pixels as 0:
    # the kept pixels' scores never read them, but the patch net computes (and differentiates) maps it then drops
    sizes = (patch,) * dims
    no_data_as_zero = torch.where(torch.isfinite(x), x, 0)
    padded = F.pad(no_data_as_zero, [w for p in reversed(sizes) for w in ((p - 1) // 2, p // 2)])
    image, *position = kept.nonzero(as_tuple=True)
    crops = torch.stack(
        [
            padded[(int(n), slice(None), *(slice(int(i), int(i) + p) for i, p in zip(where, sizes)))]
            for n, *where in zip(image, *position)
        ]
    )
    scores = model(crops).reshape(len(crops), -1)
    expected = F.cross_entropy(scores, labels[(image, *position)])
    expected.backward()
    assert_equal_to_rounding(loss.detach(), expected.detach(), "loss")
    for p, grad in zip(model.parameters(), grads):
        assert_equal_to_rounding(grad, p.grad, "gradient")


def test_finite_values_whose_sum_overflows_are_finite():
    large = torch.full((1, 1, 4, 4), 3e38)  # float32: the sum overflows to inf, every value is finite
    assert all_finite(large)
    large[0, 0, 1, 2] = float("inf")
    assert not all_finite(large)
    large[0, 0, 1, 2] = -float("inf")
    assert not all_finite(large)


def _overflowing_net() -> tuple[nn.Sequential, int]:
    """Finite weights that send a finite pixel of 2 to +inf and -inf, then add them: NaN scores for class 0."""
    first, second = nn.Conv2d(1, 2, 3), nn.Conv2d(2, 2, 1)
    with torch.no_grad():
        first.weight.zero_()
        first.weight[0, 0, 1, 1], first.weight[1, 0, 1, 1] = 3e38, -3e38
        first.bias.zero_()
        second.weight.copy_(torch.tensor([[1.0, 1.0], [1.0, 0.0]]).view(2, 2, 1, 1))
        second.bias.zero_()
    return nn.Sequential(first, second), 3


@pytest.mark.parametrize("max_memory", [None, 30_000])
def test_nan_scores_on_a_finite_input_are_refused_not_labelled_no_data(max_memory, tmp_path):
    """The net overflowing on a finite input has no label for those pixels: predict, LoadedModel.labels and
    classify (whole or tiled) raise, where ``nonfinite="propagate"`` (an input with holes) labels them -1."""
    model, patch = _overflowing_net()
    x = torch.full((1, 1, 40, 40), 2.0)
    dense = densecnn.convert(model, patch, verify=False)
    assert dense(x).isnan().any()  # the scores themselves are what the net computes
    with pytest.raises(
        ScoresNotFiniteError,
        match=r"scores are NaN at \d+ of the \d+ pixels scored at once, on a finite input",
    ):
        dense.predict(x, max_memory)
    assert (dense.predict(x, max_memory, nonfinite="propagate") == NO_DATA_LABEL).all()
    densecnn.save(model, tmp_path / "model", patch_size=patch)
    loaded = densecnn.load(tmp_path / "model")
    for call in (loaded.labels, loaded.classify):
        with pytest.raises(ScoresNotFiniteError):
            call(x, max_memory=max_memory)
