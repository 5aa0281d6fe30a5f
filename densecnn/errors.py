"""Exceptions and warnings raised by densecnn.

Every error densecnn raises on purpose derives from :class:`DenseCNNError` (and, for code written before it, from the
built-in type it refines: ``ValueError``, ``TypeError`` or ``RuntimeError``), so one ``except DenseCNNError`` handles
them all: the CLI prints them as one line, the service answers them with its JSON error body.

An error whose fix is an option's value carries it as a :class:`Fix` (the option, the values that fix it), so each
front end names the option in its own words: ``str(error)`` spells it as the library's keyword
(``intensity="range:0,4095"``), :func:`render` with :func:`cli_option` as the command line's flag
(``--intensity range:0,4095``), with :func:`query_option` as the service's query parameter (``?intensity=...``).

>>> error = IntensityError("the image is dark", fix=Fix("declare its range", (("intensity", "range:0,4095"),)))
>>> str(error)
'the image is dark; declare its range: intensity="range:0,4095"'
>>> render(error, cli_option)
'the image is dark; declare its range: --intensity range:0,4095'
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection
from dataclasses import dataclass

OptionSpelling = Callable[[str, str], str]  # (option, value) -> how a front end writes that setting


def keyword_option(option: str, value: str) -> str:
    """The library's words: a keyword argument, ``intensity="range:0,4095"`` (a switch: ``overwrite=True``)."""
    return f"{option}=True" if value == "" else f'{option}="{value}"'


def cli_option(option: str, value: str) -> str:
    """The command line's words: ``--intensity range:0,4095`` (a switch: ``--overwrite``)."""
    flag = f"--{option.replace('_', '-')}"
    return flag if value == "" else f"{flag} {value}"


def query_option(option: str, value: str) -> str:
    """The service's words: the query parameter ``?intensity=range:0,4095`` (a switch: ``?overwrite=true``)."""
    return f"?{option}={value or 'true'}"


@dataclass(frozen=True)
class Fix:
    """What fixes an error: ``advice``, then any one of ``settings``, (option, value) pairs that each front end
    spells its own way (an empty value: a switch turned on).

    >>> Fix("give a fixed range", (("intensity", "range:LOW,HIGH"),)).render(cli_option)
    'give a fixed range: --intensity range:LOW,HIGH'
    """

    advice: str  # e.g. "declare how the model's inputs are scaled"
    settings: tuple[
        tuple[str, str], ...
    ]  # e.g. (("intensity", "range:0,4095"), ("intensity", "percentiles:1,99.8"))

    def render(self, spell: OptionSpelling) -> str:
        return f"{self.advice}: {' or '.join(spell(option, value) for option, value in self.settings)}"

    @property
    def values(self) -> tuple[str, ...]:
        """The values suggested (for every option)."""
        return tuple(value for _, value in self.settings)

    def within(self, options: Collection[str]) -> Fix | None:
        """This fix kept to the settings among ``options`` (those a front end takes), or None when none is: a caller
        is never told to give an option it cannot give.

        >>> Fix("name it", (("channel_axis", "N"),)).within({"intensity"}) is None
        True
        """
        settings = tuple((option, value) for option, value in self.settings if option in options)
        return dataclasses.replace(self, settings=settings) if settings else None


class DenseCNNError(Exception):
    """Base of every error densecnn raises: its message names the problem and the fix (``fix``: the option whose
    value fixes it, which :meth:`render` names in a front end's words)."""

    def __init__(self, *args: object, fix: Fix | None = None):
        super().__init__(*args)
        self.fix = (
            fix  # kept through pickling (a Dask task's error): Exception pickles the instance's __dict__
        )

    @property
    def problem(self) -> str:
        """The message without its fix."""
        return super().__str__()

    def render(self, spell: OptionSpelling = keyword_option) -> str:
        """The message, naming the fixing option as ``spell`` writes it."""
        return self.problem if self.fix is None else f"{self.problem}; {self.fix.render(spell)}"

    def __str__(self) -> str:
        return self.render()


def render(error: BaseException, spell: OptionSpelling = keyword_option) -> str:
    """Any exception's message, a :class:`DenseCNNError`'s fix named as ``spell`` writes options."""
    return error.render(spell) if isinstance(error, DenseCNNError) else str(error)


class InvalidInputError(DenseCNNError, ValueError):
    """An argument or input densecnn cannot use (a tensor of the wrong shape, an unknown name, a memory cap too
    small); the message names it and what to give instead."""


class IntensityError(InvalidInputError):
    """An image's values do not fit how the model declares its inputs are scaled (16-bit data using a sliver of its
    range, floats outside [0, 1], a varying image whose percentiles are equal); the message gives the numbers, its
    ``fix`` the intensity that fixes it."""


class NonFiniteInputError(InvalidInputError):
    """An image holds NaN or infinite values; the message counts them and names the first position."""


class InvalidTypeError(DenseCNNError, TypeError):
    """An argument or input of the wrong type or dtype (an integer image, float labels); the message says which."""


class ConversionError(DenseCNNError, ValueError):
    """A patch model (or one of its layers) cannot be converted to an exactly equivalent dense net.

    The message names the layer's dotted path and type, says why, and says what to do.
    """


class PatchSizeError(ConversionError):
    """The patch size does not bring the patch net to a single output pixel; the message names the nearest sizes
    that do."""


class ModelFileError(DenseCNNError, ValueError):
    """A model directory is missing, malformed, or was written by an incompatible version."""


class BioimageioExportError(DenseCNNError, ValueError):
    """A model cannot be written as a bioimage.io package that computes what densecnn computes (an input scaling
    the spec cannot express, a test image that does not fit the model); the message names the problem and fix."""


class WorkerFailed(DenseCNNError):
    """A napari plugin's thread (labelling, training) failed with a RuntimeError (torch's, or a densecnn error such
    as :class:`ScoresNotFiniteError`): superqt's workers drop a RuntimeError without any signal, so it is passed on
    as this, which is not one, keeping a densecnn error's fix.

    >>> str(WorkerFailed.passing_on(RuntimeError("out of memory"), "labelling"))
    'labelling failed: out of memory'
    """

    @classmethod
    def passing_on(cls, exc: RuntimeError, doing: str) -> WorkerFailed:
        if isinstance(exc, DenseCNNError):
            return cls(f"{doing} failed: {exc.problem}", fix=exc.fix)
        return cls(f"{doing} failed: {exc}")


class ScoresNotFiniteError(DenseCNNError, RuntimeError):
    """A model's scores are NaN on an input it was given as finite: the net overflowed (its weights or activations
    beyond float range), so no label of those pixels is known; never written as no-data."""


class OnnxExportError(DenseCNNError, ValueError):
    """A dense net holds a layer the ONNX exporter does not know how to write."""


class ModelOverflowError(ConversionError):
    """The model's own scores are NaN or ±Inf on the verification's random patches: its weights or activations
    overflow the float range (a diverged training run), so no dense net can be checked against it."""


class DenseEquivalenceWarning(UserWarning):
    """The dense net will not match patch-by-patch scanning (e.g. BatchNorm/Dropout in training mode)."""


class BioimageioExportWarning(UserWarning):
    """A bioimage.io consumer's scores for an exported package differ from densecnn's somewhere, or do unless it
    heeds what the spec cannot enforce (an input's declared dtype): the message says where and the fix."""


class PatchSizeWarning(UserWarning):
    """The patch size converts, but a smaller size gives the same net: the extra rows or columns of every patch are
    never read (pooling floors them away), so the size was most likely not the one the model was trained with."""


class DatasetError(DenseCNNError, ValueError):
    """A training dataset directory or one of its files is unusable; the message names the file and the fix."""


class TrainingError(DenseCNNError, ValueError):
    """A training run cannot start or continue: an invalid option, a run directory in the wrong state, or a damaged
    checkpoint. The message names the option (``--batch``) or the file, and the fix."""


class ExtensionUnavailableError(DenseCNNError, RuntimeError):
    """densecnn's compiled kernels were asked for (``backend="ext"``) but are not built or failed to load."""


class ExtensionUnavailableWarning(RuntimeWarning):
    """densecnn's compiled kernels are not built or failed to load; torch-only solvers are used instead."""


class ImageReadError(DenseCNNError, ValueError):
    """An image or array file could not be read, or does not have the axes asked for (densecnn.io raises it and its
    subclasses); the message names the file, what is wrong and what to give instead."""


class ImageTooLargeError(ImageReadError):
    """An image is larger than allowed (its pixels or decoded bytes, judged from its header before decoding)."""


class ImageStackError(ImageReadError):
    """A stack of planes (a multi-page/volumetric TIFF) was given where one 2-D image is expected."""


class ImageDimensionsError(ImageReadError):
    """An upload has other spatial axes than the model takes (a 2-D image for a volume model, a volume for a signal
    model, ...); the message names what was received and what the model takes."""


class Cancelled(DenseCNNError, RuntimeError):
    """A computation was stopped between two steps because its ``cancel`` event was set."""


class PredictInputError(DenseCNNError, ValueError):
    """``densecnn predict`` was given an input or output it cannot use; the message says which and what to give."""


class BlockFailedError(DenseCNNError, RuntimeError):
    """A block of a chunked prediction kept failing after its retries; the message names its coordinates."""


class ModelChangedError(DenseCNNError, RuntimeError):
    """The patch model's structure (a layer, a hyper-parameter, an attribute its forward reads) changed after it was
    converted; the message names what changed and says to convert it again (parameter values are followed)."""
