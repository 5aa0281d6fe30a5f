"""One segmentation job, run on an inference thread: decode the image, run the dense net, encode the answer."""

from __future__ import annotations

import base64
import io
import json
import threading
import time
from dataclasses import dataclass, field

import numpy as np
import torch
from PIL import Image

from densecnn.errors import ImageTooLargeError
from densecnn.imageio import class_probabilities, model_input, read_array, unit_planes

from .negotiation import Output
from .registry import ServedModel

OVERLAY_ALPHA = 0.5  # weight of the class colour in ?view=overlay
OVERLAY_ROWS = 256  # rows blended at a time


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
    width: int
    height: int
    timings: dict[str, float] = field(default_factory=dict)  # step -> seconds

    def server_timing(self) -> str:
        """The ``Server-Timing`` header value, milliseconds per step."""
        return ", ".join(f"{step};dur={seconds * 1000:.1f}" for step, seconds in self.timings.items())


def labels_png(labels: np.ndarray, palette: list[list[int]], num_classes: int) -> bytes:
    """(H, W) class ids -> a palette PNG (up to 256 classes) or a 16-bit grayscale PNG of the ids."""
    out = io.BytesIO()
    if num_classes <= 256:
        image = Image.fromarray(labels.astype(np.uint8))
        image.putpalette([v for colour in palette for v in colour])  # mode L -> P
    else:
        image = Image.fromarray(labels.astype(np.uint16))  # mode I;16
    image.save(out, format="PNG", compress_level=3)
    return out.getvalue()


def overlay_png(pixels: np.ndarray, labels: np.ndarray, palette: list[list[int]]) -> bytes:
    """Decoded pixels (H, W[, C]) and (H, W) class ids -> an RGB PNG of the image with class colours blended in.

    Works on bands of rows, so besides the (H, W, 3) uint8 result only one band of floats is held.
    """
    colours = np.asarray(palette, dtype=np.float32) / 255.0  # (K, 3)
    blended = np.empty((*labels.shape, 3), np.uint8)  # (H, W, 3)
    for row in range(0, labels.shape[0], OVERLAY_ROWS):
        rows = slice(row, row + OVERLAY_ROWS)
        display = unit_planes(pixels[rows], 3).transpose(1, 2, 0)  # (band, W, 3) in [0, 1]
        mixed = (1 - OVERLAY_ALPHA) * np.clip(display, 0, 1) + OVERLAY_ALPHA * colours[labels[rows]]
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
    cancel: threading.Event | None = None,
) -> SegmentResult:
    """Label every pixel of the image in ``data`` and encode the answer as ``output`` asks.

    The image is refused from its header if it is over ``limits``; once ``cancel`` is set the dense net stops at
    its next layer or tile (:class:`densecnn.errors.Cancelled`).
    """
    loaded = served.loaded
    timings = {}
    start = time.perf_counter()
    pixels = read_array(data, max_pixels=limits.max_pixels, max_bytes=limits.max_decode_bytes)  # as displayed
    x = model_input(pixels, loaded)  # (1, C, H, W)
    height, width = x.shape[2], x.shape[3]
    timings["decode"] = time.perf_counter() - start

    start = time.perf_counter()
    with torch.inference_mode():
        try:
            if output is Output.NPY:
                scores = served.dense(x, max_memory=limits.max_memory, cancel=cancel)  # (1, K, H, W)
                del x  # from here on: the scores, then the probabilities, then their .npy bytes
                probabilities = class_probabilities(scores, served.dense)[0].float().numpy()  # (K, H, W)
                del scores
            else:  # only the labels are kept, tile by tile
                labels = served.dense.predict(x, max_memory=limits.max_memory, cancel=cancel)
                labels = labels[0].numpy()  # (H, W)
                del x
        except ValueError as exc:  # the input is valid by now: only the memory budget can refuse it
            raise ImageTooLargeError(
                f"a {width}x{height} image needs more memory than this server allows per inference "
                f"(max_inference_memory): {exc}. Send a smaller image, or ask for labels instead of probabilities"
            ) from None
    timings["infer"] = time.perf_counter() - start

    start = time.perf_counter()
    if output is Output.NPY:
        body = npy_view(probabilities)
    elif output is Output.PNG and overlay:
        body = overlay_png(pixels, labels, loaded.palette)
    elif output is Output.PNG:
        body = labels_png(labels, loaded.palette, loaded.num_classes)
    else:
        counts = np.bincount(labels.ravel(), minlength=loaded.num_classes)
        document = {
            "width": width,
            "height": height,
            "classes": [
                {"id": k, "name": name, "color": colour}
                for k, (name, colour) in enumerate(zip(loaded.class_names, loaded.palette))
            ],
            "labels_png_base64": base64.b64encode(
                labels_png(labels, loaded.palette, loaded.num_classes)
            ).decode(),
            "pixel_counts": counts.tolist(),
        }
        if overlay:
            document["overlay_png_base64"] = base64.b64encode(
                overlay_png(pixels, labels, loaded.palette)
            ).decode()
        body = json.dumps(document).encode()
    timings["encode"] = time.perf_counter() - start
    return SegmentResult(body, output.value, width, height, timings)
