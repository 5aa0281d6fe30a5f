"""densecnn: exact whole-image inference and masked training for patch-trained CNNs.

>>> import densecnn, torch
>>> model, patch = densecnn.zoo.plain_133(in_channels=3, num_classes=32)
>>> dense = densecnn.convert(model.eval(), patch)
>>> scores = dense(torch.rand(1, 3, 256, 256))   # (1, 32, 256, 256): model(patch) at every pixel
"""

from . import masks, zoo
from ._version import __version__ as __version__
from .bioimageio_export import BioimageioExportError, export_bioimageio
from .convert import convert
from .dense import DenseCNN
from .errors import (
    BlockFailedError,
    Cancelled,
    ConversionError,
    DatasetError,
    DenseCNNError,
    DenseEquivalenceWarning,
    ExtensionUnavailableError,
    ImageDimensionsError,
    ImageReadError,
    ImageStackError,
    ImageTooLargeError,
    InvalidInputError,
    InvalidTypeError,
    ModelFileError,
    OnnxExportError,
    PatchSizeError,
    PatchSizeWarning,
    PredictInputError,
    TrainingError,
)
from .losses import masked_cross_entropy
from .modelfile import LoadedModel, load, save
from .rules import register_rule
from .scan import fast_scan, scan_patches

__all__ = [
    "BioimageioExportError",
    "BlockFailedError",
    "Cancelled",
    "ConversionError",
    "DatasetError",
    "DenseCNN",
    "DenseCNNError",
    "DenseEquivalenceWarning",
    "ExtensionUnavailableError",
    "ImageDimensionsError",
    "ImageReadError",
    "ImageStackError",
    "ImageTooLargeError",
    "InvalidInputError",
    "InvalidTypeError",
    "LoadedModel",
    "ModelFileError",
    "OnnxExportError",
    "PatchSizeError",
    "PatchSizeWarning",
    "PredictInputError",
    "TrainingError",
    "convert",
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
