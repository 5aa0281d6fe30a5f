"""The format of ``model.json``: a pydantic schema, built from the layer types a spec may name and their
constructors' own signatures, and the layers it describes, built on the meta device.

Every problem becomes one :class:`~densecnn.ModelFileError` that names the file, the key (a JSON path such as
``layers[3].kernel_size``), what is wrong and how to fix it.

>>> config = parse_config(Path("models/nuclei/model.json").read_text(), where="models/nuclei/model.json")
>>> config.patch_size, config.num_classes
((40, 40), 3)
>>> build_on_meta(config, where="models/nuclei/model.json")[0].weight.device
device(type='meta')
"""

from __future__ import annotations

import functools
import inspect
import json
import types
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, ForwardRef, Literal, Union, get_args, get_origin

import torch
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    TypeAdapter,
    ValidationError,
    WrapValidator,
    create_model,
)
from pydantic_core import PydanticCustomError
from torch import nn

from ..errors import IntensityError, ModelFileError
from ..io.intensity import MODES as INTENSITY_MODES
from ..io.intensity import Intensity
from ..padding import PADDING_MODES
from . import spec

FORMAT = "densecnn-model"
FORMAT_VERSION = 1
CONFIG_FILE = "model.json"
WEIGHTS_FILE = "weights.safetensors"
FORMAT_DOCS = "docs/model-files.md"
# JSON semantics, no coercion: "3" is not an int, 3.5 is not an int, true is not 1; NaN and infinities are refused
_STRICT = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False)
# layer arguments go through validator functions, which see Python lists where torch's annotations say tuples:
# lax containers, strict scalars (see _strict_scalars)
_LAYER_CONFIG = ConfigDict(strict=False, extra="forbid", allow_inf_nan=False)


def file_error(where: str | Path, key: str | None, problem: str, fix: str) -> ModelFileError:
    """The one shape of a model-file error: ``FILE: KEY: problem; fix``."""
    located = f"{where}: {key}" if key else str(where)
    return ModelFileError(f"{located}: {problem}; {fix}")


def layer_vocabulary() -> dict[str, tuple[type[nn.Module], tuple[str, ...]]]:
    """Layer type name -> (its class, the constructor arguments a spec gives it): the types a file may name."""
    return spec.layer_types()


# ---- argument ranges, by argument name (the same name means the same thing in every torch layer)
def _at_least(bound: float) -> Callable[[float], bool]:
    return lambda v: v >= bound


_RANGES: dict[str, tuple[Callable[[float], bool], str]] = {
    **{
        name: (_at_least(1), "at least 1")
        for name in (
            "in_channels", "out_channels", "in_features", "out_features", "num_features", "num_parameters",
            "groups", "kernel_size", "stride", "dilation", "output_size", "divisor_override",
        )
    },
    "padding": (_at_least(0), "at least 0"),
    "p": (lambda v: 0 <= v <= 1, "between 0 and 1"),
    "eps": (lambda v: v > 0, "greater than 0"),
}  # fmt: skip


def _numbers(value: Any) -> list[float]:
    if isinstance(value, (tuple, list)):
        return [n for item in value for n in _numbers(item)]
    return [value] if isinstance(value, (int, float)) and not isinstance(value, bool) else []


def _range_check(name: str) -> AfterValidator:
    accepts, wanted = _RANGES[name]

    def check(value: Any) -> Any:
        if not all(accepts(n) for n in _numbers(value)):
            raise PydanticCustomError(
                "out_of_range", "must be {wanted}, got {got}", {"wanted": wanted, "got": _short(value)}
            )
        return value

    return AfterValidator(check)


# ---- readable names for constructor annotations
_NOUNS = {int: ("an integer", "integers"), float: ("a number", "numbers"), bool: ("true or false", "booleans"),
          str: ("a string", "strings"), type(None): ("null", "nulls")}  # fmt: skip


def _is_union(annotation: Any) -> bool:
    return get_origin(annotation) in (Union, types.UnionType)


def describe(annotation: Any, *, plural: bool = False) -> str:
    """A constructor annotation in words: ``Union[int, tuple[int, int]]`` -> "an integer or a list of 2 integers"."""
    if _is_union(annotation):
        return " or ".join(describe(arg, plural=plural) for arg in get_args(annotation))
    if get_origin(annotation) is tuple:
        items = get_args(annotation)
        if len(items) == 2 and items[1] is Ellipsis:
            return f"a list of {describe(items[0], plural=True)}"
        return f"a list of {len(items)} {describe(items[0], plural=True)}"
    if annotation in _NOUNS:
        return _NOUNS[annotation][plural]
    return getattr(annotation, "__name__", str(annotation))


def _one_type_error(annotation: Any) -> WrapValidator:
    """Report a wrong type as one error ("expected an integer or a list of 2 integers"), not one per union member."""
    expected = describe(annotation)

    def validate(value: Any, handler):
        try:
            return handler(value)
        except ValidationError:
            raise PydanticCustomError(
                "wrong_type", "expected {expected}, got {got}", {"expected": expected, "got": _short(value)}
            ) from None

    return WrapValidator(validate)


def _strict_scalars(annotation: Any) -> Any:
    """``annotation`` with every int/float/bool/str made strict (no "3" -> 3, no true -> 1), containers kept."""
    if annotation in (int, float, bool, str):
        return Annotated[annotation, Strict()]
    origin, args = get_origin(annotation), get_args(annotation)
    if _is_union(annotation):
        return Union[tuple(_strict_scalars(arg) for arg in args)]  # noqa: UP007 (a runtime tuple of types)
    if origin is tuple:
        return tuple[tuple(arg if arg is Ellipsis else _strict_scalars(arg) for arg in args)]
    return annotation


def _signature(layer: type[nn.Module]) -> inspect.Signature:
    try:
        return inspect.signature(layer.__init__, eval_str=True)
    except Exception:  # string annotations that do not resolve: kept as strings, checked by the constructor
        return inspect.signature(layer.__init__)


def _argument_type(layer: type[nn.Module], name: str) -> tuple[Any, Any]:
    """(annotated type, default) of one constructor argument, from the layer's own signature. An argument taken
    through ``**kwargs``, or annotated with a type pydantic cannot check, is left to the constructor."""
    parameter = _signature(layer).parameters.get(name)
    if parameter is None or parameter.kind is inspect.Parameter.VAR_KEYWORD:
        return Any, None
    annotation = parameter.annotation
    if annotation is inspect.Parameter.empty or isinstance(annotation, (str, ForwardRef)):
        annotation = Any  # unannotated, or a name that does not resolve
    try:
        TypeAdapter(annotation)
    except Exception:  # a user layer's annotation pydantic cannot check: the constructor checks it when built
        annotation = Any
    checks = [_one_type_error(annotation)] if annotation is not Any else []
    annotation = _strict_scalars(annotation)
    if name in _RANGES:
        checks.append(_range_check(name))
    default = ... if parameter.default is inspect.Parameter.empty else parameter.default
    return (Annotated[(annotation, *checks)] if checks else annotation), default


def _layer_model(name: str, layer: type[nn.Module], args: tuple[str, ...]) -> type[BaseModel]:
    fields = {arg: _argument_type(layer, arg) for arg in args}
    return create_model(f"{name}Layer", __config__=_LAYER_CONFIG, type=(Literal[name], ...), **fields)


# ---- the whole model.json
class IntensitySpec(BaseModel):
    """How raw pixel values are scaled to [0, 1] before the normalisation (:mod:`densecnn.io.intensity`)."""

    model_config = _STRICT
    mode: Literal[INTENSITY_MODES]
    low: float | None = None
    high: float | None = None


class Normalization(BaseModel):
    """Per input channel, applied to images scaled to [0, 1]: ``(x - mean) / std``."""

    model_config = _STRICT
    mean: list[float]
    std: list[Annotated[float, Field(gt=0)]]


PositiveInt = Annotated[int, Field(ge=1)]
ColourValue = Annotated[int, Field(ge=0, le=255)]


class ReuseLayer(BaseModel):
    """``{"type": "Reuse", "layer": i}``: the layer at index ``i`` used again (the same module and weights)."""

    model_config = _STRICT
    type: Literal[spec.REUSE]
    layer: Annotated[int, Field(ge=0)]


@functools.lru_cache(maxsize=4)
def _config_model(vocabulary: tuple[tuple[str, type[nn.Module], tuple[str, ...]], ...]) -> type[BaseModel]:
    layers = (*(_layer_model(name, layer, args) for name, layer, args in vocabulary), ReuseLayer)
    layer_entry = Annotated[Union[layers], Field(discriminator="type")]  # noqa: UP007 (a runtime tuple of types)
    return create_model(
        "ModelFile",
        __config__=_STRICT,
        format=(Literal[FORMAT], ...),
        format_version=(Literal[FORMAT_VERSION], ...),
        patch_size=(
            Annotated[tuple[PositiveInt, ...], Field(min_length=1, max_length=3)],
            ...,
        ),  # one per axis
        in_channels=(PositiveInt, ...),
        num_classes=(PositiveInt, ...),
        class_names=(list[str], ...),
        palette=(list[tuple[ColourValue, ColourValue, ColourValue]], ...),
        normalization=(Normalization | None, None),
        intensity=(IntensitySpec | None, None),
        pixel_size=(list[Annotated[float, Field(gt=0, allow_inf_nan=False)]] | None, None),
        padding_mode=(Literal[PADDING_MODES], ...),
        layers=(Annotated[list[layer_entry], Field(min_length=1)], ...),
        extra=(dict[str, Any], {}),
    )


def parse_config(text: str, *, where: str | Path) -> BaseModel:
    """Validate the text of a ``model.json``: format and version, every key's type and range, the layer types and
    their arguments, and the lengths of class names, palette and normalisation. Returns the validated config.

    Raises:
        ModelFileError: naming ``where``, the key, the problem and the fix.
    """
    try:
        raw = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise file_error(
            where, None, f"not valid JSON ({exc})", "write the file as JSON (densecnn.save does)"
        ) from None
    _check_format(raw, where)
    vocabulary = layer_vocabulary()
    model = _config_model(tuple((name, layer, args) for name, (layer, args) in vocabulary.items()))
    try:
        config = model.model_validate_json(text)
    except ValidationError as exc:
        raise _translate(exc, where, vocabulary) from None
    _check_lengths(config, where)
    return config


def _check_format(raw: Any, where: str | Path) -> None:
    if not isinstance(raw, dict):
        raise file_error(where, None, f"expected a JSON object, got {_short(raw)}", f"see {FORMAT_DOCS}")
    if raw.get("format") != FORMAT:
        raise file_error(
            where, "format", f"is {_short(raw.get('format'))}, not {FORMAT!r}: not a densecnn model file",
            "point to a directory written by densecnn.save",
        )  # fmt: skip
    version = raw.get("format_version")
    if version != FORMAT_VERSION:
        newer = isinstance(version, int) and not isinstance(version, bool) and version > FORMAT_VERSION
        raise file_error(
            where, "format_version", f"{_short(version)} is not supported (this densecnn reads {FORMAT_VERSION})",
            "upgrade densecnn to read it" if newer else f"set it to {FORMAT_VERSION}",
        )  # fmt: skip


def _check_lengths(config: BaseModel, where: str | Path) -> None:
    k, c = config.num_classes, config.in_channels
    if len(config.class_names) != k:
        raise file_error(
            where, "class_names", f"{len(config.class_names)} names for num_classes={k}", f"give {k} names, one per class"
        )  # fmt: skip
    if len(config.palette) != k:
        raise file_error(
            where, "palette", f"{len(config.palette)} colours for num_classes={k}", f"give {k} [r, g, b] colours"
        )  # fmt: skip
    if config.pixel_size is not None and len(config.pixel_size) != len(config.patch_size):
        raise file_error(
            where, "pixel_size", f"{len(config.pixel_size)} values for a {len(config.patch_size)}-D patch",
            "give micrometres per pixel along each axis of the patch",
        )  # fmt: skip
    if config.intensity is not None:
        try:
            Intensity.from_json(config.intensity.model_dump())
        except IntensityError as exc:
            raise file_error(
                where, "intensity", str(exc), 'see "Intensities" in docs/model-files.md'
            ) from None
    if config.normalization is not None:
        for key in ("mean", "std"):
            values = getattr(config.normalization, key)
            if len(values) != c:
                raise file_error(
                    where, f"normalization.{key}", f"{len(values)} values for in_channels={c}",
                    f"give {c} values, one per input channel",
                )  # fmt: skip


def json_path(loc: tuple) -> str:
    """('layers', 3, 'Conv2dLayer'-tag, 'kernel_size') -> 'layers[3].kernel_size' (the union tag dropped)."""
    if len(loc) > 2 and loc[0] == "layers":
        loc = loc[:2] + loc[3:]
    path = ""
    for item in loc:
        path += f"[{item}]" if isinstance(item, int) else (f".{item}" if path else str(item))
    return path


def _short(value: Any) -> str:
    """A value as the file spells it, cut to one short line."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (torch appends C++ stack traces to some)."""
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def _translate(exc: ValidationError, where: str | Path, vocabulary: dict) -> ModelFileError:
    """The first problem pydantic found, as a ModelFileError with its JSON path and a fix."""
    errors = exc.errors()
    error = errors[0]
    loc, kind = error["loc"], error["type"]
    key = json_path(loc)
    more = f" (and {len(errors) - 1} more problems)" if len(errors) > 1 else ""
    in_layer = len(loc) > 2 and loc[0] == "layers"
    layer_name = loc[2] if in_layer else None
    if kind == "union_tag_invalid":
        problem = f"unknown layer type {_short(error['input'].get('type'))}"
        fix = f"use one of {', '.join(sorted(vocabulary))}, or {spec.REUSE} for an earlier layer used again"
        key += ".type"
    elif kind == "union_tag_not_found":
        problem, fix, key = "missing key", 'give every layer a "type"', key + ".type"
    elif kind == "missing" and isinstance(loc[-1], int):  # a tuple too short
        key = json_path(loc[:-1])
        problem, fix = (
            f"too few entries (nothing at index {loc[-1]})",
            f"give every entry (the format is described in {FORMAT_DOCS})",
        )
    elif kind == "missing":
        problem, fix = "missing key", f"add it (the format is described in {FORMAT_DOCS})"
    elif kind == "extra_forbidden" and in_layer:
        known = ", ".join(vocabulary[layer_name][1] if layer_name in vocabulary else ("layer",)) or "none"
        problem, fix = f"unknown argument of {layer_name}", f"remove it ({layer_name} takes: {known})"
    elif kind == "extra_forbidden":
        problem, fix = "unknown key", 'remove it (free-form metadata goes under "extra")'
    elif kind in ("wrong_type", "out_of_range"):
        problem, fix = error["msg"], f"correct it (the format is described in {FORMAT_DOCS})"
    else:
        problem = f"{error['msg'][0].lower()}{error['msg'][1:]}, got {_short(error['input'])}"
        fix = f"correct it (the format is described in {FORMAT_DOCS})"
    return file_error(where, key, problem + more, fix)


def build_on_meta(config, *, where: Path) -> nn.Sequential:
    """The layers ``config`` describes, on the meta device: shapes without memory, nothing initialised."""
    layers: list[nn.Module] = []
    with torch.device("meta"):
        for index, entry in enumerate(config.layers):
            if entry.type == spec.REUSE and entry.layer >= index:
                raise file_error(
                    where, f"layers[{index}].layer", f"{entry.layer} is not the index of an earlier layer",
                    f"give the index of the layer used again (0 to {index - 1})" if index else "remove the entry",
                )  # fmt: skip
            try:
                layers.append(spec.build_layer(entry.model_dump(exclude_unset=True), layers))
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
