"""POST an image, get its label map (or probabilities, or an overlay) back."""

from __future__ import annotations

import threading
from functools import partial
from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request, Response

from densecnn.io import Intensity

from ..auth import client_address
from ..dependencies import MetricsDep, ModelDep, PoolDep, ReceivingDep, SettingsDep
from ..errors import ClientGone, ErrorBody, InferenceTimeout
from ..negotiation import View, choose_output
from ..request_image import read_upload
from ..responses import SegmentJson
from ..segmentation import RequestLimits, segment

router = APIRouter(prefix="/v1/models", tags=["segmentation"])

BINARY = {"schema": {"type": "string", "format": "binary"}}
IMAGE_BODY = {
    "required": True,
    "description": "the image: PNG, JPEG or TIFF (also BMP, GIF); the volume: a multi-page or volumetric TIFF; "
                   "or a .npy array (any model; the only form for signals), as multipart field `image` or as the "
                   "raw body",
    "content": {
        "multipart/form-data": {
            "schema": {"type": "object", "properties": {"image": {"type": "string", "format": "binary"}},
                       "required": ["image"]},
        },
        "image/png": BINARY,
        "image/jpeg": BINARY,
        "image/tiff": BINARY,
        "application/x-npy": BINARY,
    },
}  # fmt: skip


def _error(description: str) -> dict:
    return {"model": ErrorBody, "description": description}


@router.post(
    "/{name}/segment",
    summary="Label every pixel of an image (every voxel of a volume, every sample of a signal)",
    description=(
        "The answer's format is chosen by `Accept`: `image/png` (default for 2-D models) a palette PNG of class "
        "ids at the image's full resolution (a 16-bit PNG above 255 classes); `image/tiff` (default for 3-D "
        "models, which do not answer PNG) a multi-page TIFF of class ids, one page per slice (uint8, uint16 above "
        "255 classes); `application/json` the shape, classes, per-class counts and the labels in base64 (a PNG "
        "for images, a multi-page TIFF for volumes, a .npy for signals); `application/x-npy` always the float32 "
        "class probabilities (K, *spatial): (K, H, W), (K, D, H, W) or (K, L). "
        "**Volumes** (3-D models): a multi-page or volumetric TIFF (pages are slices; samples or ImageJ channels "
        "are the channels) or a .npy (D, H, W) / (C, D, H, W). **Signals** (1-D models): a .npy (L,) / (C, L). "
        "2-D models also take a .npy (H, W) / (C, H, W). An upload with other axes than the model takes gets 422 "
        "`wrong_dimensions`, naming both. .npy files are read without unpickling. "
        "`?view=overlay` returns the image with the class colours blended in (PNG, or base64 in the JSON). "
        "**Orientation**: the EXIF orientation (JPEG, PNG) and the TIFF Orientation tag (274) are applied before "
        "inference, so the label map has the orientation in which the image is *displayed* (for orientations 5-8 "
        "its width and height are the stored height and width). "
        "A TIFF may be compressed (LZW, deflate, JPEG, packbits, ...); a stack of planes (multi-page or volumetric "
        "TIFF) is refused with 422, naming what was received. "
        "**Limits**: the body is limited in bytes, the image in pixels and in decoded bytes (width x height x "
        "samples x planes x bytes per sample), both judged from its header before decoding (413). "
        "A client that disconnects gets no answer and its job is dropped (queued) or stopped at its next layer "
        "(running); a job past the request deadline is stopped the same way (503). "
        "Timing is in the `Server-Timing` header."
    ),
    openapi_extra={"requestBody": IMAGE_BODY},
    response_class=Response,
    responses={
        200: {
            "description": "the label map, probabilities or overlay, as Accept asks",
            "model": SegmentJson,
            "content": {
                "image/png": BINARY,
                "image/tiff": BINARY,
                "application/x-npy": BINARY,
            },
        },
        400: _error("the image is corrupt or truncated, the multipart body is cut off or has no field `image`, its "
                    "values do not fit the intensity scaling (intensity_out_of_range) or are not finite (non_finite_input, "
                    "unless ?nonfinite=propagate)"),
        404: _error("no such model"),
        406: _error("no response format in Accept is offered"),
        408: _error("the request body did not arrive within the upload timeout"),
        413: _error("the body is over the byte limit, or the image over the pixel or decoded-byte limit"),
        415: _error("not an image in a format read here"),
        422: _error("an invalid or unknown query parameter, a stack of planes sent to a model of 2-D images, a "
                    "2-D image sent to a volume model (other axes than the model takes), or ?view=overlay for a "
                    "volume or signal"),
        503: _error("busy (queue full), timed out, loading or draining; see Retry-After"),
    },
)  # fmt: skip
async def segment_image(
    request: Request,
    served: ModelDep,
    pool: PoolDep,
    receiving: ReceivingDep,
    settings: SettingsDep,
    metrics: MetricsDep,
    view: View | None = None,
    intensity: Annotated[
        str | None,
        Query(
            description="how the image's values are scaled to [0, 1], overriding the model's declaration: "
            "dtype (integers by their dtype's range, floats as they are), range:LOW,HIGH or percentiles:LOW,HIGH",
            examples=["range:0,4095", "percentiles:1,99.8"],
        ),
    ] = None,
    nonfinite: Annotated[
        Literal["refuse", "propagate"],
        Query(
            description="NaN/±Inf pixels (float TIFF or .npy): refuse the image with 400 non_finite_input "
            "(default), or propagate them as no-data: pixels whose patch reads one get the label type's maximum "
            "(255 in uint8, 65535 in uint16; transparent in the palette PNG, black in overlays) and NaN "
            "probabilities",
        ),
    ] = "refuse",
) -> Response:
    output = choose_output(request.headers.get("accept"), view, served.dense.dims)
    scaling = (
        None if intensity is None else Intensity.parse(intensity)
    )  # 400 intensity_out_of_range if unreadable
    # the body first, so that a client sending slowly holds no inference place; 503 at once past the bounds
    with receiving.hold(client_address(request)):
        upload = await read_upload(request, timeout=settings.upload_timeout)
    with pool.admit() as place:  # 503 at once when full
        limits = RequestLimits(
            settings.max_image_pixels, settings.max_decode_bytes, settings.max_inference_memory
        )
        cancel = threading.Event()
        job = partial(
            segment, served, upload.data, output, name=upload.name, overlay=view is View.overlay, limits=limits,
            intensity=scaling, nonfinite=nonfinite, cancel=cancel,
        )  # fmt: skip
        try:
            result = await pool.run(place, job, cancel=cancel, timeout=settings.request_timeout,
                                    client_gone=partial(client_disconnected, request))  # fmt: skip
        except ClientGone:
            metrics.abandoned.labels("client_gone").inc()
            raise
        except InferenceTimeout:
            metrics.abandoned.labels("timeout").inc()
            raise
    metrics.inference.labels(served.name).observe(result.timings["infer"])
    metrics.image_pixels.observe(result.size)
    headers = {**result.headers(), "Vary": "Accept"}
    return Response(result.body, media_type=result.media_type, headers=headers)


async def client_disconnected(request: Request) -> None:
    """Returns when the client closes the connection (the body has been read: only a disconnect can arrive)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
