"""Reading a patch model as a single chain of layers: ``[(dotted_path, module), ...]``.

``nn.Sequential`` (nested too) is read directly. Any other module is traced with ``torch.fx``; the trace must be a
single chain where each op consumes the previous one's output. Functional ops (``F.relu``, ``torch.flatten``,
``x.view(x.size(0), -1)`` …) become the equivalent parameter-free modules, as the layer records' aliases say
(:mod:`densecnn.rules.registry`); ops that only read the input's shape (``x.size(0)``, ``x.shape[0]``) are skipped.
A functional op that takes ``training=`` (``F.dropout(x, p, training=self.training)``) becomes a module in the model's
mode at conversion, which then follows the dense net's own ``.train()``/``.eval()``. Modules with a conversion rule are
leaves; a module used twice (``act = nn.ReLU(); nn.Sequential(conv1, act, conv2, act)``) is a layer at each use.
Hooks are honoured or refused as :mod:`densecnn.hooks` says.
"""

from __future__ import annotations

import operator

import torch
import torch.fx
from torch import nn

from . import functional_weights
from .errors import ConversionError, InvalidTypeError
from .hooks import check_global_hooks, check_modules
from .rules import aliases, find_record, module_type, unconvertible_subclass
from .rules.registry import overrides

Chain = list[tuple[str, nn.Module]]


class _RuleLeafTracer(torch.fx.Tracer):
    """Stops at every layer (a module densecnn has a rule for, or refuses by name), so rules apply to it whole.
    Buffers are traced as the model's tensors, as parameters are: read by value while tracing, one that forward
    updates in place (``self.count.add_(1)``) or branches on (``if self.flag:``) would leave no op in the trace to
    refuse, and the dense net would keep the value it had at conversion."""

    proxy_buffer_attributes = True

    def is_leaf_module(self, module: nn.Module, qualname: str) -> bool:
        return _is_layer(module) or super().is_leaf_module(module, qualname)


def extract_chain(model: nn.Module) -> Chain:
    """The layers in the order the model runs them, as ``(dotted_path, module)`` pairs; a module used twice is listed
    at each use.

    >>> relu = nn.ReLU()
    >>> extract_chain(nn.Sequential(nn.Conv2d(1, 2, 3), relu, nn.Sequential(nn.Conv2d(2, 2, 1), relu)))
    [('0', Conv2d(1, 2, kernel_size=(3, 3), stride=(1, 1))), ('1', ReLU()), ('2.0', Conv2d(2, 2, kernel_size=(1, 1), stride=(1, 1))), ('2.1', ReLU())]

    Raises:
        ConversionError: the model or one of its modules has a hook or a ``forward`` replaced on the instance, a
            global module hook is registered (:mod:`densecnn.hooks`), or the model is not a chain of layers.
    """
    check_global_hooks()
    check_readable(model)
    check_modules(model.named_modules())
    return _layers(model, "")


_EAGER = (
    "densecnn reads the layers of an eager nn.Module; pass the module itself, before torch.jit.script/trace or "
    "torch.compile"
)
_QUANTIZED_PACKAGES = ("torch.ao.nn.quantized", "torch.nn.quantized", "torch.ao.nn.intrinsic.quantized")


def check_readable(model: nn.Module) -> None:
    """Raise for a model whose computation is not its eager layers: TorchScript (``torch.jit.script`` or
    ``torch.jit.trace``), ``torch.compile``, or a quantized model (``torch.ao.quantization.quantize_dynamic`` and
    kin), naming what it is and what to pass instead.

    Raises:
        ConversionError: naming the module's dotted path, what it is, and the eager model to pass.
    """
    if not isinstance(model, nn.Module):
        raise InvalidTypeError(
            f"the model is a {type(model).__name__}, not a torch.nn.Module; densecnn converts the layers of a module. "
            "Pass the nn.Module patch classifier itself (wrap a function's layers in an nn.Sequential)"
        )
    if type(model).__name__ == "OptimizedModule" and isinstance(getattr(model, "_orig_mod", None), nn.Module):
        raise ConversionError(
            f"the model is a torch.compile'd module ({type(model).__name__}), whose forward runs generated code. "
            "Pass the eager module it wraps: densecnn.convert(compiled._orig_mod, patch_size)"
        )
    for path, module in model.named_modules():
        where = f"layer {path!r}" if path else "the model"
        if isinstance(module, torch.jit.ScriptModule):
            how = "torch.jit.trace" if isinstance(module, torch.jit.TracedModule) else "torch.jit.script"
            raise ConversionError(
                f"{where} is a TorchScript module made by {how} ({type(module).__name__}), whose layers are compiled "
                f"code. {_EAGER} (keep the eager model; TorchScript is for deployment, densecnn's dense net replaces "
                "it)"
            )
        if type(module).__module__.startswith(_QUANTIZED_PACKAGES):
            raise ConversionError(
                f"{where} ({type(module).__name__}) is a quantized layer (quantize_dynamic or static quantization), "
                "which computes with integer weights densecnn's dense ops do not run. Convert the float model "
                "before quantizing it (densecnn.convert(float_model, patch_size)); bfloat16 inference needs no "
                "quantization: dense.predict(x.bfloat16())"
            )


def _layers(model: nn.Module, prefix: str) -> Chain:
    if _is_layer(model):
        return [(prefix or type(model).__name__, model)]
    if isinstance(model, nn.Sequential) and not overrides(type(model), nn.Sequential):
        chain: Chain = []
        # every use, from the ordered dict itself: named_children() yields a repeated module once
        for name, child in model._modules.items():
            if child is not None:
                chain += _layers(child, f"{prefix}.{name}" if prefix else name)
        return chain
    return _trace_chain(model, prefix)  # a custom forward (an nn.Sequential subclass's too)


def _is_layer(module: nn.Module) -> bool:
    """A leaf of the chain: a layer with a rule, a subclass refused by name, or a torch.nn layer (not a container)
    whose lack of a rule is reported as such, not traced into."""
    layer_type = module_type(module)
    return (
        find_record(layer_type) is not None
        or unconvertible_subclass(layer_type) is not None
        or (layer_type.__module__.startswith("torch.nn.modules") and not isinstance(module, nn.Sequential))
    )


def _trace_chain(model: nn.Module, prefix: str) -> Chain:
    where = f"{prefix or type(model).__name__} ({type(model).__name__})"
    try:
        graph = _RuleLeafTracer().trace(model)
    except Exception as exc:  # fx raises many types; the user needs the reason, not the type
        raise _untraceable(where, exc) from None
    constants = functional_weights.constant_nodes(graph)
    _refuse_randomness_and_state(graph, constants, where)
    dims = _spatial_dims(model, graph)
    chain: list[tuple[str, nn.Module | None]] = []
    current = None
    for node in graph.nodes:
        op = f"{where}: op {node.name!r} ({node.op} {_target_name(node)})"
        if node.op == "placeholder":
            if current is not None:
                raise ConversionError(
                    f"{where}: forward() takes more than one input; densecnn needs exactly one. Give forward a "
                    "single tensor argument (fix the others as attributes of the model)"
                )
            current = node
            continue
        if node.op == "output":
            if node.args[0] is not current:
                raise ConversionError(
                    f"{where}: forward() must return the last op's output (a single tensor). Return the scores "
                    "tensor alone (no tuple, dict or intermediate map)"
                )
            break
        if node in constants:
            continue  # the model's own tensors, read by the op that uses them
        if _is_shape_query(node):
            continue
        if functional_weights.input_of(node, current) is not current and _map_after_constant(
            node, current, constants
        ):
            raise ConversionError(
                f"{op} takes the map as another argument than its input ({_target_name(node)}(c, x), c - x, c / x): "
                "arithmetic on the map that no layer computes. Write it as a layer with a conversion rule "
                "(@densecnn.register_rule), or fold the constant into the weights of the layer before it"
            )
        if _reads_what_an_in_place_op_changed(node, current):
            raise ConversionError(
                f"{where}: op {current.name!r} ({current.op} {_target_name(current)}) changes its input in place "
                f"and {node.name!r} reads that input instead of its result; densecnn follows the values ops return. "
                "Pass the op's result on (y = F.relu(y), not a bare F.relu(y, inplace=True))"
            )
        if functional_weights.input_of(node, current) is not current or _adds_another_map(
            node, current, constants
        ):
            raise ConversionError(
                f"{op} does not consume the previous op's output; densecnn converts single chains of layers (no "
                "branches, skips or extra inputs). Write the model as an nn.Sequential of the layers it runs"
            )
        if node.target in functional_weights.ADDS and chain and _constant_operand(node, current, constants):
            chain[-1] = (
                chain[-1][0],
                functional_weights.with_bias(chain[-1][1], model, node, current, constants, op),
            )
        elif functional_weights.is_weight_op(node) and node.target not in functional_weights.ADDS:
            flat = any(isinstance(m, (nn.Flatten, nn.Linear)) for _, m in chain)
            module = functional_weights.weight_layer(model, node, constants, op, flat=flat, dims=dims)
            chain.append((f"{prefix}.{node.name}" if prefix else node.name, module))
        else:
            chain.append(_node_layer(model, node, prefix, where))
        current = node
    return [(path, module) for path, module in chain if module is not None]


def _reads_what_an_in_place_op_changed(node: torch.fx.Node, current: torch.fx.Node | None) -> bool:
    """Whether ``current`` updates its input in place (``inplace=True``, ``x.relu_()``, ``torch.relu_``) and ``node``
    takes that input rather than ``current``'s result, as after ``F.relu(y, inplace=True)`` with the result unused."""
    if current is None or current.op not in ("call_function", "call_method") or not current.args:
        return False
    in_place = current.kwargs.get("inplace") is True or str(
        getattr(current.target, "__name__", current.target)
    ).endswith("_")
    changed = current.args[0]
    return (
        in_place
        and isinstance(changed, torch.fx.Node)
        and functional_weights.input_of(node, changed) is changed
    )


def _refuse_randomness_and_state(graph: torch.fx.Graph, constants: set, where: str) -> None:
    """Raise for an op anywhere in the trace that draws random numbers, or that updates one of the model's tensors in
    place from the map or where the forward reads that tensor too: no dense net reproduces either, whatever else the
    forward does. (A tensor forward only updates by constants, a call counter, changes no score.)"""
    updates = [
        node
        for node in graph.nodes
        if node.op == "call_method" and str(node.target).endswith("_") and node.args[0] in constants
    ]
    read = {
        str(node.target)
        for node in graph.nodes
        if node.op == "get_attr" and any(user not in updates or user.users for user in node.users)
    }
    for node in graph.nodes:
        op = f"{where}: op {node.name!r} ({node.op} {_target_name(node)})"
        if functional_weights.is_random(node):
            raise ConversionError(
                f"{op} draws random numbers in forward(), so the model's output is stochastic and no dense net can "
                "reproduce it. Remove the noise from forward (add it to the training data), or apply it only "
                "under `if self.training:` and convert the model in eval mode"
            )
        if node in updates and (node not in constants or _root_attribute(node) in read):
            raise ConversionError(
                f"{op} updates the model's tensor {_root_attribute(node)!r} in place in forward(), state that a dense "
                "net (which never runs forward) cannot follow. Update it outside forward (in the training loop), or "
                "keep it out of the model"
            )


def _untraceable(where: str, exc: Exception) -> ConversionError:
    reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    if "as buffer" in reason or "as parameter" in reason:
        return ConversionError(
            f"{where}: its forward() assigns one of the model's tensors ({reason}), state that a dense net (which "
            "never runs forward) cannot follow. Update it outside forward (in the training loop), or keep it out "
            "of the model"
        )
    if "control flow" in reason:
        return ConversionError(
            f"{where}: its forward() branches on a tensor's value (`if self.flag:` on a buffer, `if x.sum() > 0:`), "
            "which no dense net can follow: the branch taken would be fixed at conversion. Keep such a switch in a "
            "plain Python attribute (self.use_relu = True), which densecnn reads at conversion and checks on every "
            "call, or register a rule for the layer with @densecnn.register_rule"
        )
    return ConversionError(
        f"{where}: has no conversion rule and torch.fx cannot trace it ({reason}). Register a rule with "
        "@densecnn.register_rule, or write the model as an nn.Sequential of layers densecnn converts"
    )


def _other_operand(node: torch.fx.Node, current: torch.fx.Node):
    return node.args[1] if node.args[0] is current else node.args[0]


def _constant_operand(node: torch.fx.Node, current: torch.fx.Node, constants: set) -> bool:
    return _other_operand(node, current) in constants


def _map_after_constant(node: torch.fx.Node, current: torch.fx.Node, constants: set) -> bool:
    """An op on a constant first and the map after it (``c - x``, ``torch.div(c, x)``)."""
    first = node.args[0] if node.args else None
    return current in node.args[1:] and (not isinstance(first, torch.fx.Node) or first in constants)


def _adds_another_map(node: torch.fx.Node, current: torch.fx.Node, constants: set) -> bool:
    """An add of the map and another map computed from the input (a skip connection)."""
    if node.target not in functional_weights.ADDS or len(node.args) < 2:
        return False
    other = _other_operand(node, current)
    return isinstance(other, torch.fx.Node) and other not in constants


def _root_attribute(node: torch.fx.Node) -> str:
    while node.op != "get_attr" and node.all_input_nodes:
        node = node.all_input_nodes[0]
    return str(node.target)


def _spatial_dims(model: nn.Module, graph: torch.fx.Graph) -> int:
    """The spatial axes a traced model's layers imply (its modules', or a functional conv's), 2 if none does."""
    for node in graph.nodes:
        if node.target in functional_weights.CONVS:
            return functional_weights.CONVS[node.target]
    for module in model.modules():
        record = find_record(module_type(module))
        if record is not None and record.dims is not None:
            return record.dims
    return 2


def _is_shape_query(node: torch.fx.Node) -> bool:
    """``x.size(0)``, ``x.dim()``, ``x.shape``, ``x.shape[0]``, ``x.size()[0]``: reads a shape, computes nothing."""
    if node.op == "call_method" and node.target in ("size", "dim"):
        return True
    if node.op != "call_function":
        return False
    if node.target is getattr:
        return node.args[1] == "shape"
    return (
        node.target is operator.getitem
        and isinstance(node.args[0], torch.fx.Node)
        and _is_shape_query(node.args[0])
    )


def _target_name(node: torch.fx.Node) -> str:
    return getattr(node.target, "__name__", str(node.target))


def _node_layer(
    model: nn.Module, node: torch.fx.Node, prefix: str, where: str
) -> tuple[str, nn.Module | None]:
    path = f"{prefix}.{node.target}" if prefix and node.op == "call_module" else str(node.target)
    if node.op == "call_module":
        return path, model.get_submodule(node.target)
    op = f"{where}: op {node.name!r} ({node.op} {_target_name(node)})"
    functions, methods = aliases()
    found = functions.get(node.target) if node.op == "call_function" else methods.get(node.target)
    module = _alias_layer(model, node, *found, op) if found else None
    if module is None:
        raise ConversionError(
            f"{op} is not a supported layer. Use an nn module with a conversion rule, or register one with "
            "@densecnn.register_rule"
        )
    name = f"{prefix}.{node.name}" if prefix else node.name
    return name, None if isinstance(module, nn.Identity) else module


def _alias_layer(model: nn.Module, node: torch.fx.Node, record, alias, op: str) -> nn.Module | None:
    """The module a functional/method call stands for, in the model's mode (None: not this layer)."""
    values = node.args[1:]
    if alias.build is not None:
        return alias.build(*values, **node.kwargs)
    if len(values) > len(alias.params):
        raise ConversionError(
            f"{op}: takes at most {len(alias.params)} arguments after the input here. Pass the others by keyword, "
            "or use the nn module"
        )
    named = {**alias.defaults, **dict(zip(alias.params, values)), **node.kwargs}
    named.pop("inplace", None)  # the dense net never works in place
    named.pop("_stacklevel", None)
    if named.pop("dtype", None) is not None:
        raise ConversionError(f"{op}: dtype= changes the precision inside the net; cast the model instead")
    unknown = set(named) - set(alias.params)
    if unknown:
        raise ConversionError(
            f"{op}: argument(s) {', '.join(sorted(unknown))} are not supported. Use the nn module with those "
            "arguments, or remove them"
        )
    training = named.pop("training", alias.training_default())
    if any(isinstance(value, torch.fx.Node) for value in named.values()):
        raise ConversionError(
            f"{op}: its arguments must be constants, not computed in forward(). Use the nn module, whose arguments "
            "are fixed at construction"
        )
    module = record.layer_type(**named).train(model.training)
    if training is None or training == model.training:
        return module
    if training:
        raise ConversionError(
            f"{op}: is called with training=True while the model is in eval mode, so it is random even in eval "
            "mode and no net can reproduce it. Pass training=self.training"
        )
    return nn.Identity()  # training=False while the model trains: the op never acts
