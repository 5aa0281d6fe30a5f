"""convert(): a patch classifier -> an exactly equivalent DenseCNN of stride-1 dilated ops."""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence

from torch import nn
from torch.nn.modules.lazy import LazyModuleMixin

from . import functional_weights
from .chain import Chain, extract_chain
from .dense import DenseCNN
from .errors import ConversionError, DenseCNNError, DenseEquivalenceWarning, PatchSizeError, PatchSizeWarning
from .geometry import Size, ntuple
from .materialised import check_finite, check_materialised
from .ops import check_backend
from .ops.backends import Backend, allowed_solvers, ext_available, no_ext_kernel
from .ops.solvers import candidates
from .padding import check_padding_mode
from .patch_sizes import describe_nearest, smallest_equivalent
from .rules import ConversionContext, is_stochastic, module_type, record_for, unconvertible_subclass
from .rules.registry import spatial_dims
from .verify import ConvertedLayer, verify_conversion

_AXES = {1: "(length,)", 2: "(height, width)", 3: "(depth, height, width)"}


MAX_PATCH_PIXELS = 2**26  # per patch (8192² for images): no patch classifier is trained on more


def as_patch_size(patch_size, dims: int = 2) -> Size:
    """An int or a tuple with one entry per spatial axis (numpy ints too) as a validated tuple of ``dims`` positive
    Python ints: (h, w) for images, (d, h, w) for volumes, (l,) for signals.

    >>> as_patch_size(9, 3), as_patch_size((9, 65, 65), 3)
    ((9, 9, 9), (9, 65, 65))

    Raises:
        PatchSizeError: a string, a non-integer, a wrong number of entries or an entry below 1.
    """
    if isinstance(patch_size, (str, bytes)):
        text = patch_size.decode("ascii", "replace") if isinstance(patch_size, bytes) else patch_size
        number = f" ({int(text)})" if text.strip().isdigit() else ""
        raise PatchSizeError(
            f"patch_size must be an int or a tuple of ints, got the string {patch_size!r}: pass the number "
            f"itself{number}"
        )
    try:
        size = ntuple(patch_size, dims, "patch_size")
    except (TypeError, ValueError):
        size = ()
    if len(size) != dims or min(size) < 1:
        raise PatchSizeError(
            f"patch_size must be a positive int or a tuple {_AXES[dims]} of them for a net with {dims} spatial "
            f"axis/axes, got {patch_size!r}"
        )
    return size


def _is_sequence(patch_size) -> bool:
    """A tuple or list of sizes (a string is refused as a string by :func:`as_patch_size`, not read as digits)."""
    return isinstance(patch_size, Sequence) and not isinstance(patch_size, (str, bytes))


def spatial_dims_of(chain: Chain, patch_size) -> int:
    """The number of spatial axes of a patch net: fixed by its layers (``Conv3d``: 3), else by a tuple
    ``patch_size``'s length, else 2 (an MLP on raw image patches).

    Raises:
        ConversionError: the layers mix numbers of axes (a Conv2d and a MaxPool3d).
    """
    found: dict[int, str] = {}
    for path, module in chain:
        dims = spatial_dims(module)
        if dims is not None:
            found.setdefault(dims, f"{path!r} ({type(module).__name__})")
    if len(found) > 1:
        named = ", ".join(f"{where}: {dims}-D" for dims, where in sorted(found.items()))
        raise ConversionError(
            f"the model mixes layers for different numbers of spatial axes ({named}). Use layers of one kind "
            "throughout (Conv1d/MaxPool1d for signals, Conv2d/MaxPool2d for images, Conv3d/MaxPool3d for volumes)"
        )
    if found:
        return next(iter(found))
    if _is_sequence(patch_size) and len(patch_size) in _AXES:
        return len(patch_size)
    return 2


def convert(
    model: nn.Module,
    patch_size,
    *,
    padding_mode: str = "zeros",
    backend: str = "auto",
    tune: bool = False,
    verify: bool = True,
) -> DenseCNN:
    """Convert a patch classifier into a DenseCNN that labels every pixel of a whole image in one pass.

    ``model`` maps (B, C, Ph, Pw) patches to (B, K) scores (or (B, K, 1, 1)). The dense net uses the very same
    parameters (no copies), so gradients through it land in ``model``; ``model`` itself is not modified.
    Signal and volume nets convert the same way: a model of ``Conv1d`` layers maps (B, C, Pl) patches, one of
    ``Conv3d`` layers (B, C, Pd, Ph, Pw) patches; the layers fix the number of spatial axes.

    Args:
        model: an ``nn.Sequential`` (nested allowed) or a module whose ``torch.fx`` trace is a chain of layers.
        patch_size: the patch size the model was trained on: an int, or a tuple with one entry per spatial axis
            ((h, w) for images; (d, h, w) for volumes, anisotropic ones like (9, 65, 65) included; (l,) for signals).
        padding_mode: how the image is extended beyond its border: "zeros", "reflect" or "replicate".
        backend: which solvers may run the dense ops (:class:`densecnn.ops.Backend`): "auto" (all), "native"
            (torch's dilated ops, NCHW) or "ext" (densecnn's own kernels).
        tune: time the candidate solvers of each layer on the first call for a new input shape (cached on disk)
            instead of choosing at once from the shipped cost model; see docs/performance.md.
        verify: run the dense net on a random map two patches wide and the model on a few of its patches, and raise
            unless they agree to rounding (:mod:`densecnn.verify`; a fraction of one warm 512² forward, once:
            docs/conversion.md gives the figures). Turn it off only where the same model was verified already.

    Raises:
        ConversionError: a layer cannot be converted exactly (the message names it and says what to do), a tensor
            holds no values (the meta device, a lazy layer not yet run) or NaN/±Inf ones (a diverged training run's
            weights: the message names the tensor and counts them), no solver of ``backend`` runs a layer, or
            the verification pass found the dense net and the model disagreeing (the message names the first layer
            whose outputs differ).
        PatchSizeError: the patch size does not bring the net to one output, or has a number of entries other than
            the layers' spatial axes; the message names the nearest sizes that do (computed in closed form from the layers, instantly whatever the size).

    Warns:
        PatchSizeWarning: a smaller patch size gives the same net (pooling floors drop the extra rows and columns),
            so the model was most likely trained with that one.
        DenseEquivalenceWarning: BatchNorm/Dropout-like layers are in training mode.

    Example::

        >>> model, patch = densecnn.zoo.tiny(in_channels=1, num_classes=3)
        >>> dense = densecnn.convert(model.eval(), patch)
        >>> dense(torch.rand(2, 1, 40, 50)).shape
        torch.Size([2, 3, 40, 50])
    """
    check_padding_mode(padding_mode)
    backend = check_backend(backend)
    chain, converted, ctx, patch = _converted_layers(model, patch_size)
    check_materialised(model)
    check_finite(model)
    _warn_if_random_in_training(chain)
    _check_solvers(converted, backend, model)
    dense = DenseCNN(
        [layer.dense for layer in converted if layer.dense is not None],
        patch_size=patch, in_channels=ctx.in_channels, num_classes=ctx.channels, padding_mode=padding_mode,
        backend=backend.value, tune=tune, patch_modules=tuple(model.named_modules()),
        shared_tensors=functional_weights.shared_tensors(module for _, module in chain),
    )  # fmt: skip
    if verify:
        verify_conversion(model, dense, converted)
        _refuse_changed_by_running(dense)
    return dense


def _warn_if_random_in_training(chain) -> None:
    """A :class:`DenseEquivalenceWarning` when a layer of ``chain`` (name, module) is in training mode with an
    output that is then random or depends on the batch."""
    if any(module.training and is_stochastic(module) for _, module in chain):
        warnings.warn(
            "the model has layers in training mode whose output is then random or depends on the batch "
            "(BatchNorm, Dropout, RReLU, ...): the dense net matches patch-by-patch scanning only in eval mode. "
            "Call model.eval() before comparing or predicting.",
            DenseEquivalenceWarning,
            stacklevel=3,
        )


def _refuse_changed_by_running(dense: DenseCNN) -> None:
    """Raise if running the model (in the verification pass) changed its structure: a forward that sets its own
    attributes or resizes its buffers, which the dense net (that never runs it) cannot follow."""
    change = dense.structure.follow()
    if change is not None:
        raise ConversionError(
            f"the model changes its own state when it runs ({change}), which a dense net, computed from the layers "
            "as converted, cannot follow. Write forward without setting attributes or resizing buffers (keep such "
            "state outside the model)"
        )


def layer_channels(model: nn.Module, patch_size) -> tuple[int | None, int]:
    """(in_channels, num_classes) of the dense net ``model`` converts to at ``patch_size``, from its layers' arguments
    alone (no tensor is read: the layers may be on the meta device, as a model file's are while it is checked).

    >>> layer_channels(nn.Sequential(nn.Conv2d(3, 8, 5), nn.ReLU(), nn.Conv2d(8, 2, 1)), 5)
    (3, 2)

    Raises:
        ConversionError, PatchSizeError: as :func:`convert`, for the layers.
    """
    _, _, ctx, _ = _converted_layers(model, patch_size)
    return ctx.in_channels, ctx.channels


def _converted_layers(
    model: nn.Module, patch_size
) -> tuple[Chain, list[ConvertedLayer], ConversionContext, Size]:
    """The chain, each layer converted, the context after the last one and the patch size as a tuple; warns if a
    smaller patch size gives the same net."""
    chain = extract_chain(model)
    dims = spatial_dims_of(chain, patch_size)
    if _is_sequence(patch_size) and len(patch_size) != dims:
        raise PatchSizeError(
            f"patch_size {tuple(patch_size)} has {len(patch_size)} entries, but the model's layers have {dims} "
            f"spatial axis/axes: give an int or {_AXES[dims]}"
        )
    patch = as_patch_size(patch_size, dims)
    try:
        converted, ctx = _convert_chain(chain, patch)
    except PatchSizeError as exc:
        raise PatchSizeError(f"{exc}. {_nearest_valid_sizes(chain, patch)}") from None
    if math.prod(patch) > MAX_PATCH_PIXELS:  # the layers take it (a global pool), but no net is trained on it
        raise PatchSizeError(
            f"patch_size {'x'.join(map(str, patch))} is {math.prod(patch):,} pixels per patch, more than densecnn "
            f"accepts ({MAX_PATCH_PIXELS:,}); pass the patch size the model was trained with"
        )
    _warn_if_not_smallest(ctx, patch)
    return chain, converted, ctx, patch


def _check_solvers(converted: list[ConvertedLayer], backend: Backend, model: nn.Module) -> None:
    """Raise unless some solver of ``backend`` runs each dense layer (``backend="ext"`` has kernels for dilated and
    pooling layers, not for every conv)."""
    if backend is not Backend.EXT:
        return
    weight = next((p for p in model.parameters() if p.is_floating_point()), None)
    dtype = weight.dtype if weight is not None else None
    allowed = allowed_solvers(backend, None)
    for layer in converted:
        if layer.dense is None or not hasattr(layer.dense, "dense_op"):
            continue
        runs = set(candidates(layer.dense.dense_op(), ext_available=ext_available(), dtype=dtype)) & allowed
        if not runs:
            raise ConversionError(
                no_ext_kernel(f"layer {layer.path!r} ({type(layer.module).__name__})", allowed, dtype)
            )


def _convert_chain(
    chain: Chain, patch: Size, *, strict: bool = True
) -> tuple[list[ConvertedLayer], ConversionContext]:
    """Each layer of the chain with its dense layer (None: dropped) and the patch net's map after it, and the
    context after the last layer.

    ``strict=False`` goes on past a patch size that does not fit, to record every layer's size steps.
    """
    if not chain:
        raise ConversionError("the model has no layers to convert")
    ctx = ConversionContext(path="", size=patch, channels=None, strict=strict)
    converted = []
    for index, (path, module) in enumerate(chain):
        ctx.path, ctx.module, ctx.is_last = path, module, index == len(chain) - 1
        record = record_for(module)
        if record is None:
            raise _no_rule(ctx, module)
        try:
            dense_layer = record.rule(module, ctx)
        except DenseCNNError:
            raise
        except Exception as exc:  # a rule's own failure (a user's rule, an argument it did not expect)
            raise ctx.error(
                f"its conversion rule ({record.name}) failed: {type(exc).__name__}: {exc}",
                "if you registered that rule, correct it; otherwise report this as a densecnn bug",
            ) from None
        converted.append(
            ConvertedLayer(path, module, record, dense_layer, ctx.size, ctx.dilation, ctx.flat_map)
        )
    if not ctx.is_point() and strict:
        raise PatchSizeError(
            f"this patch size leaves a {'x'.join(map(str, ctx.size))} output map, not one score vector per patch"
        )
    if ctx.channels is None:
        raise ConversionError("the model has no layer that fixes its number of classes (no Conv or Linear)")
    return converted, ctx


def _no_rule(ctx: ConversionContext, module: nn.Module) -> ConversionError:
    if isinstance(module, LazyModuleMixin) and module.has_uninitialized_params():
        return ctx.error(
            "is a lazy layer whose parameters do not exist yet",
            "run the model once on a patch (model(torch.zeros(1, C, *patch_size))) before converting it",
        )
    subclass = unconvertible_subclass(module_type(module))
    if subclass is None:
        return ctx.error(
            "has no conversion rule",
            "use a supported layer, or register a rule for it with @densecnn.register_rule "
            "(only if it can be made exactly equivalent)",
        )
    base, names = subclass
    return ctx.error(
        f"subclasses {base.__name__} but redefines {', '.join(names)}, so {base.__name__}'s rule may not "
        "reproduce what it computes",
        f"register a rule for {type(module).__name__} with @densecnn.register_rule (only if it can be made exactly "
        f"equivalent), or write its computation as layers densecnn converts",
    )


def _nearest_valid_sizes(chain: Chain, patch: Size) -> str:
    """A hint naming the valid patch sizes nearest to ``patch``, from the layers' size steps (closed form)."""
    try:
        _, ctx = _convert_chain(chain, patch, strict=False)
    except ConversionError as exc:  # the model has another problem too: say it
        return f"(The model also fails for another reason: {exc})"
    return describe_nearest(ctx.steps, patch)


def _warn_if_not_smallest(ctx: ConversionContext, patch: Size) -> None:
    smallest = smallest_equivalent(ctx.steps, patch)
    if smallest != patch:
        unread = tuple(p - s for p, s in zip(patch, smallest))
        size = smallest[0] if len(set(smallest)) == 1 and len(set(patch)) == 1 else smallest
        if len(patch) == 2:
            what = f"{unread[0]} row(s) and {unread[1]} column(s)"
        else:
            names = {1: ("sample(s)",), 3: ("slice(s)", "row(s)", "column(s)")}[len(patch)]
            what = " and ".join(f"{u} {name}" for u, name in zip(unread, names))
        warnings.warn(
            f"patch size {'x'.join(map(str, patch))}: the net never reads the last {what} of each patch (its "
            f"pools floor them away), so {'x'.join(map(str, smallest))} gives the same "
            f"net, and the model was most likely trained with patch_size={size}. With a larger size, each pixel's "
            "label comes from a patch whose centre is shifted. Pass the size the model was trained with",
            PatchSizeWarning,
            stacklevel=4,
        )
