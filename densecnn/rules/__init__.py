"""Conversion rules: one small function per layer type, extensible with :func:`register_rule`."""

from . import builtin  # noqa: F401  (registers the built-in rules)
from .registry import ConversionContext, PatchSizeError, find_rule, register_rule

__all__ = ["ConversionContext", "PatchSizeError", "find_rule", "register_rule"]
