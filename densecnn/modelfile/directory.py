"""Model directories: ``model.json`` (layer spec + metadata) and ``weights.safetensors``. Loading never unpickles."""

from __future__ import annotations

import colorsys
import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from ..atomic import atomic_write
from ..chain import extract_chain
from ..convert import convert
from ..dense import DenseCNN
from ..errors import ConversionError
from ..io.intensity import Intensity
from ..padding import check_padding_mode
from .check import TensorInfo, check_directory, check_weights
from .format import (
    CONFIG_FILE,
    FORMAT,
    FORMAT_VERSION,
    WEIGHTS_FILE,
    build_on_meta,
    file_error,
    parse_config,
)
from .spec import full_state, saved_state, to_spec


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
        intensity: how raw pixel values are scaled to [0, 1] before the normalisation (:mod:`densecnn.io.intensity`;
            the default, for files that declare none: by the dtype's range).
        pixel_size: micrometres per pixel along each axis of the images it was trained on, or None (``densecnn
            predict`` then reads an OME-Zarr image at the level of that pixel size).
        path: the directory it was read from.
    """

    model: nn.Sequential
    patch_size: tuple[int, ...]
    in_channels: int
    num_classes: int
    class_names: list[str]
    palette: list[list[int]]
    normalization: dict[str, list[float]] | None
    padding_mode: str
    path: Path | None = None
    extra: dict = field(default_factory=dict)
    intensity: Intensity = field(default_factory=Intensity)
    pixel_size: tuple[float, ...] | None = None

    def dense(self, *, backend: str = "auto") -> DenseCNN:
        """The dense net of this model (sharing its parameters), with the saved padding mode (verified once, by
        :func:`load`)."""
        return convert(
            self.model, self.patch_size, padding_mode=self.padding_mode, backend=backend, verify=False
        )

    @property
    def dtype(self) -> torch.dtype:
        """The dtype the weights were saved in (and are kept in): float32, float64, float16 or bfloat16."""
        return next((p.dtype for p in self.model.parameters() if p.is_floating_point()), torch.float32)

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        """(N, C, H, W) images scaled to [0, 1] -> the model's input: ``(x - mean) / std`` per channel, in the
        model's dtype (computed in the wider of the two). Signals (N, C, L) and volumes (N, C, D, H, W) alike."""
        x = x.to(torch.promote_types(x.dtype, self.dtype))
        if self.normalization:
            per_channel = (1, -1) + (1,) * (x.dim() - 2)  # broadcast over N and every spatial axis
            mean = x.new_tensor(self.normalization["mean"]).view(per_channel)
            std = x.new_tensor(self.normalization["std"]).view(per_channel)
            x = (x - mean) / std
        return x.to(self.dtype)


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
    intensity: Intensity | None = None,
    pixel_size=None,
) -> Path:
    """Write ``model`` to the directory ``path`` as ``model.json`` + ``weights.safetensors``.

    The model must convert at ``patch_size`` (checked before anything is written). ``normalization`` is
    ``{"mean": [...], "std": [...]}`` per input channel, applied to images scaled to [0, 1]; ``intensity`` says how
    raw pixel values are scaled to [0, 1] (:class:`~densecnn.io.intensity.Intensity`; by default by their dtype's
    range, and then the key is left out); ``pixel_size`` the micrometres per pixel of the training images, one per
    axis (optional). ``extra`` is free-form JSON metadata kept in ``model.json``.

    >>> model, patch = densecnn.zoo.tiny(in_channels=1, num_classes=3)
    >>> densecnn.save(model, "models/tiny", patch_size=patch, class_names=["bg", "cell", "edge"])
    PosixPath('models/tiny')
    """
    check_padding_mode(padding_mode)
    dense = convert(model, patch_size, padding_mode=padding_mode)  # validates that the model converts exactly
    patch = dense.patch_size
    num_classes, in_channels = dense.num_classes, dense.in_channels
    state = saved_state(nn.Sequential(*[module for _, module in extract_chain(model)]))
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
        **({"intensity": intensity.to_json()} if intensity is not None and intensity != Intensity() else {}),
        **({"pixel_size": [float(s) for s in pixel_size]} if pixel_size is not None else {}),
        "padding_mode": padding_mode,
        "layers": to_spec(model),
        "extra": extra or {},
    }
    out = Path(path)
    where = f"{out / CONFIG_FILE} (not written)"
    try:
        text = json.dumps(config, indent=2, allow_nan=False) + "\n"
    except (TypeError, ValueError) as exc:
        raise file_error(
            where, None, f"the metadata is not plain JSON ({exc})", "pass lists, numbers and strings"
        ) from None
    # the checks load makes, so that save never writes a directory load refuses
    layers = build_on_meta(parse_config(text, where=where), where=where)
    check_weights(
        layers, {name: TensorInfo(t.dtype, tuple(t.shape)) for name, t in state.items()}, where=where
    )
    out.mkdir(parents=True, exist_ok=True)
    tensors = {name: tensor.detach().cpu().contiguous() for name, tensor in state.items()}
    atomic_write(out / WEIGHTS_FILE, lambda tmp: save_file(tensors, tmp, metadata={"format": FORMAT}))
    atomic_write(out / CONFIG_FILE, lambda tmp: tmp.write_text(text))
    return out


_VERIFIED: set[tuple] = (
    set()
)  # (directory, its files' identities) whose dense net passed the verification pass


def _verify_once(directory: Path, model: nn.Sequential, config) -> None:
    files = [directory / CONFIG_FILE, directory / WEIGHTS_FILE]
    key = (directory.resolve(), *((f.stat().st_ino, f.stat().st_size, f.stat().st_mtime_ns) for f in files))
    if key in _VERIFIED:
        return
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the model's warnings are for dense(), which converts it again
            convert(model, config.patch_size, padding_mode=config.padding_mode)
    except ConversionError as exc:
        raise file_error(
            directory, None, f"its dense net does not reproduce its patch model ({exc})",
            "report this, with the directory, as a densecnn bug",
        ) from None  # fmt: skip
    _VERIFIED.add(key)


def load(path) -> LoadedModel:
    """Read a model directory written by :func:`save` (no pickle is ever loaded), keeping the saved dtype.

    The whole directory is validated before any tensor is allocated: ``model.json`` against the format (types,
    ranges, layer types and arguments, lengths of class names, palette and normalisation), the layers against
    each other and the patch size (on the meta device), and every tensor's name, shape and dtype against the
    weights file's header. Only then are the weights read, straight into the layers.

    Once per directory and process (again if a file changes), the dense net is checked against the patch model on
    random patches (:mod:`densecnn.verify`).

    Raises:
        ModelFileError: naming the file, the key (such as ``layers[3].kernel_size``), the problem and the fix.

    >>> loaded = densecnn.load("models/nuclei")
    >>> labels = loaded.dense().predict(loaded.normalize(images))  # (N, H, W)
    """
    directory = Path(path)
    config, model = check_directory(directory)
    try:
        state = load_file(directory / WEIGHTS_FILE)
    except (SafetensorError, OSError) as exc:
        raise file_error(
            directory / WEIGHTS_FILE,
            None,
            f"cannot be read ({exc})",
            "write the model again with densecnn.save",
        ) from None
    # the file's tensors become the parameters (no copy, no cast); a reused layer shares its first use's
    model.load_state_dict(full_state(model, state), assign=True)
    _verify_once(directory, model, config)
    return LoadedModel(
        model=model,
        patch_size=config.patch_size,
        in_channels=config.in_channels,
        num_classes=config.num_classes,
        class_names=config.class_names,
        palette=[list(colour) for colour in config.palette],
        normalization=config.normalization.model_dump() if config.normalization else None,
        padding_mode=config.padding_mode,
        path=directory,
        extra=config.extra,
        intensity=Intensity.from_json(config.intensity.model_dump() if config.intensity else None),
        pixel_size=None if config.pixel_size is None else tuple(config.pixel_size),
    )
