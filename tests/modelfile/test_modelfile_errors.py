"""Broken model directories: every problem is one ModelFileError naming the file, the key and the fix, found before
any tensor is allocated."""

import json
import logging
import os
import re
import shutil
import subprocess
import sys
import textwrap
import threading

import numpy
import pytest
import torch
from safetensors.torch import load_file, save_file

import densecnn
from densecnn.cli import main as cli_main

HUGE = 10**6  # a Linear(HUGE, HUGE) holds 10^12 parameters (4 TB in float32)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A valid saved model (zoo.tiny: Conv, MaxPool, ReLU, Conv, AvgPool, Tanh, Flatten, Linear, ReLU, Linear)."""
    torch.manual_seed(0)
    model, patch = densecnn.zoo.tiny(in_channels=1, num_classes=3)
    return densecnn.save(
        model.eval(),
        tmp_path_factory.mktemp("base") / "tiny",
        patch_size=patch,
        class_names=["background", "cell", "edge"],
        normalization={"mean": [0.5], "std": [0.25]},
        padding_mode="reflect",
    )


@pytest.fixture
def broken(base, tmp_path):
    """A fresh copy of the valid model directory to break."""
    return shutil.copytree(base, tmp_path / "model")


def _edit(path, change):
    config = json.loads((path / "model.json").read_text())
    change(config)
    (path / "model.json").write_text(json.dumps(config))


def _set(index, key, value):
    return lambda config: config["layers"][index].__setitem__(key, value)


def _huge_head(width):
    """The FC head of zoo.tiny widened to Linear(24, width), Linear(width, width), Linear(width, 3)."""

    def change(config):
        config["layers"][7:] = [
            {"type": "Linear", "in_features": 24, "out_features": width},
            {"type": "ReLU"},
            {"type": "Linear", "in_features": width, "out_features": width},
            {"type": "ReLU"},
            {"type": "Linear", "in_features": width, "out_features": 3},
        ]

    return change


def _expect(path, file, key, problem):
    """load(path) raises one ModelFileError "<dir>/<file>: <key>: <problem...>; <fix>" (key and problem are
    regular expressions) with no raw error chained to it."""
    with pytest.raises(densecnn.ModelFileError) as info:
        densecnn.load(path)
    message = str(info.value)
    located = re.match(re.escape(f"{path / file}: ") + (f"{key}: " if key else ""), message)
    assert located, message
    assert re.search(problem, message[located.end() :]), message
    assert "; " in message[located.end() :], f"no fix in: {message}"
    error = info.value
    assert "\n" not in message and error.__cause__ is None, message
    assert error.__context__ is None or error.__suppress_context__, f"a raw error is chained to: {message}"
    return message


CONFIG_CASES = {
    "missing key": (lambda c: c.pop("num_classes"), "num_classes", "missing key"),
    "string for int": (lambda c: c.update(in_channels="1"), "in_channels", 'valid integer, got "1"'),
    "float for int": (lambda c: c.update(patch_size=[12.5, 12]), r"patch_size\[0\]", "valid integer, got 12.5"),
    "zero patch": (lambda c: c.update(patch_size=[0, 12]), r"patch_size\[0\]", "greater than or equal to 1"),
    "one patch axis": (lambda c: c.update(patch_size=[12]), "patch_size", "layers have 2 spatial axis"),
    "three patch axes": (lambda c: c.update(patch_size=[12, 12, 12]), "patch_size", "layers have 2 spatial axis"),
    "four patch axes": (lambda c: c.update(patch_size=[12] * 4), "patch_size", "at most 3 items"),
    "negative kernel": (_set(3, "kernel_size", [-2, 2]), r"layers\[3\]\.kernel_size", r"at least 1, got \[-2, 2\]"),
    "bool for int": (_set(0, "out_channels", True), r"layers\[0\]\.out_channels", "expected an integer, got true"),
    "zero channels": (_set(0, "out_channels", 0), r"layers\[0\]\.out_channels", "at least 1, got 0"),
    "kernel as string": (_set(0, "kernel_size", "3"), r"layers\[0\]\.kernel_size",
                         'expected an integer or a list of 2 integers, got "3"'),
    "negative padding": (_set(0, "padding", -1), r"layers\[0\]\.padding", "at least 0"),
    "dropout p": (lambda c: c["layers"].insert(2, {"type": "Dropout", "p": 1.5}), r"layers\[2\]\.p", "between 0 and 1"),
    "unknown layer type": (_set(2, "type", "Swish"), r"layers\[2\]\.type", 'unknown layer type "Swish".*; use one of'),
    "layer without type": (lambda c: c["layers"][2].pop("type"), r"layers\[2\]\.type", "missing key"),
    "layer not an object": (lambda c: c["layers"].__setitem__(1, 3), r"layers\[1\]", "object, got 3"),
    "unknown layer argument": (_set(0, "colour", 1), r"layers\[0\]\.colour", r"unknown argument of Conv2d; remove"),
    "missing layer argument": (lambda c: c["layers"][0].pop("kernel_size"), r"layers\[0\]\.kernel_size", "missing"),
    "no layers": (lambda c: c.update(layers=[]), "layers", "at least 1 item"),
    "unknown key": (lambda c: c.update(colour=1), "colour", 'unknown key; remove it .*"extra"'),
    "class names length": (lambda c: c.update(class_names=["a"]), "class_names", "1 names for num_classes=3"),
    "class name type": (lambda c: c["class_names"].__setitem__(1, 7), r"class_names\[1\]", "valid string"),
    "palette length": (lambda c: c.update(palette=[[0, 0, 0]] * 4), "palette", "4 colours for num_classes=3"),
    "palette value": (lambda c: c["palette"][1].__setitem__(0, 300), r"palette\[1\]\[0\]", "less than or equal to 255"),
    "palette rgb": (lambda c: c["palette"].__setitem__(1, [1, 2]), r"palette\[1\]", "too few entries"),
    "normalisation length": (lambda c: c.update(normalization={"mean": [0.5, 0.5], "std": [1, 1]}),
                             "normalization.mean", "2 values for in_channels=1"),
    "normalisation std": (lambda c: c.update(normalization={"mean": [0.5], "std": [0]}), r"normalization\.std\[0\]",
                          "greater than 0"),
    "normalisation NaN": (lambda c: c.update(normalization={"mean": [float("nan")], "std": [1]}),
                          r"normalization\.mean\[0\]", "finite number"),
    "padding mode": (lambda c: c.update(padding_mode="circular"), "padding_mode", "'zeros', 'reflect' or 'replicate'"),
    "format": (lambda c: c.update(format="other"), "format", "not a densecnn model file"),
    "newer version": (lambda c: c.update(format_version=99), "format_version",
                      "99 is not supported .*; upgrade densecnn"),
    "version as string": (lambda c: c.update(format_version="1"), "format_version", '"1" is not supported'),
    "in_channels vs layers": (lambda c: c.update(in_channels=3, normalization=None), "in_channels",
                              "is 3, but the first layer takes 1 channels"),
    "num_classes vs layers": (lambda c: c.update(num_classes=4, class_names=list("abcd"), palette=[[0, 0, 0]] * 4),
                              "num_classes", "is 4, but the layers give 3 scores"),
    "channels between layers": (_set(3, "in_channels", 5), "layers", r"do not convert to a dense net \(.*Conv2d"),
    "wrong patch size": (lambda c: c.update(patch_size=[20, 20]), "patch_size", r"20x20 does not fit the layers"),
    "unconvertible layer": (_set(0, "padding", "same"), "layers", r"do not convert to a dense net \(.*Conv2d"),
    "constructor refuses": (_set(0, "groups", 3), r"layers\[0\]", "Conv2d rejects these arguments .*divisible"),
    "size overflows": (_set(0, "out_channels", 10**30), r"layers\[0\]", "Conv2d rejects these arguments"),
}  # fmt: skip


@pytest.mark.parametrize(("change", "key", "problem"), CONFIG_CASES.values(), ids=CONFIG_CASES.keys())
def test_broken_model_json(broken, change, key, problem):
    _edit(broken, change)
    _expect(broken, "model.json", key, problem)


def _weights(path, change):
    tensors = load_file(path / "weights.safetensors")
    change(tensors)
    save_file(tensors, path / "weights.safetensors")


def _cut(size):
    def change(path):
        data = (path / "weights.safetensors").read_bytes()
        (path / "weights.safetensors").write_bytes(data[:size] if size >= 0 else data[:size])

    return change


WEIGHT_CASES = {
    "missing tensor": (lambda p: _weights(p, lambda t: t.pop("9.bias")), "tensor '9.bias'",
                       r"missing; layers\[9\] \(Linear\) needs it"),
    "extra tensor": (lambda p: _weights(p, lambda t: t.update({"10.weight": torch.zeros(2)})), "tensor '10.weight'",
                     "no layer in model.json holds it"),
    "wrong shape": (lambda p: _weights(p, lambda t: t.update({"9.weight": torch.zeros(4, 8)})), "tensor '9.weight'",
                    r"has shape \[4, 8\], but layers\[9\] \(Linear\) needs \[3, 8\]"),
    "integer weights": (lambda p: _weights(p, lambda t: t.update({"9.weight": torch.zeros(3, 8, dtype=torch.int32)})),
                        "tensor '9.weight'", "is int32, but layers.* needs float64 or float32"),
    "mixed float dtypes": (lambda p: _weights(p, lambda t: t.update({"9.weight": t["9.weight"].double()})), None,
                           "mixes float dtypes"),
    "truncated header": (_cut(20), None, "truncated"),
    "truncated data": (_cut(-10), r"tensor '\d+\.\w+'", "truncated or corrupt"),
    "empty file": (_cut(0), None, "truncated"),
    "a pickle": (lambda p: (p / "weights.safetensors").write_bytes(b"\x80\x04\x95pickle" + bytes(64)), None,
                 "not a safetensors file: a Python pickle"),
    "torch.save zip": (lambda p: torch.save({"w": torch.zeros(3)}, p / "weights.safetensors"), None,
                       "not a safetensors file: a zip archive"),
    "numpy array": (lambda p: numpy.save(p / "weights.npy", numpy.zeros(3)) or (p / "weights.npy").rename(
                    p / "weights.safetensors"), None, "not a safetensors file: a NumPy"),
    "header not JSON": (lambda p: (p / "weights.safetensors").write_bytes((8).to_bytes(8, "little") + b"nonsense"),
                        None, "not a safetensors file"),
    "missing file": (lambda p: (p / "weights.safetensors").unlink(), None, "missing; put the model's weights"),
    # a diverged training run's weights: every score NaN, every pixel no-data, were they loaded
    "NaN weights": (lambda p: _weights(p, lambda t: t["0.weight"].view(-1)[:12].fill_(float("nan"))),
                    "tensor '0.weight'", r"has 12 NaN values \(of \d+\); these weights are broken.*lower learning rate"),
    "infinite bias": (lambda p: _weights(p, lambda t: t["9.bias"].__setitem__(1, float("-inf"))), "tensor '9.bias'",
                      r"has 1 infinite value \(of 3\)"),
}  # fmt: skip


@pytest.mark.parametrize(("change", "key", "problem"), WEIGHT_CASES.values(), ids=WEIGHT_CASES.keys())
def test_broken_weights(broken, change, key, problem):
    change(broken)
    _expect(broken, "weights.safetensors", key, problem)


def test_broken_directories(broken, tmp_path):
    (broken / "model.json").write_text("{not json")
    _expect(broken, "model.json", None, "not valid JSON")
    (broken / "model.json").write_bytes(b"\xff\xfe\x00binary")
    _expect(broken, "model.json", None, "not UTF-8 text")
    (broken / "model.json").write_text("[1, 2]")
    _expect(broken, "model.json", None, "expected a JSON object, got \\[1, 2\\]")
    (broken / "model.json").unlink()
    with pytest.raises(
        densecnn.ModelFileError, match=f"^{re.escape(str(broken))}: not a model directory: model.json"
    ):
        densecnn.load(broken)
    with pytest.raises(
        densecnn.ModelFileError, match=r"nowhere: not a model directory: .* \(no such directory\)"
    ):
        densecnn.load(tmp_path / "nowhere")


def _forge_header(path):
    """Replace the weights with a file whose header claims exactly the tensors model.json needs, but no data."""
    config = json.loads((path / "model.json").read_text())
    with torch.device("meta"):
        state = densecnn.modelfile.spec.from_spec(config["layers"]).state_dict()
    header, offset = {}, 0
    for name, tensor in state.items():
        size = tensor.numel() * 4
        header[name] = {"dtype": "F32", "shape": list(tensor.shape), "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    (path / "weights.safetensors").write_bytes(len(raw).to_bytes(8, "little") + raw)


def test_huge_layers_fail_fast_without_allocating(base, tmp_path):
    """Layers of 10^12 parameters (against the real weights, and against a forged header that claims them) and of
    10^8 parameters (which an allocating loader would visibly hold) fail in well under a second each, and the
    process's peak memory does not grow."""
    cases = []
    for name, width, forge in [("tera", HUGE, False), ("forged", HUGE, True), ("large", 10**4, False)]:
        path = shutil.copytree(base, tmp_path / name)
        _edit(path, _huge_head(width))
        if forge:
            _forge_header(path)
        cases.append(str(path))
    script = textwrap.dedent(
        """
        import json, resource, sys, time
        import densecnn

        densecnn.load(sys.argv[1])  # warm: imports and the format's schema
        results = []
        for path in sys.argv[2:]:
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            start = time.perf_counter()
            try:
                densecnn.load(path)
                message = None
            except densecnn.ModelFileError as exc:
                message = str(exc)
            seconds = time.perf_counter() - start
            grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak
            results.append({"message": message, "seconds": seconds, "grown_kib": grown_kib})
        print(json.dumps(results))
        """
    )
    run = subprocess.run(
        [sys.executable, "-c", script, str(base), *cases],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    tera, forged, large = json.loads(run.stdout.strip().splitlines()[-1])
    assert "needs [1000000, 24] (the layers need 1,000,029,000,145 values" in tera["message"]
    assert "truncated or corrupt" in forged["message"] and "weights.safetensors" in forged["message"]
    assert "needs [10000, 24]" in large["message"]
    for result in (tera, forged, large):
        assert result["seconds"] < 1.0, result
        assert result["grown_kib"] < 32 * 1024, result  # an allocated Linear(10^4, 10^4) alone is 390 MiB


def test_cli_prints_one_line_and_exits_2(broken, capsys):
    _edit(broken, _set(3, "kernel_size", [-2, 2]))
    assert cli_main(["info", str(broken)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"densecnn info: error: {broken / 'model.json'}: layers[3].kernel_size"
    )
    assert cli_main(["info", str(broken / "nowhere")]) == 2
    assert "model.json is missing (no such directory)" in capsys.readouterr().err


def test_cli_info_on_a_broken_directory_has_no_traceback(broken):
    (broken / "weights.safetensors").write_bytes(b"\x00" * 4)
    run = subprocess.run(
        [sys.executable, "-m", "densecnn.cli", "info", str(broken)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr.count("\n") == 1 and "Traceback" not in run.stderr
    assert "weights.safetensors: truncated" in run.stderr


def test_server_skips_a_broken_model_with_one_log_line(base, broken, tmp_path, caplog):
    registry = pytest.importorskip("densecnn_app.registry")
    root = tmp_path / "models"
    root.mkdir()
    shutil.copytree(base, root / "good")
    shutil.move(broken, root / "bad")
    _edit(root / "bad", lambda c: c.update(palette=[[0, 0, 0]]))
    with caplog.at_level(logging.ERROR, logger="densecnn.app"):
        models = registry.load_models(root)
    assert list(models) == ["good"]
    [record] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert "bad/model.json: palette: 1 colours for num_classes=3" in record.getMessage()
    assert record.exc_info is None


@pytest.mark.parametrize(
    "computed, fix",
    [
        (lambda conv: torch.nn.utils.parametrizations.weight_norm(conv), "remove_parametrizations"),
        (lambda conv: torch.nn.utils.weight_norm(conv), "remove_weight_norm"),
        (lambda conv: torch.nn.utils.prune.l1_unstructured(conv, "weight", amount=0.5), "prune.remove"),
    ],
)
def test_a_layer_computing_its_weight_each_call_is_refused_naming_the_fix(tmp_path, computed, fix):
    import torch.nn.utils.prune  # noqa: F401  (the submodule the case uses)

    conv = torch.nn.Conv2d(1, 4, 3)
    conv = computed(conv) or conv
    model = torch.nn.Sequential(conv, torch.nn.ReLU(), torch.nn.Conv2d(4, 3, 3), torch.nn.Flatten()).eval()
    with pytest.raises(densecnn.errors.ModelFileError, match=re.escape(fix)):
        densecnn.save(model, tmp_path / "m", patch_size=5)
    assert not (tmp_path / "m" / "model.json").exists()


def test_a_model_with_nan_weights_is_not_saved_naming_the_tensor(tmp_path):
    """A diverged training run's weights would label every pixel no-data: save refuses them and writes nothing."""
    model = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.ReLU(), torch.nn.Conv2d(4, 2, 5)).eval()
    with torch.no_grad():
        model[0].weight.view(-1)[:12] = float("nan")
    with pytest.raises(
        densecnn.ConversionError, match=r"'0\.weight' has 12 NaN values \(of 36\).*learning rate"
    ):
        densecnn.save(model, tmp_path / "m", patch_size=7)
    assert not (tmp_path / "m").exists()


def _batch_norm_net(dims: int) -> torch.nn.Sequential:
    conv, norm = {2: (torch.nn.Conv2d, torch.nn.BatchNorm2d), 3: (torch.nn.Conv3d, torch.nn.BatchNorm3d)}[
        dims
    ]
    return torch.nn.Sequential(conv(1, 4, 3), norm(4), torch.nn.ReLU(), conv(4, 2, 3)).eval()


@pytest.mark.parametrize("dims", [2, 3])
def test_a_negative_running_variance_is_refused_at_convert_and_load(tmp_path, dims):
    """A corrupt BatchNorm variance makes every score NaN: convert refuses it, and load names the tensor."""
    model = _batch_norm_net(dims)
    densecnn.save(model, tmp_path / "m", patch_size=5)
    weights = tmp_path / "m" / "weights.safetensors"
    state = load_file(weights)
    state["1.running_var"][2] = -1.0
    save_file(state, weights)
    with pytest.raises(
        densecnn.errors.ModelFileError, match=r"tensor '1\.running_var': has 1 negative value"
    ):
        densecnn.load(tmp_path / "m")
    with torch.no_grad():
        model[1].running_var[2] = -1.0
    with pytest.raises(
        densecnn.ConversionError, match=r"running_var \+ eps is not positive in 1 of its 4 channels"
    ):
        densecnn.convert(model, 5)


def test_save_takes_the_intensity_as_text_and_refuses_other_types(tmp_path):
    model = _batch_norm_net(2)
    densecnn.save(model, tmp_path / "m", patch_size=5, intensity="percentiles:1,99.8")
    assert str(densecnn.load(tmp_path / "m").intensity) == "percentiles:1,99.8"
    with pytest.raises(
        densecnn.InvalidInputError, match="intensity is a int; give a densecnn.io.intensity.Intensity"
    ):
        densecnn.save(model, tmp_path / "n", patch_size=5, intensity=3)
    with pytest.raises(densecnn.DenseCNNError, match="not understood"):
        densecnn.save(model, tmp_path / "n", patch_size=5, intensity="percentile 1 99")
    assert not (tmp_path / "n").exists()


@pytest.mark.parametrize("file", ["model.json", "weights.safetensors"])
def test_a_fifo_in_a_model_directory_is_refused_not_read_forever(tmp_path, file):
    """Reading a FIFO blocks until something writes to it: load (and so info and serve) would hang."""
    densecnn.save(_batch_norm_net(2), tmp_path / "m", patch_size=5)
    fifo = tmp_path / "m" / file
    fifo.unlink()
    os.mkfifo(fifo)
    # a read that blocks anyway ends after 10 s (with an empty file, another error) rather than hanging the suite
    unblock = threading.Timer(10, lambda: os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)))
    unblock.start()
    try:
        with pytest.raises(densecnn.errors.ModelFileError, match=rf"{file}: not a regular file \(a FIFO"):
            densecnn.load(tmp_path / "m")
    finally:
        unblock.cancel()
