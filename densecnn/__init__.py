"""densecnn: exact whole-image inference and masked training for patch-trained CNNs.

The top level holds what a session starts from: :func:`convert` a patch net to a :class:`DenseCNN`, :func:`save`
and :func:`load` model directories (a :class:`LoadedModel`, the façade every front end labels through),
:func:`scan_patches` and :func:`fast_scan` (the references), :func:`masked_cross_entropy`, :func:`register_rule`,
:func:`export_bioimageio`, the :mod:`zoo` and :mod:`masks`, and :class:`DenseCNNError`, the base of every error.
The errors and warnings themselves live in :mod:`densecnn.errors` (``densecnn.ConversionError`` and the other
names there still resolve).

>>> import densecnn, torch
>>> model, patch = densecnn.zoo.plain_133(in_channels=3, num_classes=32)
>>> dense = densecnn.convert(model.eval(), patch)
>>> scores = dense(torch.rand(1, 3, 256, 256))   # (1, 32, 256, 256): model(patch) at every pixel
"""

from . import errors
from ._version import __version__ as __version__
from .command_interrupts import quiet_interrupt_while_starting as _quiet_interrupt_while_starting
from .errors import DenseCNNError

# torch and the rest: the seconds the densecnn command takes to start
with _quiet_interrupt_while_starting():
    from . import masks, zoo
    from .bioimageio_export import export_bioimageio
    from .convert import convert
    from .dense import DenseCNN
    from .losses import masked_cross_entropy
    from .modelfile import LoadedModel, load, save
    from .rules import register_rule
    from .scan import fast_scan, scan_patches

__all__ = [
    "DenseCNN",
    "DenseCNNError",
    "LoadedModel",
    "convert",
    "errors",
    "export_bioimageio",
    "fast_scan",
    "load",
    "masked_cross_entropy",
    "masks",
    "register_rule",
    "save",
    "scan_patches",
    "zoo",
]


def __getattr__(name: str):
    """``densecnn.ConversionError`` and the other errors and warnings of :mod:`densecnn.errors`."""
    value = getattr(errors, name, None)
    if isinstance(value, type) and issubclass(value, Warning | DenseCNNError):
        return value
    raise AttributeError(f"module 'densecnn' has no attribute {name!r}")
