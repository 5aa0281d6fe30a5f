"""Property: for random patch nets, the dense net equals patch-by-patch scanning at every pixel."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import densecnn
from tests.tolerances import assert_close_relative

# random patch sizes are often larger than the smallest of their class (pooling floors): that is intended here
pytestmark = pytest.mark.filterwarnings("ignore::densecnn.PatchSizeWarning")

ACTIVATIONS = [nn.ReLU, nn.Tanh, nn.Sigmoid, nn.ELU, nn.GELU, lambda: nn.LeakyReLU(0.1), nn.Identity]
FLATTENS = [
    lambda x: x.reshape(x.shape[0], -1),
    lambda x: x.view(x.size(0), -1),
    lambda x: x.flatten(1),
    lambda x: torch.flatten(x, 1),
]
LAST = [None, None, lambda: nn.Softmax(dim=1), nn.LogSoftmax]  # nn.LogSoftmax(): dim=None, over the classes


class FunctionalNet(nn.Module):
    """The same layers as a module that torch.fx traces, each Flatten written as a tensor idiom."""

    def __init__(self, layers: list[nn.Module], flatten: int):
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.flatten = flatten

    def __getitem__(self, index: int) -> nn.Module:
        return self.layers[index]

    def forward(self, x):
        for layer in self.layers:
            x = FLATTENS[self.flatten](x) if isinstance(layer, nn.Flatten) else layer(x)
        return x


@st.composite
def patch_nets(draw):
    """(model, patch_size): 0-4 conv/pool stages then a conv, FC or global-pool head reaching one output (no stage
    and an FC head: an MLP on raw patches), maybe a softmax, as an nn.Sequential or a module traced by torch.fx.

    ``model.in_channels`` is the patch channels.
    """
    torch.manual_seed(draw(st.integers(0, 2**31 - 1), label="weights seed"))  # reproducible weights
    in_channels = draw(st.integers(1, 4))
    height = draw(st.integers(4, 26))
    width = height if draw(st.booleans()) else draw(st.integers(4, 26))
    size, channels, layers = [height, width], in_channels, []
    mlp = draw(st.integers(0, 9), label="mlp") == 0

    def window(max_kernel=7):
        kernel = draw(st.integers(1, max(1, min(max_kernel, *size))))
        dilation = draw(st.sampled_from([1, 1, 2])) if (kernel - 1) * 2 + 1 <= min(size) else 1
        stride = draw(st.integers(1, 3))
        for axis in (0, 1):
            size[axis] = (size[axis] - (kernel - 1) * dilation - 1) // stride + 1
        return kernel, stride, dilation

    for _ in range(0 if mlp else draw(st.integers(1, 4))):
        if min(size) < 1:
            break
        out_channels = draw(st.integers(1, 5))
        groups = draw(st.sampled_from([g for g in (1, 2) if channels % g == 0 and out_channels % g == 0]))
        kernel, stride, dilation = window()
        layers.append(nn.Conv2d(channels, out_channels, kernel, stride, dilation=dilation, groups=groups,
                                bias=draw(st.booleans())))  # fmt: skip
        channels = out_channels
        if draw(st.booleans()) and min(size) >= 1:
            pool_type = draw(st.sampled_from([nn.MaxPool2d, nn.AvgPool2d]))
            kernel = draw(st.integers(1, min(3, *size)))
            stride = draw(st.integers(1, 3))
            layers.append(pool_type(kernel, stride))
            size = [(n - kernel) // stride + 1 for n in size]
        layers.append(draw(st.sampled_from(ACTIVATIONS))())
    classes = draw(st.integers(1, 4))
    head = "fc" if mlp else draw(st.sampled_from(["conv", "fc", "global"]))
    if head == "conv":
        layers.append(nn.Conv2d(channels, classes, tuple(size)))
    elif head == "fc":
        hidden = draw(st.integers(1, 6))
        layers += [
            nn.Flatten(),
            nn.Linear(channels * size[0] * size[1], hidden),
            nn.Tanh(),
            nn.Linear(hidden, classes),
        ]
    else:
        pool = draw(st.sampled_from([nn.AdaptiveAvgPool2d, nn.AdaptiveMaxPool2d]))
        layers += [pool(1), nn.Flatten(), nn.Linear(channels, classes)]
    last = draw(st.sampled_from(LAST), label="softmax")
    layers += [last()] if last else []
    traced = draw(st.booleans(), label="traced")
    model = (
        FunctionalNet(layers, draw(st.integers(0, len(FLATTENS) - 1))) if traced else nn.Sequential(*layers)
    )
    model.in_channels = in_channels
    return model.eval(), (height, width)


def _valid(net):
    model, patch = net
    try:
        densecnn.convert(model, patch)
    except densecnn.ConversionError:
        return False
    return True


def _image(data, shape, dtype) -> torch.Tensor:
    seed = data.draw(st.integers(0, 2**31 - 1), label="image seed")
    return torch.randn(shape, dtype=dtype, generator=torch.Generator().manual_seed(seed))


def _check(net, data, dtype, rel, floor=0.0):
    model, patch = net
    model = model.to(dtype)
    n = data.draw(st.integers(1, 2), label="batch")
    height = data.draw(st.integers(1, patch[0] + 6), label="height")
    width = data.draw(st.integers(1, patch[1] + 6), label="width")
    mode = data.draw(st.sampled_from(["zeros", "reflect", "replicate"]), label="padding_mode")
    x = _image(data, (n, model.in_channels, height, width), dtype)
    expected = densecnn.scan_patches(model, x, patch, padding_mode=mode)
    dense = densecnn.convert(model, patch, padding_mode=mode, backend="native")
    with torch.no_grad():
        assert_close_relative(dense(x), expected, rel, floor)


@settings(max_examples=300)
@given(net=patch_nets().filter(_valid), data=st.data())
def test_dense_equals_patch_scanning_float64(net, data):
    _check(net, data, torch.float64, 1e-10)


@settings(max_examples=100)
@given(net=patch_nets().filter(_valid), data=st.data())
def test_dense_equals_patch_scanning_float32(net, data):
    _check(net, data, torch.float32, 1e-5, floor=1.0)


@settings(max_examples=100)
@given(net=patch_nets().filter(_valid), data=st.data())
def test_fast_scan_equals_patch_scanning(net, data):
    model, patch = net
    model = model.double()
    height, width = (
        data.draw(st.integers(1, 20), label="height"),
        data.draw(st.integers(1, 20), label="width"),
    )
    x = _image(data, (1, model.in_channels, height, width), torch.float64)
    expected = densecnn.scan_patches(model, x, patch)
    assert_close_relative(densecnn.fast_scan(model, x, patch), expected, 1e-10)
