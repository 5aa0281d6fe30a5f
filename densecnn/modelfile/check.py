"""Checking a model directory before loading it: the config, the layers it builds (on the meta device), and the
weights file's header, so that a broken or hostile directory fails fast, before any tensor is allocated.

>>> config, layers = check_directory(Path("models/nuclei"))   # layers on the meta device
>>> read_weights_header(Path("models/nuclei/weights.safetensors"))["0.weight"]
TensorInfo(dtype=torch.float32, shape=(8, 1, 3, 3))
"""

from __future__ import annotations

import json
import math
import os
import stat
import warnings
from pathlib import Path
from typing import Annotated, NamedTuple

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from torch import nn

from ..convert import layer_channels
from ..errors import PatchSizeError
from .format import (
    CONFIG_FILE,
    WEIGHTS_FILE,
    build_on_meta,
    file_error,
    first_line,
    json_path,
    parse_config,
)
from .spec import saved_state

# the float dtypes a model's weights may be saved in (all of a model's float tensors share one)
FLOAT_DTYPES = (torch.float64, torch.float32, torch.float16, torch.bfloat16)
_SAFETENSORS_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
_MAX_HEADER_BYTES = 100 * 2**20  # the limit the safetensors library itself enforces


# ---- weights.safetensors, from its header only
_MAGIC = {  # what other weight files start with
    b"PK\x03\x04": "a zip archive (torch.save's format, a pickle inside)",
    b"\x89HDF": "an HDF5 file (Keras' format)",
    b"\x93NUMPY": "a NumPy .npy array",
}
_NOT_SAFETENSORS_FIX = (
    "densecnn never loads pickles: load the checkpoint into your model in trusted code (torch.load) and write "
    "the model directory with densecnn.save"
)


def _other_format(start: bytes) -> str:
    """What a weights file whose first bytes are not a safetensors header is, from those bytes (only ever asked once
    the header itself failed to read: a safetensors header's length may start with any bytes)."""
    for magic, what in _MAGIC.items():
        if start.startswith(magic):
            return what
    if start[:1] == b"\x80" and start[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"):
        return "a Python pickle (torch.save's legacy format)"
    return "its first bytes are not a safetensors header (an 8-byte length, then a JSON object)"


def _header_bytes(path: Path) -> bytes:
    """The JSON header of a safetensors file: its first 8 bytes are the header's length (little-endian), then that
    many bytes of JSON object. A file without that shape is named by its own first bytes."""
    fix = "write the model again with densecnn.save"
    size = _regular_file(path).st_size
    with path.open("rb") as file:
        start = file.read(9)
        if len(start) < 9:
            raise file_error(path, None, f"truncated: {size} bytes, too short for its header", fix)
        if start[8:9] != b"{":
            raise file_error(
                path, None, f"not a safetensors file: {_other_format(start)}", _NOT_SAFETENSORS_FIX
            )
        length = int.from_bytes(start[:8], "little")
        if length > size - 8:
            raise file_error(path, None, f"truncated: {size} bytes, too short for its header", fix)
        if length > _MAX_HEADER_BYTES:
            raise file_error(path, None, f"a header of {length} bytes is larger than safetensors allows", fix)
        file.seek(8)
        return file.read(length)


class TensorInfo(NamedTuple):
    """A tensor as the weights file's header describes it."""

    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


class _HeaderEntry(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    dtype: str
    shape: list[Annotated[int, Field(ge=0)]]
    data_offsets: Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=2, max_length=2)]


def read_weights_header(path: Path) -> dict[str, TensorInfo]:
    """The tensors a ``.safetensors`` file holds (name -> dtype, shape), read from its header without loading data.

    The header must be well formed and every tensor's byte range must lie inside the file and fit its dtype and
    shape, so that loading it afterwards cannot fail or allocate more than the file holds.
    """
    fix = "write the model again with densecnn.save"
    try:
        size = path.stat().st_size
        header_bytes = _header_bytes(path)
    except FileNotFoundError:
        raise file_error(
            path, None, "missing", f"put the model's weights next to its model.json, or {fix}"
        ) from None
    except OSError as exc:
        raise file_error(path, None, f"cannot be read ({exc.strerror or exc})", "check the file") from None
    try:
        header = json.loads(header_bytes)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise file_error(path, None, "not a safetensors file (its header is not JSON)", fix) from None
    if not isinstance(header, dict):
        raise file_error(path, None, "not a safetensors file (its header is not a JSON object)", fix)
    header.pop("__metadata__", None)
    data_bytes = size - 8 - len(header_bytes)
    tensors = {}
    for name, raw in header.items():
        try:
            entry = _HeaderEntry.model_validate(raw)
        except ValidationError as exc:
            problem = (
                f"malformed header entry ({exc.errors()[0]['msg']} at {json_path(exc.errors()[0]['loc'])})"
            )
            raise file_error(path, f"tensor {name!r}", problem, fix) from None
        dtype = _SAFETENSORS_DTYPES.get(entry.dtype)
        if dtype is None:
            raise file_error(
                path, f"tensor {name!r}", f"dtype {entry.dtype} is not supported",
                f"save the model in one of {', '.join(str(d).removeprefix('torch.') for d in FLOAT_DTYPES)}",
            )  # fmt: skip
        info = TensorInfo(dtype, tuple(entry.shape))
        begin, end = entry.data_offsets
        if end < begin or end - begin != info.numel * dtype.itemsize or end > data_bytes:
            raise file_error(
                path, f"tensor {name!r}",
                f"its bytes {begin}..{end} do not hold a {entry.dtype} tensor of shape {list(info.shape)} inside "
                f"the file's {data_bytes} data bytes (truncated or corrupt)", fix,
            )  # fmt: skip
        tensors[name] = info
    return tensors


# ---- the whole directory
def check_directory(directory: Path) -> tuple[BaseModel, nn.Sequential]:
    """Validate a model directory without reading a tensor: the config, its layers (built on the meta device and
    converted at the patch size) and the weights file's header. Returns (config, the layers on the meta device),
    ready for ``load_state_dict(weights, assign=True)``.

    Raises:
        ModelFileError: naming the file, the key, the problem and the fix.
    """
    config_path = directory / CONFIG_FILE
    config = parse_config(_read_text(config_path), where=config_path)
    header = read_weights_header(directory / WEIGHTS_FILE)
    layers = build_on_meta(config, where=config_path)
    check_conversion(layers, config, where=config_path)
    check_weights(layers, header, where=directory / WEIGHTS_FILE)
    return config, layers


def _regular_file(path: Path) -> os.stat_result:
    """``path``'s status; refused unless it is a regular file (a FIFO or a device would block the read, or never
    end it)."""
    status = path.stat()
    if not stat.S_ISREG(status.st_mode):
        kind = "a directory" if stat.S_ISDIR(status.st_mode) else "a FIFO, socket or device"
        raise file_error(
            path, None, f"not a regular file ({kind})", "give a model directory written by densecnn.save"
        )
    return status


def _read_text(config_path: Path) -> str:
    try:
        _regular_file(config_path)
        return config_path.read_text(encoding="utf-8")
    except FileNotFoundError:
        absent = "" if config_path.parent.is_dir() else " (no such directory)"
        raise file_error(
            config_path.parent, None, f"not a model directory: {CONFIG_FILE} is missing{absent}",
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


def check_conversion(model: nn.Sequential, config, *, where: Path) -> None:
    """The meta layers must convert at ``patch_size`` (the conversion walks sizes and channels from the layers'
    arguments, without tensors; the verification pass runs once the weights are read) and map ``in_channels`` to
    ``num_classes``."""
    patch = "x".join(map(str, config.patch_size))
    try:
        with warnings.catch_warnings():
            # warnings about the model are for dense(), which converts it again
            warnings.simplefilter("ignore")
            in_channels, num_classes = layer_channels(model, config.patch_size)
    except PatchSizeError as exc:
        raise file_error(
            where, "patch_size", f"{patch} does not fit the layers ({exc})", "set it to the size the model was trained with"
        ) from None  # fmt: skip
    except Exception as exc:  # any rejection of a hand-written file's layers is a problem of that file
        raise file_error(
            where, "layers", f"the layers do not convert to a dense net ({first_line(exc)})",
            "correct them (densecnn.save writes only models that convert)",
        ) from None  # fmt: skip
    if num_classes != config.num_classes:
        raise file_error(
            where, "num_classes", f"is {config.num_classes}, but the layers give {num_classes} scores per patch",
            f"set it to {num_classes}, with as many class_names and palette colours",
        )  # fmt: skip
    if in_channels is not None and in_channels != config.in_channels:
        raise file_error(
            where, "in_channels", f"is {config.in_channels}, but the first layer takes {in_channels} channels",
            f"set it to {in_channels} (with as many normalization values)",
        )  # fmt: skip


def check_weights(model: nn.Sequential, tensors: dict[str, TensorInfo], *, where: Path) -> None:
    """Every tensor the layers hold must be in ``tensors`` (a weights file's header) with its shape, and nothing
    else; float tensors share one of :data:`FLOAT_DTYPES`, the others keep their dtype (e.g. int64 counters)."""
    expected = {name: TensorInfo(t.dtype, tuple(t.shape)) for name, t in saved_state(model).items()}
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
    unexpected = sorted(tensors.keys() - expected.keys())
    if unexpected:
        raise file_error(
            where, f"tensor {unexpected[0]!r}", f"no layer in {CONFIG_FILE} holds it ({totals})", fix
        )
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
