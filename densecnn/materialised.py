"""Refusing models whose tensors hold no values yet: a dense net of them would compute from uninitialised memory.

A parameter or buffer on the ``meta`` device (``torch.device("meta")``, ``init_empty_weights`` and kin) has a shape
but no values; a lazy module's ``UninitializedParameter`` has neither. :func:`densecnn.convert` refuses both, naming
the tensor by its dotted name.

>>> with torch.device("meta"):
...     model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.Flatten(), nn.Linear(2, 3))
>>> check_materialised(model)
Traceback (most recent call last):
ConversionError: layer '0' (Conv2d): its parameter '0.weight' is on the meta device (a shape without values) ...
"""

from __future__ import annotations

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
