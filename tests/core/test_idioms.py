"""Model idioms as users write them: each converts exactly (checked against the independent patch scanner, which runs
the model's own forward, hooks and all) or is refused with a ConversionError naming the cause.

The classes: one module used more than once; subclasses that redefine their base's computation; hooks and forwards
replaced on an instance; weights a pre-hook recomputes; softmax's implicit dimension; and the verification pass,
which catches what no reader rule foresaw.
"""

from __future__ import annotations

import copy
import math
import re
import sys

import pytest
import torch
import torch.nn.functional as F
import torch.nn.modules.module as module_globals
from hypothesis import given
from hypothesis import strategies as st
from torch import nn
from torch.nn.utils import parametrizations, parametrize, prune

import densecnn
from densecnn.convert import MAX_PATCH_PIXELS
from densecnn.layers import DenseConv
from densecnn.verify import verify_conversion
from tests.tolerances import assert_close_relative

REL = 1e-10  # float64
CONV = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}
POOL = {1: nn.MaxPool1d, 2: nn.MaxPool2d, 3: nn.MaxPool3d}
SIZE = {1: (19,), 2: (9, 11), 3: (5, 6, 7)}


def exact(model: nn.Module, patch, *, dims: int = 2, in_channels: int = 1, verify: bool = True):
    """Convert ``model`` and assert the dense scores equal patch-by-patch scanning of the model itself."""
    model = model.double().eval()
    x = torch.randn(2, in_channels, *SIZE[dims], dtype=torch.float64)
    dense = densecnn.convert(model, patch, verify=verify)
    with torch.no_grad():
        assert_close_relative(dense(x), densecnn.scan_patches(model, x, patch), REL)
    return dense


def refused(model: nn.Module, patch, match: str, *, by_reader: bool = True) -> str:
    """Assert that conversion raises a ConversionError matching ``match``; ``by_reader``: before any verification
    (the idiom's class is refused by the reader itself, not caught by the safety net)."""
    with pytest.raises(densecnn.ConversionError, match=match) as info:
        densecnn.convert(model.double().eval(), patch, verify=not by_reader)
    return str(info.value)


# --- 1. one module instance used more than once -----------------------------------------------------------------


def test_one_activation_instance_used_after_every_conv():
    act = nn.ReLU()
    exact(
        nn.Sequential(nn.Conv2d(1, 4, 3), act, nn.Conv2d(4, 4, 3), act, nn.Conv2d(4, 3, 3), act),
        7,
        verify=False,
    )


def test_layers_built_by_list_repetition():
    conv, act = nn.Conv2d(3, 3, 1), nn.Tanh()
    exact(nn.Sequential(nn.Conv2d(1, 3, 3), *[conv, act] * 3, nn.Conv2d(3, 2, 3)), 5, verify=False)


def test_a_1x1_conv_applied_twice_in_a_row():
    conv = nn.Conv2d(4, 4, 1)
    exact(nn.Sequential(nn.Conv2d(1, 4, 2), conv, conv, nn.MaxPool2d(2), nn.Conv2d(4, 2, 2)), 5, verify=False)


def test_a_whole_block_applied_twice():
    block = nn.Sequential(nn.Conv2d(4, 4, 3), nn.ELU())
    exact(nn.Sequential(nn.Conv2d(1, 4, 2), block, block, nn.Conv2d(4, 2, 1)), 6, verify=False)


def test_a_block_repeated_inside_nested_containers():
    block = nn.Sequential(nn.Conv2d(3, 3, 1), nn.Sigmoid())
    model = nn.Sequential(
        nn.Conv2d(1, 3, 3), block, nn.Sequential(block, nn.Sequential(block)), nn.Conv2d(3, 2, 3)
    )
    exact(model, 5, verify=False)


def test_a_traced_model_calling_one_layer_twice():
    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem, self.mix, self.head = nn.Conv2d(1, 4, 3), nn.Conv2d(4, 4, 1), nn.Conv2d(4, 2, 3)

        def forward(self, x):
            return self.head(F.relu(self.mix(F.relu(self.mix(self.stem(x))))))

    exact(Twice(), 5, verify=False)


@pytest.mark.parametrize("dims", [1, 2, 3])
@given(order=st.lists(st.integers(0, 3), min_size=1, max_size=6))
def test_any_order_of_shared_modules_converts_exactly(dims, order):
    """Layers drawn with repetition from one pool of module instances, in any number of spatial axes."""
    torch.manual_seed(len(order))
    pool = [CONV[dims](3, 3, 1), nn.Tanh(), CONV[dims](3, 3, 2), nn.LeakyReLU(0.2)]
    layers = [CONV[dims](1, 3, 2), *(pool[i] for i in order), CONV[dims](3, 2, 1)]
    patch = 2 + sum(1 for i in order if i == 2)
    exact(nn.Sequential(*layers), patch, dims=dims, verify=False)


def test_a_saved_model_keeps_every_use_of_a_shared_layer(tmp_path):
    conv, act = nn.Conv2d(4, 4, 1), nn.ReLU()
    model = nn.Sequential(nn.Conv2d(1, 4, 3), act, conv, act, conv, act, nn.Conv2d(4, 3, 3)).double().eval()
    densecnn.save(model, tmp_path / "m", patch_size=5)
    loaded = densecnn.load(tmp_path / "m")
    patches = torch.randn(6, 1, 5, 5, dtype=torch.float64)
    with torch.no_grad():
        assert_close_relative(loaded.model(patches), model(patches), REL)
    assert (
        loaded.model[2] is loaded.model[4]
    )  # one module, as saved: training the reloaded net keeps them tied
    x = torch.randn(1, 1, 9, 9, dtype=torch.float64)
    with torch.no_grad():
        assert_close_relative(loaded.dense()(x), densecnn.scan_patches(model, x, 5), REL)


def test_a_reuse_entry_must_name_an_earlier_layer(tmp_path):
    relu = nn.ReLU()
    model = nn.Sequential(nn.Conv2d(1, 2, 3), relu, nn.Conv2d(2, 2, 1), relu)
    densecnn.save(model, tmp_path / "m", patch_size=3)
    config = (tmp_path / "m" / "model.json").read_text()
    assert '"type": "Reuse"' in config
    (tmp_path / "m" / "model.json").write_text(config.replace('"layer": 1', '"layer": 3'))
    with pytest.raises(
        densecnn.ModelFileError, match=r"layers\[3\]\.layer: 3 is not the index of an earlier layer"
    ):
        densecnn.load(tmp_path / "m")


# --- 2. subclasses that redefine what their base computes -------------------------------------------------------


class WSConv2d(nn.Conv2d):
    """Weight-standardised conv (each filter to zero mean, unit variance), as in BiT and NFNet code."""

    def forward(self, x):
        w = self.weight
        w = (w - w.mean((1, 2, 3), keepdim=True)) / (w.std((1, 2, 3), keepdim=True) + 1e-5)
        return F.conv2d(x, w, self.bias, self.stride, self.padding, self.dilation, self.groups)


class AveragingMaxPool(nn.MaxPool2d):
    def forward(self, x):
        return F.avg_pool2d(x, self.kernel_size, self.stride)


class ScaledLinear(nn.Linear):
    def forward(self, x):
        return super().forward(x) * 0.5


class Conv2dSame(nn.Conv2d):
    """timm-style "same" padding computed from the input size in forward."""

    def forward(self, x):
        ih, iw = x.shape[-2:]
        kh, kw = self.kernel_size
        x = F.pad(x, [(kw - 1) // 2, kw // 2, (kh - 1) // 2, kh // 2])
        return F.conv2d(x, self.weight, self.bias, self.stride, 0, self.dilation, self.groups)


class ConvForwardOverride(nn.Conv2d):
    def _conv_forward(self, x, weight, bias):
        return F.conv2d(x, weight.flip(-1), bias, self.stride, self.padding, self.dilation, self.groups)


class WeightProperty(nn.Conv2d):
    @property
    def scaled_weight(self):
        return self.weight * 2


class ShiftedReLU(nn.ReLU):
    def forward(self, x):
        return F.relu(x - 0.1)


@pytest.mark.parametrize(
    ("layer", "where"),
    [
        (WSConv2d(1, 3, 3), "forward"),
        (Conv2dSame(1, 3, 3), "forward"),
        (ConvForwardOverride(1, 3, 3), "_conv_forward"),
        (WeightProperty(1, 3, 3), "scaled_weight"),
    ],
    ids=["weight-standardised", "same-padding", "_conv_forward", "property"],
)
def test_conv_subclasses_that_redefine_the_computation_are_refused_by_name(layer, where):
    model = nn.Sequential(layer, nn.ReLU(), nn.Conv2d(3, 2, 3))
    message = refused(model, 5, rf"'0' \({type(layer).__name__}\): subclasses Conv2d but redefines {where}")
    assert f"Register a rule for {type(layer).__name__}" in message


@pytest.mark.parametrize(
    "model",
    [
        nn.Sequential(nn.Conv2d(1, 3, 2), AveragingMaxPool(2), nn.Conv2d(3, 2, 2)),
        nn.Sequential(nn.Conv2d(1, 3, 3), ShiftedReLU(), nn.Conv2d(3, 2, 3)),
        nn.Sequential(nn.Conv2d(1, 3, 3), nn.Flatten(), ScaledLinear(27, 2)),
    ],
    ids=["pool", "activation", "linear"],
)
def test_other_subclasses_that_redefine_forward_are_refused(model):
    refused(model, 5 if isinstance(model[1], ShiftedReLU) else (4 if isinstance(model[1], AveragingMaxPool) else 5),
            r"subclasses \w+ but redefines forward")  # fmt: skip


def test_a_subclass_that_only_adds_setup_and_helpers_converts_with_its_base_rule():
    class NamedConv(nn.Conv2d):
        def __init__(self, *args, name="stem", **kwargs):
            super().__init__(*args, **kwargs)
            self.name = name

        def describe(self):
            return f"{self.name}: {self.kernel_size}"

        def extra_repr(self):
            return self.describe()

    exact(nn.Sequential(NamedConv(1, 3, 3), nn.ReLU(), nn.Conv2d(3, 2, 3)), 5, verify=False)


def test_a_sequential_subclass_with_its_own_forward_is_traced():
    class Reversed(nn.Sequential):
        def forward(self, x):
            for layer in reversed(self):
                x = layer(x)
            return x

    # runs head(relu(stem(x))) though its children are listed head-first
    model = Reversed(nn.Conv2d(3, 2, 3), nn.ReLU(), nn.Conv2d(1, 3, 3))
    exact(model, 5, verify=False)


def test_a_sequential_subclass_that_skips_a_child_is_read_as_it_runs():
    class SkipsDropout(nn.Sequential):
        def forward(self, x):
            return self[2](self[0](x))

    exact(SkipsDropout(nn.Conv2d(1, 3, 3), nn.Tanh(), nn.Conv2d(3, 2, 3)), 5, verify=False)


# --- 3. hooks and forwards replaced on an instance --------------------------------------------------------------


def _net():
    return nn.Sequential(
        nn.Conv2d(1, 3, 3), nn.ReLU(), nn.Sequential(nn.Conv2d(3, 3, 1), nn.Tanh()), nn.Conv2d(3, 2, 3)
    )


@pytest.mark.parametrize(
    ("register", "match"),
    [
        (
            lambda m: m[0].register_forward_hook(lambda mod, i, o: o * 2),
            r"layer '0' \(Conv2d\) has a forward hook",
        ),
        (
            lambda m: m[1].register_forward_hook(lambda mod, i, o: o + 1),
            r"layer '1' \(ReLU\) has a forward hook",
        ),
        (
            lambda m: m[0].register_forward_pre_hook(lambda mod, i: (i[0] * 3,)),
            r"'0' \(Conv2d\) has a forward pre-hook",
        ),
        (
            lambda m: m[2][0].register_forward_hook(lambda mod, i, o: o.abs()),
            r"layer '2\.0' \(Conv2d\) has a forward hook",
        ),
        (
            lambda m: m[2].register_forward_hook(lambda mod, i, o: -o),
            r"layer '2' \(Sequential\) has a forward hook",
        ),
        (
            lambda m: m.register_forward_hook(lambda mod, i, o: o * 0),
            r"the model \(Sequential\) has a forward hook",
        ),
        (
            lambda m: m.register_forward_pre_hook(lambda mod, i: (i[0].flip(-1),)),
            r"the model .* forward pre-hook",
        ),
        (
            lambda m: m[0].register_full_backward_hook(lambda mod, gi, go: gi),
            r"'0' \(Conv2d\) has a backward hook",
        ),
        (
            lambda m: m[3].register_full_backward_pre_hook(lambda mod, go: go),
            r"'3' \(Conv2d\) has a backward pre-hook",
        ),
        (
            lambda m: m[0].register_forward_hook(lambda mod, a, k, o: o, with_kwargs=True),
            r"'0' .* forward hook",
        ),
    ],
    ids=[
        "conv",
        "relu",
        "pre",
        "nested",
        "container",
        "model",
        "model-pre",
        "backward",
        "backward-pre",
        "kwargs",
    ],
)
def test_hooks_are_refused_naming_the_layer(register, match):
    model = _net()
    register(model)
    message = refused(model, 5, match)
    assert "handle.remove()" in message


@pytest.mark.parametrize(
    "register",
    [module_globals.register_module_forward_hook, module_globals.register_module_forward_pre_hook,
     module_globals.register_module_full_backward_hook],
    ids=["forward", "pre", "backward"],
)  # fmt: skip
def test_global_module_hooks_are_refused(register):
    handle = register(lambda *args: None)
    try:
        refused(_net(), 5, r"a global module hook is registered .*register_module_")
    finally:
        handle.remove()
    exact(_net(), 5)  # and converts once it is removed


def test_a_forward_replaced_on_an_instance_is_refused():
    model = _net()
    relu = model[1]
    relu.forward = lambda x: F.relu(x) * 2
    message = refused(model, 5, r"layer '1' \(ReLU\) has its forward replaced on the instance")
    assert (
        "del layer.forward" in message and "handle" not in message
    )  # no handle to remove: the fix that works
    del relu.forward
    exact(model, 5)


def test_a_model_forward_replaced_on_the_instance_is_refused():
    model = _net()
    original = model.forward
    model.forward = lambda x: original(x) + 1
    refused(model, 5, r"the model \(Sequential\) has its forward replaced")


def test_a_model_class_that_redefines_call_is_refused():
    class Doubled(nn.Sequential):
        def __call__(self, x):
            return super().__call__(x) * 2

    refused(
        Doubled(nn.Conv2d(1, 3, 3), nn.ReLU(), nn.Conv2d(3, 2, 3)),
        5,
        r"the model \(Doubled\) redefines __call__",
    )


def test_a_hook_added_after_conversion_stops_the_dense_net():
    model = _net().double().eval()
    dense = densecnn.convert(model, 5)
    handle = model[2][1].register_forward_hook(lambda mod, i, o: o * 2)
    x = torch.randn(1, 1, 8, 8, dtype=torch.float64)
    with pytest.raises(densecnn.ConversionError, match=r"layer '2\.1' \(Tanh\) has a forward hook"):
        dense(x)
    with pytest.raises(densecnn.ConversionError, match="forward hook"):
        dense.predict(x, max_memory=10**8)
    handle.remove()
    dense(x)


def test_hooks_inside_a_traced_model_are_refused():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = _net()

        def forward(self, x):
            return self.body(x)

    model = Net()
    model.body[3].register_forward_hook(lambda mod, i, o: o * 2)
    refused(model, 5, r"layer 'body\.3' \(Conv2d\) has a forward hook")


# --- 4. weights a pre-hook recomputes ---------------------------------------------------------------------------


class Doubled(nn.Module):
    """A custom parametrisation: the weight is twice the stored tensor."""

    def forward(self, weight):
        return 2 * weight


def _with_old_weight_norm(layer):
    with pytest.warns(FutureWarning):
        return torch.nn.utils.weight_norm(layer)


@pytest.mark.parametrize(
    ("reparametrise", "update"),
    [
        (_with_old_weight_norm, lambda layer: layer.weight_g.mul_(1.7)),
        (_with_old_weight_norm, lambda layer: layer.weight_v.add_(0.3)),
        (lambda layer: prune.l1_unstructured(layer, "weight", amount=0.4), lambda layer: layer.weight_orig.mul_(-2)),
        (lambda layer: prune.random_structured(layer, "weight", amount=1, dim=0),
         lambda layer: layer.weight_orig.add_(1.0)),
        (lambda layer: torch.nn.utils.spectral_norm(layer), lambda layer: layer.weight_orig.mul_(3)),
        (lambda layer: parametrizations.weight_norm(layer), lambda layer: layer.parametrizations.weight.original0.mul_(2)),
        (lambda layer: parametrizations.spectral_norm(layer), lambda layer: None),
        (lambda layer: parametrize.register_parametrization(layer, "weight", Doubled()),
         lambda layer: layer.parametrizations.weight.original.add_(0.5)),
    ],
    ids=["weight_norm-g", "weight_norm-v", "prune-l1", "prune-structured", "spectral_norm", "parametrize-weight_norm",
         "parametrize-spectral", "parametrize-custom"],
)  # fmt: skip
@pytest.mark.parametrize("which", ["conv", "linear"])
def test_weights_recomputed_by_a_hook_are_read_as_the_forward_reads_them(reparametrise, update, which):
    torch.manual_seed(1)
    model = nn.Sequential(
        nn.Conv2d(1, 3, 3), nn.ReLU(), nn.Conv2d(3, 4, 2), nn.Flatten(), nn.Linear(4 * 2 * 2, 3)
    )
    layer = model[0] if which == "conv" else model[4]
    model = model.double()
    reparametrise(layer)
    model.eval()
    dense = exact(model, 5, verify=False)
    x = torch.randn(2, 1, *SIZE[2], dtype=torch.float64)
    with torch.no_grad():
        update(layer)  # the weight the layer's forward computes changes; the dense net must follow
        assert_close_relative(dense(x), densecnn.scan_patches(model, x, 5), REL)


def test_gradients_through_weight_norm_match_the_patch_minibatch():
    torch.manual_seed(2)
    model = nn.Sequential(nn.Conv2d(1, 3, 3), nn.Tanh(), nn.Conv2d(3, 2, 3)).double()
    with pytest.warns(FutureWarning):
        torch.nn.utils.weight_norm(model[0])
    dense = densecnn.convert(model, 5)
    x = torch.randn(1, 1, 8, 8, dtype=torch.float64)
    dense(x).square().sum().backward()
    dense_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()  # the patch minibatch: every pixel's patch, through the model itself
    windows = F.pad(x, (2, 2, 2, 2)).unfold(2, 5, 1).unfold(3, 5, 1)  # (1, 1, 8, 8, 5, 5)
    patches = windows.permute(0, 2, 3, 1, 4, 5).reshape(-1, 1, 5, 5)
    model(patches).square().sum().backward()
    for got, want in zip(dense_grads, (p.grad for p in model.parameters()), strict=True):
        assert_close_relative(got, want, 1e-9)


# --- 5. softmax's implicit dimension ----------------------------------------------------------------------------


class FunctionalSoftmax(nn.Module):
    def __init__(self, dims: int):
        super().__init__()
        self.conv = CONV[dims](1, 3, 3)

    def forward(self, x):
        return F.softmax(self.conv(x))


@pytest.mark.parametrize(
    "model",
    [nn.Sequential(nn.Conv1d(1, 3, 3), nn.Softmax()), nn.Sequential(nn.Conv1d(1, 3, 3), nn.LogSoftmax()),
     FunctionalSoftmax(1)],
    ids=["Softmax", "LogSoftmax", "F.softmax"],
)  # fmt: skip
def test_implicit_softmax_dim_over_a_signal_nets_batch_is_refused(model):
    with pytest.warns(UserWarning, match="Implicit dimension"):
        model(torch.randn(2, 1, 3))  # torch's own warning: it softmaxes over dim 0 of (B, K, 1)
    refused(model, 3, r"without dim, torch applies \w+ over dim 0 .* Pass dim=1")


@pytest.mark.filterwarnings("ignore:Implicit dimension")
@pytest.mark.parametrize(
    ("model", "dims"),
    [(nn.Sequential(nn.Conv2d(1, 3, 3), nn.Softmax()), 2), (nn.Sequential(nn.Conv3d(1, 3, 3), nn.LogSoftmax()), 3),
     (FunctionalSoftmax(2), 2), (nn.Sequential(nn.Conv1d(1, 3, 3), nn.Flatten(), nn.Softmax()), 1)],
    ids=["2-D", "3-D", "F.softmax-2-D", "flat-1-D"],
)  # fmt: skip
def test_implicit_softmax_dim_over_classes_converts_exactly(model, dims):
    exact(model, 3, dims=dims, verify=False)


# --- 6. the verification pass -----------------------------------------------------------------------------------


class SpatialCentring(nn.Module):
    """Subtracts each channel's mean over the map: not pointwise, whatever a rule says."""

    def forward(self, x):
        return x - x.mean(tuple(range(2, x.dim())), keepdim=True)


densecnn.register_rule(SpatialCentring)  # a wrong registration: a pointwise rule for a layer that is not


def test_verification_names_the_layer_a_wrong_rule_was_registered_for():
    model = nn.Sequential(nn.Conv2d(1, 3, 3), SpatialCentring(), nn.Conv2d(3, 2, 3))
    message = refused(model, 5, "verification failed", by_reader=False)
    assert re.search(r"first layer whose output differs is '1' \(SpatialCentring, relative error", message)
    assert densecnn.convert(model, 5, verify=False)  # the off switch: converts, silently wrong


class WideMapCentring(nn.Module):
    """Pointwise on maps up to 8 wide, not on wider ones: a layer whose behaviour depends on the map's size."""

    def forward(self, x):
        return x - x.mean(-1, keepdim=True) if x.shape[-1] > 8 else x


densecnn.register_rule(WideMapCentring)  # a wrong registration that a map a few pixels wide does not show


@pytest.mark.parametrize("dims", [1, 2, 3])
def test_verification_runs_on_a_map_several_patches_wide(dims):
    conv = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}[dims]
    model = nn.Sequential(conv(1, 3, 3), WideMapCentring(), conv(3, 2, 3)).eval()
    message = refused(model, 5, "verification failed", by_reader=False)
    assert "first layer whose output differs is '1' (WideMapCentring" in message


def test_verification_names_where_the_model_computes_what_its_trace_does_not_show():
    class TracesDifferently(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem, self.head = nn.Conv2d(1, 3, 3), nn.Conv2d(3, 2, 3)

        def forward(self, x):
            x = self.stem(x)
            if not torch.fx._symbolic_trace.is_fx_tracing():
                x = x.flip(-1)  # only outside tracing: the chain reader cannot see it
            return self.head(x)

    message = refused(TracesDifferently(), 5, "verification failed", by_reader=False)
    assert "first layer whose output differs is 'head' (Conv2d)" in message


class StridedConv(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 2, stride=2)

    def forward(self, x):
        return self.conv(x)


@densecnn.register_rule(StridedConv)
def _forgets_the_stride(module, ctx):  # a wrong registration: the layer's map is half the size it says
    dense = DenseConv(module.conv, ctx.dilation)
    ctx.slide((2, 2), (1, 1))
    return dense


def test_verification_names_a_rule_that_gives_its_layer_the_wrong_map_size():
    model = nn.Sequential(
        nn.Conv2d(1, 3, 3), StridedConv(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(3, 2)
    )
    message = refused(model.eval(), 12, "verification failed", by_reader=False)
    assert "first layer whose output differs is '1' (StridedConv)" in message
    assert "shape (3, 5, 5), not the size 9x9 its conversion rule (StridedConv) gave it" in message


def test_a_mismatch_where_the_model_itself_overflows_is_reported_as_its_overflow_not_a_layers_fault():
    # which solver spreads an Inf into NaN differs with the threads and the CPU: the decision is tested on its own,
    # a model that overflows on some patches against the dense net of one that does not
    finite = nn.Sequential(nn.Conv2d(1, 2, 3), nn.Flatten()).eval()
    overflowing = nn.Sequential(finite, Scale(torch.tensor([1.0, float("inf")]))).eval()
    dense = densecnn.convert(finite, 3)
    with pytest.raises(
        densecnn.ModelOverflowError, match=r"model's own scores are NaN or ±Inf on \d+ of \d+"
    ) as info:
        verify_conversion(overflowing, dense, layers=[])
    assert "first layer whose output differs" not in str(info.value) and "float32 range" in str(info.value)
    verify_conversion(finite, dense, layers=[])  # agreeing nets pass


class Scale(nn.Module):
    def __init__(self, factor: torch.Tensor):
        super().__init__()
        self.register_buffer("factor", factor)

    def forward(self, x):
        return x * self.factor


def test_verification_leaves_the_random_stream_the_modes_and_the_statistics_as_they_were():
    model = nn.Sequential(nn.Conv2d(1, 3, 3), nn.BatchNorm2d(3), nn.Dropout(0.5), nn.Conv2d(3, 2, 3)).train()
    model[1].running_mean.fill_(0.3)
    state = copy.deepcopy(model.state_dict())
    torch.manual_seed(5)
    expected_draw = torch.rand(3)
    torch.manual_seed(5)
    with pytest.warns(densecnn.DenseEquivalenceWarning):
        densecnn.convert(model, 5)
    assert torch.equal(torch.rand(3), expected_draw)
    assert all(m.training for m in model.modules())
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())


def test_verification_runs_in_the_models_dtype_and_bound():
    for dtype in (torch.float32, torch.bfloat16):
        model = (
            nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(4, 2, 2)).to(dtype).eval()
        )
        dense = densecnn.convert(model, 6)
        assert dense(torch.rand(1, 1, 7, 7, dtype=dtype)).dtype == dtype


def test_load_verifies_once_per_directory(tmp_path, monkeypatch):
    model, patch = densecnn.zoo.tiny(in_channels=1, num_classes=3)
    densecnn.save(model, tmp_path / "m", patch_size=patch)
    calls = []
    convert_module = sys.modules["densecnn.convert"]
    checker = convert_module.verify_conversion
    monkeypatch.setattr(convert_module, "verify_conversion", lambda *a: calls.append(1) or checker(*a))
    densecnn.load(tmp_path / "m")
    densecnn.load(tmp_path / "m").dense()
    assert len(calls) == 1
    densecnn.save(model, tmp_path / "m", patch_size=patch)  # save verifies what it writes...
    densecnn.load(tmp_path / "m")  # ...and load the rewritten directory again
    assert len(calls) == 3


# --- 7. error messages that point at the cause ------------------------------------------------------------------


@pytest.mark.parametrize("patch", ["133", b"12", "12"])
def test_a_patch_size_given_as_a_string_is_refused_as_a_string(patch):
    model, _ = densecnn.zoo.tiny()
    with pytest.raises(densecnn.PatchSizeError, match="got the string"):
        densecnn.convert(model, patch)


def test_an_absurd_patch_size_that_the_layers_accept_is_refused_naming_the_patch_size(tmp_path):
    model = nn.Sequential(
        nn.Conv2d(1, 4, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 2)
    )
    with pytest.raises(
        densecnn.PatchSizeError, match=r"patch_size 1000000000x1000000000 is .* pixels per patch"
    ):
        densecnn.convert(model, 10**9)
    densecnn.save(model, tmp_path / "m", patch_size=12)
    config = tmp_path / "m" / "model.json"
    config.write_text(
        config.read_text().replace('"patch_size": [\n    12,\n    12\n  ]', '"patch_size": [1000000000, 5]')
    )
    with pytest.raises(
        densecnn.ModelFileError, match=r"model.json: patch_size: 1000000000x5 .* pixels per patch"
    ):
        densecnn.load(tmp_path / "m")
    assert math.prod((10**9, 5)) > MAX_PATCH_PIXELS


# --- every idiom at once: exact or refused ----------------------------------------------------------------------

MUTATIONS = {
    "none": lambda layer: None,
    "forward hook": lambda layer: layer.register_forward_hook(lambda module, inputs, output: output * 1.5),
    "pre-hook": lambda layer: layer.register_forward_pre_hook(lambda module, inputs: (inputs[0] + 0.5,)),
    "observing hook": lambda layer: layer.register_forward_hook(lambda module, inputs, output: None),
    "instance forward": lambda layer: setattr(layer, "forward", lambda x, f=layer.forward: f(x) + 0.25),
    "backward hook": lambda layer: layer.register_full_backward_hook(lambda module, gi, go: None),
}


@given(
    order=st.lists(st.integers(0, 3), min_size=0, max_size=5),
    mutation=st.sampled_from(sorted(MUTATIONS)),
    target=st.integers(0, 20),
    dims=st.sampled_from([1, 2, 3]),
)
def test_any_model_with_any_idiom_converts_exactly_or_is_refused(order, mutation, target, dims):
    torch.manual_seed(target)
    pool = [CONV[dims](3, 3, 1), nn.Tanh(), POOL[dims](2), nn.ReLU()]
    model = nn.Sequential(CONV[dims](1, 3, 2), *(pool[i] for i in order), CONV[dims](3, 2, 1)).double().eval()
    MUTATIONS[mutation](list(model.modules())[target % len(list(model.modules()))])
    patch = 2 * 2 ** sum(1 for i in order if i == 2)
    x = torch.randn(1, 1, *(s + 3 for s in SIZE[dims]), dtype=torch.float64)
    try:
        dense = densecnn.convert(model, patch)
    except densecnn.ConversionError:
        assert mutation != "none"
        return
    with torch.no_grad():
        assert_close_relative(dense(x), densecnn.scan_patches(model, x, patch), REL)


def test_a_lazy_layer_not_yet_run_is_refused_and_converts_once_it_has_run():
    model = nn.Sequential(nn.Conv2d(1, 3, 3), nn.Flatten(), nn.LazyLinear(2))
    refused(
        model, 5, r"'2' \(LazyLinear\): is a lazy layer whose parameters do not exist yet. Run the model once"
    )
    model(torch.zeros(1, 1, 5, 5, dtype=torch.float64))
    exact(model, 5)


def test_the_pass_leaves_no_plan_in_the_dense_net():
    dense = densecnn.convert(_net().eval(), 5)
    assert dense._plans == {}
