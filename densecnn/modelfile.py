"""Model directories: ``model.json`` (layer spec + metadata) and ``weights.safetensors``. Loading never unpickles."""

from __future__ import annotations

import colorsys
import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from .atomic import atomic_write
from .chain import extract_chain
from .convert import as_patch_size, convert
from .dense import DenseCNN
from .errors import ModelFileError
from .padding import check_padding_mode
from .spec import from_spec, to_spec

FORMAT = "densecnn-model"
FORMAT_VERSION = 1
CONFIG_FILE = "model.json"
WEIGHTS_FILE = "weights.safetensors"


def default_palette(num_classes: int) -> list[list[int]]:
    """Distinct RGB colours: black for class 0, then hues spaced by the golden ratio."""
    colours = [[0, 0, 0]]
    for k in range(1, num_classes):
        r, g, b = colorsys.hsv_to_rgb((k * 0.618033988749895) % 1.0, 0.75, 1.0 if k % 2 else 0.8)
        colours.append([round(r * 255), round(g * 255), round(b * 255)])
    return colours[:num_classes]


@dataclass
class LoadedModel:
    """A patch model read from a model directory, with its metadata.

    Attributes:
        model: the patch classifier (an ``nn.Sequential``, in eval mode).
        patch_size, in_channels, num_classes, class_names, palette, normalization, padding_mode: as saved.
        path: the directory it was read from.
    """

    model: nn.Sequential
    patch_size: tuple[int, int]
    in_channels: int
    num_classes: int
    class_names: list[str]
    palette: list[list[int]]
    normalization: dict[str, list[float]] | None
    padding_mode: str
    path: Path | None = None
    extra: dict = field(default_factory=dict)

    def dense(self, *, backend: str = "auto") -> DenseCNN:
        """The dense net of this model (sharing its parameters), with the saved padding mode."""
        return convert(self.model, self.patch_size, padding_mode=self.padding_mode, backend=backend)

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        """(N, C, H, W) images scaled to [0, 1] -> the model's input: ``(x - mean) / std`` per channel."""
        if not self.normalization:
            return x
        mean = x.new_tensor(self.normalization["mean"]).view(1, -1, 1, 1)
        std = x.new_tensor(self.normalization["std"]).view(1, -1, 1, 1)
        return (x - mean) / std


def save(
    model: nn.Module,
    path,
    *,
    patch_size,
    class_names: list[str] | None = None,
    palette: list[list[int]] | None = None,
    normalization: dict[str, list[float]] | None = None,
    padding_mode: str = "zeros",
    extra: dict | None = None,
) -> Path:
    """Write ``model`` to the directory ``path`` as ``model.json`` + ``weights.safetensors``.

    The model must convert at ``patch_size`` (checked before anything is written). ``normalization`` is
    ``{"mean": [...], "std": [...]}`` per input channel, applied to images scaled to [0, 1]. ``extra`` is free-form
    JSON metadata kept in ``model.json``.

    >>> model, patch = densecnn.zoo.tiny(in_channels=1, num_classes=3)
    >>> densecnn.save(model, "models/tiny", patch_size=patch, class_names=["bg", "cell", "edge"])
    PosixPath('models/tiny')
    """
    patch = as_patch_size(patch_size)
    check_padding_mode(padding_mode)
    dense = convert(model, patch, padding_mode=padding_mode)  # validates that the model converts exactly
    num_classes, in_channels = dense.num_classes, dense.in_channels
    spec = to_spec(model)
    sequential = from_spec(spec)
    state = nn.Sequential(*[module for _, module in extract_chain(model)]).state_dict()
    class_names = list(class_names) if class_names is not None else [f"class_{k}" for k in range(num_classes)]
    palette = [list(map(int, c)) for c in palette] if palette is not None else default_palette(num_classes)
    config = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "patch_size": list(patch),
        "in_channels": in_channels,
        "num_classes": num_classes,
        "class_names": class_names,
        "palette": palette,
        "normalization": normalization,
        "padding_mode": padding_mode,
        "layers": spec,
        "extra": extra or {},
    }
    _validate_config(config, where="save()")
    sequential.load_state_dict(state)  # the spec rebuilds exactly this model
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {name: tensor.detach().cpu().contiguous() for name, tensor in state.items()}
    atomic_write(out / WEIGHTS_FILE, lambda tmp: save_file(tensors, tmp, metadata={"format": FORMAT}))
    atomic_write(out / CONFIG_FILE, lambda tmp: tmp.write_text(json.dumps(config, indent=2) + "\n"))
    return out


def load(path) -> LoadedModel:
    """Read a model directory written by :func:`save` (no pickle is ever loaded).

    >>> loaded = densecnn.load("models/nuclei")
    >>> labels = loaded.dense().predict(loaded.normalize(images))  # (N, H, W)
    """
    directory = Path(path)
    config_path = directory / CONFIG_FILE
    if not config_path.is_file():
        raise ModelFileError(f"{directory} is not a model directory: {CONFIG_FILE} is missing")
    try:
        config = json.loads(config_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelFileError(f"{config_path} is not valid JSON: {exc}") from None
    _validate_config(config, where=str(config_path))
    model = from_spec(config["layers"])
    try:
        state = load_file(directory / WEIGHTS_FILE)
    except (FileNotFoundError, SafetensorError, OSError) as exc:
        raise ModelFileError(f"cannot read {directory / WEIGHTS_FILE}: {exc}") from None
    try:
        model.load_state_dict(state)
    except RuntimeError as exc:
        raise ModelFileError(
            f"{directory / WEIGHTS_FILE} does not match the layers in {CONFIG_FILE}: {exc}"
        ) from None
    model.eval()
    return LoadedModel(
        model=model,
        patch_size=tuple(config["patch_size"]),
        in_channels=config["in_channels"],
        num_classes=config["num_classes"],
        class_names=config["class_names"],
        palette=config["palette"],
        normalization=config["normalization"],
        padding_mode=config["padding_mode"],
        path=directory,
        extra=config.get("extra", {}),
    )


def _validate_config(config: dict, *, where: str) -> None:
    def fail(why: str):
        raise ModelFileError(f"{where}: {why}")

    if not isinstance(config, dict) or config.get("format") != FORMAT:
        fail(f'not a densecnn model file (expected "format": "{FORMAT}")')
    if config.get("format_version") != FORMAT_VERSION:
        fail(
            f"format_version {config.get('format_version')!r} is not supported (this densecnn reads {FORMAT_VERSION})"
        )
    for key in (
        "patch_size",
        "in_channels",
        "num_classes",
        "class_names",
        "palette",
        "padding_mode",
        "layers",
    ):
        if key not in config:
            fail(f"missing key {key!r}")
    k = config["num_classes"]
    if len(config["class_names"]) != k:
        fail(f"{len(config['class_names'])} class_names for {k} classes")
    palette = config["palette"]
    if len(palette) != k or any(len(c) != 3 or not all(0 <= int(v) <= 255 for v in c) for c in palette):
        fail(f"palette must be {k} [r, g, b] colours with values in 0..255")
    normalization = config.get("normalization")
    if normalization is not None:
        c = config["in_channels"]
        if set(normalization) != {"mean", "std"} or any(
            len(normalization[key]) != c for key in ("mean", "std")
        ):
            fail(f'normalization must be {{"mean": [{c} values], "std": [{c} values]}}')
        if any(s <= 0 for s in normalization["std"]):
            fail("normalization std values must be > 0")
    try:
        check_padding_mode(config["padding_mode"])
    except ValueError as exc:
        fail(str(exc))
