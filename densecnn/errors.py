"""Exceptions and warnings raised by densecnn."""


class ConversionError(ValueError):
    """A patch model (or one of its layers) cannot be converted to an exactly equivalent dense net.

    The message names the layer's dotted path and type, says why, and says what to do.
    """


class ModelFileError(ValueError):
    """A model directory is missing, malformed, or was written by an incompatible version."""


class DenseEquivalenceWarning(UserWarning):
    """The dense net will not match patch-by-patch scanning (e.g. BatchNorm/Dropout in training mode)."""


class ExtensionUnavailableWarning(RuntimeWarning):
    """densecnn's compiled kernels are not built or failed to load; torch-only solvers are used instead."""
