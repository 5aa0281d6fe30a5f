"""One test per conversion rule and per conversion error."""

import itertools
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import densecnn
from densecnn.geometry import pooled_length
from densecnn.layers import ChannelSoftmax, DenseAvgPool, DenseLinear
from densecnn.rules import aliases
from tests.naive import literal_scan
from tests.tolerances import assert_close_relative, assert_equal_to_rounding

torch.manual_seed(0)


def _matches_scan(model, patch, *, size=(9, 11), mode="zeros", rel=1e-10, in_channels=None):
    if in_channels is None:
        in_channels = next(m for m in model.modules() if isinstance(m, nn.Conv2d)).in_channels
    patch_hw = (patch, patch) if isinstance(patch, int) else patch
    if any(isinstance(m, nn.modules.lazy.LazyModuleMixin) for m in model.modules()):
        model.eval()(torch.zeros(1, in_channels, *patch_hw))  # materialises LazyLinear heads
    model = model.double().eval()
    x = torch.randn(2, in_channels, *size, dtype=torch.float64)
    dense = densecnn.convert(model, patch, padding_mode=mode)
    with torch.no_grad():
        assert_close_relative(dense(x), densecnn.scan_patches(model, x, patch, padding_mode=mode), rel)
    return dense


# --- rules ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "conv",
    [
        nn.Conv2d(2, 3, 3),
        nn.Conv2d(2, 3, (2, 4), stride=(2, 1)),
        nn.Conv2d(2, 4, 3, stride=3, dilation=2),
        nn.Conv2d(2, 4, 2, groups=2, bias=False),
        nn.Conv2d(2, 3, 3, padding="valid"),
    ],
    ids=["plain", "rect-stride", "stride3-dilation2", "groups-nobias", "valid"],
)
def test_conv2d_rule(conv):
    model = nn.Sequential(
        conv, nn.Tanh(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(conv.out_channels, 2)
    )
    _matches_scan(model, 9)


@pytest.mark.parametrize("pool", [nn.MaxPool2d(3, 2), nn.MaxPool2d(2, 3), nn.MaxPool2d(2, 2, dilation=2)])
def test_max_pool_rule_overlapping_and_dilated(pool):
    _matches_scan(
        nn.Sequential(nn.Conv2d(1, 2, 2), pool, nn.Conv2d(2, 2, 1), nn.Flatten(), nn.LazyLinear(2)), 8
    )


@pytest.mark.parametrize(
    "pool", [nn.AvgPool2d(3, 2), nn.AvgPool2d(2, 3), nn.AvgPool2d(2, 2, divisor_override=3)]
)
def test_avg_pool_rule(pool):
    model = nn.Sequential(nn.Conv2d(1, 2, 2), nn.MaxPool2d(2, 2), pool, nn.Flatten(), nn.LazyLinear(2))
    _matches_scan(model, 12)


@pytest.mark.parametrize(
    ("pool", "patch"),
    [
        # the 8x8 map in 4x4 whole windows
        (nn.MaxPool2d(2, ceil_mode=True), 10),
        (nn.AvgPool2d(2, ceil_mode=True), 10),
        (nn.AvgPool2d(2, ceil_mode=True, count_include_pad=False), 10),
        # the 9x9 map in 2x2 windows of 5 taps
        (nn.MaxPool2d(3, 2, dilation=2, ceil_mode=True), 11),
    ],
    ids=["max", "avg", "avg-count-exclude-pad", "max-dilated"],
)
def test_a_ceil_mode_pool_whose_windows_tile_the_patch_map_converts(pool, patch):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 2, 3), pool, nn.Conv2d(2, 2, 1), nn.Flatten(), nn.LazyLinear(2))
    # materialises the LazyLinear head
    model(torch.zeros(1, 1, patch, patch))
    model = model.double().eval()
    x = torch.randn(2, 1, 7, 9, dtype=torch.float64)
    assert_equal_to_rounding(densecnn.convert(model, patch)(x), literal_scan(model, x, (patch, patch)))


def test_a_ceil_mode_pool_whose_partial_window_would_start_past_the_map_converts():
    """torch drops a last window that would start at or past the map's end: on a 6x6 map, windows of 2 moved by 3
    are two with ceil_mode=True as with ceil_mode=False (the last row is read by neither)."""
    torch.manual_seed(0)
    pool = nn.MaxPool2d(2, 3, ceil_mode=True)
    model = nn.Sequential(nn.Conv2d(1, 2, 3), pool, nn.Flatten(), nn.LazyLinear(2))
    model(torch.zeros(1, 1, 8, 8))
    model = model.double().eval()
    x = torch.randn(1, 1, 6, 7, dtype=torch.float64)
    with pytest.warns(densecnn.PatchSizeWarning, match="last 1 row"):
        dense = densecnn.convert(model, 8)
    assert_equal_to_rounding(dense(x), literal_scan(model, x, (8, 8)))


@pytest.mark.parametrize(
    ("pool", "patch", "message"),
    [
        (nn.MaxPool2d(2, ceil_mode=True), 11, r"9x9 map .* \(5x5 outputs, 4x4 with .* \(8x8 or 10x10\)"),
        (nn.AvgPool2d(2, ceil_mode=True), (11, 10), r"9x8 map .* \(5x4 outputs, 4x4 with .* \(8x8 or 10x8\)"),
        (nn.MaxPool2d(2, 3, ceil_mode=True), 9, r"7x7 map .* \(3x3 outputs, 2x2 with .* \(5x5 or 8x8\)"),
    ],
    ids=["max", "avg", "max-stride-3"],
)
def test_a_ceil_mode_pool_with_a_partial_window_on_the_patch_map_is_refused(pool, patch, message):
    model = nn.Sequential(nn.Conv2d(1, 2, 3), pool, nn.AdaptiveAvgPool2d(1), nn.Conv2d(2, 2, 1))
    layer = rf"'1' \({type(pool).__name__}\)"
    with pytest.raises(
        densecnn.ConversionError, match=rf"{layer}: ceil_mode=True pools a partial .*{message}$"
    ):
        densecnn.convert(model, patch)


def test_a_ceil_mode_window_larger_than_the_map_names_ceil_mode_and_the_sizes_that_fit():
    """torch pools one partial window where the window is larger than the map: the patch size is refused for it."""
    model = nn.Sequential(nn.Conv1d(1, 3, 2), nn.ReLU(), nn.MaxPool1d(3, 3, ceil_mode=True), nn.Flatten(),
                          nn.Linear(3, 2)).eval()  # fmt: skip
    assert model(torch.zeros(1, 1, 3)).shape == (1, 2)  # torch runs it on 3-sample patches
    with pytest.raises(
        densecnn.PatchSizeError,
        match=r"'2' \(MaxPool1d\): its 3 window does not fit the 2 map .* ceil_mode=True lets torch pool a partial "
        r"window there.*Nearest valid patch sizes: 4",
    ):
        densecnn.convert(model, 3)


def test_pooled_lengths_are_torchs():
    for length, kernel, stride, dilation, ceil_mode in itertools.product(
        range(1, 14), range(1, 4), range(1, 4), range(1, 3), (False, True)
    ):
        extent = (kernel - 1) * dilation + 1
        if extent <= length:
            pooled = F.max_pool1d(torch.zeros(1, 1, length), kernel, stride, 0, dilation, ceil_mode)
            assert pooled_length(length, extent, stride, ceil_mode=ceil_mode) == pooled.shape[-1]


def test_dilated_avg_pool_is_the_mean_of_its_dilated_taps():
    x = torch.arange(36.0, dtype=torch.float64).view(1, 1, 6, 6)
    out = DenseAvgPool((2, 2), (2, 2), (2, 2))(x)
    assert out.shape == (1, 1, 4, 4)
    assert out[0, 0, 0, 0] == (x[0, 0, 0, 0] + x[0, 0, 0, 2] + x[0, 0, 2, 0] + x[0, 0, 2, 2]) / 4


@pytest.mark.parametrize(
    "pool", [nn.AdaptiveAvgPool2d(2), nn.AdaptiveMaxPool2d((1, 2)), nn.AdaptiveAvgPool2d((None, 4))]
)
def test_adaptive_pool_rule(pool):
    model = nn.Sequential(nn.Conv2d(1, 2, 3), pool, nn.Flatten(), nn.LazyLinear(2))
    _matches_scan(model, 10)  # map 8x8 at the pool


def test_linear_stack_and_batchnorm1d():
    bn = nn.BatchNorm1d(5)
    bn.running_mean.uniform_(-1, 1)
    bn.running_var.uniform_(0.5, 2)
    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.Flatten(), nn.Linear(2 * 4 * 4, 5), bn, nn.ReLU(), nn.Dropout(0.3),
                          nn.Linear(5, 4), nn.Identity(), nn.Linear(4, 3))  # fmt: skip
    _matches_scan(model, 6)


def test_batchnorm2d_and_dropout2d_in_eval_mode():
    bn = nn.BatchNorm2d(3)
    bn.running_mean.uniform_(-1, 1)
    bn.running_var.uniform_(0.5, 2)
    bn.weight.data.uniform_(0.5, 1.5)
    model = nn.Sequential(nn.Conv2d(2, 3, 3), bn, nn.Dropout2d(), nn.ReLU(), nn.Conv2d(3, 2, 3))
    _matches_scan(model, 5)


@pytest.mark.parametrize(
    "activation",
    [nn.ReLU(), nn.ReLU6(), nn.LeakyReLU(0.2), nn.PReLU(3), nn.ELU(), nn.SELU(), nn.CELU(), nn.GELU(), nn.SiLU(),
     nn.Mish(), nn.Tanh(), nn.Sigmoid(), nn.Hardtanh(-0.5, 0.5), nn.Hardswish(), nn.Hardsigmoid(), nn.Softplus(2),
     nn.Softsign(), nn.Tanhshrink(), nn.LogSigmoid(), nn.Softshrink(0.1), nn.Hardshrink(0.1), nn.Threshold(0.1, -1)],
    ids=lambda m: type(m).__name__,
)  # fmt: skip
def test_pointwise_rules(activation):
    _matches_scan(nn.Sequential(nn.Conv2d(1, 3, 3), activation, nn.Conv2d(3, 2, 2)), 4)


@pytest.mark.parametrize("last", [nn.Softmax(dim=1), nn.LogSoftmax(dim=-1)])
def test_channel_softmax_at_the_end(last):
    model = nn.Sequential(nn.Conv2d(1, 3, 3), nn.Flatten(), nn.Linear(3 * 2 * 2, 4), last)
    _matches_scan(model, 4)


def test_fx_traced_module_with_functional_ops():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(2, 4, 3)
            self.conv2 = nn.Conv2d(4, 4, 2)
            self.fc = nn.Linear(4 * 2 * 2, 3)

        def forward(self, x):
            x = F.max_pool2d(F.relu(self.conv1(x)), 2)
            x = torch.tanh(self.conv2(x))
            x = x.view(x.size(0), -1)
            return F.log_softmax(self.fc(x), dim=1)

    _matches_scan(Net(), 9)


def test_fx_traced_module_with_torch_flatten_and_nested_sequential():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.features = nn.Sequential(nn.Conv2d(1, 3, 3), nn.Sequential(nn.AvgPool2d(2), nn.SiLU()))
            self.head = nn.Linear(12, 2)

        def forward(self, x):
            return self.head(torch.flatten(self.features(x), 1))

    dense = _matches_scan(Net(), 6)
    assert isinstance(dense.features[-1], DenseLinear)


class _FunctionalDropoutNet(nn.Module):
    """PyTorch's MNIST example idiom: functional dropout following self.training, flattened by reshape."""

    def __init__(self, training_argument=True):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3)
        self.fc = nn.Linear(4 * 2 * 2, 3)
        self.training_argument = training_argument

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv(x)), 2)
        # without training=, F.dropout drops whatever the model's mode: random in eval mode too
        x = F.dropout(x, 0.5, training=self.training) if self.training_argument else F.dropout(x, 0.5)
        x = x.reshape(x.shape[0], -1)
        return F.log_softmax(self.fc(x), dim=1)


def test_functional_dropout_follows_the_model_mode_and_the_dense_nets():
    torch.manual_seed(0)
    model = _FunctionalDropoutNet().double().eval()
    dense = _matches_scan(model, 6)  # deterministic and exact in eval mode
    x = torch.rand(1, 1, 12, 12, dtype=torch.float64)
    dense.train()
    with pytest.warns(densecnn.DenseEquivalenceWarning):
        assert not torch.equal(dense(x), dense(x))  # the dense net's own .train() turns dropout on
    dense.eval()
    assert torch.equal(dense(x), dense(x))
    with pytest.warns(densecnn.DenseEquivalenceWarning, match="training mode"):
        trained = densecnn.convert(model.train(), 6)  # converted in training mode: drops until .eval()
    assert trained.features[3].training and not trained.eval().features[3].training


@pytest.mark.parametrize("method", ["dense", "region", "patches"])
def test_a_masked_loss_in_training_mode_warns_as_a_forward_does(method):
    # batch statistics of the whole image, of a region or of the patches: each method's gradient differs
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 2, 3)).double()
    dense = densecnn.convert(model.eval(), 5)
    x, labels = torch.rand(2, 1, 12, 12, dtype=torch.float64), torch.randint(0, 2, (2, 12, 12))
    mask = torch.zeros(2, 12, 12, dtype=torch.bool)
    mask[0, 3, 3] = mask[1, 7, 8] = True
    model.train()
    with pytest.warns(densecnn.DenseEquivalenceWarning, match="training mode"):
        dense.masked_loss(x, labels, mask, method=method)


def test_functional_dropout_that_ignores_the_mode_is_refused():
    with pytest.raises(
        densecnn.ConversionError, match="training=True while the model is in eval mode.*self.training"
    ):
        densecnn.convert(_FunctionalDropoutNet(training_argument=False).eval(), 6)


@pytest.mark.parametrize(
    "flatten",
    [
        lambda x: x.reshape(x.shape[0], -1),
        lambda x: x.view(x.size(0), -1),
        lambda x: x.view(x.size()[0], -1),
        lambda x: x.flatten(1),
        lambda x: torch.flatten(x, 1),
        lambda x: torch.reshape(x, (x.shape[0], -1)),
        lambda x: x.view(-1, 3 * 2 * 2),
        lambda x: x.contiguous().view(-1, 12),
    ],
    ids=["reshape-shape0", "view-size0", "view-size()0", "flatten-method", "torch-flatten", "torch-reshape",
         "view-minus1-n", "contiguous-view"],
)  # fmt: skip
def test_flatten_idioms(flatten):
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(2, 3, 3)
            self.fc = nn.Linear(12, 2)

        def forward(self, x):
            return self.fc(flatten(torch.tanh(self.conv(x))))

    dense = _matches_scan(Net(), 4)
    assert isinstance(dense.features[-1], DenseLinear)


def test_flatten_idioms_that_are_not_per_patch_flattening_are_refused():
    class Net(nn.Module):
        def __init__(self, flatten):
            super().__init__()
            self.conv, self.flatten = nn.Conv2d(2, 3, 3), flatten

        def forward(self, x):
            return self.flatten(self.conv(x))

    with pytest.raises(densecnn.ConversionError, match="start_dim=0"):
        densecnn.convert(Net(lambda x: torch.flatten(x)), 3)
    with pytest.raises(densecnn.ConversionError, match=r"view\(-1, 1\) splits each patch"):
        densecnn.convert(Net(lambda x: x.view(-1, 1)), 3)  # a 3x1x1 map: 3 rows per patch
    with pytest.raises(densecnn.ConversionError, match="not a supported layer"):
        densecnn.convert(Net(lambda x: x.view(x.size(0), 3, -1)), 3)


def test_mlp_on_flattened_patches():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(5 * 5 * 3, 7), nn.ReLU(), nn.Linear(7, 4))
    dense = _matches_scan(model, 5, in_channels=3)
    assert (dense.in_channels, dense.num_classes, dense.receptive_field) == (3, 4, (5, 5))
    with pytest.raises(
        densecnn.PatchSizeError, match=r"expects 75 input features.*Nearest valid patch sizes: 5$"
    ):
        densecnn.convert(model, 6)
    with pytest.raises(
        densecnn.PatchSizeError, match=r"not a multiple of 16.*sizes: 1 and 5$"
    ):  # 1x1, 75 channels
        densecnn.convert(model, 4)


@pytest.mark.parametrize("last", [nn.Softmax(), nn.LogSoftmax()], ids=["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("flat", [True, False])
def test_softmax_without_dim_is_over_the_classes(last, flat):
    head = [nn.Flatten(), nn.Linear(3 * 2 * 2, 4)] if flat else [nn.Conv2d(3, 4, 2)]
    with pytest.warns(UserWarning, match="Implicit dimension"):  # torch's own warning, from patch scanning
        _matches_scan(nn.Sequential(nn.Conv2d(1, 3, 3), *head, last), 4)


def test_numpy_patch_sizes():
    np = pytest.importorskip("numpy")
    model, _ = densecnn.zoo.tiny(in_channels=1, num_classes=3)
    for patch in (np.int64(12), (np.int32(12), np.int64(12)), np.array([12, 12])[0]):
        dense = densecnn.convert(model.eval(), patch)
        assert dense.patch_size == (12, 12) and all(type(p) is int for p in dense.patch_size)


def test_linear_on_an_unflattened_map_is_refused():
    with pytest.raises(
        densecnn.ConversionError, match=r"'1' \(Linear\): Linear applied to a \(B, C, h, w\) map"
    ):
        densecnn.convert(nn.Sequential(nn.Conv2d(1, 4, 5), nn.Linear(4, 3)), 5)


def test_a_larger_patch_size_that_still_converts_warns_naming_the_smallest():
    model, _ = densecnn.zoo.plain_133()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        densecnn.convert(model.eval(), 133)  # the size it was built for: no warning
    with pytest.warns(
        densecnn.PatchSizeWarning, match=r"last 7 row\(s\) and 7 column.*trained with patch_size=133"
    ):
        densecnn.convert(model, 140)
    tiny, _ = densecnn.zoo.tiny()
    with pytest.warns(densecnn.PatchSizeWarning, match=r"patch_size=\(12, 12\)"):
        densecnn.convert(tiny, (12, 15))


_FUNCTIONAL = [
    pytest.param(record.layer_type, alias, id=f"{record.name}-{getattr(alias.target, '__name__', alias.target)}")
    for table in aliases()
    for record, alias in table.values()
    if alias.build is None and record.layer_type not in (nn.Flatten, nn.MaxPool2d, nn.AvgPool2d)
    and not record.layer_type.__name__.startswith("Adaptive")
    and record.dims in (None, 2)  # this net is 2-D; signal and volume aliases: tests/core/test_volumes.py
]  # fmt: skip


_FUNCTIONAL_ARGS = {nn.Threshold: (0.1, -1.0), nn.Softmax: (1,), nn.LogSoftmax: (1,)}  # required arguments


@pytest.mark.parametrize(("layer_type", "alias"), _FUNCTIONAL)
def test_every_functional_alias_converts_like_its_layer(layer_type, alias):
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1, self.conv2 = nn.Conv2d(1, 3, 3), nn.Conv2d(3, 2, 2)

        def forward(self, x):
            x = self.conv2(self.conv1(x))
            args = _FUNCTIONAL_ARGS.get(layer_type, ())
            extra = {"training": self.training} if "training" in alias.params else {}
            if isinstance(alias.target, str):
                return getattr(x, alias.target)(*args, **extra)
            return alias.target(x, *args, **extra)

    torch.manual_seed(0)
    dense = _matches_scan(Net(), 4)
    expected = {nn.Identity: [], nn.Softmax: [ChannelSoftmax], nn.LogSoftmax: [ChannelSoftmax]}.get(
        layer_type
    )
    assert [type(layer) for layer in dense.features][2:] == (
        expected if expected is not None else [layer_type]
    )


def test_register_rule_for_a_custom_layer():
    class Square(nn.Module):
        def forward(self, x):
            return x * x

    @densecnn.register_rule(Square)
    def _(module, ctx):
        return module

    _matches_scan(nn.Sequential(nn.Conv2d(1, 2, 3), Square(), nn.Conv2d(2, 2, 3)), 5)


def test_even_patch_and_receptive_field_smaller_than_patch():
    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.MaxPool2d(2), nn.Conv2d(2, 2, 2))  # 7 -> 5 -> 2 -> 1, R = 6
    dense = _matches_scan(model, 7, size=(5, 4), mode="reflect")
    assert dense.receptive_field == (6, 6)
    _matches_scan(model, (6, 7), size=(3, 8), mode="replicate")


# --- the contract of the dense net -----------------------------------------------------------------------


def test_parameters_are_shared_and_model_not_mutated():
    model, patch = densecnn.zoo.tiny(in_channels=1, num_classes=3)
    model.train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    dense = densecnn.convert(model, patch)
    assert model.training and all(m.training for m in model.modules())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    model_params = {id(p) for p in model.parameters()}
    assert {id(p) for p in dense.parameters()} == model_params
    dense(torch.rand(1, 1, 8, 8)).sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


def test_gradients_through_dense_net_equal_summed_patch_gradients():
    torch.manual_seed(3)
    model, patch = densecnn.zoo.tiny(in_channels=1, num_classes=2)
    model = model.double().eval()
    x = torch.rand(1, 1, 5, 6, dtype=torch.float64)
    densecnn.convert(model, patch)(x).sum().backward()
    dense_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    patches = (
        densecnn.padding.pad_for_patches(x, (patch, patch), "zeros").unfold(2, patch, 1).unfold(3, patch, 1)
    )
    model(patches.permute(0, 2, 3, 1, 4, 5).reshape(-1, 1, patch, patch)).sum().backward()
    for dense_grad, p in zip(dense_grads, model.parameters()):
        assert_close_relative(dense_grad, p.grad, 1e-10)


def test_attributes_predict_and_repr():
    model, patch = densecnn.zoo.plain_133(in_channels=3, num_classes=5)
    dense = densecnn.convert(model.eval(), patch)
    assert (dense.patch_size, dense.receptive_field) == ((133, 133), (133, 133))
    assert (dense.in_channels, dense.num_classes, dense.padding_mode) == (3, 5, "zeros")
    labels = dense.predict(torch.rand(2, 3, 7, 9))
    assert labels.shape == (2, 7, 9) and labels.dtype == torch.int64
    text = repr(dense)
    assert "kernel=(8, 8), dilation=(1, 1)" in text and "kernel=(7, 7), dilation=(16, 16)" in text


def test_training_mode_warns():
    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.Conv2d(2, 2, 3))
    with pytest.warns(densecnn.DenseEquivalenceWarning, match="eval"):
        dense = densecnn.convert(model, 5)
    with pytest.warns(densecnn.DenseEquivalenceWarning, match="training mode"):
        dense(torch.rand(2, 1, 6, 6))
    model.eval()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dense(torch.rand(2, 1, 6, 6))


# --- errors --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("layer", "message"),
    [
        (nn.Conv2d(2, 2, 3, padding=1), r"'1' \(Conv2d\): padding=\(1, 1\).*padding=0"),
        (nn.MaxPool2d(3, ceil_mode=True), r"'1' \(MaxPool2d\): ceil_mode=True.*8x8 map.*ceil_mode=False"),
        (nn.AvgPool2d(2, padding=1), r"'1' \(AvgPool2d\): padding=1"),
        (nn.MaxPool2d(2, return_indices=True), r"return_indices"),
        (nn.Upsample(scale_factor=2), r"'1' \(Upsample\): has no conversion rule.*register_rule"),
        (nn.AdaptiveAvgPool2d(3), r"output_size=\(3, 3\) does not divide the 8x8 map"),
    ],
    ids=["conv-padding", "ceil-mode", "pool-padding", "return-indices", "unsupported", "adaptive-uneven"],
)
def test_conversion_errors_name_layer_reason_and_fix(layer, message):
    model = nn.Sequential(nn.Conv2d(1, 2, 3), layer, nn.AdaptiveAvgPool2d(1), nn.Conv2d(2, 2, 1))
    with pytest.raises(densecnn.ConversionError, match=message):
        densecnn.convert(model, 10)


def test_same_padding_of_a_kernel_without_reach_pads_nothing_and_converts():
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Conv2d(4, 2, 1, padding="same"), nn.Flatten()
    ).eval()
    x = torch.rand(1, 1, 9, 8, dtype=torch.float64)
    dense = densecnn.convert(model.double(), 3)
    assert_equal_to_rounding(dense(x), literal_scan(model, x, (3, 3)))
    with pytest.raises(densecnn.ConversionError, match="padding=same"):
        densecnn.convert(nn.Sequential(nn.Conv2d(1, 2, 3, padding="same"), nn.Flatten()), 3)


def test_wrong_patch_size_names_the_nearest_valid_sizes():
    model, _ = densecnn.zoo.plain_133()
    with pytest.raises(densecnn.ConversionError, match=r"'6' \(Conv2d\).*Nearest valid patch sizes: 133$"):
        densecnn.convert(model, 100)
    with pytest.raises(
        densecnn.PatchSizeError,
        match=r"leaves a 2x2 output map.*Nearest valid patch sizes: 133 to 148 \(one net; most likely trained with 133\)$",
    ):
        densecnn.convert(model, 149)  # 133..148 all bring the net to one output: pooling floors
    tiny, _ = densecnn.zoo.tiny()
    with pytest.raises(
        densecnn.ConversionError, match=r"'7' \(Linear\): expects 24 input features.*sizes: 12 to 15"
    ):
        densecnn.convert(tiny, 16)
    with pytest.raises(
        densecnn.PatchSizeError, match=r"heights \(width 20\): 8 to 11.*widths \(height 12\): 12 to"
    ):
        densecnn.convert(tiny, (12, 20))


def test_misplaced_layers_are_rejected():
    with pytest.raises(densecnn.ConversionError, match="BatchNorm2d before the Flatten"):
        densecnn.convert(
            nn.Sequential(nn.Conv2d(1, 2, 2), nn.Flatten(), nn.BatchNorm1d(8), nn.Linear(8, 2)), 3
        )
    with pytest.raises(densecnn.ConversionError, match="Flatten the map first"):
        densecnn.convert(nn.Sequential(nn.Conv2d(1, 2, 2), nn.Linear(2, 2)), 3)
    with pytest.raises(densecnn.ConversionError, match="dim=2 is not the class axis"):
        densecnn.convert(nn.Sequential(nn.Conv2d(1, 2, 3), nn.Softmax(dim=2)), 3)
    with pytest.raises(densecnn.ConversionError, match="start_dim=1"):
        densecnn.convert(nn.Sequential(nn.Conv2d(1, 2, 3), nn.Flatten(0)), 3)


def test_branching_model_is_rejected():
    class Residual(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(2, 2, 1)

        def forward(self, x):
            return x + self.conv(x)

    with pytest.raises(densecnn.ConversionError, match="single chains"):
        densecnn.convert(Residual(), 1)


class _BareInPlaceRelu(nn.Module):
    """F.relu(y, inplace=True) with its result unused: the next conv reads y, changed in place."""

    def __init__(self):
        super().__init__()
        self.first, self.second = nn.Conv2d(1, 4, 3), nn.Conv2d(4, 2, 3)

    def forward(self, x):
        y = self.first(x)
        F.relu(y, inplace=True)
        return self.second(y).flatten(1)


def test_an_in_place_op_whose_result_is_unused_is_refused_naming_it():
    with pytest.raises(
        densecnn.ConversionError, match=r"'relu' .* changes its input in place and 'second' reads"
    ):
        densecnn.convert(_BareInPlaceRelu().eval(), 5)


def test_bad_arguments_and_inputs():
    model, patch = densecnn.zoo.tiny(in_channels=1, num_classes=3)
    with pytest.raises(ValueError, match="patch_size"):
        densecnn.convert(model, 0)
    with pytest.raises(ValueError, match="padding_mode"):
        densecnn.convert(model, patch, padding_mode="circular")
    with pytest.raises(ValueError, match="backend"):
        densecnn.convert(model, patch, backend="cuda")
    dense = densecnn.convert(model.eval(), patch)
    with pytest.raises(ValueError, match=r"\(N, C, H, W\)"):
        dense(torch.rand(1, 8, 8))
    with pytest.raises(ValueError, match="1 input channels, the images have 3"):
        dense(torch.rand(1, 3, 8, 8))
    with pytest.raises(TypeError, match="float"):
        dense(torch.zeros(1, 1, 8, 8, dtype=torch.uint8))


def test_a_one_tap_axis_has_dilation_one():
    """A 1x1 conv after a pool runs undilated (torch's dilated path is far slower), with the same scores."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.MaxPool2d(2), nn.Conv2d(4, 3, (1, 2))).double().eval()
    dense = densecnn.convert(model, (4, 6))
    head = dense.features[-1]
    assert head.kernel == (1, 2) and head.dilation == (1, 2)
    x = torch.rand(1, 1, 9, 11, dtype=torch.float64)
    with torch.no_grad():
        assert_close_relative(dense(x), densecnn.scan_patches(model, x, (4, 6)), 1e-10)


@pytest.mark.parametrize(
    "pool",
    [nn.MaxPool2d(2, stride=()), nn.AvgPool2d(2, stride=[]), nn.MaxPool2d(2, stride=None)],
    ids=["max-()", "avg-[]", "max-None"],
)
def test_an_empty_pool_stride_is_the_kernel_size_as_torch_reads_it(pool):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 3), pool, nn.Conv2d(4, 2, 2)).double().eval()
    x = torch.randn(1, 1, 9, 8, dtype=torch.float64)
    assert_equal_to_rounding(densecnn.convert(model, 6)(x), literal_scan(model, x, (6, 6)))
