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

from torch import nn

from .chain import extract_chain
from .errors import ModelFileError

_POOL = ("kernel_size", "stride", "padding", "ceil_mode")
# layer type -> the constructor arguments that describe it (all readable as attributes of the module)
LAYER_ARGS: dict[type, tuple[str, ...]] = {
    nn.Conv2d: ("in_channels", "out_channels", "kernel_size", "stride", "padding", "dilation", "groups", "bias"),
    nn.Linear: ("in_features", "out_features", "bias"),
    nn.MaxPool2d: (*_POOL, "dilation"),
    nn.AvgPool2d: (*_POOL, "count_include_pad", "divisor_override"),
    nn.AdaptiveMaxPool2d: ("output_size",),
    nn.AdaptiveAvgPool2d: ("output_size",),
    nn.BatchNorm1d: ("num_features", "eps", "momentum", "affine", "track_running_stats"),
    nn.BatchNorm2d: ("num_features", "eps", "momentum", "affine", "track_running_stats"),
    nn.Flatten: ("start_dim", "end_dim"),
    nn.Dropout: ("p",),
    nn.Dropout2d: ("p",),
    nn.AlphaDropout: ("p",),
    nn.LeakyReLU: ("negative_slope",),
    nn.PReLU: ("num_parameters",),
    nn.ELU: ("alpha",),
    nn.CELU: ("alpha",),
    nn.GELU: ("approximate",),
    nn.Hardtanh: ("min_val", "max_val"),
    nn.Softplus: ("beta", "threshold"),
    nn.Softshrink: ("lambd",),
    nn.Hardshrink: ("lambd",),
    nn.Threshold: ("threshold", "value"),
    nn.Softmax: ("dim",),
    nn.LogSoftmax: ("dim",),
    **{
        layer: ()
        for layer in (
            nn.ReLU, nn.ReLU6, nn.SELU, nn.SiLU, nn.Mish, nn.Tanh, nn.Sigmoid, nn.Hardswish, nn.Hardsigmoid,
            nn.Softsign, nn.Tanhshrink, nn.LogSigmoid, nn.Identity,
        )
    },
}  # fmt: skip
_TYPES = {layer.__name__: layer for layer in LAYER_ARGS}


def _json_value(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def to_spec(model: nn.Module) -> list[dict[str, Any]]:
    """The layer spec of ``model`` (an ``nn.Sequential`` or a traceable chain), one dict per layer."""
    spec = []
    for path, module in extract_chain(model):
        args = LAYER_ARGS.get(type(module))
        if args is None:
            raise ModelFileError(
                f"layer {path!r} ({type(module).__name__}) has no spec entry; spec layers are {', '.join(sorted(_TYPES))}"
            )
        layer = {"type": type(module).__name__}
        for name in args:
            value = getattr(module, name)
            layer[name] = (value is not None) if name == "bias" else _json_value(value)
        spec.append(layer)
    return spec


def from_spec(spec: list[dict[str, Any]]) -> nn.Sequential:
    """Build the ``nn.Sequential`` a layer spec describes (freshly initialised weights)."""
    if not isinstance(spec, list) or not spec:
        raise ModelFileError("a layer spec must be a non-empty list of layers")
    layers = []
    for index, entry in enumerate(spec):
        if not isinstance(entry, dict) or "type" not in entry:
            raise ModelFileError(f"layer {index} of the spec must be an object with a 'type', got {entry!r}")
        args = {key: value for key, value in entry.items() if key != "type"}
        layer_type = _TYPES.get(entry["type"])
        if layer_type is None:
            raise ModelFileError(
                f"layer {index} has unknown type {entry['type']!r}; supported types: {', '.join(sorted(_TYPES))}"
            )
        unknown = set(args) - set(LAYER_ARGS[layer_type])
        if unknown:
            raise ModelFileError(
                f"layer {index} ({entry['type']}) has unknown arguments: {', '.join(sorted(unknown))}"
            )
        try:
            layers.append(layer_type(**args))
        except (TypeError, ValueError) as exc:
            raise ModelFileError(f"layer {index} ({entry['type']}) has invalid arguments: {exc}") from None
    return nn.Sequential(*layers)
