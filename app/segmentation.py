"""One segmentation job, run on an inference thread: decode the image (volume, signal), run the dense net, encode
the answer."""

from __future__ import annotations

import base64
import io
import json
import math
import threading
import time
from dataclasses import dataclass, field

import numpy as np
from PIL import Image

from densecnn.errors import DenseCNNError, ImageReadError, ImageTooLargeError, ScoresNotFiniteError
from densecnn.io import decode_array, image_format, labels_png, labels_tiff, read_nd, unit_planes
from densecnn.io.intensity import Intensity
from densecnn.io.labels import file_labels, no_data_value

from .errors import ApiError
from .negotiation import Output
from .registry import ServedModel

OVERLAY_ALPHA = 0.5  # weight of the class colour in ?view=overlay
OVERLAY_ROWS = 256  # rows blended at a time
WARNING_HEADER = (
    "X-Densecnn-Warning"  # says what the client may want to know of a labelled input (a constant image)
)


@dataclass(frozen=True)
class RequestLimits:
    """What one segment request may decode and compute (from the settings)."""

    max_pixels: int
    max_decode_bytes: int
    max_memory: int


@dataclass
class SegmentResult:
    body: bytes | memoryview
    media_type: str
    shape: tuple[int, ...]  # the spatial shape: (L,), (H, W) or (D, H, W)
    timings: dict[str, float] = field(default_factory=dict)  # step -> seconds
    warning: str | None = None  # what the answer's X-Densecnn-Warning says (a constant image), if anything

    @property
    def size(self) -> int:
        """Pixels (voxels, samples) labelled."""
        return math.prod(self.shape)

    def server_timing(self) -> str:
        """The ``Server-Timing`` header value, milliseconds per step."""
        return ", ".join(f"{step};dur={seconds * 1000:.1f}" for step, seconds in self.timings.items())

    def headers(self) -> dict[str, str]:
        """The answer's headers about the computation: ``Server-Timing`` and, if any, ``X-Densecnn-Warning``."""
        warning = {} if self.warning is None else {WARNING_HEADER: self.warning}
        return {"Server-Timing": self.server_timing(), **warning}


def overlay_png(pixels: np.ndarray, labels: np.ndarray, palette: list[list[int]]) -> bytes:
    """Decoded pixels (H, W[, C]) and (H, W) class ids -> an RGB PNG of the image with class colours blended in.

    Works on bands of rows, so besides the (H, W, 3) uint8 result only one band of floats is held.
    """
    colours = np.asarray([*palette, [0, 0, 0]], dtype=np.float32) / 255.0  # (K + 1, 3): no-data (-1) black
    blended = np.empty((*labels.shape, 3), np.uint8)  # (H, W, 3)
    for row in range(0, labels.shape[0], OVERLAY_ROWS):
        rows = slice(row, row + OVERLAY_ROWS)
        display = unit_planes(pixels[rows], 3).transpose(1, 2, 0)  # (band, W, 3) in [0, 1]
        shown = np.clip(np.nan_to_num(display, nan=0.0), 0, 1)  # no-data (NaN) pixels dark
        mixed = (1 - OVERLAY_ALPHA) * shown + OVERLAY_ALPHA * colours[labels[rows]]
        blended[rows] = np.round(mixed * 255)
    out = io.BytesIO()
    Image.fromarray(blended).save(out, format="PNG", compress_level=3)
    return out.getvalue()


def npy_view(array: np.ndarray) -> memoryview:
    """``array`` as the bytes of a .npy file (one copy, into the file's buffer)."""
    out = io.BytesIO()
    np.save(out, array, allow_pickle=False)
    return out.getbuffer()


def segment(
    served: ServedModel,
    data: bytes,
    output: Output,
    *,
    overlay: bool,
    limits: RequestLimits,
    name: str = "the upload",
    intensity: Intensity | None = None,
    nonfinite: str = "refuse",
    cancel: threading.Event | None = None,
) -> SegmentResult:
    """Label every pixel of the image in ``data`` (``name`` in messages) and encode the answer as ``output`` asks.

    The image is refused from its header if it is over ``limits``, and if its values do not fit how the model's
    inputs are scaled (``intensity``, by default the model's own) or, unless ``nonfinite`` is "propagate", are not
    finite (under "propagate" a pixel whose patch reads NaN/±Inf is no-data: the label type's maximum, NaN
    probabilities); once ``cancel`` is set the dense net stops at its next layer or tile
    (:class:`densecnn.errors.Cancelled`).
    """
    loaded = served.loaded
    timings = {}
    start = time.perf_counter()
    raw, channel_axis, pixels = _decode(served.dense.dims, loaded.in_channels, data, limits, name)
    try:
        scaling = loaded.scaling(raw, intensity=intensity, channel_axis=channel_axis, nonfinite=nonfinite)
        # (1, C, *spatial)
        x = loaded.input(raw, channel_axis=channel_axis, scaling=scaling, nonfinite=nonfinite)
    except ImageReadError as exc:
        # the pixels do not fit the model (its channels): the message names the file
        raise type(exc)(f"{name}: {exc.problem}", fix=exc.fix) from None
    del raw
    shape = tuple(x.shape[2:])
    timings["decode"] = time.perf_counter() - start

    start = time.perf_counter()
    scores = _infer(served, x, output, max_memory=limits.max_memory, cancel=cancel, nonfinite=nonfinite)
    del x
    timings["infer"] = time.perf_counter() - start

    start = time.perf_counter()
    body = _encode(loaded, output, scores, pixels if overlay else None)
    timings["encode"] = time.perf_counter() - start
    return SegmentResult(body, output.value, shape, timings, scaling.note())


def _decode(
    dims: int, channels: int, data: bytes, limits: RequestLimits, name: str
) -> tuple[np.ndarray, int | None, np.ndarray | None]:
    """(the decoded array, its channel axis or None for a displayed image's (H, W[, S]), its (H, W, C) pixels for an
    overlay: None for volumes and signals), for a model of ``channels``."""
    limits_kw = dict(max_pixels=limits.max_pixels, max_bytes=limits.max_decode_bytes, name=name)
    if dims == 2 and image_format(data) != "npy":
        pixels = decode_array(data, **limits_kw, channels=channels)  # (H, W[, S]) as displayed
        return pixels, None, pixels
    raw = read_nd(data, dims, **limits_kw)  # (C, *spatial), channel first
    return raw, 0, np.moveaxis(raw, 0, -1) if dims == 2 else None


def _infer(served: ServedModel, x, output: Output, **run) -> np.ndarray:
    """(K, *spatial) class probabilities for an npy answer, else the (*spatial) labels in the model's label dtype
    (only they are kept, tile by tile); an input too large for ``max_memory`` is an ImageTooLargeError."""
    try:
        if output is Output.NPY:
            return served.loaded.probabilities(x, dense=served.dense, **run)[0].numpy()
        return served.loaded.labels(x, dense=served.dense, **run)[0]
    except ScoresNotFiniteError as exc:  # the model, not the request: no label map rather than a wrong one
        raise ApiError(
            500, "model_scores_not_finite", f"{exc}; the request was valid: tell the server's operator"
        ) from None
    except DenseCNNError as exc:  # the input is valid by now: only the memory budget can refuse it
        raise ImageTooLargeError(
            f"an input of shape {'x'.join(map(str, x.shape[2:]))} needs more memory than this server allows per "
            f"inference (max_inference_memory): {exc}. Send a smaller input, or ask for labels instead of "
            "probabilities"
        ) from None


def _encode(
    loaded, output: Output, scores: np.ndarray, overlay_pixels: np.ndarray | None
) -> bytes | memoryview:
    """The answer's body: ``scores`` (probabilities for npy, else labels) encoded as ``output`` asks, drawn over
    ``overlay_pixels`` where an overlay is asked for."""
    if output is Output.NPY:
        return npy_view(scores)
    if output is Output.TIFF:
        return labels_tiff(scores, loaded.num_classes)
    if output is Output.PNG and overlay_pixels is not None:
        return overlay_png(overlay_pixels, scores, loaded.palette)
    if output is Output.PNG:
        return labels_png(scores, loaded.palette)
    return json.dumps(_document(loaded, scores, overlay_pixels)).encode()


def _document(loaded, labels: np.ndarray, overlay_pixels: np.ndarray | None) -> dict:
    """The JSON answer: shape, classes, counts per class (and of no-data pixels) and the labels (PNG, multi-page TIFF
    or .npy) in base64."""
    ids = file_labels(labels, loaded.num_classes)  # no-data as the label type's maximum
    every = np.bincount(ids.ravel(), minlength=loaded.num_classes)
    counts = every[: loaded.num_classes].tolist()
    document = {
        "shape": list(labels.shape),
        "classes": [
            {"id": k, "name": name, "color": colour}
            for k, (name, colour) in enumerate(zip(loaded.class_names, loaded.palette))
        ],
        "counts": counts,
        "no_data_count": int(every[no_data_value(loaded.num_classes)])
        if len(every) > loaded.num_classes
        else 0,
    }
    if labels.ndim == 2:  # an image: the fields 2-D clients read
        height, width = labels.shape
        png = labels_png(labels, loaded.palette)
        document |= {"width": width, "height": height, "labels_png_base64": base64.b64encode(png).decode()}
        document["pixel_counts"] = counts
    elif labels.ndim == 3:
        document["labels_tiff_base64"] = base64.b64encode(labels_tiff(labels, loaded.num_classes)).decode()
    else:
        document["labels_npy_base64"] = base64.b64encode(bytes(npy_view(ids))).decode()
    if overlay_pixels is not None:
        document["overlay_png_base64"] = base64.b64encode(
            overlay_png(overlay_pixels, labels, loaded.palette)
        ).decode()
    return document
