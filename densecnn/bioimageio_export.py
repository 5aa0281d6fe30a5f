"""Export a saved model as a bioimage.io model package (spec 0.5): its dense net as TorchScript and ONNX, the
model's input scaling as preprocessing, the receptive field as the output's halo, test tensors, a cover and a README.

What the package holds (``docs/bioimageio.md`` has the details):

- input ``image`` (batch, channel, [z,] y, x) in the test image's dtype (float32 where that dtype cannot hold the
  raw value of a zero-padded model's padding, :func:`input_dtype`), every spatial axis any size from
  ``max(patch, 2 * halo + 1)`` in steps of 1; output ``scores`` (batch, channel, [z,] y, x) float32 of the same
  size: the dense net's per-pixel class scores (logits, or the probabilities of a net ending in a softmax), one
  channel per class name;
- preprocessing: the model's intensity (``dtype`` or ``range``: ``scale_linear``; ``percentiles``:
  ``scale_range``), then its normalisation ``(x - mean) / std`` as a ``scale_linear`` per channel;
- a halo on each output spatial axis: the farthest pixel the net reads from its centre, so tiles cropped by it
  join into exactly the whole-image output; ``pad`` names the net's own padding mode, so a consumer that pads the
  image's border pads it as the net does. Where it cannot (:func:`differences`: zeros under unequal channel means
  or percentile scaling, and percentile scaling itself, which consumers take over the padded image), the export
  warns (:class:`BioimageioExportWarning`) and the package's README says where scores differ.

>>> densecnn.export_bioimageio("models/nuclei", "nuclei.zip", image="tests/images/nuclei.png")
PosixPath('nuclei.zip')
"""

from __future__ import annotations

import re
import tempfile
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import tifffile
import torch

from ._version import __version__
from .dense import DenseCNN
from .errors import BioimageioExportError, BioimageioExportWarning
from .io.decode_nd import read_nd
from .io.labels import score_kind
from .io.pixels import array_input
from .modelfile import LoadedModel, load
from .onnx_export import OPSET, evaluating, export_onnx, exportable
from .padding import dense_padding

if TYPE_CHECKING:
    import PIL.Image

INSTALL = "pip install 'densecnn[bioimageio]'"
INPUT, OUTPUT = "image", "scores"  # the tensor ids, the ONNX graph's names too
SPATIAL_AXES = {1: ("x",), 2: ("y", "x"), 3: ("z", "y", "x")}
# scale_range's eps: far below any float32 rounding, and a float whose YAML has a decimal point (9.09...e-13),
# which YAML 1.1 readers (PyYAML, deepImageJ's SnakeYAML) need to read it as a number: 1e-12 reads as a string
SCALE_RANGE_EPS = 2.0**-40
CITATION = (
    "Li, Zhao & Wang (2014), Highly efficient forward and backward propagation of convolutional neural networks "
    "for pixelwise classification",
    "https://arxiv.org/abs/1412.4526",
)
DEFAULT_AUTHOR = "densecnn contributors"
DEFAULT_LICENSE = "MIT"


def halo(dense: DenseCNN) -> tuple[int, ...]:
    """Per spatial axis, the farthest pixel (before or after) an output pixel reads: what a tile loses at each side.

    >>> halo(densecnn.load("models/nuclei").dense())   # a 40x40 patch reads 19 pixels before, 20 after
    (20, 20)
    """
    before, after = dense_padding(dense.patch_size, dense.receptive_field)
    return tuple(max(b, a) for b, a in zip(before, after))


def min_size(dense: DenseCNN) -> tuple[int, ...]:
    """The smallest input per spatial axis: the patch size, and more than two halos (the spec keeps at least one
    pixel after cropping both)."""
    return tuple(max(p, 2 * h + 1) for p, h in zip(dense.patch_size, halo(dense)))


def preprocessing(loaded: LoadedModel, dtype: np.dtype) -> list[dict]:
    """The model's input scaling as bioimage.io preprocessing steps (plain dicts in the spec's YAML form), for
    inputs of ``dtype``: raw values to [0, 1] as the model's intensity declares, then ``(x - mean) / std``.

    The normalisation is a ``scale_linear`` (gain 1/std, offset -mean/std), not ``fixed_zero_mean_unit_variance``:
    bioimageio.core divides that one by ``std + 1e-6``, which densecnn does not.

    >>> preprocessing(densecnn.load("models/nuclei"), np.dtype("uint8"))[1]
    {'id': 'scale_linear', 'kwargs': {'gain': 0.00392156862745098, 'offset': 0.0}}
    """
    intensity, channels = loaded.intensity, loaded.in_channels
    steps = [{"id": "ensure_dtype", "kwargs": {"dtype": "float32"}}]
    if intensity.mode == "percentiles":
        if intensity.high <= 1:
            raise BioimageioExportError(
                f"the model scales inputs by percentiles {intensity.low:g}..{intensity.high:g}, but bioimage.io's "
                "scale_range takes upper percentiles above 1 only (so that fractions are not mistaken for "
                "percentiles): this scaling cannot be written as bioimage.io preprocessing"
            )
        # over all channels of one image together, as densecnn takes them
        axes = ["channel", *SPATIAL_AXES[len(loaded.patch_size)]]
        kwargs = {
            "axes": axes,
            "min_percentile": intensity.low,
            "max_percentile": intensity.high,
            "eps": SCALE_RANGE_EPS,
        }
        steps.append({"id": "scale_range", "kwargs": kwargs})
    else:
        low, high = _range(loaded, dtype)
        if (low, high) != (0.0, 1.0):
            offset = -low / (high - low) if low else 0.0
            steps.append({"id": "scale_linear", "kwargs": {"gain": 1 / (high - low), "offset": offset}})
    if loaded.normalization:
        mean, std = loaded.normalization["mean"], loaded.normalization["std"]
        if min(std) <= 0:
            raise BioimageioExportError(
                f"the model's normalisation divides by std {std}; a std of 0 or below cannot be exported: save the "
                "model with the training images' positive per-channel std"
            )
        gain, offset = [1 / s for s in std], [-m / s for m, s in zip(mean, std)]
        if channels == 1:
            steps.append({"id": "scale_linear", "kwargs": {"gain": gain[0], "offset": offset[0]}})
        else:
            steps.append(
                {"id": "scale_linear", "kwargs": {"axis": "channel", "gain": gain, "offset": offset}}
            )
    steps.append({"id": "ensure_dtype", "kwargs": {"dtype": "float32"}})
    return steps


def _range(loaded: LoadedModel, dtype: np.dtype) -> tuple[float, float]:
    """The raw values that become 0 and 1 under a fixed intensity: the declared range, or the dtype's."""
    intensity = loaded.intensity
    if intensity.mode == "range":
        return float(intensity.low), float(intensity.high)
    return (0.0, float(np.iinfo(dtype).max)) if np.issubdtype(dtype, np.integer) else (0.0, 1.0)


def padding(loaded: LoadedModel, dtype: np.dtype) -> dict | None:
    """How a consumer pads the raw image's border so the net sees what it pads itself: ``reflect`` and ``edge``
    (replicate) as they are; zeros as the raw value that preprocessing maps to 0 in every channel, where there is
    one (a fixed intensity and equal channel means); otherwise None (the spec's default, symmetric: pixels within
    a halo of the image's border then differ from densecnn's). ``dtype``: the test image's, whose range a model
    with intensity ``dtype`` scales by; the value may be one that ``dtype`` cannot hold (see :func:`input_dtype`).

    >>> padding(densecnn.load("models/nuclei"), np.dtype("uint8"))
    {'mode': 'reflect'}
    """
    if loaded.padding_mode == "reflect":
        return {"mode": "reflect"}
    if loaded.padding_mode == "replicate":
        return {"mode": "edge"}
    if loaded.intensity.mode == "percentiles":
        return None
    low, high = _range(loaded, dtype)
    means = set(loaded.normalization["mean"]) if loaded.normalization else {0.0}
    return {"mode": "constant", "value": low + means.pop() * (high - low)} if len(means) == 1 else None


def input_dtype(loaded: LoadedModel, dtype: np.dtype) -> np.dtype:
    """The package input's dtype: the test image's ``dtype``, or float32 where the model pads with zeros and
    ``dtype`` cannot hold the raw pad value (:func:`padding`; 32.55 for uint8 under nuclei's mean): consumers pad
    the raw image before any preprocessing, in its own dtype (bioimageio.core casts 32.55 to 32), so the package
    takes the raw values as float32 (0..255 for a uint8 image: the scaling stays the test image's dtype's).

    >>> input_dtype(densecnn.load("models/nuclei"), np.dtype("uint8"))   # reflect padding: any value is fine
    dtype('uint8')
    """
    pad = padding(loaded, dtype)
    if pad is None or pad["mode"] != "constant" or _holds(dtype, pad["value"]):
        return np.dtype(dtype)
    return np.dtype(np.float32)


def _holds(dtype: np.dtype, value: float) -> bool:
    """Whether an array of ``dtype`` holds ``value`` exactly (floats: to their precision, which is enough)."""
    if not np.issubdtype(dtype, np.integer):
        return True
    info = np.iinfo(dtype)
    return float(value).is_integer() and info.min <= value <= info.max


def differences(loaded: LoadedModel, dense: DenseCNN, dtype: np.dtype) -> list[str]:
    """What a bioimage.io consumer computes otherwise than densecnn for a package exported with a test image of
    ``dtype``, one line each with its fix (empty when the package computes densecnn's scores, border included):

    - a zero-padded model whose raw pad value ``dtype`` cannot hold: the input is float32, and integer images
      (which bioimageio.core pads in their own dtype) get other scores within a halo of the border;
    - zeros that ``pad`` cannot express (channel means that differ, or percentile scaling): the consumer pads
      symmetrically, and scores within a halo of the border differ;
    - percentile scaling: bioimageio.core pads the image by the halo before it takes the percentiles (unless it
      predicts blockwise), so the whole image is scaled otherwise and scores differ everywhere.
    """
    h = max(halo(dense), default=0)
    if h == 0:  # consumers pad nothing: the net's own padding and the image's own percentiles
        return []
    lines = []
    pad = padding(loaded, dtype)
    if input_dtype(loaded, dtype) != dtype:
        value = pad["value"]
        lines.append(
            f"the model pads with zeros, the raw value {value:.6g}, which {dtype} cannot hold, so the package's input "
            f"is float32 ({dtype} values as floats): give consumers float32 images, as an integer image is padded in "
            f"its own dtype (bioimageio.core casts {value:.6g} to {_cast(value, dtype):g}) and its scores within {h} "
            "px of the border differ"
        )
    if loaded.padding_mode == "zeros" and pad is None:
        why = (
            "the scaling is per image"
            if loaded.intensity.mode == "percentiles"
            else "the channel means differ"
        )
        lines.append(
            f"the model pads with zeros, which bioimage.io's pad cannot express ({why}): consumers pad "
            f"symmetrically, so scores within {h} px of the image border differ from densecnn's; for equal scores "
            "save the model with padding_mode='reflect' or 'replicate'"
        )
    if loaded.intensity.mode == "percentiles":
        lines.append(
            "the model scales each image by its own percentiles, which bioimageio.core's whole-image predict takes "
            f"over the image padded by the {h} px halo, so its scores differ from densecnn's everywhere, not only "
            "at the border; for equal scores export a model saved with a fixed intensity (intensity='range:L,H')"
        )
    return lines


def _cast(value: float, dtype: np.dtype) -> float:
    """``value`` as numpy pads an array of ``dtype`` with it (as bioimageio.core does): cast, not rounded."""
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return float(np.array([value]).astype(dtype)[0])


def read_test_image(image, loaded: LoadedModel, smallest: tuple[int, ...]) -> np.ndarray:
    """The raw test image as (C, *spatial), channel first, in its own dtype: a path to an image, TIFF stack or
    .npy file, or an array already channel first (a single channel's may leave the channel axis out). Refused
    unless it has the model's channels and at least ``smallest`` pixels per axis."""
    dims = len(loaded.patch_size)
    if isinstance(image, np.ndarray):
        array = image if image.ndim == dims + 1 else image[None]
    else:
        array = read_nd(image, dims)
    if array.ndim != dims + 1 or array.shape[0] != loaded.in_channels:
        raise BioimageioExportError(
            f"the test image has shape {array.shape}, but the model takes {loaded.in_channels} channel(s) and "
            f"{dims} spatial axes: give an image of {loaded.in_channels} channel(s), channel first"
        )
    if any(s < m for s, m in zip(array.shape[1:], smallest)):
        raise BioimageioExportError(
            f"the test image's spatial shape {array.shape[1:]} is below the package's minimum input {smallest}; "
            "give a larger test image"
        )
    if array.dtype.kind not in "uif":
        raise BioimageioExportError(f"the test image holds {array.dtype} values; give integers or floats")
    return np.ascontiguousarray(array)


def identifier(text: str) -> str:
    """``text`` as a bioimage.io identifier (a letter first, then letters, digits and underscores).

    >>> identifier("nucleus boundary")
    'nucleus_boundary'
    """
    name = re.sub(r"[^A-Za-z0-9_]+", "_", text.strip()).strip("_")
    return name if re.match(r"[A-Za-z]", name) else f"c_{name}"


def _cover(raw: np.ndarray, scores: np.ndarray, palette: list[list[int]]) -> PIL.Image.Image:
    """The test image (its middle plane for a volume) beside its label map in the model's colours."""
    from PIL import Image

    middle = tuple(s // 2 for s in raw.shape[1:-2])  # leading spatial axes of a volume: their middle plane
    plane = raw[(slice(None), *middle)].astype(np.float64)  # (C, H, W)
    plane = plane[:3] if plane.shape[0] >= 3 else plane[:1].repeat(3, 0)
    low, high = np.percentile(plane, (0.5, 99.5))
    grey = np.clip((plane - low) / max(high - low, 1e-12) * 255, 0, 255).astype(np.uint8).transpose(1, 2, 0)
    labels = scores[0].argmax(0)[middle]  # (H, W)
    colours = np.asarray(palette, np.uint8)[labels]
    return Image.fromarray(np.concatenate([grey, colours], axis=1))


# what the README says the scores are, by score_kind
_SCORES_ARE = {
    "logits": "These are logits: the argmax is the label, a softmax over the channels gives class probabilities.",
    "probabilities": "The net ends in a softmax: these are class probabilities, and their argmax is the label.",
    "log-probabilities": "The net ends in a log-softmax: these are log class probabilities (their exp the "
    "probabilities), and their argmax is the label.",
}


def _readme(loaded: LoadedModel, dense: DenseCNN, name: str, dtype: np.dtype, steps: list[dict]) -> str:
    axes = ", ".join(SPATIAL_AXES[dense.dims])
    classes = ", ".join(f"{k} {c}" for k, c in enumerate(loaded.class_names))
    size = "x".join(map(str, dense.patch_size))
    preprocessing_lines = [f"  - `{s['id']}` {s['kwargs']}" for s in steps]
    card = loaded.path / "README.md" if loaded.path is not None else None
    declared = input_dtype(loaded, dtype)
    as_floats = ""
    if declared != dtype:  # the test image's values as floats, for the zero padding's sake: said below
        as_floats = f" (the raw {dtype} values as floats: cast {dtype} images to float32, see below)"
    differ = differences(loaded, dense, dtype)
    return "\n".join(
        [
            f"# {name}",
            "",
            f"A densecnn patch classifier ({size} patches: each patch's centre pixel gets a class) exported by "
            f"densecnn {__version__} as its exact dense net: one pass labels every pixel with the scores "
            "patch-by-patch scanning gives (Li, Zhao & Wang, 2014).",
            "",
            "## Input",
            "",
            f"`{INPUT}` (batch, channel, {axes}), {declared}{as_floats}, {loaded.in_channels} channel(s), each "
            "spatial axis any size "
            f"from {min_size(dense)}. Preprocessing (densecnn's intensity `{loaded.intensity}`, then the "
            "normalisation of the training images):",
            "",
            *preprocessing_lines,
            "",
            f"The net pads the image itself ({dense.padding_mode} padding), so the output has the input's size.",
            "",
            "## Where a consumer's scores differ from densecnn's",
            "",
            *(
                [f"- {line}." for line in differ]
                if differ
                else [
                    "Nowhere: the declared padding is the net's own, and the preprocessing is densecnn's scaling, so "
                    "whole-image and tiled predictions give densecnn's scores, border included."
                ]
            ),
            "",
            "## Output",
            "",
            f"`{OUTPUT}` (batch, channel, {axes}) float32, the input's size: one score per class ({classes}). "
            f"{_SCORES_ARE[score_kind(dense)]}",
            "",
            f"Halo {halo(dense)} ({axes}): an output pixel reads the input at most that far away. Predict tiles "
            "overlapping by twice the halo and crop the halo from each tile: the tiles join into the whole-image "
            "output exactly.",
            "",
            "## Weights",
            "",
            f"TorchScript (traced) and ONNX (opset {OPSET}) of the same dense net: stride-1 dilated convolutions "
            "and poolings, the image padding included.",
            "",
            *_validation(loaded),
            *(
                ["## Model card", "", "The densecnn model card: `model_card.md`.", ""]
                if card and card.is_file()
                else []
            ),
        ]
    )


def _validation(loaded: LoadedModel) -> list[str]:
    """The README's "Validation" section: the held-out metrics the training run recorded, where it did."""
    lines = [
        "## Validation",
        "",
        "The test output is densecnn's dense scores for the test input; both weights reproduce it (bioimageio.core's "
        "`test_model`). To validate the model on your data, compare the argmax of the scores with labelled images "
        "(per-class IoU).",
        "",
    ]
    training = loaded.extra.get("training") if isinstance(loaded.extra, dict) else None
    val = training.get("val") if isinstance(training, dict) else None  # as densecnn train records it
    if not isinstance(val, dict) or not isinstance(val.get("iou"), list):
        return [*lines, "No held-out metrics were recorded for this model.", ""]
    table = ["| class | IoU |", "|---|---|"]
    table += [f"| {c} | {iou:.4f} |" for c, iou in zip(loaded.class_names, val["iou"]) if iou is not None]
    if val.get("mean_iou") is not None:
        table.append(f"| **mean IoU** | {val['mean_iou']:.4f} |")
    config = training.get("config")
    where = config.get("val") if isinstance(config, dict) else None
    held_out = f" on `{where}`" if where else ""
    return [*lines, f"Recorded when it was trained: whole-image dense prediction{held_out}.", "", *table, ""]


def export_bioimageio(
    model,
    path,
    *,
    image,
    name: str | None = None,
    description: str | None = None,
    authors: list[str] | None = None,
    maintainers: list[str] | None = None,
    license: str = DEFAULT_LICENSE,
) -> Path:
    """Write ``model`` (a model directory or a :class:`~densecnn.LoadedModel`) as a bioimage.io model package,
    a .zip at ``path``. ``image``: the raw test image (a file path, or an array channel first) whose dense scores
    become the package's test output. ``name`` defaults to the model directory's name; ``authors`` to the
    model's ``extra["authors"]``, else "densecnn contributors"; ``maintainers``: GitHub user names (bioimage.io
    wants one to accept an upload: without, its validator warns); ``license`` is an SPDX id.

    >>> export_bioimageio("models/nuclei", "nuclei.zip", image="tests/images/nuclei.png", authors=["Ada"],
    ...                   maintainers=["ada-lovelace"])
    PosixPath('nuclei.zip')

    Warns:
        BioimageioExportWarning: one line per place where a consumer's scores differ from densecnn's
            (:func:`differences`), each with its fix; the package's README lists them too.

    Raises:
        BioimageioExportError: bioimage.io's spec is not installed, the model's input scaling cannot be written
            as preprocessing, or the test image does not fit the model.
    """
    try:
        from bioimageio.spec import save_bioimageio_package
        from bioimageio.spec.model import v0_5
    except ImportError:
        raise BioimageioExportError(f"bioimage.io export needs bioimageio.spec: {INSTALL}") from None
    loaded = _float32_model(model)
    dense = loaded.dense(backend="native")
    raw = read_test_image(image, loaded, min_size(dense))
    steps = preprocessing(loaded, raw.dtype)
    x = array_input(raw, loaded)  # (1, C, *spatial): scaled and normalised as densecnn does
    for line in differences(loaded, dense, raw.dtype):
        warnings.warn(line, BioimageioExportWarning, stacklevel=2)
    with torch.no_grad():
        scores = dense(x).numpy()  # (1, K, *spatial) float32
    name = name or _package_name(loaded)
    authors = authors or (loaded.extra or {}).get("authors") or [DEFAULT_AUTHOR]

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        attachments, covers = _write_files(tmp, loaded, dense, raw, x, scores, name, steps)
        inputs, outputs = _tensors(v0_5, tmp, loaded, dense, raw.dtype, steps)
        descr = _description(
            v0_5, tmp, loaded, dense,
            name=name, description=description, authors=authors, maintainers=maintainers or [], license=license,
            attachments=attachments, covers=covers, inputs=inputs, outputs=outputs,
        )  # fmt: skip
        return Path(save_bioimageio_package(descr, output_path=Path(path)))


def _float32_model(model) -> LoadedModel:
    """``model`` loaded (unless it is already), refused unless its weights are float32."""
    loaded = model if isinstance(model, LoadedModel) else load(model)
    if loaded.dtype != torch.float32:
        raise BioimageioExportError(
            f"the model's weights are {loaded.dtype}; bioimage.io consumers run float32: save a float32 copy "
            "(model.float()) and export that"
        )
    return loaded


def _package_name(loaded: LoadedModel) -> str:
    """The package name "densecnn DIRECTORY", in the characters and length bioimage.io allows."""
    return re.sub(r"[^A-Za-z0-9_+\- ()]", "-", f"densecnn {loaded.path.name if loaded.path else 'model'}")[
        :64
    ]


def _description(v0_5, tmp: Path, loaded, dense, *, name, description, authors, maintainers, license, attachments,
                 covers, inputs, outputs):  # fmt: skip
    """The package's ``v0_5.ModelDescr`` over the files written in ``tmp``, validated by bioimage.io's spec (a
    :class:`BioimageioExportError` listing what it refuses)."""
    import pydantic

    try:
        return v0_5.ModelDescr(
            name=name,
            description=description or f"densecnn pixel classifier: {', '.join(loaded.class_names)}",
            authors=[v0_5.Author(name=a) for a in authors],
            maintainers=[_maintainer(v0_5, m) for m in maintainers],
            cite=[v0_5.CiteEntry(text=CITATION[0], url=CITATION[1])],
            license=license,
            documentation=v0_5.FileDescr(source=tmp / "README.md"),
            covers=[v0_5.FileDescr(source=cover) for cover in covers],
            attachments=attachments,
            tags=["densecnn", "pixel-classification", "semantic-segmentation", f"{dense.dims}d"],
            inputs=inputs,
            outputs=outputs,
            weights=v0_5.WeightsDescr(
                torchscript=v0_5.TorchscriptWeightsDescr(
                    source=tmp / "weights.pt", pytorch_version=torch.__version__.split("+")[0]
                ),
                onnx=v0_5.OnnxWeightsDescr(
                    source=tmp / "weights.onnx", opset_version=OPSET, parent="torchscript"
                ),
            ),
            config={"densecnn": _densecnn_config(loaded, dense)},
        )
    except pydantic.ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise BioimageioExportError(f"bioimage.io's spec refuses the description: {problems}") from None


def _write_files(tmp: Path, loaded, dense, raw: np.ndarray, x: torch.Tensor, scores: np.ndarray, name: str,
                 steps: list) -> tuple[list, list]:  # fmt: skip
    """The package's files in ``tmp``: test and sample tensors, both weights, the README, the model card and a
    cover; returns (attachments, cover paths)."""
    # the raw values, as the package takes them (as floats where its dtype cannot hold the zero padding)
    stored = raw.astype(input_dtype(loaded, raw.dtype), copy=False)
    np.save(tmp / "test_input.npy", stored[None])
    np.save(tmp / "test_output.npy", scores)
    # for people: the same tensors, in a format imageio reads
    tifffile.imwrite(tmp / "sample_input.tif", stored, photometric="minisblack")
    tifffile.imwrite(tmp / "sample_output.tif", scores[0], photometric="minisblack")
    with evaluating(exportable(dense)) as module, warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # TorchScript's deprecation notice; the format bioimage.io reads
        # traced on a corner of the smallest input: the padding reads the input's size, so any size runs
        traced = torch.jit.trace(module, x[(..., *(slice(0, m) for m in min_size(dense)))])
    traced.save(str(tmp / "weights.pt"))
    export_onnx(dense, tmp / "weights.onnx")
    (tmp / "README.md").write_text(_readme(loaded, dense, name, raw.dtype, steps))
    attachments, covers = [], []
    card = loaded.path / "README.md" if loaded.path is not None else None
    if card is not None and card.is_file():
        (tmp / "model_card.md").write_text(card.read_text())
        attachments.append({"source": tmp / "model_card.md"})
    if dense.dims >= 2:
        _cover(raw, scores, loaded.palette).save(tmp / "cover.png")
        covers.append(tmp / "cover.png")
    return attachments, covers


def _tensors(v0_5, tmp: Path, loaded, dense, dtype: np.dtype, steps: list) -> tuple[list, list]:
    """The input and output tensor descriptions: axes (the input's least size, the output's halo), test and
    sample tensors, the preprocessing ``steps`` and the padding, for a test image of ``dtype``."""
    spatial = SPATIAL_AXES[dense.dims]
    input_axes = [
        v0_5.BatchAxis(),
        v0_5.ChannelAxis(channel_names=[f"channel{c}" for c in range(loaded.in_channels)]),
        *(
            v0_5.SpaceInputAxis(id=a, size=v0_5.ParameterizedSize(min=m, step=1), concatenable=True)
            for a, m in zip(spatial, min_size(dense))
        ),
    ]
    output_axes = [
        v0_5.BatchAxis(),
        v0_5.ChannelAxis(channel_names=[identifier(c) for c in loaded.class_names]),
        *(_output_axis(v0_5, a, h) for a, h in zip(spatial, halo(dense))),
    ]
    pad = padding(loaded, dtype)
    declared = input_dtype(loaded, dtype)
    data = {"type": str(declared)}
    if declared != dtype and np.issubdtype(dtype, np.integer):  # the test image's integers, as floats
        data["range"] = (float(np.iinfo(dtype).min), float(np.iinfo(dtype).max))
    inputs = [
        v0_5.InputTensorDescr(
            id=INPUT,
            axes=input_axes,
            data=v0_5.IntervalOrRatioDataDescr(**data),
            test_tensor=v0_5.FileDescr(source=tmp / "test_input.npy"),
            sample_tensor=v0_5.FileDescr(source=tmp / "sample_input.tif"),
            preprocessing=steps,
            **({"pad": pad} if pad else {}),
        )
    ]
    outputs = [
        v0_5.OutputTensorDescr(
            id=OUTPUT,
            axes=output_axes,
            description=f"per-pixel class scores ({score_kind(dense)})",
            test_tensor=v0_5.FileDescr(source=tmp / "test_output.npy"),
            sample_tensor=v0_5.FileDescr(source=tmp / "sample_output.tif"),
        )
    ]
    return inputs, outputs


def _densecnn_config(loaded, dense) -> dict:
    """What densecnn records in the package's config: its version and the geometry and scaling it computes with."""
    return {
        "version": __version__,
        "patch_size": list(dense.patch_size),
        "receptive_field": list(dense.receptive_field),
        "padding_mode": dense.padding_mode,
        "intensity": loaded.intensity.to_json(),
        "normalization": loaded.normalization,
    }


def _maintainer(v0_5, github_user: str):
    """A maintainer; the spec's validator looks the user up on GitHub."""
    import httpx

    try:
        return v0_5.Maintainer(github_user=github_user)
    except httpx.TransportError as exc:
        raise BioimageioExportError(
            f"bioimage.io's validator could not look up the GitHub user {github_user!r} ({exc}); export on a machine "
            "that reaches api.github.com, or without maintainers"
        ) from None


def _output_axis(v0_5, axis: str, size_halo: int):
    """An output spatial axis the input's size (a size reference), with the halo where the net reads any."""
    size = v0_5.SizeReference(tensor_id=INPUT, axis_id=axis)
    if size_halo:
        return v0_5.SpaceOutputAxisWithHalo(id=axis, size=size, halo=size_halo)
    return v0_5.SpaceOutputAxis(id=axis, size=size)
