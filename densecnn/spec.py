"""A JSON layer spec <-> ``nn.Sequential``, so a model can be described (and saved) without Python code.

A spec is a list of layers, each ``{"type": <torch.nn class name>, <constructor arguments>...}``::

    [{"type": "Conv2d", "in_channels": 1, "out_channels": 8, "kernel_size": [3, 3]},
     {"type": "MaxPool2d", "kernel_size": [2, 2], "stride": [2, 2]},
     {"type": "ReLU"},
     {"type": "Flatten"},
     {"type": "Linear", "in_features": 200, "out_features": 3}]

>>> model = from_spec([{"type": "Conv2d", "in_channels": 1, "out_channels": 2, "kernel_size": 3}])
>>> to_spec(model)[0]["kernel_size"]
[3, 3]
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .chain import extract_chain
from .errors import ModelFileError
from .rules import LayerRecord, saved_record, saved_types


def layer_types() -> dict[str, tuple[type[nn.Module], tuple[str, ...]]]:
    """Name in a spec -> (layer type, its constructor arguments): every layer registered with ``args``, built-in or
    a user's (:func:`densecnn.register_rule`), at the time of the call.

    >>> layer_types()["Conv2d"][1][:3]
    ('in_channels', 'out_channels', 'kernel_size')
    """
    return {name: (record.layer_type, record.args) for name, record in saved_types().items()}


def _json_value(name: str, value: Any) -> Any:
    if name == "bias" and (value is None or isinstance(value, torch.Tensor)):
        return value is not None  # the constructor flag, read back from the parameter
    if isinstance(value, tuple):
        return [_json_value("", v) for v in value]
    return value


def to_spec(model: nn.Module) -> list[dict[str, Any]]:
    """The layer spec of ``model`` (an ``nn.Sequential`` or a traceable chain), one dict per layer."""
    spec = []
    for path, module in extract_chain(model):
        record = saved_record(type(module))
        if record is None:
            raise ModelFileError(
                f"layer {path!r} ({type(module).__name__}) has no spec entry; spec layers are "
                f"{', '.join(saved_types())}. Register your own layers with "
                "densecnn.register_rule(MyLayer, args=[...constructor arguments...])"
            )
        layer = {"type": record.name}
        for name in record.args:
            if not hasattr(module, name):
                raise ModelFileError(
                    f"layer {path!r} ({record.name}): its registered argument {name!r} is not an attribute of the "
                    f"layer; keep each constructor argument as an attribute of the same name (self.{name} = {name})"
                )
            value = _json_value(name, getattr(module, name))
            if not isinstance(value, (bool, int, float, str, list, type(None))):
                raise ModelFileError(
                    f"layer {path!r} ({record.name}): argument {name}={value!r} is not a JSON value (a number, "
                    "string, bool, list or null); register the layer with arguments that are"
                )
            layer[name] = value
        spec.append(layer)
    return spec


def from_spec(spec: list[dict[str, Any]]) -> nn.Sequential:
    """Build the ``nn.Sequential`` a layer spec describes (freshly initialised weights, on the current default
    device: ``with torch.device("meta"):`` builds it without memory)."""
    if not isinstance(spec, list) or not spec:
        raise ModelFileError("a layer spec must be a non-empty list of layers")
    types = saved_types()
    layers = []
    for index, entry in enumerate(spec):
        if not isinstance(entry, dict) or "type" not in entry:
            raise ModelFileError(f"layer {index} of the spec must be an object with a 'type', got {entry!r}")
        args = {key: value for key, value in entry.items() if key != "type"}
        record: LayerRecord | None = types.get(entry["type"])
        if record is None:
            raise ModelFileError(
                f"layer {index} has unknown type {entry['type']!r}; supported types: {', '.join(types)}. A layer of "
                "your own loads once it is registered in this process: densecnn.register_rule(MyLayer, args=[...])"
            )
        unknown = set(args) - set(record.args)
        if unknown:
            raise ModelFileError(
                f"layer {index} ({entry['type']}) has unknown arguments: {', '.join(sorted(unknown))}"
            )
        try:
            layers.append(record.layer_type(**args))
        except (TypeError, ValueError) as exc:
            raise ModelFileError(f"layer {index} ({entry['type']}) has invalid arguments: {exc}") from None
    return nn.Sequential(*layers)
