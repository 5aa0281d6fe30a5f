"""Model directories: ``model.json`` (layer spec + metadata) and ``weights.safetensors``. Loading never unpickles."""

from __future__ import annotations

import colorsys
import inspect
import json
import threading
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load as load_weights
from safetensors.torch import save_file
from torch import nn

from ..atomic import atomic_write
from ..chain import extract_chain
from ..convert import convert
from ..dense import DenseCNN
from ..errors import ConversionError, InvalidInputError, InvalidTypeError, ModelOverflowError
from ..functional_weights import saved_layer
from ..io.intensity import Intensity, Scaling
from ..io.labels import class_probabilities, label_dtype
from ..io.pixels import array_input, colour_samples, image_scaling
from ..materialised import NONFINITE_WEIGHTS_FIX, first_nonfinite
from ..padding import check_padding_mode
from ..tiling import class_labels
from .check import TensorInfo, check_directory, check_weights
from .format import (
    CONFIG_FILE,
    FORMAT,
    FORMAT_VERSION,
    WEIGHTS_FILE,
    build_on_meta,
    file_error,
    parse_config,
)
from .spec import full_state, saved_state, to_spec


def default_palette(num_classes: int) -> list[list[int]]:
    """Distinct RGB colours: black for class 0, then hues spaced by the golden ratio."""
    colours = [[0, 0, 0]]
    for k in range(1, num_classes):
        r, g, b = colorsys.hsv_to_rgb((k * 0.618033988749895) % 1.0, 0.75, 1.0 if k % 2 else 0.8)
        colours.append([round(r * 255), round(g * 255), round(b * 255)])
    return colours[:num_classes]


@dataclass
class LoadedModel:
    """A patch model read from a model directory, with its metadata, and the one way every front end (the
    service, its jobs, ``densecnn predict``, the napari plugin) turns raw pixels into labels and probabilities:
    :meth:`input`, :meth:`labels`, :meth:`probabilities`, :attr:`label_dtype`.

    >>> loaded = densecnn.load("models/nuclei")
    >>> loaded.labels(decode_array("cells.png")).dtype          # (H, W) class ids
    dtype('uint8')
    >>> loaded.probabilities(decode_array("cells.png")).shape   # (K, H, W), summing to 1
    torch.Size([2, 512, 512])

    Attributes:
        model: the patch classifier (an ``nn.Sequential``, in eval mode).
        patch_size, in_channels, num_classes, class_names, palette, normalization, padding_mode: as saved.
        intensity: how raw pixel values are scaled to [0, 1] before the normalisation (:mod:`densecnn.io.intensity`;
            the default, for files that declare none: by the dtype's range).
        pixel_size: micrometres per pixel along each axis of the images it was trained on, or None (``densecnn
            predict`` then reads an OME-Zarr image at the level of that pixel size).
        path: the directory it was read from.
    """

    model: nn.Sequential
    patch_size: tuple[int, ...]
    in_channels: int
    num_classes: int
    class_names: list[str]
    palette: list[list[int]]
    normalization: dict[str, list[float]] | None
    padding_mode: str
    path: Path | None = None
    extra: dict = field(default_factory=dict)
    intensity: Intensity = field(default_factory=Intensity)
    pixel_size: tuple[float, ...] | None = None
    _net: DenseCNN | None = field(default=None, init=False, repr=False, compare=False)

    def dense(self, *, backend: str = "auto") -> DenseCNN:
        """The dense net of this model (sharing its parameters), with the saved padding mode (verified once, by
        :func:`load`)."""
        return convert(
            self.model, self.patch_size, padding_mode=self.padding_mode, backend=backend, verify=False
        )

    @property
    def dtype(self) -> torch.dtype:
        """The dtype the weights were saved in (and are kept in): float32, float64, float16 or bfloat16."""
        return next((p.dtype for p in self.model.parameters() if p.is_floating_point()), torch.float32)

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        """(N, C, H, W) images scaled to [0, 1] -> the model's input: ``(x - mean) / std`` per channel, in the
        model's dtype (computed in the wider of the two). Signals (N, C, L) and volumes (N, C, D, H, W) alike.

        Raises:
            InvalidTypeError: integer pixels, which are not scaled to [0, 1] (:meth:`input` scales raw pixels).
        """
        if not x.is_floating_point():
            raise InvalidTypeError(_RAW_TENSOR.format(dtype=x.dtype))
        x = x.to(torch.promote_types(x.dtype, self.dtype))
        if self.normalization:
            per_channel = (1, -1) + (1,) * (x.dim() - 2)  # broadcast over N and every spatial axis
            mean = x.new_tensor(self.normalization["mean"]).view(per_channel)
            std = x.new_tensor(self.normalization["std"]).view(per_channel)
            x = (x - mean) / std
        return x.to(self.dtype)

    @property
    def label_dtype(self) -> np.dtype:
        """The dtype of this model's label maps: uint8 up to 255 classes, uint16 past that (the type's maximum is the no-data value)."""
        return label_dtype(self.num_classes)

    def scaling(
        self,
        raw: np.ndarray,
        *,
        intensity: Intensity | str | None = None,
        channel_axis: int | None = None,
        nonfinite: str | None = None,
    ) -> Scaling:
        """How ``raw`` pixels are scaled to [0, 1]: ``intensity`` (None: as the model declares) resolved on the
        image (:func:`~densecnn.io.pixels.image_scaling`; ``channel_axis`` as :meth:`input` takes it). A constant
        image's scaling says so (``constant``, :meth:`~densecnn.io.Scaling.note`).

        Raises:
            IntensityError: values the scaling cannot be right for.
            NonFiniteInputError: NaN or infinite values, unless ``nonfinite`` is "propagate".
        """
        array = self._channels_first(raw, channel_axis)  # (C, *spatial)
        spatial = tuple(range(1, array.ndim))
        rule = Intensity.of(intensity) or self.intensity
        return image_scaling(array, rule, spatial, finite=nonfinite != "propagate")

    def input(
        self,
        raw: np.ndarray,
        *,
        intensity: Intensity | str | None = None,
        channel_axis: int | None = None,
        scaling: Scaling | None = None,
        nonfinite: str | None = None,
    ) -> torch.Tensor:
        """Raw pixels -> this model's (1, C, *spatial) input: scaled to [0, 1] (``scaling``, by default
        :meth:`scaling` with ``intensity``), converted to its channels (gray <-> RGB, alpha dropped), normalised,
        checked finite (unless ``nonfinite`` is "propagate": the dense net then marks what reads them). ``raw``:
        any dtype; for a 2-D model (H, W) or (H, W, C) as images decode, for others (*spatial) or (C, *spatial) as
        arrays read; ``channel_axis`` says where the channels are otherwise.

        >>> loaded.input(np.zeros((64, 80), np.uint8)).shape
        torch.Size([1, 1, 64, 80])
        """
        array = self._channels_first(raw, channel_axis)  # (C, *spatial)
        scaling = scaling or self.scaling(array, intensity=intensity, channel_axis=0, nonfinite=nonfinite)
        return array_input(array, self, scaling, finite=nonfinite != "propagate")

    def labels(
        self,
        raw_or_input: np.ndarray | torch.Tensor,
        *,
        intensity: Intensity | str | None = None,
        channel_axis: int | None = None,
        max_memory: int | None = None,
        cancel: threading.Event | None = None,
        nonfinite: str | None = None,
        dense: DenseCNN | None = None,
    ) -> np.ndarray:
        """Class ids of every pixel, in :attr:`label_dtype`: raw pixels (as :meth:`input` takes them) -> (*spatial),
        or a model input tensor (N, C, *spatial) -> (N, *spatial). ``max_memory``, ``cancel`` and ``nonfinite`` as
        :meth:`densecnn.DenseCNN.predict` takes them (with ``nonfinite="propagate"`` the labels are signed and -1
        marks no data); ``dense``: the dense net to run (e.g. one moved to a GPU), by default this model's own."""
        x = self._as_input(raw_or_input, intensity, channel_axis, nonfinite)
        net = dense or self._dense()
        with torch.inference_mode():
            labels = net.predict(_on_device(x, net), max_memory, cancel=cancel, **_policy(net, nonfinite))
        out = self._label_array(labels, nonfinite)  # (N, *spatial)
        return out if isinstance(raw_or_input, torch.Tensor) else out[0]

    def probabilities(
        self,
        raw_or_input: np.ndarray | torch.Tensor,
        *,
        intensity: Intensity | str | None = None,
        channel_axis: int | None = None,
        max_memory: int | None = None,
        cancel: threading.Event | None = None,
        nonfinite: str | None = None,
        dense: DenseCNN | None = None,
    ) -> torch.Tensor:
        """Class probabilities of every pixel, float32: raw pixels -> (K, *spatial), a model input (N, C, *spatial)
        -> (N, K, *spatial). The softmax of the scores, unless the net already ends in ``nn.Softmax`` (its scores
        are the probabilities) or ``nn.LogSoftmax`` (their exp), dropout after it included
        (:func:`~densecnn.io.labels.score_kind`). Arguments as :meth:`labels`."""
        options = dict(intensity=intensity, channel_axis=channel_axis, max_memory=max_memory, cancel=cancel)
        return self.classify(raw_or_input, nonfinite=nonfinite, dense=dense, **options)[1]

    def classify(
        self,
        raw_or_input: np.ndarray | torch.Tensor,
        *,
        intensity: Intensity | str | None = None,
        channel_axis: int | None = None,
        max_memory: int | None = None,
        cancel: threading.Event | None = None,
        nonfinite: str | None = None,
        dense: DenseCNN | None = None,
    ) -> tuple[np.ndarray, torch.Tensor]:
        """(:meth:`labels`, :meth:`probabilities`) from one pass of the dense net (which then holds the scores of
        the whole input, where :meth:`labels` keeps only each tile's labels)."""
        x = self._as_input(raw_or_input, intensity, channel_axis, nonfinite)
        net = dense or self._dense()
        with torch.inference_mode():
            scores = net(_on_device(x, net), max_memory, cancel=cancel, **_policy(net, nonfinite))
            labels = class_labels(scores, no_data=nonfinite == "propagate")
            labels = self._label_array(labels, nonfinite)  # (N, *spatial)
            probabilities = class_probabilities(scores, net).float().cpu()  # (N, K, *spatial)
        if isinstance(raw_or_input, torch.Tensor):
            return labels, probabilities
        return labels[0], probabilities[0]

    def _label_array(self, labels: torch.Tensor, nonfinite: str | None) -> np.ndarray:
        """int64 class ids -> :attr:`label_dtype` (signed, holding -1 for no data, under ``"propagate"``)."""
        if nonfinite == "propagate":
            return labels.cpu().numpy().astype(np.int16 if self.num_classes <= 32767 else np.int32)
        return labels.cpu().numpy().astype(self.label_dtype)

    def _as_input(
        self, raw_or_input, intensity: Intensity | str | None, channel_axis: int | None, nonfinite: str | None
    ) -> torch.Tensor:
        if isinstance(raw_or_input, torch.Tensor):
            if not raw_or_input.is_floating_point():
                raise InvalidTypeError(_RAW_TENSOR.format(dtype=raw_or_input.dtype))
            return raw_or_input
        if not isinstance(raw_or_input, np.ndarray):
            raise InvalidInputError(
                f"expected raw pixels as a numpy array (or the model's input as a float tensor), got "
                f"{type(raw_or_input).__name__}; e.g. numpy.asarray(pixels)"
            )
        return self.input(raw_or_input, intensity=intensity, channel_axis=channel_axis, nonfinite=nonfinite)

    def _dense(self) -> DenseCNN:
        """This model's dense net, converted once and kept."""
        if self._net is None:
            self._net = self.dense().eval()
        return self._net

    def _channels_first(self, raw: np.ndarray, channel_axis: int | None) -> np.ndarray:
        """``raw`` as (C, *spatial): channels at ``channel_axis``, or where :meth:`input` expects them."""
        dims = len(self.patch_size)
        if channel_axis is None:
            if raw.ndim == dims:
                return raw[None]
            if dims == 2 and raw.ndim == 3:  # an image's samples as decoded (H, W, S): alpha is no channel
                raw = colour_samples(raw, self.in_channels)
            channel_axis = -1 if dims == 2 else 0  # images decode (H, W, C); arrays read (C, *spatial)
        if raw.ndim != dims + 1:
            raise InvalidInputError(
                f"pixels of shape {raw.shape} for a {dims}-D model: give {dims} spatial axes and at most one of "
                "channels"
            )
        return np.moveaxis(raw, channel_axis, 0)


# an integer tensor given where the model's input (scaled to [0, 1], normalised) is expected
_RAW_TENSOR = (
    "a {dtype} tensor holds raw pixels, not scaled to [0, 1] nor normalised; give them as a numpy array "
    "(x.numpy()): the model scales them by its intensity rule (loaded.input does the same)"
)


def _on_device(x: torch.Tensor, net: DenseCNN) -> torch.Tensor:
    """``x`` on the device of ``net``'s parameters; a meta tensor (no values to move) as it is, for the net to
    refuse naming its device."""
    return x if x.is_meta else x.to(next((p.device for p in net.parameters()), torch.device("cpu")))


def _policy(net: DenseCNN, nonfinite: str | None) -> dict:
    """``nonfinite`` as a keyword for ``net``'s forward and predict, if given and the net takes it."""
    if nonfinite is None:
        return {}
    if "nonfinite" not in inspect.signature(net.predict).parameters:
        raise InvalidInputError("this densecnn's dense nets take no nonfinite policy: leave nonfinite out")
    return {"nonfinite": nonfinite}


def save(
    model: nn.Module,
    path,
    *,
    patch_size,
    class_names: list[str] | None = None,
    palette: list[list[int]] | None = None,
    normalization: dict[str, list[float]] | None = None,
    padding_mode: str = "zeros",
    extra: dict | None = None,
    intensity: Intensity | str | None = None,
    pixel_size=None,
) -> Path:
    """Write ``model`` to the directory ``path`` as ``model.json`` + ``weights.safetensors``.

    The model must convert at ``patch_size``, its weights finite (checked before anything is written). ``normalization`` is
    ``{"mean": [...], "std": [...]}`` per input channel, applied to images scaled to [0, 1]; ``intensity`` says how
    raw pixel values are scaled to [0, 1] (:class:`~densecnn.io.intensity.Intensity`, or its text as the command line
    takes it: ``"range:0,4095"``, ``"percentiles:1,99.8"``; by default by their dtype's range, and then the key is
    left out); ``pixel_size`` the micrometres per pixel of the training images, one per
    axis (optional). ``extra`` is free-form JSON metadata kept in ``model.json``.

    >>> model, patch = densecnn.zoo.tiny(in_channels=1, num_classes=3)
    >>> densecnn.save(model, "models/tiny", patch_size=patch, class_names=["bg", "cell", "edge"])
    PosixPath('models/tiny')
    """
    check_padding_mode(padding_mode)
    intensity = Intensity.of(intensity)
    dense = convert(model, patch_size, padding_mode=padding_mode)  # validates that the model converts exactly
    patch = dense.patch_size
    num_classes, in_channels = dense.num_classes, dense.in_channels
    state = saved_state(nn.Sequential(*[saved_layer(module) for _, module in extract_chain(model)]))
    class_names = list(class_names) if class_names is not None else [f"class_{k}" for k in range(num_classes)]
    palette = [list(map(int, c)) for c in palette] if palette is not None else default_palette(num_classes)
    config = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "patch_size": list(patch),
        "in_channels": in_channels,
        "num_classes": num_classes,
        "class_names": class_names,
        "palette": palette,
        "normalization": normalization,
        **({"intensity": intensity.to_json()} if intensity is not None and intensity != Intensity() else {}),
        **({"pixel_size": [float(s) for s in pixel_size]} if pixel_size is not None else {}),
        "padding_mode": padding_mode,
        "layers": to_spec(model),
        "extra": extra or {},
    }
    out = Path(path)
    text = _checked_config_text(config, state, where=f"{out / CONFIG_FILE} (not written)")
    out.mkdir(parents=True, exist_ok=True)
    tensors = {name: tensor.detach().cpu().contiguous() for name, tensor in state.items()}
    atomic_write(out / WEIGHTS_FILE, lambda tmp: save_file(tensors, tmp, metadata={"format": FORMAT}))
    atomic_write(out / CONFIG_FILE, lambda tmp: tmp.write_text(text))
    return out


def _checked_config_text(config: dict, state: dict[str, torch.Tensor], *, where: str) -> str:
    """``config`` as model.json's text, after the checks :func:`load` makes (so that save never writes a directory
    load refuses)."""
    try:
        text = json.dumps(config, indent=2, allow_nan=False) + "\n"
    except (TypeError, ValueError) as exc:
        raise file_error(
            where, None, f"the metadata is not plain JSON ({exc})", "pass lists, numbers and strings"
        ) from None
    layers = build_on_meta(parse_config(text, where=where), where=where)
    check_weights(
        layers, {name: TensorInfo(t.dtype, tuple(t.shape)) for name, t in state.items()}, where=where
    )
    return text


_VERIFIED: set[tuple] = (
    set()
)  # (directory, its files' identities) whose dense net passed the verification pass


def _verify_once(directory: Path, model: nn.Sequential, config) -> None:
    files = [directory / CONFIG_FILE, directory / WEIGHTS_FILE]
    key = (directory.resolve(), *((f.stat().st_ino, f.stat().st_size, f.stat().st_mtime_ns) for f in files))
    if key in _VERIFIED:
        return
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the model's warnings are for dense(), which converts it again
            convert(model, config.patch_size, padding_mode=config.padding_mode)
    except ModelOverflowError as exc:
        raise file_error(
            directory, None, f"its weights overflow ({exc})", "retrain the model, or load another"
        ) from None
    except ConversionError as exc:
        raise file_error(
            directory, None, f"its dense net does not reproduce its patch model ({exc})",
            "report this, with the directory, as a densecnn bug",
        ) from None  # fmt: skip
    _VERIFIED.add(key)


def load(path) -> LoadedModel:
    """Read a model directory written by :func:`save` (no pickle is ever loaded), keeping the saved dtype.

    The whole directory is validated before any tensor is allocated: ``model.json`` against the format (types,
    ranges, layer types and arguments, lengths of class names, palette and normalisation), the layers against
    each other and the patch size (on the meta device), and every tensor's name, shape and dtype against the
    weights file's header. Only then are the weights read, straight into the layers, and refused if one holds NaN or
    ±Inf (the weights of a diverged training run, which would label every pixel no-data).

    Once per directory and process (again if a file changes), the dense net is checked against the patch model on
    random patches (:mod:`densecnn.verify`).

    Raises:
        ModelFileError: naming the file, the key (such as ``layers[3].kernel_size``), the problem and the fix.

    >>> loaded = densecnn.load("models/nuclei")
    >>> labels = loaded.dense().predict(loaded.normalize(images))  # (N, H, W)
    """
    directory = Path(path)
    config, model = check_directory(directory)
    try:
        # read into memory, not mapped: a mapped file's tensors would change with the file (a copy over it)
        state = load_weights((directory / WEIGHTS_FILE).read_bytes())
    except (SafetensorError, OSError) as exc:
        raise file_error(
            directory / WEIGHTS_FILE,
            None,
            f"cannot be read ({exc})",
            "write the model again with densecnn.save",
        ) from None
    broken = first_nonfinite(state.items())  # NaN/±Inf weights: every score NaN, every pixel no-data
    if broken is not None:
        name, found = broken
        raise file_error(directory / WEIGHTS_FILE, f"tensor {name!r}", f"has {found}", NONFINITE_WEIGHTS_FIX)
    for name, tensor in state.items():  # a normalisation's running variance: negative, every score NaN
        negative = int((tensor < 0).sum()) if name.endswith("running_var") else 0
        if negative:
            raise file_error(
                directory / WEIGHTS_FILE, f"tensor {name!r}",
                f"has {negative} negative value(s); a variance is never negative, and the normalisation would "
                "make every score NaN",
                "write the model again from a good checkpoint",
            )  # fmt: skip
    # the file's tensors become the parameters (no copy, no cast); a reused layer shares its first use's
    model.load_state_dict(full_state(model, state), assign=True)
    _verify_once(directory, model, config)
    return LoadedModel(
        model=model,
        patch_size=config.patch_size,
        in_channels=config.in_channels,
        num_classes=config.num_classes,
        class_names=config.class_names,
        palette=[list(colour) for colour in config.palette],
        normalization=config.normalization.model_dump() if config.normalization else None,
        padding_mode=config.padding_mode,
        path=directory,
        extra=config.extra,
        intensity=Intensity.from_json(config.intensity.model_dump() if config.intensity else None),
        pixel_size=None if config.pixel_size is None else tuple(config.pixel_size),
    )
