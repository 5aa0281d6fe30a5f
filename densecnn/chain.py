"""Reading a patch model as a single chain of layers: ``[(dotted_path, module), ...]``.

``nn.Sequential`` (nested too) is read directly. Any other module is traced with ``torch.fx``; the trace must be a
single chain where each op consumes the previous one's output. Functional ops (``F.relu``, ``torch.flatten``,
``x.view(x.size(0), -1)`` …) become the equivalent parameter-free modules. Modules with a conversion rule are leaves.
"""

from __future__ import annotations

import operator

import torch
import torch.fx
import torch.nn.functional as F
from torch import nn

from .errors import ConversionError
from .rules import find_rule

Chain = list[tuple[str, nn.Module]]


def _flatten_view(node: torch.fx.Node) -> nn.Module | None:
    """``x.view(x.size(0), -1)`` / ``x.reshape(n, -1)`` / ``x.view(-1, F)`` as a Flatten, else None."""
    shape = node.args[1:] if len(node.args) > 2 else tuple(node.args[1]) if len(node.args) == 2 else ()
    if len(shape) == 2 and (shape[1] == -1 or shape[0] == -1):
        return nn.Flatten()
    return None


def _arg(node: torch.fx.Node, index: int, name: str, default):
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


# functional op -> builder of the equivalent module from the fx node
_FUNCTIONS = {
    F.relu: lambda n: nn.ReLU(),
    torch.relu: lambda n: nn.ReLU(),
    torch.tanh: lambda n: nn.Tanh(),
    F.tanh: lambda n: nn.Tanh(),
    torch.sigmoid: lambda n: nn.Sigmoid(),
    F.sigmoid: lambda n: nn.Sigmoid(),
    F.gelu: lambda n: nn.GELU(approximate=n.kwargs.get("approximate", "none")),
    F.silu: lambda n: nn.SiLU(),
    F.elu: lambda n: nn.ELU(alpha=_arg(n, 1, "alpha", 1.0)),
    F.leaky_relu: lambda n: nn.LeakyReLU(_arg(n, 1, "negative_slope", 0.01)),
    F.hardtanh: lambda n: nn.Hardtanh(_arg(n, 1, "min_val", -1.0), _arg(n, 2, "max_val", 1.0)),
    F.softplus: lambda n: nn.Softplus(_arg(n, 1, "beta", 1.0), _arg(n, 2, "threshold", 20.0)),
    F.softmax: lambda n: nn.Softmax(dim=_arg(n, 1, "dim", None)),
    F.log_softmax: lambda n: nn.LogSoftmax(dim=_arg(n, 1, "dim", None)),
    torch.softmax: lambda n: nn.Softmax(dim=_arg(n, 1, "dim", None)),
    torch.log_softmax: lambda n: nn.LogSoftmax(dim=_arg(n, 1, "dim", None)),
    torch.flatten: lambda n: nn.Flatten(_arg(n, 1, "start_dim", 0), _arg(n, 2, "end_dim", -1)),
    F.max_pool2d: lambda n: nn.MaxPool2d(
        _arg(n, 1, "kernel_size", None), _arg(n, 2, "stride", None), _arg(n, 3, "padding", 0),
        _arg(n, 4, "dilation", 1), ceil_mode=_arg(n, 5, "ceil_mode", False),
    ),
    F.avg_pool2d: lambda n: nn.AvgPool2d(
        _arg(n, 1, "kernel_size", None), _arg(n, 2, "stride", None), _arg(n, 3, "padding", 0),
        _arg(n, 4, "ceil_mode", False), divisor_override=_arg(n, 6, "divisor_override", None),
    ),
    F.dropout: lambda n: nn.Dropout(_arg(n, 1, "p", 0.5)),
}  # fmt: skip

_METHODS = {
    "relu": lambda n: nn.ReLU(),
    "tanh": lambda n: nn.Tanh(),
    "sigmoid": lambda n: nn.Sigmoid(),
    "softmax": lambda n: nn.Softmax(dim=_arg(n, 1, "dim", None)),
    "log_softmax": lambda n: nn.LogSoftmax(dim=_arg(n, 1, "dim", None)),
    "flatten": lambda n: nn.Flatten(_arg(n, 1, "start_dim", 0), _arg(n, 2, "end_dim", -1)),
    "contiguous": lambda n: nn.Identity(),
    "view": _flatten_view,
    "reshape": _flatten_view,
}


class _RuleLeafTracer(torch.fx.Tracer):
    """Stops at every module densecnn has a rule for, so custom rules apply to their layer as a whole."""

    def is_leaf_module(self, module: nn.Module, qualname: str) -> bool:
        return find_rule(type(module)) is not None or super().is_leaf_module(module, qualname)


def extract_chain(model: nn.Module, prefix: str = "") -> Chain:
    """The model's layers in order, as ``(dotted_path, module)`` pairs.

    >>> extract_chain(nn.Sequential(nn.Conv2d(1, 2, 3), nn.Sequential(nn.ReLU())))
    [('0', Conv2d(1, 2, kernel_size=(3, 3), stride=(1, 1))), ('1.0', ReLU())]
    """
    if find_rule(type(model)) is not None or _is_torch_layer(model):
        return [(prefix or type(model).__name__, model)]
    if isinstance(model, nn.Sequential):
        chain: Chain = []
        for name, child in model.named_children():
            chain += extract_chain(child, f"{prefix}.{name}" if prefix else name)
        return chain
    return _trace_chain(model, prefix)


def _is_torch_layer(module: nn.Module) -> bool:
    """A torch.nn layer (not a container): a leaf whose lack of a rule is reported as such, not traced into."""
    return type(module).__module__.startswith("torch.nn.modules") and not isinstance(module, nn.Sequential)


def _trace_chain(model: nn.Module, prefix: str) -> Chain:
    where = f"{prefix or type(model).__name__} ({type(model).__name__})"
    try:
        graph = _RuleLeafTracer().trace(model)
    except Exception as exc:  # fx raises many types; the user needs the reason, not the type
        raise ConversionError(
            f"{where}: has no conversion rule and torch.fx cannot trace it ({exc}). "
            "Register a rule with @densecnn.register_rule, or write the model as an nn.Sequential"
        ) from None
    chain: Chain = []
    current = None
    for node in graph.nodes:
        if node.op == "placeholder":
            if current is not None:
                raise ConversionError(
                    f"{where}: forward() takes more than one input; densecnn needs exactly one"
                )
            current = node
            continue
        if node.op == "output":
            if node.args[0] is not current:
                raise ConversionError(
                    f"{where}: forward() must return the last op's output (a single tensor)"
                )
            break
        if _is_shape_query(node):
            continue
        if not node.args or node.args[0] is not current:
            raise ConversionError(
                f"{where}: op {node.name!r} ({node.op} {_target_name(node)}) does not consume the previous op's "
                "output; densecnn converts single chains of layers (no branches, skips or extra inputs)"
            )
        chain.append(_node_layer(model, node, prefix, where))
        current = node
    return [(path, module) for path, module in chain if module is not None]


def _is_shape_query(node: torch.fx.Node) -> bool:
    return (node.op == "call_method" and node.target in ("size", "dim")) or (
        node.op == "call_function"
        and node.target in (getattr, operator.getitem)
        and node.args[1:2] == ("shape",)
    )


def _target_name(node: torch.fx.Node) -> str:
    return getattr(node.target, "__name__", str(node.target))


def _node_layer(
    model: nn.Module, node: torch.fx.Node, prefix: str, where: str
) -> tuple[str, nn.Module | None]:
    path = f"{prefix}.{node.target}" if prefix and node.op == "call_module" else str(node.target)
    if node.op == "call_module":
        return path, model.get_submodule(node.target)
    builders = _FUNCTIONS if node.op == "call_function" else _METHODS if node.op == "call_method" else {}
    builder = builders.get(node.target)
    module = builder(node) if builder else None
    if module is None:
        raise ConversionError(
            f"{where}: op {node.name!r} ({node.op} {_target_name(node)}) is not a supported layer. "
            "Use an nn module with a conversion rule, or register one with @densecnn.register_rule"
        )
    name = f"{prefix}.{node.name}" if prefix else node.name
    return name, None if isinstance(module, nn.Identity) else module
