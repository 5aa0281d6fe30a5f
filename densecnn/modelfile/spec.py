"""A JSON layer spec <-> ``nn.Sequential``, so a model can be described (and saved) without Python code.

A spec is a list of layers, each ``{"type": <torch.nn class name>, <constructor arguments>...}``::

    [{"type": "Conv2d", "in_channels": 1, "out_channels": 8, "kernel_size": [3, 3]},
     {"type": "MaxPool2d", "kernel_size": [2, 2], "stride": [2, 2]},
     {"type": "ReLU"},
     {"type": "Conv2d", "in_channels": 8, "out_channels": 8, "kernel_size": [1, 1]},
     {"type": "Reuse", "layer": 2},
     {"type": "Flatten"},
     {"type": "Linear", "in_features": 200, "out_features": 3}]

``{"type": "Reuse", "layer": i}`` is the layer at index ``i`` used again: the same module, with the same weights (a
model that applies one ``nn.ReLU`` or one block twice). Its tensors are saved once, under the first use.

>>> model = from_spec([{"type": "Conv2d", "in_channels": 1, "out_channels": 2, "kernel_size": 3}])
>>> to_spec(model)[0]["kernel_size"]
[3, 3]
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..chain import extract_chain
from ..errors import ModelFileError
from ..functional_weights import saved_layer
from ..hooks import WEIGHT_HOOKS, weight_hook_removal
from ..rules import LayerRecord, saved_record, saved_types
from ..rules.registry import REUSE


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


def _refuse_computed_weights(path: str, module: nn.Module) -> None:
    """A layer whose weight is computed on each call (a parametrization, ``weight_norm``, pruning's mask) is saved
    only once the weight is made a plain parameter again: the file holds a layer's own parameters."""
    from torch.nn.utils import parametrize

    if parametrize.is_parametrized(module):
        names = ", ".join(module.parametrizations.keys())
        raise ModelFileError(
            f"layer {path!r} ({type(module).__name__}) computes its {names} by a parametrization (weight_norm, "
            f"spectral_norm, ...); a model file holds plain parameters: bake it in first with "
            f"torch.nn.utils.parametrize.remove_parametrizations(layer, {next(iter(module.parametrizations))!r}), "
            "which keeps the values"
        )
    weight_hooks = [h for h in module._forward_pre_hooks.values() if isinstance(h, WEIGHT_HOOKS)]
    if weight_hooks:
        raise ModelFileError(
            f"layer {path!r} ({type(module).__name__}) recomputes its weights before each call "
            f"({', '.join(type(h).__name__ for h in weight_hooks)}: the old weight_norm, spectral_norm or pruning); a "
            "model file holds plain parameters: remove the hook first with "
            f"{' and '.join(weight_hook_removal(h) for h in weight_hooks)}, which keeps the values"
        )


def to_spec(model: nn.Module) -> list[dict[str, Any]]:
    """The layer spec of ``model`` (an ``nn.Sequential`` or a traceable chain), one dict per use of a layer (a layer
    built for a functional op as a file holds it: :func:`~densecnn.functional_weights.saved_layer`)."""
    spec: list[dict[str, Any]] = []
    first_use: dict[nn.Module, int] = {}
    for index, (path, module) in enumerate(extract_chain(model)):
        if module in first_use:
            spec.append({"type": REUSE, "layer": first_use[module]})
            continue
        first_use[module] = index
        spec.append(_layer_entry(path, saved_layer(module)))
    return spec


def _layer_entry(path: str, module: nn.Module) -> dict[str, Any]:
    _refuse_computed_weights(path, module)
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
    return layer


def from_spec(spec: list[dict[str, Any]]) -> nn.Sequential:
    """Build the ``nn.Sequential`` a layer spec describes (freshly initialised weights, on the current default
    device: ``with torch.device("meta"):`` builds it without memory); a ``Reuse`` entry is the earlier module
    itself."""
    if not isinstance(spec, list) or not spec:
        raise ModelFileError("a layer spec must be a non-empty list of layers")
    layers: list[nn.Module] = []
    for entry in spec:
        layers.append(build_layer(entry, layers))
    return nn.Sequential(*layers)


def build_layer(entry: dict[str, Any], built: list[nn.Module]) -> nn.Module:
    """The module a spec entry describes, ``built`` being the modules of the entries before it."""
    index = len(built)
    if not isinstance(entry, dict) or "type" not in entry:
        raise ModelFileError(f"layer {index} of the spec must be an object with a 'type', got {entry!r}")
    if entry["type"] == REUSE:
        earlier = entry.get("layer")
        if set(entry) != {"type", "layer"} or not isinstance(earlier, int) or not 0 <= earlier < index:
            raise ModelFileError(
                f'layer {index} ({REUSE}) must be {{"type": "{REUSE}", "layer": i}} with i the index of an '
                f"earlier layer (0 to {index - 1}), got {entry!r}"
            )
        return built[earlier]
    args = {key: value for key, value in entry.items() if key != "type"}
    record: LayerRecord | None = saved_types().get(entry["type"])
    if record is None:
        raise ModelFileError(
            f"layer {index} has unknown type {entry['type']!r}; supported types: {', '.join(saved_types())}. A layer "
            "of your own loads once it is registered in this process: densecnn.register_rule(MyLayer, args=[...])"
        )
    unknown = set(args) - set(record.args)
    if unknown:
        raise ModelFileError(
            f"layer {index} ({entry['type']}) has unknown arguments: {', '.join(sorted(unknown))}"
        )
    try:
        return record.layer_type(**args)
    except (TypeError, ValueError) as exc:
        raise ModelFileError(f"layer {index} ({entry['type']}) has invalid arguments: {exc}") from None


def reused_layers(model: nn.Sequential) -> dict[int, int]:
    """Index of each layer that is an earlier layer used again -> the index of its first use.

    >>> relu = nn.ReLU()
    >>> reused_layers(nn.Sequential(nn.Conv2d(1, 2, 3), relu, nn.Conv2d(2, 2, 1), relu))
    {3: 1}
    """
    first_use: dict[nn.Module, int] = {}
    reused = {}
    for index, layer in enumerate(model):
        if layer in first_use:
            reused[index] = first_use[layer]
        else:
            first_use[layer] = index
    return reused


def saved_state(model: nn.Sequential) -> dict[str, torch.Tensor]:
    """The tensors a model file holds: ``model.state_dict()`` without the entries of reused layers (a reused layer's
    tensors are its first use's, saved once under that index)."""
    reused = reused_layers(model)
    return {name: t for name, t in model.state_dict().items() if int(name.split(".", 1)[0]) not in reused}


def full_state(model: nn.Sequential, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A saved ``state`` with the entries of reused layers filled in from their first use, for
    ``model.load_state_dict``."""
    full = dict(state)
    for index, first in reused_layers(model).items():
        for name, tensor in state.items():
            owner, _, rest = name.partition(".")
            if int(owner) == first:
                full[f"{index}.{rest}"] = tensor
    return full
