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

from .atomic import atomic_write
from .chain import extract_chain
from .convert import as_patch_size, convert
from .dense import DenseCNN
from .errors import ModelFileError
from .modelformat import (
    FLOAT_DTYPES,
    FORMAT,
    FORMAT_VERSION,
    TensorInfo,
    file_error,
    first_line,
    parse_config,
    read_weights_header,
)
from .padding import check_padding_mode
from .rules import PatchSizeError
from .spec import from_spec, to_spec

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

    @property
    def dtype(self) -> torch.dtype:
        """The dtype the weights were saved in (and are kept in): float32, float64, float16 or bfloat16."""
        return next((p.dtype for p in self.model.parameters() if p.is_floating_point()), torch.float32)

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        """(N, C, H, W) images scaled to [0, 1] -> the model's input: ``(x - mean) / std`` per channel, in the
        model's dtype (computed in the wider of the two)."""
        x = x.to(torch.promote_types(x.dtype, self.dtype))
        if self.normalization:
            mean = x.new_tensor(self.normalization["mean"]).view(1, -1, 1, 1)
            std = x.new_tensor(self.normalization["std"]).view(1, -1, 1, 1)
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
    parsed = parse_config(text, where=where)
    meta = _build_on_meta(parsed, where=where)
    _check_weights(
        meta, {name: TensorInfo(t.dtype, tuple(t.shape)) for name, t in state.items()}, where=where
    )
    out.mkdir(parents=True, exist_ok=True)
    tensors = {name: tensor.detach().cpu().contiguous() for name, tensor in state.items()}
    atomic_write(out / WEIGHTS_FILE, lambda tmp: save_file(tensors, tmp, metadata={"format": FORMAT}))
    atomic_write(out / CONFIG_FILE, lambda tmp: tmp.write_text(text))
    return out


def load(path) -> LoadedModel:
    """Read a model directory written by :func:`save` (no pickle is ever loaded), keeping the saved dtype.

    The whole directory is validated before any tensor is allocated: ``model.json`` against the format (types,
    ranges, layer types and arguments, lengths of class names, palette and normalisation), the layers against
    each other and the patch size (on the meta device), and every tensor's name, shape and dtype against the
    weights file's header. Only then are the weights read, straight into the layers.

    Raises:
        ModelFileError: naming the file, the key (such as ``layers[3].kernel_size``), the problem and the fix.

    >>> loaded = densecnn.load("models/nuclei")
    >>> labels = loaded.dense().predict(loaded.normalize(images))  # (N, H, W)
    """
    directory = Path(path)
    config_path, weights_path = directory / CONFIG_FILE, directory / WEIGHTS_FILE
    config = parse_config(_read_text(config_path), where=config_path)
    header = read_weights_header(weights_path)
    model = _build_on_meta(config, where=config_path)
    _check_conversion(model, config, where=config_path)
    _check_weights(model, header, where=weights_path)
    try:
        state = load_file(weights_path)
    except (SafetensorError, OSError) as exc:
        raise file_error(
            weights_path, None, f"cannot be read ({exc})", "write the model again with densecnn.save"
        ) from None
    model.load_state_dict(state, assign=True)  # the file's tensors become the parameters: no copy, no cast
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
    )


def _read_text(config_path: Path) -> str:
    if not config_path.parent.is_dir():
        raise file_error(config_path.parent, None, "no such directory", "give the path of a model directory")
    try:
        return config_path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise file_error(
            config_path.parent, None, f"not a model directory: {CONFIG_FILE} is missing",
            f"give a directory written by densecnn.save ({CONFIG_FILE} + {WEIGHTS_FILE})",
        ) from None  # fmt: skip
    except UnicodeDecodeError:
        raise file_error(
            config_path, None, "not UTF-8 text", "write the file as JSON (densecnn.save does)"
        ) from None
    except OSError as exc:
        raise file_error(
            config_path, None, f"cannot be read ({exc.strerror or exc})", "check the file"
        ) from None


def _build_on_meta(config, *, where: Path) -> nn.Sequential:
    """The layers ``config`` describes, on the meta device: shapes without memory, nothing initialised."""
    layers = []
    with torch.device("meta"):
        for index, entry in enumerate(config.layers):
            try:
                layers.append(from_spec([entry.model_dump(exclude_unset=True)])[0])
            except (ModelFileError, TypeError, ValueError, RuntimeError, OverflowError) as exc:
                reason = first_line(
                    exc.__context__ if isinstance(exc, ModelFileError) and exc.__context__ else exc
                )
                raise file_error(
                    where,
                    f"layers[{index}]",
                    f"{entry.type} rejects these arguments ({reason})",
                    "correct them",
                ) from None
    return nn.Sequential(*layers).eval()


def _check_conversion(model: nn.Sequential, config, *, where: Path) -> None:
    """The meta layers must convert at ``patch_size`` (the conversion walks sizes and channels from the layers'
    arguments, without tensors) and map ``in_channels`` to ``num_classes``."""
    patch = "x".join(map(str, config.patch_size))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter(
                "ignore"
            )  # warnings about the model are for dense(), which converts it again
            dense = convert(model, config.patch_size, padding_mode=config.padding_mode)
    except PatchSizeError as exc:
        raise file_error(
            where, "patch_size", f"{patch} does not fit the layers ({exc})", "set it to the size the model was trained with"
        ) from None  # fmt: skip
    except Exception as exc:  # any rejection of a hand-written file's layers is a problem of that file
        raise file_error(
            where, "layers", f"the layers do not convert to a dense net ({first_line(exc)})",
            "correct them (densecnn.save writes only models that convert)",
        ) from None  # fmt: skip
    if dense.num_classes != config.num_classes:
        raise file_error(
            where, "num_classes", f"is {config.num_classes}, but the layers give {dense.num_classes} scores per patch",
            f"set it to {dense.num_classes}, with as many class_names and palette colours",
        )  # fmt: skip
    if dense.in_channels is not None and dense.in_channels != config.in_channels:
        raise file_error(
            where, "in_channels", f"is {config.in_channels}, but the first layer takes {dense.in_channels} channels",
            f"set it to {dense.in_channels} (with as many normalization values)",
        )  # fmt: skip


def _check_weights(model: nn.Sequential, tensors: dict[str, TensorInfo], *, where: Path) -> None:
    """Every tensor the layers hold must be in ``tensors`` (a weights file's header) with its shape, and nothing
    else; float tensors share one of :data:`FLOAT_DTYPES`, the others keep their dtype (e.g. int64 counters)."""
    expected = {name: TensorInfo(t.dtype, tuple(t.shape)) for name, t in model.state_dict().items()}
    fix = f"{CONFIG_FILE} and {WEIGHTS_FILE} must come from the same densecnn.save: save the model again"
    totals = (
        f"the layers need {sum(i.numel for i in expected.values()):,} values in all, "
        f"the file holds {sum(i.numel for i in tensors.values()):,}"
    )

    def owner(name: str) -> str:
        index = name.split(".", 1)[0]
        return f"layers[{index}] ({type(model[int(index)]).__name__})"

    for name, info in expected.items():
        if name not in tensors:
            raise file_error(
                where, f"tensor {name!r}", f"missing; {owner(name)} needs it, shape {list(info.shape)} ({totals})", fix
            )  # fmt: skip
        if tensors[name].shape != info.shape:
            raise file_error(
                where, f"tensor {name!r}",
                f"has shape {list(tensors[name].shape)}, but {owner(name)} needs {list(info.shape)} ({totals})", fix,
            )  # fmt: skip
    for name in tensors.keys() - expected.keys():
        raise file_error(where, f"tensor {name!r}", f"no layer in {CONFIG_FILE} holds it ({totals})", fix)
    float_dtypes = set()
    for name, info in expected.items():
        have = tensors[name].dtype
        if info.dtype.is_floating_point and have in FLOAT_DTYPES:
            float_dtypes.add(have)
        elif have != info.dtype or info.dtype.is_floating_point:
            wanted = (
                " or ".join(map(_dtype_name, FLOAT_DTYPES)) if info.dtype.is_floating_point else info.dtype
            )
            raise file_error(
                where, f"tensor {name!r}", f"is {_dtype_name(have)}, but {owner(name)} needs {_dtype_name(wanted)}", fix
            )  # fmt: skip
    if len(float_dtypes) > 1:
        raise file_error(
            where, None, f"mixes float dtypes ({', '.join(sorted(map(_dtype_name, float_dtypes)))})",
            "cast the model to one dtype (model.to(torch.float32)) and save it again",
        )  # fmt: skip


def _dtype_name(dtype) -> str:
    return str(dtype).removeprefix("torch.")
