"""What a new job will produce, decided when it is submitted (so that a job that cannot run is refused at once):
a zarr store for inputs read block by block, one label PNG for image files decoded whole, which must then fit the
service's image limits; and whether its result fits the disk quota."""

from __future__ import annotations

import math

from densecnn import LoadedModel
from densecnn.errors import ImageReadError
from densecnn.io import label_dtype, open_array, read_header

from ..errors import ApiError
from ..settings import Settings
from .inputs import JobInput
from .quota import QuotaExceeded


def plan(job_input: JobInput, loaded: LoadedModel, settings: Settings, room: int, level: int | None) -> str:
    """The job's result, "zarr" or "png". Blocking (reads the input's header or metadata).

    Raises ApiError (413, 422), densecnn's ImageReadError (400; naming the input as the caller did, not where it lies
    on the server), QuotaExceeded (507).
    """
    try:
        return _plan(job_input, loaded, settings, room, level)
    except ImageReadError as exc:
        raise type(exc)(str(exc).replace(str(job_input.path), job_input.name)) from None


def _plan(job_input: JobInput, loaded: LoadedModel, settings: Settings, room: int, level: int | None) -> str:
    dims = len(loaded.patch_size)
    if job_input.chunked:
        array = open_array(job_input.path, spatial_dims=dims, level=level or 0)
        labels = math.prod(array.spatial_shape) * label_dtype(loaded.num_classes).itemsize
        if labels > room:  # the labels at most, uncompressed
            raise QuotaExceeded(room)
        return "zarr"
    if dims != 2:
        raise ApiError(422, "wrong_dimensions",
                       f"{job_input.name} is an image file; a {dims}-D model labels a zarr array, TIFF or .npy "
                       "holding its input")  # fmt: skip
    size = job_input.path.stat().st_size
    advice = "convert it to a (tiled) TIFF or a zarr array, which jobs read block by block"
    if size > settings.max_upload_bytes:
        raise ApiError(413, "image_too_large",
                       f"{job_input.name} ({size:,} bytes) is an image file decoded whole, larger than the limit of "
                       f"{settings.max_upload_bytes:,} bytes for those; {advice}")  # fmt: skip
    header = read_header(job_input.path)
    if header.pixels > settings.max_image_pixels or header.decoded_bytes > settings.max_decode_bytes:
        raise ApiError(413, "image_too_large",
                       f"{job_input.name} ({header.width}x{header.height}) is an image file decoded whole, over the "
                       f"limit of {settings.max_image_pixels:,} pixels or {settings.max_decode_bytes:,} decoded bytes "
                       f"for those; {advice}")  # fmt: skip
    return "png"
