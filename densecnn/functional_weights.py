"""Functional ops of a traced ``forward`` whose weights are the model's own parameters or buffers, as layers.

A module may hold its weights itself and call the functional form of a layer: ``F.conv2d(x, self.weight,
self.bias)``, ``F.linear(x, self.w)``, ``x @ self.W.t() + self.b``, ``torch.addmm(self.b, x, self.W.t())``,
``F.batch_norm(x, self.mean, self.var, self.w, self.b, self.training)``. In its ``torch.fx`` trace the tensors are
``get_attr`` nodes feeding the op; they are no branch. :func:`weight_layer` builds the torch layer the call stands for,
holding the very same tensors (no copies: values and gradients are shared), which then converts by its rule. A
Linear's bias may be any shape that broadcasts to its ``(out_features,)`` as the op reads it (``(1, K)``, a scalar):
the layer reads it through :class:`BroadcastBias`. :func:`saved_layer` is the layer as a model file holds it.

>>> class Net(nn.Module):
...     def __init__(self):
...         super().__init__()
...         self.w = nn.Parameter(torch.randn(4, 1, 3, 3))
...     def forward(self, x):
...         return F.conv2d(x, self.w).flatten(1)
>>> densecnn.convert(Net(), 3)   # the conv reads Net's own parameter w
"""

from __future__ import annotations

import operator
from typing import NamedTuple

import torch
import torch.fx
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrize

from .errors import ConversionError

CONVS = {F.conv1d: 1, F.conv2d: 2, F.conv3d: 3, torch.conv1d: 1, torch.conv2d: 2, torch.conv3d: 3}
MATMULS = (operator.matmul, torch.matmul, torch.mm, "matmul", "mm")
ADDS = (operator.add, torch.add, "add")
_TRANSPOSES = (torch.t, "t")
RANDOM_FUNCTIONS = frozenset(
    {
        torch.rand, torch.randn, torch.randint, torch.rand_like, torch.randn_like, torch.randint_like,
        torch.normal, torch.bernoulli, torch.poisson, torch.multinomial, torch.randperm,
    }
)  # fmt: skip
RANDOM_METHODS = frozenset(
    {
        "normal_",
        "uniform_",
        "bernoulli",
        "bernoulli_",
        "exponential_",
        "random_",
        "geometric_",
        "cauchy_",
        "log_normal_",
    }
)


def is_weight_op(node: torch.fx.Node) -> bool:
    """Whether ``node`` is a call this module turns into a layer (a conv, linear, matmul, addmm, batch norm, or a bias
    added to one)."""
    target = node.target
    return node.op in ("call_function", "call_method") and (
        target in CONVS
        or target in (F.linear, torch.addmm, F.batch_norm)
        or target in MATMULS
        or target in ADDS
    )


def is_random(node: torch.fx.Node) -> bool:
    """Whether ``node`` draws random numbers."""
    if node.op == "call_function":
        return node.target in RANDOM_FUNCTIONS
    return node.op == "call_method" and node.target in RANDOM_METHODS


def input_of(node: torch.fx.Node, current: torch.fx.Node) -> torch.fx.Node | None:
    """The argument of ``node`` that carries the map (``torch.addmm(b, x, w)``: x; an add: either operand)."""
    if node.target is torch.addmm:
        return node.args[1] if len(node.args) > 1 else None
    if node.target in ADDS and current in node.args[:2]:
        return current
    return node.args[0] if node.args else None


def constant_nodes(graph: torch.fx.Graph) -> set[torch.fx.Node]:
    """The nodes computed from the model's tensors alone (``get_attr``, ops on them only, and modules called without
    the map), not from the input."""
    constants: set[torch.fx.Node] = set()
    for node in graph.nodes:
        if node.op == "get_attr":
            constants.add(node)
        elif node.op in ("call_function", "call_method", "call_module") and not is_random(node):
            inputs = node.all_input_nodes
            # a module called on none of the map (a parametrisation computing a weight) reads its own tensors
            if (inputs or node.op == "call_module") and all(n in constants for n in inputs):
                constants.add(node)
    return constants


def weight_layer(
    model: nn.Module, node: torch.fx.Node, constants: set[torch.fx.Node], op: str, *, flat: bool, dims: int
) -> nn.Module:
    """The layer a functional call with the model's own tensors stands for (its tensors shared); ``flat``: the map
    was flattened before it (a batch norm of features), ``dims``: the net's spatial axes.

    Raises:
        ConversionError: a weight computed in ``forward`` (other than a transpose for a matmul), or an argument the
            layer cannot take.
    """
    target = node.target
    if target in CONVS:
        return _conv(model, node, constants, op, CONVS[target])
    if target is F.linear:
        weight, bias = _arguments(node, ("weight", "bias"), 1)
        return _linear(
            _tensor(model, weight, constants, op, "weight"), _optional(model, bias, constants, op), op
        )
    if target in MATMULS:
        return _linear(_transposed(model, node.args[1], constants, op), None, op)
    if target is torch.addmm:
        if node.kwargs.get("beta", 1) != 1 or node.kwargs.get("alpha", 1) != 1:
            raise ConversionError(
                f"{op}: torch.addmm with beta or alpha other than 1 scales the bias or the product, which no Linear "
                "computes. Write it torch.addmm(self.b, x, self.W.t()) (or F.linear(x, self.W, self.b)), with the "
                "scale folded into the parameters"
            )
        return _linear(
            _transposed(model, node.args[2], constants, op),
            _tensor(model, node.args[0], constants, op, "bias"),
            op,
        )
    if target is F.batch_norm:
        return _batch_norm(model, node, constants, op, flat=flat, dims=dims)
    raise ConversionError(f"{op} is not a supported layer")


def _arguments(node: torch.fx.Node, names: tuple[str, ...], start: int) -> list:
    """The values of ``names`` (positional from ``node.args[start]`` on, or by keyword; None if absent)."""
    values = list(node.args[start:]) + [None] * len(names)
    return [node.kwargs.get(name, values[i]) for i, name in enumerate(names)]


class Read(NamedTuple):
    """One of the model's tensors as a ``get_attr`` node read it: ``owner.attribute`` (a parameter, a buffer or a
    plain tensor attribute) was ``tensor``."""

    tensor: torch.Tensor
    owner: nn.Module
    attribute: str


class SharedTensor:
    """A tensor of the model that a layer built here holds as its own (``layer.name`` is ``owner.attribute``).

    The model may replace it after conversion: ``model.W = nn.Parameter(...)``, or ``model.double()``, which
    replaces buffers. :meth:`follow` then shares the new tensor if it has the same shape, as a module's replaced
    parameter is followed, and says what changed otherwise.
    """

    __slots__ = ("layer", "name", "read")

    def __init__(self, layer: nn.Module, name: str, read: Read):
        self.layer, self.name, self.read = layer, name, read

    def follow(self) -> str | None:
        """None if the layer holds the model's tensor (again), else what changed (for a ModelChangedError)."""
        read = self.read
        now = getattr(read.owner, read.attribute, None)
        if now is read.tensor:
            return None
        where = f"the tensor {read.attribute!r} of {type(read.owner).__name__} that a functional op reads"
        if not isinstance(now, torch.Tensor):
            return f"{where} was replaced by {type(now).__name__}"
        if now.shape != read.tensor.shape:
            return f"{where} had shape {tuple(read.tensor.shape)}, has {tuple(now.shape)}"
        self.read = read._replace(tensor=now)
        _set(self.layer, self.name, now)
        return None


def shared_tensors(layers) -> tuple[SharedTensor, ...]:
    """The model's tensors the ``layers`` built here hold (:class:`SharedTensor`), to follow after conversion."""
    return tuple(shared for layer in layers for shared in getattr(layer, "_densecnn_shared", {}).values())


def _tensor(model: nn.Module, node, constants, op: str, what: str) -> Read:
    """The model's own parameter or buffer a ``get_attr`` node reads."""
    if (
        isinstance(node, torch.fx.Node)
        and node.op == "call_module"
        and ".parametrizations." in str(node.target)
    ):
        layer = str(node.target).split(".parametrizations.")[0]
        raise ConversionError(
            f"{op}: its {what} is the parametrised {what} of layer {layer!r} (torch.nn.utils.parametrize), recomputed "
            f"on every read, which a functional call does not share with the dense net. Call the layer itself "
            f"(self.{layer}(x)): densecnn converts a parametrised layer exactly"
        )
    if not isinstance(node, torch.fx.Node) or node.op != "get_attr":
        computed = "computed in forward()" if node in constants else "not one of the model's own tensors"
        raise ConversionError(
            f"{op}: its {what} is {computed}, so densecnn cannot share it with the dense net. Pass the parameter or "
            "buffer itself (self.weight), or compute the weight outside forward (torch.nn.utils.parametrize "
            "registers such a computation)"
        )
    owner, _, name = node.target.rpartition(".")
    owner = model.get_submodule(owner) if owner else model
    return Read(getattr(owner, name), owner, name)


def _optional(model, node, constants, op: str) -> Read | None:
    return None if node is None else _tensor(model, node, constants, op, "bias")


def _transposed(model, node, constants, op: str) -> Read:
    """W for ``x @ W.t()`` (a Linear's (out, in) weight)."""
    if isinstance(node, torch.fx.Node) and node.target in _TRANSPOSES and node.args[0] in constants:
        return _tensor(model, node.args[0], constants, op, "weight")
    raise ConversionError(
        f"{op}: a matrix product with a weight densecnn cannot read as a Linear's. Write it x @ self.weight.t() "
        "with an (out_features, in_features) weight, or F.linear(x, self.weight, self.bias)"
    )


def _share(layer: nn.Module, name: str, read: Read | None) -> None:
    """Make ``layer.name`` the model's very tensor, recorded in the layer's ``_densecnn_shared``
    (:func:`shared_tensors`)."""
    shared = layer.__dict__.setdefault("_densecnn_shared", {})
    if read is None:
        setattr(layer, name, None)
        shared.pop(name, None)
        return
    _set(layer, name, read.tensor)
    shared[name] = SharedTensor(layer, name, read)


def _set(layer: nn.Module, name: str, tensor: torch.Tensor) -> None:
    """``layer.name = tensor``: a parameter as a parameter, anything else as a buffer."""
    if isinstance(tensor, nn.Parameter):
        setattr(layer, name, tensor)
        return
    layer._parameters.pop(name, None)
    layer._buffers.pop(name, None)
    layer.register_buffer(name, tensor)


def _conv(model, node, constants, op: str, dims: int) -> nn.Module:
    weight, bias, stride, padding, dilation, groups = _arguments(
        node, ("weight", "bias", "stride", "padding", "dilation", "groups"), 1
    )
    weight = _tensor(model, weight, constants, op, "weight")
    groups = 1 if groups is None else groups
    shape = weight.tensor.shape
    layer = getattr(nn, f"Conv{dims}d")(
        shape[1] * groups,
        shape[0],
        tuple(shape[2:]),
        stride=1 if stride is None else stride,
        padding=0 if padding is None else padding,
        dilation=1 if dilation is None else dilation,
        groups=groups,
        bias=False,
        device="meta",
    )
    _share(layer, "weight", weight)
    _share(layer, "bias", _optional(model, bias, constants, op))
    return layer.train(model.training)


def _linear(weight: Read, bias: Read | None, op: str) -> nn.Module:
    layer = nn.Linear(weight.tensor.shape[1], weight.tensor.shape[0], bias=False, device="meta")
    _share(layer, "weight", weight)
    _share_linear_bias(layer, bias, op)
    return layer


class BroadcastBias(nn.Module):
    """A parametrization of a Linear built here whose bias is the model's tensor of a shape that broadcasts to
    ``(out_features,)`` (``(1, K)``, ``(1,)``, a scalar): the layer's bias is that tensor broadcast, computed from it
    on every read, so values and gradients stay the model's tensor's."""

    def __init__(self, features: int):
        super().__init__()
        self.features = features

    def forward(self, bias: torch.Tensor) -> torch.Tensor:
        return bias.broadcast_to(1, self.features).reshape(self.features).contiguous()


def _share_linear_bias(layer: nn.Linear, bias: Read | None, op: str) -> None:
    """Make ``bias`` the Linear's bias: shared as it is if it has shape ``(out_features,)``, else read through
    :class:`BroadcastBias` (the model's tensor is the parametrization's original, followed as :func:`_share` does).

    Raises:
        ConversionError: the bias does not broadcast to ``(1, out_features)``, the shape of one patch's scores.
    """
    features = layer.out_features
    if bias is None or tuple(bias.tensor.shape) == (features,):
        _share(layer, "bias", bias)
        return
    if not _broadcasts_to_scores(tuple(bias.tensor.shape), features):
        raise ConversionError(
            f"{op}: its bias has shape {tuple(bias.tensor.shape)}, which does not broadcast to one patch's "
            f"({features},) scores, so each patch's scores would depend on the batch. Give the bias shape "
            f"({features},) (self.b = nn.Parameter(torch.zeros({features})))"
        )
    _set(layer, "bias", bias.tensor)
    parametrize.register_parametrization(layer, "bias", BroadcastBias(features), unsafe=True)
    originals = layer.parametrizations.bias
    layer.__dict__.setdefault("_densecnn_shared", {})["bias"] = SharedTensor(originals, "original", bias)


def _broadcasts_to_scores(shape: tuple[int, ...], features: int) -> bool:
    """Whether a bias of ``shape`` broadcasts to ``(1, features)`` and leaves it so (a patch's row of scores)."""
    try:
        return torch.broadcast_shapes(shape, (1, features)) == (1, features)
    except RuntimeError:
        return False


def with_bias(
    layer: nn.Module, model: nn.Module, node: torch.fx.Node, current, constants, op: str
) -> nn.Module:
    """The bias-less Linear ``layer`` that computed ``current``, with the constant operand of ``current + b`` as its
    bias: ``layer`` itself if it was built here, else a Linear sharing the model's Linear's weight (the model's own
    modules are never changed).

    Raises:
        ConversionError: the add scales an operand (``alpha``) or takes another keyword (``out=``), the added tensor
            is not one of the model's own or has a shape no bias of ``layer`` has, or ``layer`` already has a bias or
            computes its weight.
    """
    _refuse_add_keywords(node, op)
    other = node.args[1] if node.args[0] is current else node.args[0]
    bias = _tensor(model, other, constants, op, "added bias")
    if (
        not isinstance(layer, nn.Linear)
        or layer.bias is not None
        or not _broadcasts_to_scores(tuple(bias.tensor.shape), layer.out_features)
    ):
        raise ConversionError(
            f"{op}: adds a tensor of shape {tuple(bias.tensor.shape)} to the map; densecnn reads such an add only as "
            "the bias of the matrix product before it (x @ self.W.t() + self.b). Use nn.Linear, or F.linear(x, W, b)"
        )
    if "_densecnn_shared" not in layer.__dict__:  # the model's own nn.Linear(bias=False)
        if type(layer) is not nn.Linear or parametrize.is_parametrized(layer) or layer._forward_pre_hooks:
            raise ConversionError(
                f"{op}: adds a bias to the output of a {type(layer).__name__} whose weight is computed when it runs "
                "(a parametrization or weight norm), which densecnn cannot share. Give the Linear its own bias "
                "(nn.Linear(..., bias=True)) instead of adding one after it"
            )
        layer = _linear(Read(layer.weight, layer, "weight"), None, op)
    _share_linear_bias(layer, bias, op)
    return layer


def _refuse_add_keywords(node: torch.fx.Node, op: str) -> None:
    """Raise for ``torch.add(x, b, alpha=a)`` with ``a`` other than 1, which scales ``b`` (or the map: ``torch.add(b,
    x, alpha=a)``), and for any other keyword (``out=``): no Linear's bias computes them."""
    alpha = node.kwargs.get("alpha", 1)
    if isinstance(alpha, torch.fx.Node) or alpha != 1:
        raise ConversionError(
            f"{op}: torch.add with alpha other than 1 scales the added bias (or the map), which no Linear computes. "
            "Write it x @ self.W.t() + self.b (or F.linear(x, self.W, self.b)), with the scale folded into the "
            "parameters"
        )
    others = sorted(set(node.kwargs) - {"alpha"})
    if others:
        raise ConversionError(
            f"{op}: torch.add with {', '.join(f'{name}=' for name in others)} is not a bias a Linear adds. Write it "
            "x @ self.W.t() + self.b (or F.linear(x, self.W, self.b)), without those arguments"
        )


def _batch_norm(model, node, constants, op: str, *, flat: bool, dims: int) -> nn.Module:
    names = ("running_mean", "running_var", "weight", "bias", "training", "momentum", "eps")
    mean, var, weight, bias, training, momentum, eps = _arguments(node, names, 1)
    if mean is None or var is None:
        raise ConversionError(
            f"{op}: batch_norm without running statistics normalises with the batch's own statistics, so a "
            "patch's output depends on the other patches. Pass the module's running_mean and running_var buffers"
        )
    if training and not model.training:
        raise ConversionError(
            f"{op}: batch_norm is called with training=True while the model is in eval mode, so it normalises "
            "with each batch's statistics. Pass training=self.training"
        )
    mean = _tensor(model, mean, constants, op, "running_mean")
    weight, bias = _optional(model, weight, constants, op), _optional(model, bias, constants, op)
    kind = 1 if flat else dims
    layer = getattr(nn, f"BatchNorm{kind}d")(
        mean.tensor.shape[0],
        eps=1e-5 if eps is None else eps,
        momentum=0.1 if momentum is None else momentum,
        affine=weight is not None or bias is not None,
        device="meta",
    )
    _share(layer, "running_mean", mean)
    _share(layer, "running_var", _tensor(model, var, constants, op, "running_var"))
    layer.num_batches_tracked = None  # F.batch_norm keeps no counter
    _share(layer, "weight", weight)  # either may be None, as F.batch_norm takes them
    _share(layer, "bias", bias)
    return layer.train(model.training)


def saved_layer(layer: nn.Module) -> nn.Module:
    """``layer`` as a model file holds it: the layer itself, unless it was built here for a functional op and lacks
    a tensor its torch class holds once saved. Then a layer of that class sharing its tensors, with the missing ones
    filled in as they act: a batch norm's weight of ones, bias of zeros and batch counter at 0 (F.batch_norm keeps
    none), a Linear's bias broadcast to ``(out_features,)`` (detached: a file holds values)."""
    if "_densecnn_shared" not in layer.__dict__:
        return layer
    if isinstance(layer, nn.modules.batchnorm._BatchNorm):
        return _saved_batch_norm(layer)
    if isinstance(layer, nn.Linear) and parametrize.is_parametrized(layer, "bias"):
        saved = nn.Linear(layer.in_features, layer.out_features, bias=False, device="meta")
        _set(saved, "weight", layer.weight)
        _set(saved, "bias", layer.bias.detach())
        return saved
    return layer


def _saved_batch_norm(layer: nn.modules.batchnorm._BatchNorm) -> nn.Module:
    """A batch norm of ``layer``'s class sharing its tensors, with a counter at 0 and, if it is affine, a weight of
    ones or a bias of zeros where ``layer`` has none."""
    like = layer.running_mean
    saved = type(layer)(
        layer.num_features,
        layer.eps,
        layer.momentum,
        affine=layer.affine,
        device=like.device,
        dtype=like.dtype,
    )
    for name in ("running_mean", "running_var", "weight", "bias"):
        tensor = getattr(layer, name)
        if tensor is not None:
            _set(saved, name, tensor)
    return saved.train(layer.training)
