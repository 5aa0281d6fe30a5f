"""The structure check: a patch model whose layers, hyper-parameters or forward-read attributes changed after conversion
is refused at the next call of its dense net; changes of parameter values (and the mode) are followed."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import densecnn
from densecnn.errors import ModelChangedError
from tests.naive import literal_scan
from tests.tolerances import assert_equal_to_rounding


def _model():
    torch.manual_seed(0)
    layers = [nn.Conv2d(1, 3, 3), nn.MaxPool2d(2), nn.ReLU(), nn.Conv2d(3, 4, 2, stride=2), nn.Flatten()]
    return nn.Sequential(*layers, nn.Linear(4, 2)).double().eval(), 6


class Toggled(nn.Module):
    """A traced model whose forward reads Python attributes."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 2, 3)
        self.head = nn.Conv2d(2, 2, 3)
        self.use_relu = True
        self.scale = 1.0

    def forward(self, x):
        x = self.conv(x)
        if self.use_relu:
            x = torch.relu(x)
        return self.head(x).flatten(1)


def _change(model: nn.Module, what: str) -> None:
    if what == "layer replaced":
        model[2] = nn.Tanh()
    elif what == "layer appended":
        model.append(nn.Softmax(1))
    elif what == "conv stride":
        model[3].stride = (1, 1)
    elif what == "conv kernel_size":
        model[0].kernel_size = (2, 2)
    elif what == "conv dilation":
        model[0].dilation = (2, 2)
    elif what == "conv padding":
        model[0].padding = (1, 1)
    elif what == "pool kernel_size":
        model[1].kernel_size = 3
    elif what == "pool stride":
        model[1].stride = 1
    elif what == "pool ceil_mode":
        model[1].ceil_mode = True
    elif what == "flatten start_dim":
        model[4].start_dim = 0
    elif what == "parameter resized":
        model[5].weight = nn.Parameter(torch.zeros(2, 5, dtype=torch.float64))
    elif what == "layer type swapped":
        model[2].__class__ = nn.ReLU6


CHANGES = [
    "layer replaced", "layer appended", "conv stride", "conv kernel_size", "conv dilation", "conv padding",
    "pool kernel_size", "pool stride", "pool ceil_mode", "flatten start_dim", "parameter resized",
    "layer type swapped",
]  # fmt: skip


@pytest.mark.parametrize("what", CHANGES)
def test_a_structural_change_is_refused_at_the_next_call(what):
    model, patch = _model()
    dense = densecnn.convert(model, patch)
    x = torch.rand(1, 1, 14, 15, dtype=torch.float64)
    dense(x)
    _change(model, what)
    for call in (lambda: dense(x), lambda: dense.predict(x), lambda: dense(x, max_memory=10**6)):
        with pytest.raises(
            ModelChangedError, match="the model changed since it was converted.*Convert it again"
        ):
            call()


@pytest.mark.parametrize("attribute, value", [("use_relu", False), ("scale", 2.0)])
def test_an_attribute_forward_reads_is_part_of_the_structure(attribute, value):
    model = Toggled().double().eval()
    dense = densecnn.convert(model, 5)
    setattr(model, attribute, value)
    with pytest.raises(ModelChangedError, match=rf"\(Toggled\): {attribute} was .*, is {value}"):
        dense(torch.rand(1, 1, 6, 6, dtype=torch.float64))


def test_parameter_values_modes_and_same_shape_parameters_are_followed():
    model, patch = _model()
    dense = densecnn.convert(model, patch)
    x = torch.rand(2, 1, 12, 13, dtype=torch.float64)
    with torch.no_grad():
        model[0].weight.mul_(-1.5)
        model[3].bias.add_(0.25)
    model[5].weight = nn.Parameter(torch.randn(2, 4, dtype=torch.float64))  # same shape: read on every call
    model.train()
    model.eval()
    with torch.no_grad():
        assert_equal_to_rounding(dense(x), densecnn.scan_patches(model, x, patch))


@pytest.mark.parametrize("solver, zoo_net", [("fft", "stages_46"), ("winograd", "nuclei"), ("ext", "nuclei")])
@pytest.mark.parametrize("how", ["data in place", "data replaced"])
def test_values_changed_through_data_are_followed_by_the_cached_kernel_transforms(
    ops_config, solver, zoo_net, how
):
    """``p.data.mul_()`` and ``p.data = t`` change values without a version counter seeing it: the solvers' cached
    transforms of the kernels (spectra, Winograd kernels) must not serve the old values."""
    ops_config(solver=solver)
    torch.manual_seed(0)
    model, patch = getattr(densecnn.zoo, zoo_net)(in_channels=1, num_classes=3)
    model.eval()
    dense = densecnn.convert(model, patch)
    x = torch.rand(1, 1, 24, 24)
    patch = (patch, patch) if isinstance(patch, int) else patch
    with torch.no_grad():
        dense(x)  # the transforms of the first values are cached now
        for _ in range(2):
            for p in model.parameters():
                if how == "data in place":
                    p.data.mul_(-1.5)
                else:
                    p.data = p.data * -1.5
            assert_equal_to_rounding(dense(x), literal_scan(model, x, patch), f"{solver}, {how}")


def test_a_deep_copy_checks_its_own_copy_of_the_model():
    model, patch = _model()
    dense = copy.deepcopy(densecnn.convert(model, patch))
    x = torch.rand(1, 1, 11, 12, dtype=torch.float64)
    model[1].kernel_size = 3  # the original, not the copy's
    with torch.no_grad():
        assert dense(x).shape == (1, 2, 11, 12)


def test_a_forward_that_changes_its_own_attributes_is_refused_at_conversion():
    class Counting(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(1, 2, 3)
            self.calls = 0

        def forward(self, x):
            self.calls += 1
            return self.conv(x).flatten(1)

    with pytest.raises(
        densecnn.ConversionError, match=r"changes its own state when it runs .*calls was \d+, is \d+"
    ):
        densecnn.convert(Counting().eval(), 3)


def test_the_structure_names_what_changed():
    model, patch = _model()
    structure = densecnn.structure.Structure(tuple(model.named_modules()))
    assert structure.follow() is None
    model[1].kernel_size = 3
    assert structure.follow() == "layer '1' (MaxPool2d): kernel_size was 2, is 3"


class FunctionalWeights(nn.Module):
    """Tensors read by functional ops in a traced forward: a parameter, a buffer and a plain tensor attribute."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 3)
        self.register_buffer("mean", torch.randn(4))
        self.register_buffer("var", torch.rand(4) + 0.5)
        self.kernel = torch.randn(4, 4, 3, 3)  # neither parameter nor buffer
        self.w = nn.Parameter(torch.randn(3, 4))
        self.b = nn.Parameter(torch.randn(3))

    def forward(self, x):
        x = F.batch_norm(self.conv(x), self.mean, self.var, None, None, self.training)
        return F.linear(torch.relu(F.conv2d(x, self.kernel)).flatten(1), self.w, self.b)


@pytest.mark.parametrize("replace", ["parameter", "buffer", "plain tensor", "model.double()"])
def test_tensors_of_functional_ops_replaced_by_the_same_shape_are_followed(replace):
    torch.manual_seed(0)
    model = FunctionalWeights().double().eval()
    model.kernel = model.kernel.double()
    dense = densecnn.convert(model, 5)
    if replace == "parameter":
        model.w = nn.Parameter(torch.randn(3, 4, dtype=torch.float64))
        model.b = nn.Parameter(torch.randn(3, dtype=torch.float64))
    elif replace == "buffer":
        model.mean = torch.randn(4, dtype=torch.float64)
    elif replace == "plain tensor":
        model.kernel = torch.randn(4, 4, 3, 3, dtype=torch.float64)
    else:  # float and back: .double() replaces every buffer, the plain attribute is set anew
        model.float().double()
        model.kernel = model.kernel.double()
        model.mean.add_(1.0)  # the new buffer's values
    x = torch.rand(1, 2, 9, 10, dtype=torch.float64)
    with torch.no_grad():
        assert_equal_to_rounding(dense(x), densecnn.scan_patches(model, x, 5))


@pytest.mark.parametrize(
    "attribute, value, change",
    [
        (
            "w",
            nn.Parameter(torch.randn(5, 4)),
            "parameters or buffers changed shape",
        ),  # the module's own record
        ("kernel", torch.randn(4, 4, 5, 5), r"'kernel' .* had shape \(4, 4, 3, 3\), has \(4, 4, 5, 5\)"),
        ("kernel", None, "'kernel' .* was replaced by NoneType"),
    ],
)
def test_a_tensor_of_a_functional_op_replaced_by_another_shape_is_refused(attribute, value, change):
    model = FunctionalWeights().eval()
    dense = densecnn.convert(model, 5)
    setattr(model, attribute, value)
    with pytest.raises(ModelChangedError, match=change):
        dense(torch.rand(1, 2, 9, 10))
