"""One record per layer type: how it converts, how it is saved, its fx aliases, what may absorb it.

Every module of densecnn that needs to know about a layer type reads its :class:`LayerRecord`:
the converter (``rule``), :mod:`densecnn.chain` (``aliases``: ``F.relu`` or ``x.flatten(1)`` in a traced model),
:mod:`densecnn.modelfile.spec` (``args``: the constructor arguments written to ``model.json``) and the solver plan
(``fused_activation``). :func:`register_rule` writes a record, for the built-in layers (:mod:`densecnn.rules.builtin`)
and for a user's own. How a dense layer is written to ONNX is the exporter's own table
(:func:`densecnn.onnx_export.register_export`).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from torch import nn
from torch.nn.utils import parametrize

from ..errors import ConversionError, PatchSizeError
from ..geometry import ntuple, reach
from ..patch_sizes import Adaptive, Features, Step, Window

Size = tuple[int, ...]  # one entry per spatial axis
Rule = Callable[[nn.Module, "ConversionContext"], "nn.Module | None"]


@dataclass(frozen=True)
class Alias:
    """A functional or tensor-method form of a layer, as it appears in a ``torch.fx`` trace.

    Attributes:
        target: the function (``F.elu``, ``torch.flatten``) or the tensor method's name (``"flatten"``).
        params: the names of its arguments after the input, in order; they are passed by name to the layer's
            constructor (``training`` and ``inplace`` excepted: the dense layer follows the model's mode and never
            works in place).
        defaults: the function's defaults where they differ from the constructor's (``torch.flatten``: start_dim=0).
        build: makes the layer from the call's arguments after the input instead of the constructor; returns None
            when the call is not this layer (``x.view(n, m, k)`` is no flatten).
    """

    target: Callable | str
    params: tuple[str, ...] = ()
    defaults: dict = field(default_factory=dict)
    build: Callable[..., nn.Module | None] | None = None

    def training_default(self) -> bool | None:
        """What a call without ``training=`` does (``F.dropout``: drops; ``F.alpha_dropout``: does not)."""
        if "training" not in self.params:
            return None
        return inspect.signature(self.target).parameters["training"].default


@dataclass(frozen=True)
class LayerRecord:
    """Everything densecnn knows about one layer type.

    Attributes:
        layer_type: the ``nn.Module`` subclass.
        rule: ``rule(module, ctx) -> dense module | None`` (None drops the layer); see :class:`ConversionContext`.
        args: the constructor arguments that describe a layer, each readable as an attribute of it, written to
            ``model.json``; None: the layer cannot be saved.
        aliases: its functional/method forms in fx traces.
        fused_activation: the name under which a pool step may absorb this layer into its kernel ("relu", "tanh").
        stochastic: in training mode its output depends on randomness or on the batch (Dropout, BatchNorm), so the
            dense net matches patch scanning only in eval mode.
        dims: the number of spatial axes the layer type implies (``Conv3d``: 3), which fixes the net's; None for
            layers that take any (pointwise layers, ``Linear``, ``BatchNorm1d``).
    """

    layer_type: type[nn.Module]
    rule: Rule
    args: tuple[str, ...] | None = None
    aliases: tuple[Alias, ...] = ()
    fused_activation: str | None = None
    stochastic: bool = False
    dims: int | None = None

    @property
    def name(self) -> str:
        """The type's name in ``model.json``."""
        return self.layer_type.__name__


_RECORDS: dict[type, LayerRecord] = {}
REUSE = "Reuse"  # the model.json entry of a layer used again (densecnn.modelfile.spec): no layer type may take its name
RESERVED_NAMES = frozenset({REUSE})
_SAVED_NAMES: dict[str, type] = {}  # name in model.json -> layer type, for the types that have args


def runs_unchanged(module: nn.Module, ctx: ConversionContext) -> nn.Module:
    """The rule of a pointwise layer (acting on each value alone): the same module runs on the dense map."""
    return module


def register_rule(
    *layer_types: type,
    args: Sequence[str] | None = None,
    aliases: Sequence[Alias | Callable | str] = (),
    fused_activation: str | None = None,
    stochastic: bool = False,
    dims: int | None = None,
) -> Callable[[Rule], Rule]:
    """Register layer types with densecnn: how they convert, and optionally how they are saved and traced.

    Called on its own, it registers pointwise layers (they run unchanged on the dense map: right only for layers
    that act on each value alone). Used as a decorator, the decorated ``rule(module, ctx) -> dense module | None``
    converts them: it returns the dense layer to run in place of ``module`` (``None`` to drop it) and updates
    ``ctx``: ``ctx.slide(...)`` for windowed ops, ``ctx.channels`` when the channel count changes. A later
    registration of the same type replaces the earlier one. A subclass without its own record converts with its
    nearest registered base class's rule only if it computes what the base computes: one that redefines
    ``forward`` (or any other method of the base) or adds a property is refused until it has a rule of its own.

    Args:
        args: constructor arguments (attributes of the layer) to write to ``model.json``, so that
            :func:`densecnn.save` can save the layer and :func:`densecnn.load` can build it again, in a process where it
            is registered (loading never imports code named by a file).
        aliases: functional or tensor-method forms of the layer for ``torch.fx`` traces (:class:`Alias`, or a bare
            function or method name taking no arguments after the input).
        fused_activation: "relu" or "tanh" if a pool kernel may apply this layer itself.
        stochastic: its training-mode output depends on randomness or on the batch.
        dims: the number of spatial axes the type implies (1 for signals, 2 for images, 3 for volumes), if any.

    Examples::

        densecnn.register_rule(ScaledTanh, args=["beta"])   # pointwise: converts, saves, loads, exports

        @densecnn.register_rule(ChannelScale, args=["channels"])
        def _(module, ctx):
            ctx.require_map("ChannelScale")
            ctx.expect_channels(module.channels, "channels")
            return module
    """
    saved = None if args is None else tuple(args)
    record_aliases = tuple(a if isinstance(a, Alias) else Alias(a) for a in aliases)

    def record(layer_type: type, rule: Rule) -> None:
        _claim_name(layer_type, saved)
        _RECORDS[layer_type] = LayerRecord(
            layer_type, rule, saved, record_aliases, fused_activation, stochastic, dims
        )

    for layer_type in layer_types:
        record(layer_type, runs_unchanged)

    def decorator(rule: Rule) -> Rule:
        for layer_type in layer_types:
            record(layer_type, rule)
        return rule

    return decorator


def _claim_name(layer_type: type, saved: tuple[str, ...] | None) -> None:
    """Refuse a class name reserved in model files or, for a type saved with args, one that already names another
    saved type there; then let the name stand for ``layer_type`` in model files."""
    if layer_type.__name__ in RESERVED_NAMES:
        raise ConversionError(
            f"cannot register {_qualified(layer_type)}: its name {layer_type.__name__!r} is reserved in model "
            "files. Rename the class"
        )
    if saved is None:
        return
    owner = _SAVED_NAMES.get(layer_type.__name__)
    if owner is not None and _qualified(owner) != _qualified(layer_type):
        raise ConversionError(
            f"cannot register {_qualified(layer_type)} with args: its name {layer_type.__name__!r} already "
            f"names {_qualified(owner)} in model files. Rename the class"
        )
    _SAVED_NAMES[layer_type.__name__] = layer_type


def _qualified(layer_type: type) -> str:
    return f"{layer_type.__module__}.{layer_type.__qualname__}"


def find_record(layer_type: type) -> LayerRecord | None:
    """The record of ``layer_type``, or of its nearest registered base class if ``layer_type`` computes what that
    base computes (it overrides none of the base's methods and adds no property: :func:`overrides`)."""
    base = _registered_base(layer_type)
    if base is None or overrides(layer_type, base):
        return None
    return _RECORDS[base]


def _registered_base(layer_type: type) -> type | None:
    return next((base for base in layer_type.__mro__ if base in _RECORDS), None)


# What a subclass may define without changing what its base's forward computes.
_INERT_NAMES = frozenset(
    {
        "__init__", "__module__", "__qualname__", "__doc__", "__annotations__", "__dict__", "__weakref__",
        "__firstlineno__", "__static_attributes__", "__orig_bases__", "__parameters__", "__slots__",
        "__classcell__", "__annotate_func__", "__annotations_cache__", "__constants__", "_version", "extra_repr",
        "reset_parameters",
    }
)  # fmt: skip


def overrides(layer_type: type, base: type) -> list[str]:
    """The names ``layer_type`` (a subclass of ``base``) defines that may change what ``base``'s forward computes:
    every method or attribute of ``base`` it redefines (``forward``, ``_conv_forward``, ``__call__``, ...) and every
    property it adds (a ``weight`` property shadows the parameter). New plain methods change nothing and pass.

    >>> class WSConv2d(nn.Conv2d):
    ...     def forward(self, x): ...
    >>> overrides(WSConv2d, nn.Conv2d)
    ['forward']
    """
    names = []
    for cls in layer_type.__mro__:
        if cls is base:
            break
        for name, value in vars(cls).items():
            if name not in _INERT_NAMES and (hasattr(base, name) or isinstance(value, property)):
                names.append(name)
    return names


def unconvertible_subclass(layer_type: type) -> tuple[type, list[str]] | None:
    """(registered base, overridden names) for a subclass whose base's rule may not reproduce it, else None."""
    base = _registered_base(layer_type)
    if base is None or base is layer_type:
        return None
    names = overrides(layer_type, base)
    return (base, names) if names else None


def module_type(module: nn.Module) -> type:
    """The class whose record converts ``module``: its own, or, for a module ``torch.nn.utils.parametrize`` has
    reparametrised (its class swapped for a generated subclass whose tensors are properties computed on every
    read), the class it had before."""
    cls = type(module)
    return cls.__bases__[0] if parametrize.is_parametrized(module) else cls


def record_for(module: nn.Module) -> LayerRecord | None:
    """The record that converts ``module`` (:func:`find_record` of :func:`module_type`), or None."""
    return find_record(module_type(module))


def records() -> list[LayerRecord]:
    """Every registered layer record, built-in and user's."""
    return list(_RECORDS.values())


def saved_record(layer_type: type) -> LayerRecord | None:
    """The record that saves layers of exactly this type (a subclass may compute something else), or None."""
    record = _RECORDS.get(layer_type)
    return record if record is not None and record.args is not None else None


def saved_types() -> dict[str, LayerRecord]:
    """Name in ``model.json`` -> record, for every layer type that can be saved (registered with ``args``)."""
    return {name: _RECORDS[layer_type] for name, layer_type in sorted(_SAVED_NAMES.items())}


def fused_activation(module: nn.Module | None) -> str | None:
    """The activation name under which a pool step may absorb ``module`` (its exact type), else None."""
    record = _RECORDS.get(type(module))
    return record.fused_activation if record else None


def spatial_dims(module: nn.Module) -> int | None:
    """The number of spatial axes ``module``'s type implies (``Conv3d``: 3), None if it takes any."""
    record = record_for(module)
    return record.dims if record else None


def is_stochastic(module: nn.Module) -> bool:
    """Whether ``module``'s training-mode output depends on randomness or on the batch."""
    record = record_for(module)
    return record is not None and record.stochastic


def aliases() -> tuple[dict[Callable, tuple[LayerRecord, Alias]], dict[str, tuple[LayerRecord, Alias]]]:
    """The fx vocabulary: (function -> (record, alias), method name -> (record, alias))."""
    functions, methods = {}, {}
    for record in _RECORDS.values():
        for alias in record.aliases:
            (methods if isinstance(alias.target, str) else functions)[alias.target] = (record, alias)
    return functions, methods


@dataclass
class ConversionContext:
    """What a rule knows about the patch net at the layer it converts.

    Attributes:
        path: dotted path of the layer in the user's model.
        size: the size of the patch net's feature map entering the layer, one entry per spatial axis ((h, w) for
            images, (d, h, w) for volumes, (l,) for signals).
        channels: channels entering the layer (``None`` until a layer fixes them).
        in_channels: the channels of the patch itself, once a layer has fixed them.
        dilation: spacing, in image pixels, of the layer's input samples in the dense net (product of strides so far).
        flat_map: (C, *size) of the map that was flattened once the patch tensor is (B, F), else ``None``.
        is_last: whether this is the model's last layer.
        steps: what each layer did to the map size so far (:mod:`densecnn.patch_sizes`).
        strict: raise on a patch size that does not fit (False: record the steps and go on, to find valid sizes).
    """

    path: str
    size: Size
    channels: int | None
    in_channels: int | None = None
    dilation: Size | None = None  # None: ones, one per axis of ``size``
    flat_map: tuple[int | None, ...] | None = None
    is_last: bool = False
    module: nn.Module | None = field(default=None, repr=False)
    steps: list[Step] = field(default_factory=list, repr=False)
    strict: bool = True

    def __post_init__(self):
        if self.dilation is None:
            self.dilation = (1,) * len(self.size)

    @property
    def dims(self) -> int:
        """The number of spatial axes."""
        return len(self.size)

    @property
    def flat(self) -> bool:
        return self.flat_map is not None

    def is_point(self) -> bool:
        """Whether the map is a single position (1×1, 1×1×1), as after a Linear."""
        return all(n == 1 for n in self.size)

    def error(self, why: str, fix: str) -> ConversionError:
        """A ConversionError naming this layer, why it cannot be converted exactly, and what to do."""
        return ConversionError(f"{self._where()}: {why}. {fix[:1].upper()}{fix[1:]}")

    def size_error(self, why: str) -> None:
        """Raise a PatchSizeError naming this layer (unless probing for the valid sizes)."""
        if self.strict:
            raise PatchSizeError(f"{self._where()}: {why}")

    def _where(self) -> str:
        return f"layer {self.path!r} ({type(self.module).__name__})"

    def require_map(self, what: str) -> None:
        """Raise unless the patch tensor is still a (B, C, *size) map (not yet flattened)."""
        if self.flat and not self.is_point():
            raise self.error(
                f"{what} is applied after Flatten, to the features of a {_x(self.size)} map",
                "move it before the Flatten",
            )

    def ntuple(self, value, name: str) -> Size:
        """A layer argument (an int or one entry per axis) as a tuple with one entry per spatial axis of the net."""
        return ntuple(value, self.dims, name)

    def slide(self, kernel: Size, stride: Size, source_dilation: Size | None = None) -> None:
        """Account for a window op (kernel, stride, own dilation): the map shrinks and later taps spread by stride."""
        source_dilation = source_dilation or (1,) * self.dims
        extent = tuple(r + 1 for r in reach(kernel, source_dilation))
        self.steps.append(tuple(Window(e, s) for e, s in zip(extent, stride, strict=True)))
        if any(e > n for e, n in zip(extent, self.size)):
            self.size_error(
                f"its {_x(extent)} window does not fit the {_x(self.size)} map this patch size leaves"
            )
        self.size = tuple(max((n - e) // s + 1, 1) for n, e, s in zip(self.size, extent, stride))
        self.dilation = tuple(d * s for d, s in zip(self.dilation, stride))

    def adapt(self, output_size) -> Size:
        """Account for an adaptive pool to ``output_size`` (None keeps an axis) as a pool whose kernel equals its
        stride; returns that kernel. The map must be a multiple of the output (equal windows)."""
        outputs = (
            (output_size,) * self.dims if isinstance(output_size, int) or output_size is None else output_size
        )
        if len(outputs) != self.dims:
            raise self.error(
                f"output_size={output_size} has {len(outputs)} entries for a map with {self.dims} spatial axes",
                "give one entry per spatial axis",
            )
        out = tuple(n if o is None else o for o, n in zip(outputs, self.size))
        self.steps.append(tuple(Window(1, 1) if o is None else Adaptive(o) for o in outputs))
        if any(n % o for n, o in zip(self.size, out)):
            self.size_error(
                f"output_size={out} does not divide the {_x(self.size)} map this patch size leaves, "
                "so its windows have unequal sizes (use a MaxPool/AvgPool layer for other sizes)"
            )
        kernel = tuple(max(n // o, 1) for n, o in zip(self.size, out))
        self.size = out
        self.dilation = tuple(d * k for d, k in zip(self.dilation, kernel))
        return kernel

    def read_features(self, in_features: int) -> tuple[int, ...]:
        """Account for a Linear reading the flattened map as ``in_features`` values; returns that map's (C, *size).

        An MLP on raw patches has no earlier layer fixing C: then C is ``in_features`` over the map's positions.
        """
        channels, *size = self.flat_map
        positions = math.prod(size)
        self.steps.append(Features(in_features, channels))
        if channels is None and in_features % positions == 0:
            channels = in_features // positions
            self.expect_channels(channels, "input channels")
        if channels is None:
            self.size_error(
                f"expects {in_features} input features, which the {_x(size)} map this patch size leaves cannot "
                f"give ({in_features} is not a multiple of {positions})"
            )
        elif channels * positions != in_features:
            self.size_error(
                f"expects {in_features} input features but this patch size leaves a {_x((channels, *size))} map "
                f"({channels * positions} features)"
            )
        self.size = (1,) * self.dims
        return (channels or 1, *size)

    def expect_channels(self, expected: int, what: str) -> None:
        """Raise unless the channels entering the layer are ``expected``; the first layer to know them fixes them."""
        if self.channels is None:
            self.channels = self.in_channels = expected
        elif self.channels != expected:
            raise self.error(
                f"expects {expected} {what} but the previous layers produce {self.channels}",
                "fix the model so that consecutive layers agree",
            )


def _x(size) -> str:
    """A size as users write it: 9x65x65."""
    return "x".join(map(str, size))
