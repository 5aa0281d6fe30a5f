"""Layer records: one per layer type, with its conversion rule; extensible with :func:`register_rule`."""

from . import builtin  # noqa: F401  (registers the built-in records)
from .registry import (
    Alias,
    ConversionContext,
    LayerRecord,
    aliases,
    find_record,
    fused_activation,
    is_stochastic,
    module_type,
    record_for,
    records,
    register_rule,
    saved_record,
    saved_types,
    unconvertible_subclass,
)

__all__ = [
    "Alias",
    "ConversionContext",
    "LayerRecord",
    "aliases",
    "find_record",
    "fused_activation",
    "is_stochastic",
    "module_type",
    "record_for",
    "records",
    "register_rule",
    "saved_record",
    "saved_types",
    "unconvertible_subclass",
]
