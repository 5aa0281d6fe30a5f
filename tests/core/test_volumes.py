"""Signals (N, C, L) and volumes (N, C, D, H, W): the dense net equals window-by-window scanning at every position.

The reference is tests/naive.py's literal scanner (numpy.pad, one patch at a time), which shares no code with the
converter. Random 1-D and 3-D patch nets: strided and dilated convs with groups, overlapping and dilated pools, BatchNorm,
conv / FC / global-pool heads, softmax, anisotropic and even/odd patches, inputs smaller than the patch, every padding
mode, as nn.Sequential or as fx-traced modules calling the functional forms.
"""

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

import densecnn
from densecnn import tiling
from densecnn.ops import ext, layout
from densecnn.padding import dense_padding, pad_image
from tests.naive import literal_scan
from tests.tolerances import assert_close_relative, assert_equal_to_rounding, assert_labels_equal_except_ties

pytestmark = pytest.mark.filterwarnings("ignore::densecnn.PatchSizeWarning")

ACTIVATIONS = [nn.ReLU, nn.Tanh, nn.ELU, nn.Identity]
MODES = ["zeros", "reflect", "replicate"]


def _layer(name: str, dims: int):
    return getattr(nn, f"{name}{dims}d")


class FunctionalNet(nn.Module):
    """The same layers in a module that torch.fx traces: pools, ReLU and Flatten in their functional forms."""

    def __init__(self, layers: list[nn.Module], dims: int):
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.dims = dims

    def forward(self, x):
        for layer in self.layers:
            if isinstance(layer, nn.modules.pooling._MaxPoolNd):
                x = getattr(F, f"max_pool{self.dims}d")(x, layer.kernel_size, layer.stride, 0, layer.dilation)
            elif isinstance(layer, nn.modules.pooling._AvgPoolNd) and self.dims == 1:
                x = F.avg_pool1d(x, layer.kernel_size, layer.stride)
            elif isinstance(layer, nn.modules.pooling._AvgPoolNd):
                x = getattr(F, f"avg_pool{self.dims}d")(
                    x, layer.kernel_size, layer.stride, divisor_override=layer.divisor_override
                )
            elif isinstance(layer, nn.ReLU):
                x = F.relu(x)
            elif isinstance(layer, nn.Flatten):
                x = x.flatten(1)
            else:
                x = layer(x)
        return x


@st.composite
def patch_nets(draw, dims: int):
    """(model, patch_size): 1-3 conv/pool stages then a conv, FC or global-pool head, for ``dims`` spatial axes."""
    torch.manual_seed(draw(st.integers(0, 2**31 - 1), label="weights seed"))
    in_channels = draw(st.integers(1, 3))
    sides = (4, 24) if dims == 1 else (2, 9)
    patch = [draw(st.integers(*sides))] * dims
    if dims > 1 and draw(
        st.booleans(), label="anisotropic"
    ):  # fewer slices than rows and columns, as in EM stacks
        patch = [draw(st.integers(1, patch[1]))] + [draw(st.integers(*sides)) for _ in range(dims - 1)]
    size, channels, layers = list(patch), in_channels, []

    def axis_tuple(low, high):
        return tuple(draw(st.integers(low, max(low, h))) for h in high)

    for _ in range(draw(st.integers(1, 3))):
        if min(size) < 1:
            break
        out_channels = draw(st.integers(1, 4))
        groups = draw(st.sampled_from([g for g in (1, 2) if channels % g == 0 and out_channels % g == 0]))
        kernel = axis_tuple(1, [min(3, s) for s in size])
        dilation = tuple(
            draw(st.sampled_from([1, 2])) if (k - 1) * 2 + 1 <= s else 1 for k, s in zip(kernel, size)
        )
        stride = axis_tuple(1, [2] * dims)
        layers.append(_layer("Conv", dims)(channels, out_channels, kernel, stride, dilation=dilation, groups=groups,
                                            bias=draw(st.booleans())))  # fmt: skip
        size = [(n - (k - 1) * d - 1) // s + 1 for n, k, d, s in zip(size, kernel, dilation, stride)]
        channels = out_channels
        if min(size) >= 1 and draw(st.booleans()):
            layers.append(_layer("BatchNorm", dims)(channels))
            layers[-1].running_mean.uniform_(-1, 1)
            layers[-1].running_var.uniform_(0.5, 2)
        layers.append(draw(st.sampled_from(ACTIVATIONS))())
        if min(size) >= 1 and draw(st.booleans()):
            kernel = axis_tuple(1, [min(3, s) for s in size])
            stride = axis_tuple(1, [3] * dims)  # stride < kernel: overlapping windows
            if draw(st.booleans()):
                dilation = tuple(2 if (k - 1) * 2 + 1 <= s else 1 for k, s in zip(kernel, size))
                layers.append(_layer("MaxPool", dims)(kernel, stride, dilation=dilation))
            else:
                dilation = (1,) * dims
                divisor = draw(st.sampled_from([None, 3])) if dims > 1 else None
                extra = {"divisor_override": divisor} if divisor else {}
                layers.append(_layer("AvgPool", dims)(kernel, stride, **extra))
            size = [(n - (k - 1) * d - 1) // s + 1 for n, k, d, s in zip(size, kernel, dilation, stride)]
    if min(size) < 1:
        return None, tuple(patch)
    classes = draw(st.integers(1, 3))
    head = draw(st.sampled_from(["conv", "fc", "global"]))
    if head == "conv":
        layers.append(_layer("Conv", dims)(channels, classes, tuple(size)))
    elif head == "fc":
        hidden = draw(st.integers(1, 5))
        layers += [
            nn.Flatten(),
            nn.Linear(channels * math.prod(size), hidden),
            nn.Tanh(),
            nn.Linear(hidden, classes),
        ]
    else:
        pool = draw(st.sampled_from([_layer("AdaptiveAvgPool", dims), _layer("AdaptiveMaxPool", dims)]))
        layers += [pool(1), nn.Flatten(), nn.Linear(channels, classes)]
    if draw(st.booleans(), label="softmax"):
        layers.append(nn.Softmax(dim=1))
    model = FunctionalNet(layers, dims) if draw(st.booleans(), label="traced") else nn.Sequential(*layers)
    model.in_channels = in_channels
    return model.eval(), tuple(patch)


def _valid(net):
    return net[0] is not None


def _input(data, model, patch, dtype, max_side):
    n = data.draw(st.integers(1, 2), label="batch")
    size = [data.draw(st.integers(1, min(p + 3, max_side)), label="side") for p in patch]  # often < the patch
    seed = data.draw(st.integers(0, 2**31 - 1), label="input seed")
    return torch.randn(
        (n, model.in_channels, *size), dtype=dtype, generator=torch.Generator().manual_seed(seed)
    )


# Forced solvers run the layers they apply to (densecnn's kernels: the pools) and native for the rest.
SOLVERS = ["native", "s2b"] + (["ext", "ext_fused"] if ext.available() else [])
MAX_SIDE = {1: 40, 3: 9}
EXAMPLES = {1: 60, 3: 40}


def _check(net, data, dtype, rel, floor, dims):
    model, patch = net
    model = model.to(dtype)
    mode = data.draw(st.sampled_from(MODES), label="padding_mode")
    solver = data.draw(st.sampled_from(SOLVERS), label="solver")
    x = _input(data, model, patch, dtype, MAX_SIDE[dims])
    dense = densecnn.convert(model, patch, padding_mode=mode)
    dense.solver = solver
    with torch.no_grad():
        assert_close_relative(dense(x), literal_scan(model, x, patch, mode), rel, floor)


@pytest.mark.parametrize("dims", [1, 3])
def test_dense_equals_window_scanning_float64(dims):
    @settings(max_examples=EXAMPLES[dims], deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
    @given(net=patch_nets(dims).filter(_valid), data=st.data())
    def check(net, data):
        _check(net, data, torch.float64, 1e-10, 0.0, dims)

    check()


@pytest.mark.parametrize("dims", [1, 3])
def test_dense_equals_window_scanning_float32(dims):
    @settings(
        max_examples=EXAMPLES[dims] // 2, deadline=None, suppress_health_check=[HealthCheck.filter_too_much]
    )
    @given(net=patch_nets(dims).filter(_valid), data=st.data())
    def check(net, data):
        _check(net, data, torch.float32, 1e-5, 1.0, dims)

    check()


@pytest.mark.parametrize("dims", [1, 3])
def test_scanners_equal_window_scanning(dims):
    @settings(
        max_examples=EXAMPLES[dims] // 2, deadline=None, suppress_health_check=[HealthCheck.filter_too_much]
    )
    @given(net=patch_nets(dims).filter(_valid), data=st.data())
    def check(net, data):
        model, patch = net
        model = model.double()
        mode = data.draw(st.sampled_from(MODES), label="padding_mode")
        x = _input(data, model, patch, torch.float64, MAX_SIDE[dims])
        expected = literal_scan(model, x, patch, mode)
        assert_close_relative(densecnn.scan_patches(model, x, patch, padding_mode=mode), expected, 1e-10)
        assert_close_relative(densecnn.fast_scan(model, x, patch, padding_mode=mode), expected, 1e-10)

    check()


def _volume_net():
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv3d(2, 4, (1, 3, 3)), nn.ReLU(), nn.MaxPool3d((1, 2, 2)), nn.Conv3d(4, 4, (2, 3, 3)), nn.Tanh(),
        nn.MaxPool3d(2), nn.Flatten(), nn.Linear(4 * 2 * 2 * 2, 3),
    )  # fmt: skip
    return model.double().eval(), (5, 14, 14)  # anisotropic, like an EM stack's (slices, rows, columns)


def _signal_net():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv1d(1, 3, 5), nn.ReLU(), nn.MaxPool1d(3, 2), nn.Conv1d(3, 4, 3, dilation=2),
                          nn.AvgPool1d(2), nn.Conv1d(4, 2, 3))  # fmt: skip
    return model.double().eval(), (26,)


def _tiny_budget(dense, x, labels, train):
    """A max_memory that admits a tile of about half the input's smallest side (so several tiles)."""
    estimate = dense.memory_estimate(x.shape, x.element_size(), labels=labels, train=train)
    return estimate.held + estimate.tile((max(1, min(x.shape[2:]) // 2),) * (x.dim() - 2))


@pytest.mark.parametrize("net", [_volume_net, _signal_net])
@pytest.mark.parametrize("mode", MODES)
def test_tiled_equals_untiled_forward_predict_and_gradients(net, mode, ops_config, tmp_path):
    ops_config(cache_dir=tmp_path)
    model, patch = net()
    dense = densecnn.convert(model, patch, padding_mode=mode)
    size = (8, 12, 10) if dense.dims == 3 else (301,)
    x = torch.randn(2, model[0].in_channels, *size, dtype=torch.float64)
    with torch.no_grad():
        untiled = dense(x)
        budget = _tiny_budget(dense, x, False, False)
        tile = tiling.choose_tile(x.shape, budget, dense.memory_estimate(x.shape, 8, labels=False, train=False),
                                  labels=False)  # fmt: skip
        assert math.prod(len(tiling.tile_starts(s, t)) for s, t in zip(size, tile)) > 1
        assert_equal_to_rounding(dense(x, max_memory=budget), untiled)
        assert_labels_equal_except_ties(
            dense.predict(x, max_memory=_tiny_budget(dense, x, True, False)), untiled
        )
    assert_close_relative(untiled, densecnn.scan_patches(model, x, patch, padding_mode=mode), 1e-10)

    weight = model[0].weight
    target = torch.randn_like(untiled)
    (dense(x) * target).sum().backward()
    expected = weight.grad.clone()
    weight.grad = None
    (dense(x, max_memory=_tiny_budget(dense, x, False, True)) * target).sum().backward()
    assert_equal_to_rounding(weight.grad, expected)


def test_volume_net_facts_and_input_checks():
    model, patch = _volume_net()
    dense = densecnn.convert(model, patch)
    assert dense.dims == 3 and dense.patch_size == (5, 14, 14) and dense.receptive_field == (5, 14, 14)
    with pytest.raises(ValueError, match=r"volumes as an \(N, C, D, H, W\).*x\[None\]"):
        dense(torch.rand(2, 5, 16, 16, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"volumes as an \(N, C, D, H, W\).*3 spatial"):
        dense(torch.rand(1, 2, 16, 16, dtype=torch.float64)[None, None])
    signal = densecnn.convert(*_signal_net())
    with pytest.raises(ValueError, match=r"signals as an \(N, C, L\)"):
        signal(torch.rand(1, 1, 30, 30, dtype=torch.float64))


def test_patch_size_errors_name_the_nearest_sizes_per_axis():
    model, _ = _volume_net()
    with pytest.raises(
        densecnn.PatchSizeError, match=r"Nearest valid depths \(height 14, width 14\): 5 to 6 \(one"
    ):
        densecnn.convert(model, (7, 14, 14))
    with pytest.raises(
        densecnn.PatchSizeError,
        match=r"has 2 entries.*3 spatial axis/axes: give an int or \(depth, height, width\)",
    ):
        densecnn.convert(model, (16, 16))
    for wrong in (17, (5, 9, 14)):
        with pytest.raises(densecnn.PatchSizeError, match="Nearest valid|nearest valid"):
            densecnn.convert(model, wrong)


def test_layers_for_different_numbers_of_axes_do_not_mix():
    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.MaxPool3d(2), nn.Flatten(), nn.LazyLinear(2))
    with pytest.raises(densecnn.ConversionError, match=r"mixes.*'0' \(Conv2d\): 2-D.*'1' \(MaxPool3d\): 3-D"):
        densecnn.convert(model, 8)


def test_refusals_carry_over():
    for layer in (nn.BatchNorm3d(2, track_running_stats=False), nn.InstanceNorm3d(2), nn.GroupNorm(1, 2)):
        with pytest.raises(densecnn.ConversionError, match="statistics"):
            densecnn.convert(nn.Sequential(nn.Conv3d(1, 2, 2), layer, nn.Conv3d(2, 2, 3)).eval(), 4)
    with pytest.raises(densecnn.ConversionError, match=r"padding=\(1,\)"):
        densecnn.convert(nn.Sequential(nn.Conv1d(1, 2, 3, padding=1)), 3)
    with pytest.raises(densecnn.ConversionError, match="ceil_mode"):
        densecnn.convert(
            nn.Sequential(nn.Conv3d(1, 2, 1), nn.MaxPool3d(2, ceil_mode=True), nn.Conv3d(2, 2, 2)), 5
        )


def test_parameters_are_shared_and_the_dense_layers_are_views():
    model, patch = _volume_net()
    dense = densecnn.convert(model, patch)
    assert {p.data_ptr() for p in dense.parameters()} == {p.data_ptr() for p in model.parameters()}
    linear = dense.features[-1]
    assert (
        linear.dense_op().weight.shape == (3, 4, 2, 2, 2)
        and linear.dense_op().weight.data_ptr() == model[-1].weight.data_ptr()
    )


@pytest.mark.parametrize("mode", MODES)
def test_pad_image_matches_numpy_pad_in_three_axes(mode):
    import numpy as np

    from tests.naive import NUMPY_MODES

    x = torch.randn(1, 2, 2, 3, 4, dtype=torch.float64)
    before, after = (3, 1, 0), (2, 5, 6)  # wider than the volume: reflect repeats, as numpy.pad does
    expected = np.pad(x.numpy(), ((0, 0), (0, 0), *zip(before, after)), mode=NUMPY_MODES[mode])
    assert torch.equal(pad_image(x, before, after, mode), torch.from_numpy(expected))
    assert dense_padding((9, 65, 65), (9, 65, 65)) == ((4, 32, 32), (4, 32, 32))


@pytest.mark.parametrize("solver", [None, "native"])
def test_volumes_run_channels_last_and_signals_ncl(solver, ops_config, tmp_path):
    """A forced "nhwc" runs a volume net in channels_last_3d (every windowed step's output, the first one's from a
    single-channel input too) and equals patch scanning; signals have no channels-last format and run NCL."""
    ops_config(cache_dir=tmp_path, memory_format="nhwc")
    for model, patch, x in (
        (*_volume_net(), torch.randn(1, 2, 6, 18, 17, dtype=torch.float64)),
        (*_one_channel_volume_net(), torch.randn(1, 1, 7, 9, 10, dtype=torch.float64)),
        (*_signal_net(), torch.randn(1, 1, 40, dtype=torch.float64)),
    ):
        dense = densecnn.convert(model, patch)
        dense.solver = solver
        with torch.no_grad():
            assert_equal_to_rounding(dense(x), densecnn.scan_patches(model, x, patch))
        plan = dense.plan(dense.pad(x))
        if x.dim() == 5:
            assert plan.memory_format == "nhwc"
            with torch.no_grad():
                outputs = [step(y, torch.channels_last_3d) for step, y in _step_inputs(plan, dense.pad(x))]
            assert outputs and all(y.stride(1) == 1 for y in outputs)
        else:
            assert plan.memory_format == "nchw"


def _one_channel_volume_net():
    torch.manual_seed(1)
    model = nn.Sequential(nn.Conv3d(1, 4, 3), nn.ReLU(), nn.MaxPool3d(2), nn.Conv3d(4, 2, (1, 2, 2)))
    return model.double().eval(), (5, 6, 6)


def _step_inputs(plan, x):
    """(windowed step, its input) for each windowed step of ``plan`` run on x."""
    pairs = []
    y = layout.to_format(x, plan.memory_format)
    for step in plan.steps:
        if step.solver is not None:
            pairs.append((step, y))
        with torch.no_grad():
            y = step(y, layout.memory_format(plan.memory_format, y.dim()))
    return pairs


def test_a_volume_model_file_round_trips_and_exports_to_onnx(tmp_path, capsys):
    ort = pytest.importorskip("onnxruntime")
    from densecnn.cli import main

    model, patch = _volume_net()
    model = nn.Sequential(*model, nn.Dropout3d(0.1), nn.LogSoftmax(dim=1)).float().eval()
    path = densecnn.save(model, tmp_path / "volume", patch_size=patch, padding_mode="reflect")
    loaded = densecnn.load(path)
    assert loaded.patch_size == patch
    x = torch.randn(1, 2, 6, 17, 15)
    expected = literal_scan(model, x, patch, "reflect")
    with torch.no_grad():
        assert_close_relative(loaded.dense()(loaded.normalize(x)), expected, 1e-5, 1.0)

    assert main(["export-onnx", str(path), str(tmp_path / "volume.onnx")]) == 0
    assert "(N, 2, D, H, W)" in capsys.readouterr().out
    session = ort.InferenceSession(str(tmp_path / "volume.onnx"), providers=["CPUExecutionProvider"])
    for shape in [
        (1, 2, 6, 17, 15),
        (2, 2, 3, 9, 20),
        (1, 2, 1, 1, 1),
    ]:  # every axis dynamic, smaller than the patch
        x = torch.randn(shape)
        (scores,) = session.run(None, {"image": x.numpy()})
        assert_close_relative(torch.from_numpy(scores), literal_scan(model, x, patch, "reflect"), 1e-5, 1.0)


@pytest.mark.parametrize("layout", [torch.contiguous_format, torch.channels_last_3d])
def test_space_to_batch_equals_the_native_dilated_ops_in_3d(layout):
    from densecnn.ops import solvers
    from densecnn.ops.solvers import ConvOp, PoolOp

    torch.manual_seed(0)
    x = torch.randn(2, 4, 9, 11, 10, dtype=torch.float64).contiguous(memory_format=layout)
    dense_ops = [
        ConvOp(
            torch.randn(6, 2, 2, 3, 2, dtype=torch.float64), torch.randn(6, dtype=torch.float64), (2, 1, 3), 2
        ),
        PoolOp("max_pool3d", (2, 2, 3), (3, 2, 1), activation="tanh"),
        PoolOp("avg_pool3d", (2, 1, 2), (2, 4, 2), divisor=3),
    ]
    for op in dense_ops:
        y = solvers.run("s2b", op, x)
        assert y.is_contiguous(memory_format=layout)
        assert_equal_to_rounding(y, solvers.run("native", op, x.contiguous()))


@pytest.mark.skipif(not ext.available(), reason="densecnn's kernels are not built")
def test_immediate_plans_pool_volumes_with_the_kernels(tmp_path, ops_config):
    """Without timing anything, a volume net's pools run on densecnn's kernels (torch's dilated 3-D pooling is
    several times slower), its convs on solvers predicted too."""
    ops_config(cache_dir=tmp_path)
    model, patch = densecnn.zoo.create("znni_3d", in_channels=1, num_classes=3)
    dense = densecnn.convert(model.eval(), patch)
    x = torch.rand(1, 1, 20, 20, 20)
    with torch.no_grad():  # an inference plan
        steps = dense.plan(dense.pad(x)).describe()
    pools = [s for s in steps if s["layers"][0] == "DenseMaxPool"]
    assert pools and all(s["solver"] in ("ext", "ext_fused") and s["source"] == "predicted" for s in pools)
    assert all(s["source"] == "predicted" for s in steps if s["layers"][0] == "DenseConv")


def test_cost_model_ranks_volume_ops_from_their_own_measurements(monkeypatch):
    """With 3-D rows in the cost model, a volume's pool is predicted from them (not from the image pools' fits),
    and a 3-D conv's candidates are ranked instead of defaulting to native."""
    from densecnn.ops import costmodel
    from densecnn.ops.solvers import ConvOp, PoolOp

    problems = []
    for side in (12, 20, 28, 36):
        for c in (4, 16):
            pool = PoolOp("max_pool3d", (2, 2, 2), (2, 2, 2), activation="relu")
            conv = ConvOp(torch.empty(16, 1, 3, 3, 3), None, (1, 1, 1), 1)
            scale = side**3 * c / 1e5  # made-up times: native pools fastest, the direct conv fastest
            for op, times in ((pool, {"native": 1.0, "ext": 3.0}), (conv, {"native": 4.0, "direct": 1.0})):
                row = costmodel.problem(op, (1, c if op is pool else 1, side, side, side))
                ms = {name: t * scale for name, t in times.items()}
                problems.append({**row, "dtype": "float32", "times_ms": {"infer": {"nchw": ms}}})
    shipped = costmodel.CostModel.fitted(problems)
    monkeypatch.setattr(costmodel, "shipped", lambda: shipped)
    assert shipped.fits("max_pool3d") and not shipped.fits("max_pool1d")
    for op, fastest, shape in (
        (PoolOp("max_pool3d", (2, 2, 2), (2, 2, 2), activation="relu"), "native", (1, 8, 30, 30, 30)),
        (ConvOp(torch.empty(16, 1, 3, 3, 3), None, (1, 1, 1), 1), "direct", (1, 1, 30, 30, 30)),
    ):
        table = costmodel.estimate(
            op, shape, torch.float32, train=False, candidates=["native", "ext", "direct"]
        )
        timed = {name: ms for name, ms in table["nchw"].items() if ms is not None}
        assert min(timed, key=timed.get) == fastest, table
