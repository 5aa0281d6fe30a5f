"""The patch model's structure as it was converted, checked on every call of the dense net.

A dense net shares the patch model's parameters, so it follows every change of their values (training, a loaded
state dict, a parameter replaced by one of the same shape). It does not follow a change of the model's structure: a
layer replaced in a ``Sequential``, a conv's ``stride`` or a pool's ``kernel_size`` set anew, a Python attribute that
``forward`` reads toggled. :class:`Structure` records, for every module of the model, its identity, its type, its
children, the shapes of its parameters and buffers, and its plain Python attributes (the hyper-parameters and the
flags a traced ``forward`` read); :meth:`Structure.check` compares them on every call and raises
:class:`~densecnn.errors.ModelChangedError` naming the first difference. The mode (``training``) and hooks are not part
of it: the dense net follows the mode, and :mod:`densecnn.hooks` refuses hooks by name.

>>> model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.MaxPool2d(2), nn.Conv2d(2, 3, 2))
>>> structure = Structure(tuple(model.named_modules()))
>>> model[1].kernel_size = 3
>>> structure.check()
Traceback (most recent call last):
ModelChangedError: the model changed since it was converted (layer '1' (MaxPool2d): kernel_size was 2, is 3): ...
"""

from __future__ import annotations

import enum
import types

import torch
from torch import nn

from .errors import ModelChangedError
from .functional_weights import SharedTensor

_PLAIN = (int, float, complex, bool, str, bytes, type(None), torch.dtype, torch.device, torch.Size, enum.Enum)
_CODE = (types.FunctionType, types.BuiltinFunctionType, type)  # compared by identity


def _plain(value) -> bool:
    """Whether ``value`` is data compared by value: numbers, strings, None, dtypes, and tuples, lists, dicts and sets
    of them."""
    if isinstance(value, _PLAIN):
        return True
    if isinstance(value, (tuple, list, set, frozenset)):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(_plain(k) and _plain(v) for k, v in value.items())
    return False


def _frozen(value):
    """A copy of a plain value that a later change of the original does not reach: lists as tuples, dicts as tuples
    of items, sets as frozensets."""
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(v) for v in value)
    if isinstance(value, dict):
        return tuple((k, _frozen(v)) for k, v in value.items())
    if isinstance(value, set):
        return frozenset(value)
    return value


def _state(module: nn.Module) -> dict[str, object]:
    """What of ``module`` the dense net was built from, besides its tensors' values: type, children, tensor shapes,
    plain attributes (and functions and classes, by identity)."""
    state: dict[str, object] = {"type": type(module)}
    state["children"] = tuple(module._modules.items())  # compared by identity (a deep copy copies them alike)
    state["tensors"] = tuple(
        (name, None if t is None else tuple(t.shape))
        for name, t in (*module._parameters.items(), *module._buffers.items())
    )
    for name, value in vars(module).items():
        if name.startswith("_") or name == "training":
            continue
        if _plain(value):
            state[name] = _frozen(value)
        elif isinstance(value, _CODE):
            state[name] = value
    return state


class _Snapshot:
    """One module's recorded state, with a fast test that nothing of it changed: the same type, children, watched
    attribute objects (immutable ones by identity, lists and dicts by value) and tensor shapes, and as many
    attributes (an added one goes through the full comparison)."""

    __slots__ = ("module", "state", "type", "children", "attributes", "mutable", "tensors", "size")

    def __init__(self, module: nn.Module):
        self.module, self.state, self.type = module, _state(module), type(module)
        self.children = dict(module._modules)
        self.attributes = {name: vars(module)[name] for name in self.state if name in vars(module)}
        self.mutable = {
            n: v for n, v in self.state.items() if isinstance(self.attributes.get(n), (list, dict, set))
        }
        self.tensors = tuple(
            (store, name, None if t is None else t.shape)
            for store in ("_parameters", "_buffers")
            for name, t in getattr(module, store).items()
        )
        self.size = len(vars(module))

    def unchanged(self) -> bool:
        module = self.module
        values = module.__dict__
        if type(module) is not self.type or module._modules != self.children:
            return False
        for name, value in self.attributes.items():
            now = values.get(name, _MISSING)
            if now is not value or (name in self.mutable and _frozen(now) != self.mutable[name]):
                return False
        for store, name, shape in self.tensors:
            tensor = values[store].get(name, _MISSING)
            if (
                None if tensor is None or tensor is _MISSING else tensor.shape
            ) != shape or tensor is _MISSING:
                return False
        if len(values) != self.size:  # an attribute added or removed: watched only if it is plain data
            if _state(module) != self.state:
                return False
            self.size = len(values)
        return True


_MISSING = object()


class Structure:
    """The structure of the modules ``(path, module)`` of a patch model (the model itself at path "") at conversion.

    >>> structure = Structure(tuple(model.named_modules()))   # DenseCNN keeps one
    >>> structure.check()                                     # on every call: raises if the structure changed
    """

    def __init__(self, modules: tuple[tuple[str, nn.Module], ...], shared: tuple[SharedTensor, ...] = ()):
        self.modules = modules
        self.snapshots = tuple(_Snapshot(module) for _, module in modules)
        self.shared = shared

    def follow(self) -> str | None:
        """Follow the model where the dense net can, and return the first change it cannot follow ("layer '1'
        (MaxPool2d): kernel_size was 2, is 3"), or None. Followed: a tensor that a functional op of a traced forward
        reads (``shared``), replaced by one of the same shape, which the dense net's layer then holds instead, as a
        module's replaced parameter is shared."""
        for (path, module), snapshot in zip(self.modules, self.snapshots):
            if not snapshot.unchanged():
                now = _state(module)
                if now != snapshot.state:
                    return f"{_where(path, module)}: {_difference(snapshot.state, now)}"
        for tensor in self.shared:
            change = tensor.follow()
            if change is not None:
                return change
        return None

    def check(self) -> None:
        """Raise if any module's structure differs from the one recorded.

        Raises:
            ModelChangedError: naming the module and what changed, and saying to convert again.
        """
        change = self.follow()
        if change is not None:
            raise ModelChangedError(
                f"the model changed since it was converted ({change}); the dense net was built from the model as it "
                "was. Convert it again: densecnn.convert(model, patch_size) (parameter values need no new "
                "conversion: they are shared)"
            )


def _where(path: str, module: nn.Module) -> str:
    return f"layer {path!r} ({type(module).__name__})" if path else f"the model ({type(module).__name__})"


def _difference(before: dict, now: dict) -> str:
    if before["type"] is not now["type"]:
        return f"its type was {before['type'].__name__}, is {now['type'].__name__}"
    if before["children"] != now["children"]:
        changed = [
            name
            for name in dict.fromkeys([n for n, _ in before["children"]] + [n for n, _ in now["children"]])
            if dict(before["children"]).get(name) is not dict(now["children"]).get(name)
        ]
        return f"its child module(s) {', '.join(map(repr, changed))} were replaced, added or removed"
    if before["tensors"] != now["tensors"]:
        return "its parameters or buffers changed shape, or were added or removed"
    for name in dict.fromkeys([*before, *now]):
        if before.get(name) != now.get(name):
            if name not in before:
                return f"attribute {name!r} was added"
            if name not in now:
                return f"attribute {name!r} was removed or is no longer plain data"
            return f"{name} was {before[name]!r}, is {now[name]!r}"
    return "it differs"
