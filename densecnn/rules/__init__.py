"""Layer records: one per layer type, with its conversion rule; extensible with :func:`register_rule`."""

from .registry import (
    Alias,
    ConversionContext,
    LayerRecord,
    aliases,
    find_record,
    find_rule,
    fused_activation,
    is_stochastic,
    records,
    register_rule,
    saved_record,
    saved_types,
)
from . import builtin  # noqa: E402, F401, I001  (registers the built-in records; after the registry)

__all__ = [
    "Alias",
    "ConversionContext",
    "LayerRecord",
    "aliases",
    "find_record",
    "find_rule",
    "fused_activation",
    "is_stochastic",
    "records",
    "register_rule",
    "saved_record",
    "saved_types",
]
