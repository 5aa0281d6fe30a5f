"""Refusing models whose tensors hold no values yet: a dense net of them would compute from uninitialised memory.

A parameter or buffer on the ``meta`` device (``torch.device("meta")``, ``init_empty_weights`` and kin) has a shape
but no values; a lazy module's ``UninitializedParameter`` has neither. :func:`densecnn.convert` refuses both, naming
the tensor by its dotted name.

>>> with torch.device("meta"):
...     model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.Flatten(), nn.Linear(2, 3))
>>> check_materialised(model)
Traceback (most recent call last):
ConversionError: layer '0' (Conv2d): its parameter '0.weight' is on the meta device (a shape without values) ...

A tensor holding NaN or ±Inf (the weights of a training run that diverged) would make the scores NaN or infinite,
every pixel no-data or one class on a finite image: :func:`check_finite` refuses it, naming the tensor and how many
such values it holds (:func:`densecnn.convert` and so :func:`densecnn.save` call it; :func:`densecnn.load` refuses
such a weights file the same way).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn
from torch.nn.parameter import UninitializedTensorMixin

from .errors import ConversionError


def check_materialised(model: nn.Module) -> None:
    """Raise unless every parameter and buffer of ``model`` holds values.

    Raises:
        ConversionError: naming the first tensor without values, why, and how to give it values.
    """
    modules = dict(model.named_modules(remove_duplicate=False))
    tensors = [("parameter", name, t) for name, t in model.named_parameters(remove_duplicate=False)]
    tensors += [("buffer", name, t) for name, t in model.named_buffers(remove_duplicate=False)]
    for kind, name, tensor in tensors:
        owner = name.rpartition(".")[0]
        module = modules[owner]
        where = (
            f"layer {owner!r} ({type(module).__name__})" if owner else f"the model ({type(module).__name__})"
        )
        if isinstance(tensor, UninitializedTensorMixin):
            raise ConversionError(
                f"{where}: is a lazy layer whose parameters do not exist yet. Run the model once on a patch "
                f"(model(torch.zeros(1, C, *patch_size))) and load its trained weights before converting it (its "
                f"{kind} {name!r} has no shape and no values)"
            )
        if tensor.device.type == "meta":
            raise ConversionError(
                f"{where}: its {kind} {name!r} is on the meta device (a shape without values), so a dense net would "
                "compute from uninitialised memory. Give the model its values before converting it: "
                "model.to_empty(device='cpu') then model.load_state_dict(weights), or "
                "model.load_state_dict(weights, assign=True)"
            )


# what fixes weights that hold NaN/±Inf: they are not the model's, whatever layer holds them
NONFINITE_WEIGHTS_FIX = (
    "these weights are broken (most often by a training run that diverged): use weights saved before it, or train "
    "again with a lower learning rate"
)


def nonfinite_values(tensor: torch.Tensor) -> str | None:
    """How many NaN and ±Inf values ``tensor`` holds (``"12 NaN values"``), or None when it holds none (an integer
    tensor, a tensor without values on the meta device). One ``isfinite().all()``; counted only when it fails.

    >>> nonfinite_values(torch.tensor([1.0, float("nan"), float("inf")]))
    '1 NaN value and 1 infinite value (of 3)'
    """
    if not (tensor.is_floating_point() or tensor.is_complex()) or tensor.device.type == "meta":
        return None
    if isinstance(tensor, UninitializedTensorMixin):
        return None
    with torch.no_grad():
        if bool(torch.isfinite(tensor).all()):
            return None
        nan, inf = int(torch.isnan(tensor).sum()), int(torch.isinf(tensor).sum())
    counts = [
        f"{n} {what} value{'s' if n != 1 else ''}" for n, what in ((nan, "NaN"), (inf, "infinite")) if n
    ]
    return f"{' and '.join(counts)} (of {tensor.numel()})"


def first_nonfinite(named: Iterable[tuple[str, torch.Tensor]]) -> tuple[str, str] | None:
    """(name, :func:`nonfinite_values`) of the first of the ``named`` tensors that holds NaN or ±Inf, or None."""
    for name, tensor in named:
        found = nonfinite_values(tensor)
        if found is not None:
            return name, found
    return None


def check_finite(model: nn.Module) -> None:
    """Raise unless every floating-point parameter and buffer of ``model`` holds finite values (meta tensors, which
    hold none, are :func:`check_materialised`'s to refuse).

    Raises:
        ConversionError: naming the first tensor holding NaN or ±Inf and how many it holds.
    """
    named = [(f"parameter {name!r}", t) for name, t in model.named_parameters()]
    named += [(f"buffer {name!r}", t) for name, t in model.named_buffers()]
    broken = first_nonfinite(named)
    if broken is not None:
        what, found = broken
        raise ConversionError(
            f"the model's {what} has {found}: the scores it feeds would be NaN or infinite, so the labels no-data "
            f"or meaningless; {NONFINITE_WEIGHTS_FIX}"
        )
