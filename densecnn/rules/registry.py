"""The table of conversion rules, keyed by layer type, and the state a rule reads and updates."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from torch import nn

from ..errors import ConversionError

Pair = tuple[int, int]
Rule = Callable[[nn.Module, "ConversionContext"], "nn.Module | None"]

_RULES: dict[type, Rule] = {}


def register_rule(*layer_types: type) -> Callable[[Rule], Rule]:
    """Register ``rule(module, ctx) -> dense module | None`` for one or more layer types.

    The rule returns the dense layer to run in place of ``module`` (``None`` to drop it) and updates ``ctx``:
    ``ctx.slide(...)`` for windowed ops, ``ctx.channels`` when the channel count changes. A later registration for
    the same type replaces the earlier one; a subclass without its own rule uses its nearest registered base class.

    Example: a custom pointwise activation runs unchanged on the dense map::

        @densecnn.register_rule(MySwish)
        def _(module, ctx):
            return module
    """

    def decorator(rule: Rule) -> Rule:
        for layer_type in layer_types:
            _RULES[layer_type] = rule
        return rule

    return decorator


def find_rule(layer_type: type) -> Rule | None:
    for base in layer_type.__mro__:
        if base in _RULES:
            return _RULES[base]
    return None


class PatchSizeError(ConversionError):
    """The patch size does not bring the patch net to a single output pixel."""


@dataclass
class ConversionContext:
    """What a rule knows about the patch net at the layer it converts.

    Attributes:
        path: dotted path of the layer in the user's model.
        size: (h, w) of the patch net's feature map entering the layer.
        channels: channels entering the layer (``None`` until a layer fixes them).
        dilation: spacing, in image pixels, of the layer's input samples in the dense net (product of strides so far).
        flat_map: (C, h, w) of the map that was flattened once the patch tensor is (B, F), else ``None``.
        is_last: whether this is the model's last layer.
    """

    path: str
    size: Pair
    channels: int | None
    dilation: Pair = (1, 1)
    flat_map: tuple[int, int, int] | None = None
    is_last: bool = False
    module: nn.Module | None = field(default=None, repr=False)

    @property
    def flat(self) -> bool:
        return self.flat_map is not None

    def error(self, why: str, fix: str) -> ConversionError:
        """A ConversionError naming this layer, why it cannot be converted exactly, and what to do."""
        return ConversionError(
            f"layer {self.path!r} ({type(self.module).__name__}): {why}. {fix[:1].upper()}{fix[1:]}"
        )

    def require_map(self, what: str) -> None:
        """Raise unless the patch tensor is still a (B, C, h, w) map (not yet flattened)."""
        if self.flat and self.size != (1, 1):
            raise self.error(
                f"{what} is applied after Flatten, to the features of a {self.size[0]}x{self.size[1]} map",
                "move it before the Flatten",
            )

    def slide(self, kernel: Pair, stride: Pair, source_dilation: Pair = (1, 1)) -> None:
        """Account for a window op (kernel, stride, own dilation): the map shrinks and later taps spread by stride."""
        extent = tuple((k - 1) * d + 1 for k, d in zip(kernel, source_dilation))
        if extent[0] > self.size[0] or extent[1] > self.size[1]:
            raise PatchSizeError(
                f"layer {self.path!r} ({type(self.module).__name__}): its {extent[0]}x{extent[1]} window does not "
                f"fit the {self.size[0]}x{self.size[1]} map this patch size leaves. Use a larger patch size"
            )
        self.size = tuple((n - e) // s + 1 for n, e, s in zip(self.size, extent, stride))
        self.dilation = (self.dilation[0] * stride[0], self.dilation[1] * stride[1])

    def expect_channels(self, expected: int, what: str) -> None:
        if self.channels is not None and self.channels != expected:
            raise self.error(
                f"expects {expected} {what} but the previous layers produce {self.channels}",
                "fix the model so that consecutive layers agree",
            )
