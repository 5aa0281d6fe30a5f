"""One segmentation job, run on an inference thread: decode the image, run the dense net, encode the answer."""

from __future__ import annotations

import base64
import io
import json
import time
from dataclasses import dataclass, field

import numpy as np
import torch
from PIL import Image

from densecnn.imageio import (
    ImageTooLargeError,
    class_probabilities,
    model_input,
    read_array,
    scale_to_unit,
    to_channels,
)

from .negotiation import Output
from .registry import ServedModel

OVERLAY_ALPHA = 0.5  # weight of the class colour in ?view=overlay


@dataclass
class SegmentResult:
    body: bytes
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


def overlay_png(display: np.ndarray, labels: np.ndarray, palette: list[list[int]]) -> bytes:
    """(H, W, 3) image in [0, 1] and (H, W) class ids -> an RGB PNG of the image with class colours blended in."""
    colours = np.asarray(palette, dtype=np.float32)[labels] / 255.0  # (H, W, 3)
    blended = (1 - OVERLAY_ALPHA) * np.clip(display, 0, 1) + OVERLAY_ALPHA * colours
    out = io.BytesIO()
    Image.fromarray(np.round(blended * 255).astype(np.uint8)).save(out, format="PNG", compress_level=3)
    return out.getvalue()


def npy_bytes(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.save(out, array, allow_pickle=False)
    return out.getvalue()


def segment(
    served: ServedModel, data: bytes, output: Output, *, overlay: bool, max_pixels: int, max_memory: int
) -> SegmentResult:
    """Label every pixel of the image in ``data`` and encode the answer as ``output`` asks."""
    loaded = served.loaded
    timings = {}
    start = time.perf_counter()
    pixels = read_array(data, max_pixels=max_pixels)  # (H, W[, C]), EXIF orientation applied
    x = model_input(pixels, loaded)  # (1, C, H, W)
    image = scale_to_unit(pixels)  # for the overlay
    height, width = x.shape[2], x.shape[3]
    timings["decode"] = time.perf_counter() - start

    start = time.perf_counter()
    kwargs = {"max_memory": max_memory} if served.tiles else {}  # tiles bound the memory of big images
    with torch.inference_mode():
        try:
            if output is Output.NPY:
                scores = served.dense(x, **kwargs)  # (1, K, H, W)
                labels = scores[0].argmax(0).numpy()  # (H, W)
                probabilities = class_probabilities(scores, served.dense)[0].float().numpy()
            else:  # only the labels are kept, tile by tile
                labels = served.dense.predict(x, **kwargs)[0].numpy()  # (H, W)
        except ValueError as exc:  # the input is valid by now: only the memory budget can refuse it
            raise ImageTooLargeError(
                f"a {width}x{height} image needs more memory than this server allows per inference "
                f"(max_inference_memory): {exc}. Send a smaller image, or ask for labels instead of probabilities"
            ) from None
    timings["infer"] = time.perf_counter() - start

    start = time.perf_counter()
    if output is Output.NPY:
        body = npy_bytes(np.ascontiguousarray(probabilities))
    elif output is Output.PNG and overlay:
        body = overlay_png(to_channels(image, 3), labels, loaded.palette)
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
            overlay_bytes = overlay_png(to_channels(image, 3), labels, loaded.palette)
            document["overlay_png_base64"] = base64.b64encode(overlay_bytes).decode()
        body = json.dumps(document).encode()
    timings["encode"] = time.perf_counter() - start
    return SegmentResult(body, output.value, width, height, timings)
