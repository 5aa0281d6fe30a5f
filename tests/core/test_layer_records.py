"""Every registered layer type through the same checks (as timm runs every registered model through its tests).

The rule: a layer whose output depends on the batch or on randomness converts exactly or raises. In eval mode each
example either raises a ConversionError or converts to a dense net that is deterministic, independent of the batch
and equal to patch scanning; a type whose record is not flagged ``stochastic`` must be deterministic in training mode
too, and converting a flagged one in training mode warns.
"""

import warnings

import pytest
import torch
from torch import nn

import densecnn
from densecnn.rules import find_record, records
from densecnn.rules.registry import runs_unchanged
from tests.tolerances import assert_close_relative

PATCH = 6


def _randomised(bn):
    bn.running_mean.uniform_(-1, 1)
    bn.running_var.uniform_(0.5, 2)
    return bn


EXACT, REFUSED_HERE = "exact", "refused"
# layer type -> examples (where it goes, factory, expected), where: "map" (after Conv2d(2, 3, 2), on a 3-channel 5x5
# map), "flat" (on 4 features, inside the Linear head) or "end" (on the 2 class scores); "map1"/"map3": the same in
# a signal net (after Conv1d, on a length-5 map) or a volume net (after Conv3d, on a 5x5x5 map).
EXAMPLES = {
    nn.Conv2d: [("map", lambda: nn.Conv2d(3, 3, 2, stride=2), EXACT)],
    nn.Linear: [("flat", lambda: nn.Linear(4, 4), EXACT)],
    nn.MaxPool2d: [("map", lambda: nn.MaxPool2d(2, 1, dilation=2), EXACT)],
    nn.AvgPool2d: [("map", lambda: nn.AvgPool2d(3, 2), EXACT)],
    nn.AdaptiveAvgPool2d: [("map", lambda: nn.AdaptiveAvgPool2d(1), EXACT)],
    nn.AdaptiveMaxPool2d: [("map", lambda: nn.AdaptiveMaxPool2d((5, 1)), EXACT)],
    nn.Flatten: [("map", lambda: nn.Flatten(), EXACT)],
    nn.Identity: [("map", lambda: nn.Identity(), EXACT)],
    nn.PReLU: [("map", lambda: nn.PReLU(3), EXACT)],
    nn.BatchNorm2d: [
        ("map", lambda: _randomised(nn.BatchNorm2d(3)), EXACT),
        ("map", lambda: nn.BatchNorm2d(3, track_running_stats=False), REFUSED_HERE),
    ],
    nn.SyncBatchNorm: [("map", lambda: _randomised(nn.SyncBatchNorm(3)), EXACT)],
    nn.BatchNorm1d: [
        ("flat", lambda: _randomised(nn.BatchNorm1d(4)), EXACT),
        ("flat", lambda: nn.BatchNorm1d(4, track_running_stats=False), REFUSED_HERE),
    ],
    nn.InstanceNorm2d: [
        ("map", lambda: nn.InstanceNorm2d(3), REFUSED_HERE),
        ("map", lambda: _randomised(nn.InstanceNorm2d(3, affine=True, track_running_stats=True)), EXACT),
    ],
    nn.modules.instancenorm._InstanceNorm: [("flat", lambda: nn.InstanceNorm1d(4), REFUSED_HERE)],
    nn.GroupNorm: [
        ("map", lambda: nn.GroupNorm(1, 3), REFUSED_HERE),
        ("map", lambda: nn.GroupNorm(3, 3), REFUSED_HERE),
    ],
    nn.LayerNorm: [
        ("map", lambda: nn.LayerNorm([3, 5, 5]), REFUSED_HERE),
        ("flat", lambda: nn.LayerNorm(4), EXACT),
    ],
    nn.Dropout: [("map", lambda: nn.Dropout(0.5), EXACT), ("flat", lambda: nn.Dropout(0.5), EXACT)],
    nn.Dropout2d: [("map", lambda: nn.Dropout2d(0.5), EXACT)],
    nn.AlphaDropout: [("flat", lambda: nn.AlphaDropout(0.5), EXACT)],
    nn.FeatureAlphaDropout: [("map", lambda: nn.FeatureAlphaDropout(0.5), EXACT)],
    nn.RReLU: [("map", lambda: nn.RReLU(0.1, 0.3), EXACT), ("flat", lambda: nn.RReLU(), EXACT)],
    nn.LocalResponseNorm: [("map", lambda: nn.LocalResponseNorm(2), EXACT)],
    nn.Softmax: [("end", lambda: nn.Softmax(dim=1), EXACT), ("end", lambda: nn.Softmax(), EXACT)],
    nn.LogSoftmax: [("end", lambda: nn.LogSoftmax(dim=-1), EXACT), ("end", lambda: nn.LogSoftmax(), EXACT)],
    nn.Softmax2d: [("map", lambda: nn.Softmax2d(), EXACT)],
    # signals and volumes
    nn.Conv1d: [("map1", lambda: nn.Conv1d(3, 3, 2, stride=2), EXACT)],
    nn.Conv3d: [("map3", lambda: nn.Conv3d(3, 3, (2, 1, 2), stride=(2, 1, 1), groups=3), EXACT)],
    nn.MaxPool1d: [("map1", lambda: nn.MaxPool1d(2, 1, dilation=2), EXACT)],
    nn.MaxPool3d: [("map3", lambda: nn.MaxPool3d(2, (1, 2, 1), dilation=(2, 1, 1)), EXACT)],
    nn.AvgPool1d: [("map1", lambda: nn.AvgPool1d(3, 2), EXACT)],
    nn.AvgPool3d: [("map3", lambda: nn.AvgPool3d(3, 2, divisor_override=5), EXACT)],
    nn.AdaptiveAvgPool1d: [("map1", lambda: nn.AdaptiveAvgPool1d(1), EXACT)],
    nn.AdaptiveAvgPool3d: [("map3", lambda: nn.AdaptiveAvgPool3d((1, None, 5)), EXACT)],
    nn.AdaptiveMaxPool1d: [("map1", lambda: nn.AdaptiveMaxPool1d(5), EXACT)],
    nn.AdaptiveMaxPool3d: [("map3", lambda: nn.AdaptiveMaxPool3d(1), EXACT)],
    nn.BatchNorm3d: [
        ("map3", lambda: _randomised(nn.BatchNorm3d(3)), EXACT),
        ("map3", lambda: nn.BatchNorm3d(3, track_running_stats=False), REFUSED_HERE),
    ],
    nn.InstanceNorm1d: [
        ("map1", lambda: nn.InstanceNorm1d(3), REFUSED_HERE),
        ("map1", lambda: _randomised(nn.InstanceNorm1d(3, track_running_stats=True)), EXACT),
    ],
    nn.InstanceNorm3d: [
        ("map3", lambda: nn.InstanceNorm3d(3), REFUSED_HERE),
        ("map3", lambda: _randomised(nn.InstanceNorm3d(3, affine=True, track_running_stats=True)), EXACT),
    ],
    nn.Dropout1d: [("map1", lambda: nn.Dropout1d(0.5), EXACT)],
    nn.Dropout3d: [("map3", lambda: nn.Dropout3d(0.5), EXACT)],
}
EXAMPLES[nn.BatchNorm1d].append(("map1", lambda: _randomised(nn.BatchNorm1d(3)), EXACT))  # on a signal's map
SIZES = (7, 8, 6)  # the input's spatial size, cut to the net's number of axes
POINTWISE_ARGS = {nn.LeakyReLU: (0.2,), nn.Hardtanh: (-0.5, 0.5), nn.Softshrink: (0.3,), nn.Hardshrink: (0.3,),
                  nn.Threshold: (0.1, -1.0), nn.Softplus: (2.0,)}  # fmt: skip


def _examples(layer_type):
    if layer_type in EXAMPLES:
        return EXAMPLES[layer_type]
    args = POINTWISE_ARGS.get(layer_type, ())
    return [("map", lambda: layer_type(*args), EXACT), ("flat", lambda: layer_type(*args), EXACT)]


BUILT_IN = sorted(
    (record.layer_type for record in records() if record.layer_type.__module__.startswith("torch.nn")),
    key=lambda t: t.__name__,
)
CASES = [
    pytest.param(layer_type, where, make, expected, id=f"{layer_type.__name__}-{where}-{index}")
    for layer_type in BUILT_IN
    for index, (where, make, expected) in enumerate(_examples(layer_type))
]


def _dims(where: str) -> int:
    return int(where[-1]) if where[-1].isdigit() else 2


def _net(where: str, layer: nn.Module) -> nn.Sequential:
    dims = _dims(where)
    conv = getattr(nn, f"Conv{dims}d")(2, 3, 2)
    head = [nn.Flatten(), nn.LazyLinear(4), nn.Tanh(), nn.Linear(4, 2)]
    if where.startswith("map"):
        net = nn.Sequential(conv, layer, *head)
    elif where == "flat":
        net = nn.Sequential(conv, *head[:3], layer, head[3])
    else:
        net = nn.Sequential(conv, *head, layer)
    with torch.no_grad():
        net.eval()(torch.rand(2, 2, *(PATCH,) * dims))  # materialises the LazyLinear
    return net.double()


def test_every_built_in_layer_type_with_a_rule_of_its_own_has_examples():
    missing = [
        t.__name__ for t in BUILT_IN if t not in EXAMPLES and find_record(t).rule is not runs_unchanged
    ]
    assert not missing


@pytest.mark.parametrize(("layer_type", "where", "make", "expected"), CASES)
def test_eval_mode_converts_exactly_or_raises(layer_type, where, make, expected):
    torch.manual_seed(0)
    net = _net(where, make()).eval()
    if expected == REFUSED_HERE:
        with pytest.raises(densecnn.ConversionError):
            densecnn.convert(net, PATCH)
        return
    dense = densecnn.convert(net, PATCH)
    x = torch.randn(3, 2, *SIZES[: _dims(where)], dtype=torch.float64)
    with torch.no_grad():
        whole = dense(x)
        assert torch.equal(dense(x), whole), "not deterministic"
        assert_close_relative(dense(x[1:2]), whole[1:2], 1e-12, what="depends on the batch:")
        assert_close_relative(whole, densecnn.scan_patches(net, x, PATCH), 1e-10)


@pytest.mark.parametrize(("layer_type", "where", "make", "expected"), CASES)
def test_training_mode_is_deterministic_unless_flagged_and_warned(layer_type, where, make, expected):
    if expected == REFUSED_HERE:
        return
    torch.manual_seed(0)
    net = _net(where, make()).train()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dense = densecnn.convert(net, PATCH)
    warned = any(issubclass(w.category, densecnn.DenseEquivalenceWarning) for w in caught)
    if find_record(layer_type).stochastic:
        assert warned
        return
    assert not warned
    x = torch.randn(3, 2, *SIZES[: _dims(where)], dtype=torch.float64)
    with torch.no_grad():
        whole = dense(x)
        assert torch.equal(dense(x), whole)
        assert_close_relative(dense(x[1:2]), whole[1:2], 1e-12)
        assert_close_relative(whole, densecnn.scan_patches(net, x, PATCH), 1e-10)


def test_batch_norm_without_running_statistics_is_refused_with_the_reason():
    net = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2, track_running_stats=False), nn.Conv2d(2, 2, 3))
    with pytest.raises(
        densecnn.ConversionError, match=r"'1' \(BatchNorm2d\): track_running_stats=False.*batch"
    ):
        densecnn.convert(net.eval(), 5)


@pytest.mark.parametrize("norm", [nn.InstanceNorm2d(2), nn.GroupNorm(2, 2), nn.LayerNorm([2, 3, 3])])
def test_normalisation_over_the_patch_map_is_refused(norm):
    with pytest.raises(densecnn.ConversionError, match="patch's own statistics"):
        densecnn.convert(nn.Sequential(nn.Conv2d(1, 2, 3), norm, nn.Conv2d(2, 2, 3)).eval(), 5)
