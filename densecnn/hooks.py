"""What a module's hooks and instance overrides mean for an exact conversion: honoured, or refused by name.

A dense net computes a layer from its parameters; it never calls the patch layer's ``forward`` (a conv) or calls it on
a whole map instead of a patch (a ReLU). So anything that changes a layer's output through torch's hook machinery is
either reproduced exactly or refused:

- honoured: the forward pre-hooks of the older weight reparametrisations (``torch.nn.utils.weight_norm``,
  ``torch.nn.utils.prune``, ``torch.nn.utils.spectral_norm``) only recompute a weight from other parameters; the dense
  layers run them before they read the weight (:func:`recompute_weights`), as the layer's own forward would;
- refused: any other forward or backward hook on the model or on any of its modules, a ``forward`` replaced on an
  instance (``layer.forward = ...``), a class that redefines ``__call__``, and global module hooks
  (``register_module_forward_hook`` and kin).

``torch.nn.utils.parametrize`` needs none of this: its weights are properties, recomputed on every read.

>>> layer = nn.Conv2d(1, 2, 3)
>>> handle = layer.register_forward_hook(lambda module, inputs, output: 2 * output)
>>> check_modules([("0", layer)])
Traceback (most recent call last):
ConversionError: layer '0' (Conv2d) has a forward hook (<lambda>), ...
"""

from __future__ import annotations

from collections.abc import Iterable

import torch.nn.modules.module as module_globals
from torch import nn
from torch.nn.modules.lazy import LazyModuleMixin
from torch.nn.utils.prune import BasePruningMethod
from torch.nn.utils.spectral_norm import SpectralNorm
from torch.nn.utils.weight_norm import WeightNorm

from .errors import ConversionError

# forward pre-hooks that only set a weight attribute from the module's other parameters: run, never refused
WEIGHT_HOOKS = (WeightNorm, BasePruningMethod, SpectralNorm)

# (attribute of a module holding hooks, what they are)
_MODULE_HOOKS = (
    ("_forward_pre_hooks", "forward pre-hook"),
    ("_forward_hooks", "forward hook"),
    ("_backward_pre_hooks", "backward pre-hook"),
    ("_backward_hooks", "backward hook"),
)
_GLOBAL_HOOKS = (
    ("_global_forward_pre_hooks", "torch.nn.modules.module.register_module_forward_pre_hook"),
    ("_global_forward_hooks", "torch.nn.modules.module.register_module_forward_hook"),
    ("_global_backward_pre_hooks", "torch.nn.modules.module.register_module_full_backward_pre_hook"),
    ("_global_backward_hooks", "torch.nn.modules.module.register_module_full_backward_hook"),
)
_REMOVE = (
    "Remove it before converting (the handle its register_* call returned: handle.remove()); to change the "
    "layer's output, write the change as a layer of the model"
)


def _name(hook) -> str:
    return getattr(hook, "__qualname__", None) or type(hook).__name__


def module_problem(module: nn.Module) -> str | None:
    """Why ``module``'s own hooks or instance attributes keep the dense net from reproducing it, and the fix; else
    None."""
    if "forward" in vars(module):
        return (
            "has its forward replaced on the instance (layer.forward = ...), which densecnn cannot read. Delete the "
            "replacement before converting (del layer.forward restores the class's); to change the layer's output, "
            "write the change as a layer of the model"
        )
    cls = type(module)
    if cls.__call__ is not nn.Module.__call__ or cls._call_impl is not nn.Module._call_impl:
        return (
            "redefines __call__, so calling it may do more than its forward, which is all densecnn can read. Write "
            "what its __call__ adds as a layer of the model, or register a rule for the class with "
            "@densecnn.register_rule"
        )
    for attribute, what in _MODULE_HOOKS:
        for hook in getattr(module, attribute, {}).values():
            if attribute == "_forward_pre_hooks" and (isinstance(hook, WEIGHT_HOOKS) or _is_lazy_setup(hook)):
                continue
            return (
                f"has a {what} ({_name(hook)}), which changes what it computes in a way a dense net cannot see. "
                f"{_REMOVE}"
            )
    return None


def _is_lazy_setup(hook) -> bool:
    """A lazy module's own pre-hook, which creates its parameters on the first call (the rules refuse a lazy module
    that has not had that call)."""
    return getattr(hook, "__func__", None) is LazyModuleMixin._infer_parameters


def check_modules(modules: Iterable[tuple[str, nn.Module]]) -> None:
    """Raise :class:`ConversionError` for the first ``(path, module)`` with a hook or an instance ``forward`` (the path
    "" is the model itself).

    Raises:
        ConversionError: naming the layer, the hook and the fix.
    """
    for path, module in modules:
        problem = module_problem(module)
        if problem is not None:
            where = f"layer {path!r}" if path else "the model"
            raise ConversionError(f"{where} ({type(module).__name__}) {problem}")


def check_global_hooks() -> None:
    """Raise :class:`ConversionError` while a global module hook is registered: it would act on every layer of the
    patch model and of the dense net alike, which have different layers."""
    for attribute, registration in _GLOBAL_HOOKS:
        hooks = getattr(module_globals, attribute, {})
        if hooks:
            hook = next(iter(hooks.values()))
            raise ConversionError(
                f"a global module hook is registered ({_name(hook)}, by {registration}): it changes what every "
                f"layer computes, so no dense net can be checked against the patch model. {_REMOVE}"
            )


def weight_hook_removal(hook) -> str:
    """The call that makes the weight a weight-recomputing pre-hook (:data:`WEIGHT_HOOKS`) sets a plain parameter
    again, with the same values."""
    if isinstance(hook, WeightNorm):
        return "torch.nn.utils.remove_weight_norm(layer)"
    if isinstance(hook, SpectralNorm):
        return "torch.nn.utils.remove_spectral_norm(layer)"
    return f"torch.nn.utils.prune.remove(layer, {hook._tensor_name!r})"


def recompute_weights(module: nn.Module) -> None:
    """Run ``module``'s weight-recomputing pre-hooks (:data:`WEIGHT_HOOKS`), as its forward would before computing:
    the dense layers call this before they read the weight."""
    for hook in module._forward_pre_hooks.values():
        if isinstance(hook, WEIGHT_HOOKS):
            hook(module, ())
