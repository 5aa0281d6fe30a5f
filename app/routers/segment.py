"""POST an image, get its label map (or probabilities, or an overlay) back."""

from __future__ import annotations

from functools import partial

from fastapi import APIRouter, Request, Response

from ..dependencies import MetricsDep, ModelDep, PoolDep, SettingsDep
from ..errors import ErrorBody
from ..negotiation import View, choose_output
from ..schemas import SegmentJson
from ..segmentation import segment
from ..uploads import read_upload

router = APIRouter(prefix="/v1/models", tags=["segmentation"])

BINARY = {"schema": {"type": "string", "format": "binary"}}
IMAGE_BODY = {
    "required": True,
    "description": "the image: PNG, JPEG or TIFF (also BMP, GIF), as multipart field `image` or as the raw body",
    "content": {
        "multipart/form-data": {
            "schema": {"type": "object", "properties": {"image": {"type": "string", "format": "binary"}},
                       "required": ["image"]},
        },
        "image/png": BINARY,
        "image/jpeg": BINARY,
        "image/tiff": BINARY,
    },
}  # fmt: skip


def _error(description: str) -> dict:
    return {"model": ErrorBody, "description": description}


@router.post(
    "/{name}/segment",
    summary="Label every pixel of an image",
    description=(
        "The answer's format is chosen by `Accept`: `image/png` (default) a palette PNG of class ids at the "
        "image's full resolution (a 16-bit PNG above 256 classes); `application/json` the label PNG in base64 "
        "with per-class pixel counts; `application/x-npy` float32 class probabilities (K, H, W). "
        "`?view=overlay` returns the image with the class colours blended in (PNG, or base64 in the JSON). "
        "EXIF orientation is applied: labels are in the orientation the image is displayed in. "
        "A multi-page TIFF is read from its first page. Timing is in the `Server-Timing` header."
    ),
    openapi_extra={"requestBody": IMAGE_BODY},
    response_class=Response,
    responses={
        200: {
            "description": "the label map, probabilities or overlay, as Accept asks",
            "model": SegmentJson,
            "content": {
                "image/png": BINARY,
                "application/x-npy": BINARY,
            },
        },
        400: _error("the image is corrupt or truncated, or the multipart body has no field `image`"),
        404: _error("no such model"),
        406: _error("no response format in Accept is offered"),
        413: _error("the body is over the byte limit, or the image over the pixel limit"),
        415: _error("not an image in a format read here"),
        422: _error("invalid query parameter"),
        503: _error("busy (queue full), timed out, loading or draining; see Retry-After"),
    },
)  # fmt: skip
async def segment_image(
    request: Request,
    served: ModelDep,
    pool: PoolDep,
    settings: SettingsDep,
    metrics: MetricsDep,
    view: View | None = None,
) -> Response:
    output = choose_output(request.headers.get("accept"), view)
    data = await read_upload(request)
    job = partial(
        segment,
        served,
        data,
        output,
        overlay=view is View.overlay,
        max_pixels=settings.max_image_pixels,
        max_memory=settings.max_inference_memory,
    )
    result = await pool.run(job, timeout=settings.request_timeout)
    metrics.inference.labels(served.name).observe(result.timings["infer"])
    metrics.image_pixels.observe(result.width * result.height)
    headers = {"Server-Timing": result.server_timing(), "Vary": "Accept"}
    return Response(result.body, media_type=result.media_type, headers=headers)
