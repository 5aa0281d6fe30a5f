"""bioimage.io export: the package passes the spec's validator, and its weights, run on its test input after its
own preprocessing, reproduce densecnn's dense scores (bioimageio.core's test_model, and onnxruntime/TorchScript)."""

import sys
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import densecnn
from densecnn.bioimageio_export import export_bioimageio, halo
from densecnn.cli import main
from densecnn.errors import BioimageioExportError
from densecnn.io.intensity import Intensity

spec = pytest.importorskip(
    "bioimageio.spec", reason="the bioimageio extra is not installed: pip install 'densecnn[bioimageio]'"
)
ort = pytest.importorskip("onnxruntime", reason="the onnx extra is not installed")
ruyaml = pytest.importorskip("ruyaml")  # YAML 1.2, as rdf.yaml is written (bioimageio.spec needs it)

ROOT = Path(__file__).resolve().parents[2]
NUCLEI, NUCLEI3D = ROOT / "models" / "nuclei", ROOT / "models" / "nuclei3d"
IMAGE = ROOT / "tests" / "images" / "nuclei.png"
RELATIVE = 1e-5  # the weights vs densecnn's dense net, relative to the largest score


def _rdf(package: Path) -> dict:
    with zipfile.ZipFile(package) as archive:
        return ruyaml.YAML(typ="safe", pure=True).load(archive.read("rdf.yaml"))


def _read_as_yaml_1_1(package: Path) -> dict:
    yaml = pytest.importorskip("yaml")
    with zipfile.ZipFile(package) as archive:
        return yaml.safe_load(archive.read("rdf.yaml"))


def _array(package: Path, name: str) -> np.ndarray:
    with zipfile.ZipFile(package) as archive, archive.open(name) as stream:
        return np.load(stream)


def _preprocess(raw: np.ndarray, steps: list[dict]) -> np.ndarray:
    """The spec's preprocessing steps as the spec defines them, in numpy (independent of densecnn and core)."""
    x = raw
    for step in steps:
        kwargs = step.get("kwargs", {})
        if step["id"] == "ensure_dtype":
            x = x.astype(kwargs["dtype"])
        elif step["id"] == "scale_linear":
            shape = (1, -1) + (1,) * (x.ndim - 2) if "axis" in kwargs else ()
            x = x * np.reshape(kwargs["gain"], shape) + np.reshape(kwargs["offset"], shape)
        elif step["id"] == "scale_range":  # over every non-batch axis: one image's channels together
            low, high = np.percentile(x[0], (kwargs["min_percentile"], kwargs["max_percentile"]))
            x = (x - low) / (high - low + kwargs["eps"])
        else:
            raise AssertionError(f"unexpected step {step['id']}")
    return x.astype(np.float32)


def _weights(package: Path, tmp_path: Path) -> dict:
    """Both weights of the package, each as a function (N, C, *spatial) float32 -> scores."""
    rdf = _rdf(package)
    with zipfile.ZipFile(package) as archive:
        archive.extract(rdf["weights"]["torchscript"]["source"], tmp_path)
        onnx_bytes = archive.read(rdf["weights"]["onnx"]["source"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch's notice that TorchScript is deprecated
        traced = torch.jit.load(str(tmp_path / rdf["weights"]["torchscript"]["source"]))
    session = ort.InferenceSession(onnx_bytes, providers=["CPUExecutionProvider"])

    def torchscript(x: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return traced(torch.from_numpy(np.ascontiguousarray(x))).numpy()

    def onnx(x: np.ndarray) -> np.ndarray:
        return session.run(None, {"image": np.ascontiguousarray(x)})[0]

    return {"torchscript": torchscript, "onnx": onnx}


def _check_weights_reproduce(package: Path, tmp_path: Path) -> None:
    """Both weights, on the package's test input after its preprocessing, give its test output."""
    rdf = _rdf(package)
    x = _preprocess(_array(package, "test_input.npy"), rdf["inputs"][0]["preprocessing"])
    expected = _array(package, "test_output.npy")
    for run in _weights(package, tmp_path).values():
        np.testing.assert_allclose(run(x), expected, rtol=0, atol=RELATIVE * np.abs(expected).max())


MAINTAINER = "densecnn-maintainer"


@pytest.fixture(scope="module", autouse=True)
def _known_maintainer():
    """The spec's validator looks maintainers up on GitHub unless it knows them: it knows this one (no network)."""
    from bioimageio.spec._internal.constants import KNOWN_GITHUB_USERS

    KNOWN_GITHUB_USERS.add(MAINTAINER)
    yield
    KNOWN_GITHUB_USERS.discard(MAINTAINER)


@pytest.fixture(scope="module")
def nuclei_package(tmp_path_factory) -> Path:
    """The shipped nuclei model with the shipped example image, exported once for this module."""
    out = tmp_path_factory.mktemp("bioimageio") / "nuclei.zip"
    return export_bioimageio(NUCLEI, out, image=IMAGE, maintainers=[MAINTAINER])


def _valid(package: Path) -> None:
    """The spec's validator: "valid-format" (its best without running the weights: bioimageio.core's test_model
    runs them, below), with neither errors nor warnings."""
    summary = spec.load_description(package).validation_summary
    assert summary.status == "valid-format" and not summary.warnings, summary.format()


def test_nuclei_package_passes_the_spec_validator_and_reproduces_its_test_tensors(nuclei_package, tmp_path):
    package = nuclei_package
    _valid(package)
    rdf = _rdf(package)
    assert rdf["format_version"].startswith("0.5.")
    (inp,), (out,) = rdf["inputs"], rdf["outputs"]
    assert [a["type"] for a in inp["axes"]] == ["batch", "channel", "space", "space"]
    assert [a["size"]["min"] for a in inp["axes"][2:]] == [41, 41]  # two halos and a pixel; the patch is 40
    assert [a["halo"] for a in out["axes"][2:]] == [20, 20]
    assert out["axes"][2]["size"] == {"tensor_id": "image", "axis_id": "y"}
    assert out["axes"][1]["channel_names"] == ["background", "nucleus", "boundary"]
    assert inp["pad"] == {"mode": "reflect"}
    assert {"torchscript", "onnx"} <= set(rdf["weights"])
    loaded = densecnn.load(NUCLEI)
    raw = _array(package, "test_input.npy")
    assert raw.dtype == np.uint8 and raw.shape == (1, 1, 512, 512)
    with torch.no_grad():
        dense = loaded.dense()(densecnn.io.array_input(raw[0], loaded)).numpy()
    np.testing.assert_allclose(
        _array(package, "test_output.npy"), dense, rtol=0, atol=RELATIVE * np.abs(dense).max()
    )
    _check_weights_reproduce(package, tmp_path)
    with zipfile.ZipFile(package) as archive:
        assert {"README.md", "cover.png", "model_card.md"} <= set(archive.namelist())
        readme = archive.read("README.md").decode()
    assert "## Where a consumer's scores differ from densecnn's\n\nNowhere:" in readme  # reflect padding


@pytest.mark.parametrize("weights", ["torchscript", "onnx"])
def test_tiles_cropped_by_the_halo_join_into_the_whole_output(nuclei_package, tmp_path, weights):
    """What a consumer tiling by the halo does: pad the raw image's border as declared, preprocess, run
    overlapping tiles (other sizes than the test input's), crop each by the halo."""
    package = nuclei_package
    rdf = _rdf(package)
    h = rdf["outputs"][0]["axes"][2]["halo"]
    raw = _array(package, "test_input.npy")[..., :200, :150]  # (1, 1, 200, 150)
    padded = np.pad(raw, ((0, 0), (0, 0), (h, h), (h, h)), mode=rdf["inputs"][0]["pad"]["mode"])
    x = _preprocess(padded, rdf["inputs"][0]["preprocessing"])
    run = _weights(package, tmp_path)[weights]
    whole = run(x)[..., h:-h, h:-h]
    tiles = [run(x[..., start : stop + 2 * h])[..., h:-h, h:-h] for start, stop in [(0, 90), (90, 150)]]
    np.testing.assert_allclose(np.concatenate(tiles, axis=-1), whole, rtol=0, atol=1e-5)
    loaded = densecnn.load(
        NUCLEI
    )  # and the border pixels are the dense net's own: the declared padding is its
    with torch.no_grad():
        expected = loaded.dense()(densecnn.io.array_input(raw[0], loaded)).numpy()
    np.testing.assert_allclose(whole, expected, rtol=0, atol=RELATIVE * np.abs(expected).max())


@pytest.mark.parametrize("model", ["nuclei", "percentiles"])
def test_bioimageio_core_reproduces_the_test_tensors(nuclei_package, tmp_path, model):
    core = pytest.importorskip(
        "bioimageio.core", reason="bioimageio.core is not installed: pip install 'densecnn[bioimageio]'"
    )
    package = nuclei_package
    if (
        model == "percentiles"
    ):  # per-image percentiles: core computes them itself, then the normalisation along the channels
        directory = _saved(
            tmp_path,
            channels=2,
            intensity=Intensity("percentiles", 1, 99.8),
            normalization={"mean": [0.5, 0.4], "std": [0.25, 0.2]},
        )
        raw = np.random.default_rng(2).integers(0, 4096, (2, 70, 60)).astype(np.uint16)
        package = export_bioimageio(directory, tmp_path / "p.zip", image=raw, maintainers=[MAINTAINER])
    summary = core.test_model(package)
    assert summary.status == "passed", summary.format()


def test_bioimageio_core_predicts_blockwise_exactly(nuclei_package):
    """core's own tiling (blocks of 41 + 60 pixels, the halo padded as declared) gives densecnn's whole-image
    scores, border included."""
    core = pytest.importorskip(
        "bioimageio.core", reason="bioimageio.core is not installed: pip install 'densecnn[bioimageio]'"
    )
    raw = np.ascontiguousarray(_array(nuclei_package, "test_input.npy")[..., :200, :150])
    loaded = densecnn.load(NUCLEI)
    with torch.no_grad():
        expected = loaded.dense()(densecnn.io.array_input(raw[0], loaded)).numpy()
    sample = core.predict(model=nuclei_package, inputs={"image": raw}, blocksize_parameter=60)
    scores = sample.members["scores"].data.values
    np.testing.assert_allclose(scores, expected, rtol=0, atol=RELATIVE * np.abs(expected).max())


def _saved(tmp_path, *, channels=1, **kwargs) -> Path:
    torch.manual_seed(0)
    model, patch = densecnn.zoo.tiny(in_channels=channels, num_classes=3)
    return densecnn.save(
        model.eval(), tmp_path / "tiny", patch_size=patch, class_names=["bg", "cell body", "edge"], **kwargs
    )


@pytest.mark.parametrize(
    ("intensity", "dtype", "normalization", "padding_mode"),
    [
        (Intensity("range", 0, 4095), "uint16", {"mean": [0.2, 0.3], "std": [0.1, 0.2]}, "zeros"),
        (Intensity("percentiles", 1, 99.8), "uint16", {"mean": [0.5, 0.5], "std": [0.25, 0.25]}, "replicate"),
        (Intensity(), "float32", None, "zeros"),
    ],
)
def test_intensity_and_normalisation_become_preprocessing(
    tmp_path, intensity, dtype, normalization, padding_mode
):
    directory = _saved(
        tmp_path, channels=2, intensity=intensity, normalization=normalization, padding_mode=padding_mode
    )
    rng = np.random.default_rng(0)
    raw = rng.uniform(0, 1, (2, 33, 30)) if dtype == "float32" else rng.integers(0, 4096, (2, 33, 30))
    from densecnn.errors import BioimageioExportWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", BioimageioExportWarning)
        package = export_bioimageio(
            directory,
            tmp_path / "tiny.zip",
            image=raw.astype(dtype),
            authors=["A. Author"],
            maintainers=[MAINTAINER],
        )
    # where a consumer's scores differ, the export says so: zeros under unequal channel means at the border,
    # percentile scaling everywhere
    said = [str(w.message) for w in caught if issubclass(w.category, BioimageioExportWarning)]
    assert [("channel means differ" in m, "percentiles" in m) for m in said] == {
        "range": [(True, False)],
        "percentiles": [(False, True)],
        "dtype": [],
    }[intensity.mode], said
    _valid(package)
    rdf = _rdf(package)
    assert _read_as_yaml_1_1(package) == rdf  # PyYAML and deepImageJ read YAML 1.1, where "1e-12" is a string
    assert rdf["outputs"][0]["axes"][1]["channel_names"] == ["bg", "cell_body", "edge"]
    assert rdf["authors"] == [{"name": "A. Author"}]
    steps = rdf["inputs"][0]["preprocessing"]
    assert [s["id"] for s in steps][1:-1] == {
        "range": ["scale_linear", "scale_linear"],
        "percentiles": ["scale_range", "scale_linear"],
        "dtype": [],
    }[intensity.mode]
    # the spec's preprocessing of the raw test input is densecnn's own scaling and normalisation
    loaded = densecnn.load(directory)
    np.testing.assert_allclose(
        _preprocess(_array(package, "test_input.npy"), steps),
        densecnn.io.array_input(raw.astype(dtype), loaded).numpy(),
        rtol=1e-6,
        atol=1e-6,
    )
    pad = rdf["inputs"][0].get("pad")
    if padding_mode == "zeros":  # the raw value that preprocessing maps to 0, where every channel shares it
        assert pad == ({"mode": "constant", "value": 0.0} if normalization is None else None)
    else:
        assert pad == {"mode": "edge"}
    _check_weights_reproduce(package, tmp_path)


def test_volume_package(tmp_path):
    raw = np.random.default_rng(1).integers(0, 256, (1, 12, 44, 46)).astype(np.uint8)
    package = export_bioimageio(NUCLEI3D, tmp_path / "nuclei3d.zip", image=raw, maintainers=[MAINTAINER])
    _valid(package)
    rdf = _rdf(package)
    assert [a.get("id", a["type"]) for a in rdf["inputs"][0]["axes"]] == ["batch", "channel", "z", "y", "x"]
    assert [a["halo"] for a in rdf["outputs"][0]["axes"][2:]] == list(halo(densecnn.load(NUCLEI3D).dense()))
    _check_weights_reproduce(package, tmp_path)


@pytest.mark.parametrize(
    ("ending", "kind"),
    [
        ((), "logits"),
        ((nn.Softmax(1), nn.Dropout(0.2)), "probabilities"),
        ((nn.LogSoftmax(1),), "log-probabilities"),
    ],
    ids=["logits", "softmax-dropout", "log-softmax"],
)
def test_the_package_says_what_its_scores_are(tmp_path, ending, kind):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 5), nn.ReLU(), nn.Conv2d(4, 3, 5), *ending).eval()
    directory = densecnn.save(model, tmp_path / "model", patch_size=9)
    image = np.random.default_rng(0).integers(0, 256, (1, 20, 20), dtype=np.uint8)
    package = export_bioimageio(directory, tmp_path / "p.zip", image=image, maintainers=[MAINTAINER])
    assert _rdf(package)["outputs"][0]["description"] == f"per-pixel class scores ({kind})"
    with zipfile.ZipFile(package) as archive:
        readme = archive.read("README.md").decode()
    assert ("softmax over the channels gives class probabilities" in readme) == (kind == "logits")


def test_refusals_name_the_problem(tmp_path):
    directory = _saved(tmp_path, intensity=Intensity("percentiles", 0, 0.5))
    with pytest.raises(BioimageioExportError, match="upper percentiles above 1"):
        export_bioimageio(directory, tmp_path / "p.zip", image=np.zeros((1, 40, 40), np.uint8))
    directory = _saved(tmp_path)
    with pytest.raises(BioimageioExportError, match="1 channel"):
        export_bioimageio(directory, tmp_path / "c.zip", image=np.zeros((3, 40, 40), np.uint8))
    with pytest.raises(BioimageioExportError, match="minimum input"):
        export_bioimageio(directory, tmp_path / "s.zip", image=np.zeros((1, 5, 40), np.uint8))
    image = np.arange(1600, dtype=np.uint8).reshape(1, 40, 40)
    with pytest.raises(BioimageioExportError, match="spec refuses the description.*name"):
        export_bioimageio(directory, tmp_path / "n.zip", image=image, name="abc")  # 5 characters at least
    model, patch = densecnn.zoo.tiny(in_channels=1, num_classes=3)
    directory = densecnn.save(model.double().eval(), tmp_path / "f64", patch_size=patch)
    with pytest.raises(BioimageioExportError, match="float64"):
        export_bioimageio(directory, tmp_path / "d.zip", image=image)


def test_a_missing_extra_is_named(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "bioimageio.spec", None)  # import fails
    with pytest.raises(BioimageioExportError, match=r"densecnn\[bioimageio\]"):
        export_bioimageio(_saved(tmp_path), tmp_path / "m.zip", image=np.zeros((1, 40, 40), np.uint8))


def test_export_bioimageio_command(tmp_path, capsys):
    out = tmp_path / "nuclei.zip"
    assert (
        main(
            [
                "export-bioimageio",
                str(NUCLEI),
                str(out),
                "--image",
                str(IMAGE),
                "--author",
                "Ada",
                "--maintainer",
                MAINTAINER,
            ]
        )
        == 0
    )
    captured = capsys.readouterr()
    assert f"wrote {out}" in captured.out and "warning" not in captured.err  # nuclei's package is densecnn's
    assert _rdf(out)["authors"] == [{"name": "Ada"}]
    assert main(["export-bioimageio", str(NUCLEI), str(out), "--image", str(tmp_path / "none.png")]) == 2
    assert "none.png" in capsys.readouterr().err


# --- where a bioimage.io consumer pads the image's border itself: its scores against densecnn's, border included


def _core():
    return pytest.importorskip(
        "bioimageio.core", reason="bioimageio.core is not installed: pip install 'densecnn[bioimageio]'"
    )


def _nuclei_resaved(tmp_path: Path, **kwargs) -> Path:
    """The shipped nuclei weights saved again with another padding or intensity."""
    nuclei = densecnn.load(NUCLEI)
    settings = dict(
        patch_size=nuclei.patch_size, class_names=nuclei.class_names, normalization=nuclei.normalization
    )
    return densecnn.save(nuclei.model, tmp_path / "resaved", **{**settings, **kwargs})


def _crop() -> np.ndarray:
    """157 x 143 pixels of the example image (1, H, W) uint8: nuclei touch its borders."""
    from PIL import Image

    return np.asarray(Image.open(IMAGE))[None, :157, :143]


def _export_recording(directory: Path, out: Path, raw: np.ndarray) -> tuple[Path, list[str]]:
    """The package, and the BioimageioExportWarning lines its export gave."""
    from densecnn.errors import BioimageioExportWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", BioimageioExportWarning)
        package = export_bioimageio(directory, out, image=raw, maintainers=[MAINTAINER])
    return package, [str(w.message) for w in caught if issubclass(w.category, BioimageioExportWarning)]


def _densecnn_scores(directory: Path, raw: np.ndarray) -> np.ndarray:
    loaded = densecnn.load(directory)
    with torch.no_grad():
        return loaded.dense()(densecnn.io.array_input(raw, loaded)).numpy()


def _core_scores(package: Path, raw: np.ndarray, blocksize: int | None) -> np.ndarray:
    """bioimageio.core's prediction for ``raw`` (C, H, W) given in the package's declared input dtype, as a
    consumer gives it: whole (blocksize None: core pads the whole image by the halo) or in blocks."""
    dtype = _rdf(package)["inputs"][0]["data"]["type"]
    sample = _core().predict(
        model=package, inputs={"image": raw[None].astype(dtype)}, blocksize_parameter=blocksize
    )
    return sample.members["scores"].data.values


@pytest.mark.parametrize(
    ("intensity", "dtype"),
    [("dtype", "uint8"), ("range:100,3000", "uint16"), ("dtype", "int16")],
)
def test_zero_padding_whose_raw_value_the_dtype_cannot_hold_gives_densecnn_scores(tmp_path, intensity, dtype):
    """A zero-padded model (densecnn.save's default) pads with the raw value its preprocessing maps to 0: 32.55 for
    uint8 under nuclei's mean, which no uint8 array holds (bioimageio.core pads the raw array in its own dtype, so
    it was cast to 32: 11 labels of this crop differed at the border). The package's input is float32 instead, and
    a consumer giving it float32 gets densecnn's scores and labels, border included."""
    crop = _crop()
    raw = {
        "uint8": crop,
        "uint16": crop.astype(np.uint16) * 11 + 100,
        "int16": (crop.astype(np.int16) - 128) * 200,
    }[dtype]
    directory = _nuclei_resaved(tmp_path, padding_mode="zeros", intensity=intensity)
    package, lines = _export_recording(directory, tmp_path / "p.zip", raw)
    _valid(package)
    rdf = _rdf(package)
    data, pad = rdf["inputs"][0]["data"], rdf["inputs"][0]["pad"]
    assert data["type"] == "float32" and data["range"] == [np.iinfo(dtype).min, np.iinfo(dtype).max]
    assert pad["mode"] == "constant" and not float(pad["value"]).is_integer()
    test_input = _array(package, "test_input.npy")
    assert test_input.dtype == np.float32 and np.array_equal(test_input[0], raw)  # the raw values, as floats
    assert len(lines) == 1 and "float32" in lines[0] and f"which {dtype} cannot hold" in lines[0], lines
    expected = _densecnn_scores(directory, raw)
    atol = RELATIVE * np.abs(expected).max()
    for blocksize in (None, 20):
        scores = _core_scores(package, raw, blocksize)
        np.testing.assert_allclose(scores, expected, rtol=0, atol=atol, err_msg=f"blocksize {blocksize}")
        assert np.array_equal(scores.argmax(1), expected.argmax(1))
    _check_weights_reproduce(package, tmp_path)
    assert _core().test_model(package).status == "passed"


def test_zero_padding_the_dtype_holds_keeps_the_dtype(tmp_path):
    """Under range:100,3000 with mean 0 the pad value is 100, which uint16 holds: the input stays uint16, and
    bioimageio.core's whole-image prediction is densecnn's, border included."""
    crop = _crop().astype(np.uint16) * 11 + 100
    directory = _nuclei_resaved(
        tmp_path,
        padding_mode="zeros",
        intensity="range:100,3000",
        normalization={"mean": [0.0], "std": [0.3]},
    )
    package, lines = _export_recording(directory, tmp_path / "p.zip", crop)
    rdf = _rdf(package)
    assert rdf["inputs"][0]["data"]["type"] == "uint16"
    assert rdf["inputs"][0]["pad"] == {"mode": "constant", "value": 100.0} and lines == []
    expected = _densecnn_scores(directory, crop)
    np.testing.assert_allclose(
        _core_scores(package, crop, None), expected, rtol=0, atol=RELATIVE * np.abs(expected).max()
    )


@pytest.mark.parametrize("padding_mode", ["reflect", "zeros"])
def test_percentile_scaling_warns_that_whole_image_prediction_differs_everywhere(tmp_path, padding_mode):
    """bioimageio.core pads the whole image by the halo before it takes the percentiles, so it scales the image
    otherwise than densecnn: scores differ far from the border too. The export says so (and, for zeros, that the
    border differs), with the fix; core's blockwise prediction takes them over the image itself."""
    raw = _crop().astype(np.uint16) * 16
    directory = _nuclei_resaved(tmp_path, padding_mode=padding_mode, intensity="percentiles:1,99.8")
    package, lines = _export_recording(directory, tmp_path / "p.zip", raw)
    assert any("percentiles" in line and "everywhere" in line and "range:L,H" in line for line in lines), (
        lines
    )
    border = [line for line in lines if "border differ" in line and "padding_mode='reflect'" in line]
    assert len(border) == (padding_mode == "zeros"), lines
    with zipfile.ZipFile(package) as archive:
        readme = archive.read("README.md").decode()
    assert all(line in readme for line in lines)
    expected = _densecnn_scores(directory, raw)
    h = halo(densecnn.load(directory).dense())[0]
    interior = (..., slice(h, -h), slice(h, -h))
    atol = RELATIVE * np.abs(expected).max()
    # what the warning says: core's whole-image scores differ more than a halo away from the border (if core ever
    # takes the percentiles before padding, this fails: then drop the warning)
    whole = _core_scores(package, raw, None)
    assert np.abs(whole - expected)[interior].max() > 100 * atol
    blocks = _core_scores(package, raw, 20)
    np.testing.assert_allclose(blocks[interior], expected[interior], rtol=0, atol=atol)
    if (
        padding_mode == "reflect"
    ):  # the declared padding is the net's: blockwise is densecnn's, border included
        np.testing.assert_allclose(blocks, expected, rtol=0, atol=atol)


def test_export_command_prints_where_scores_differ(tmp_path, capsys):
    directory = _nuclei_resaved(tmp_path, padding_mode="zeros")
    image = tmp_path / "crop.npy"
    np.save(image, _crop())
    out = tmp_path / "p.zip"
    assert (
        main(
            ["export-bioimageio", str(directory), str(out), "--image", str(image), "--maintainer", MAINTAINER]
        )
        == 0
    )
    captured = capsys.readouterr()
    assert f"wrote {out}" in captured.out
    (line,) = [line for line in captured.err.splitlines() if line]
    assert line.startswith("densecnn export-bioimageio: warning: ") and "float32" in line
