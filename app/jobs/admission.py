"""The one admission of a job's input, whichever way it entered (a job upload, a resumable upload, a server-side
path): the image judged from its header against the service's limits (pixel and decoded-byte bombs; TIFF tiles and
zarr chunks that would decode to more than ``max_decode_bytes``), the result it will get (a zarr store for inputs
read block by block, one label PNG for image files decoded whole), the output chunk its memory allows, and the disk
its results take. Everything is decided before the job is recorded, so a job that cannot run is refused at once.

>>> plan = admit(job_input, service.models["nuclei"], settings, level=None, chunk=None)
>>> plan.result, plan.chunk          # a zarr store, in the engine's own chunks (they fit max_job_memory)
('zarr', None)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from densecnn.blockwise.blocks import halo
from densecnn.blockwise.planning import bytes_per_pixel, output_chunks, task_windows
from densecnn.errors import ImageReadError, ImageTooLargeError
from densecnn.io import label_dtype, open_lazy_array, read_header
from densecnn.io.arrays import LazyArray
from densecnn.io.decode import check_tiff_tiles

from ..errors import ApiError
from ..registry import ServedModel
from ..settings import Settings
from .inputs import JobInput
from .quota import disk_blocks

MIN_CHUNK = 16  # an output chunk's least side: smaller ones make a file and a task per few pixels
MAX_CHUNK = 16384  # and its largest; memory bounds it further (max_job_memory)
METADATA_BYTES = 64 * 1024  # a result store's zarr.json and directories, at most
WINDOW_SHARE = 0.5  # of a block task's memory, what its window and output buffer may take
MAX_LEVEL = 64  # an OME-Zarr level (the levels a store really has are checked when it is opened)


@dataclass(frozen=True)
class JobPlan:
    """What a job will do: ``result`` "zarr" or "png"; ``chunk`` the output chunk side to ask of the engine (None:
    its default, which fits); ``memory`` the bytes one block task is estimated to hold; ``output_bytes`` the disk its
    results may take."""

    result: str
    chunk: int | None
    memory: int
    output_bytes: int


def task_memory(settings: Settings) -> int:
    """Bytes one block task may use, its window and its inference together (the engine's ``max_memory``: it groups
    chunks into a task and tiles the inference within it)."""
    return min(settings.job_task_memory or settings.max_job_memory, settings.max_job_memory)


def chunk_memory(side: int, source: LazyArray, served: ServedModel) -> int:
    """Bytes a block task of one output chunk of ``side`` per axis holds: the engine's own estimate of its window
    (:mod:`densecnn.blockwise.planning`: the chunk within the image plus the halo of the receptive field, read,
    copied as float32 and labelled) and the output chunk's buffer (``side`` per axis whatever the image's size: zarr
    writes whole chunks).

    >>> chunk_memory(1024, open_lazy_array("slide.zarr", spatial_dims=2), served) < 2**30
    True
    """
    chunks = output_chunks(source, side)
    margins = halo(served.dense.patch_size, served.dense.receptive_field)
    window = math.prod(task_windows(chunks, (1,) * len(chunks), source.spatial_shape, margins))
    buffer = side ** len(chunks) * label_dtype(served.loaded.num_classes).itemsize
    return window * bytes_per_pixel(source) + buffer


def admit(
    job_input: JobInput, served: ServedModel, settings: Settings, *, level: int | None, chunk: int | None
) -> JobPlan:
    """The job's plan. Blocking (reads the input's header or metadata).

    Raises ApiError (413, 422), densecnn's ImageReadError (400; 413 for ImageTooLargeError), naming the input as the
    caller did, never where it lies on the server.
    """
    try:
        return _admit(job_input, served, settings, level, chunk)
    except ImageReadError as exc:
        exc.args = (exc.problem.replace(str(job_input.path), job_input.name),)  # its fix kept apart
        raise exc from None


def _admit(job_input: JobInput, served: ServedModel, settings: Settings, level, chunk) -> JobPlan:
    loaded = served.loaded
    dims = len(loaded.patch_size)
    labels = label_dtype(loaded.num_classes).itemsize
    if job_input.chunked:
        array = open_lazy_array(job_input.path, spatial_dims=dims, level=level or 0)
        _check_stored_chunks(array, job_input, settings)
        pixels = math.prod(array.spatial_shape)
        small_copy = (
            pixels * labels if pixels <= settings.max_image_pixels else 0
        )  # the PNG or TIFF beside it
        chosen, memory = _chunk(array, served, settings, chunk)
        stored = _store_bytes(array.spatial_shape, chosen or _default_chunk(array), labels)
        return JobPlan("zarr", chosen, memory, stored + disk_blocks(small_copy))
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
    memory = settings.request_memory_bound(loaded.in_channels)
    return JobPlan("png", None, memory, disk_blocks(header.pixels * labels))


def _store_bytes(shape: tuple[int, ...], side: int, itemsize: int) -> int:
    """The most a zarr store of labels of ``shape`` in chunks of ``side`` takes on disk: every chunk uncompressed
    (edge chunks whole, as zarr writes them) in whole blocks, and its metadata."""
    chunks = math.prod(-(-n // side) for n in shape)
    return chunks * disk_blocks(side ** len(shape) * itemsize) + METADATA_BYTES


def _check_stored_chunks(array: LazyArray, job_input: JobInput, settings: Settings) -> None:
    """413 for an input whose reader would allocate more than ``max_decode_bytes`` for one stored tile or chunk
    (a TIFF tile bomb, a zarr store of one huge chunk): the reader decodes whole tiles whatever window it reads."""
    if array.kind == "tiff":
        import tifffile

        with tifffile.TiffFile(job_input.path) as tiff:
            check_tiff_tiles(tiff, job_input.name, settings.max_decode_bytes)
        return
    if array.kind in ("zarr", "slide"):
        stored = math.prod(array.chunks) * _itemsize(array)
        if stored > settings.max_decode_bytes:
            raise ImageTooLargeError(
                f"{job_input.name}: stored in chunks of {'x'.join(map(str, array.chunks))} ({stored:,} decoded bytes "
                f"each), over the limit of {settings.max_decode_bytes:,} bytes; rechunk it (e.g. 1024 per side)"
            )


def _itemsize(array: LazyArray) -> int:
    import numpy as np

    return np.dtype(array.dtype).itemsize


def _chunk(
    array: LazyArray, served: ServedModel, settings: Settings, chunk: int | None
) -> tuple[int | None, int]:
    """The output chunk to ask for (None: the engine's default) and one block task's estimated memory; 422 when
    the caller's chunk does not fit one task's memory (:func:`task_memory`), of which :data:`WINDOW_SHARE` at most
    may go to the chunk's window and buffer: the rest is for the inference, which the engine tiles within it."""
    budget = int(task_memory(settings) * WINDOW_SHARE)

    def memory(side: int) -> int:
        return chunk_memory(side, array, served)

    if chunk is not None:
        if memory(chunk) > budget:
            raise ApiError(422, "chunk_too_large",
                           f"a chunk of {chunk} per side would take about {memory(chunk):,} bytes per task, over the "
                           f"{budget:,} a task's window may use on this server (half of max_job_memory); use at most "
                           f"{_largest_fitting(lambda side: memory(side) <= budget)}")  # fmt: skip
        return chunk, memory(chunk)
    default = _default_chunk(array)
    if memory(default) <= budget:
        return None, memory(default)
    fitting = _largest_fitting(lambda side: memory(side) <= budget)
    if fitting < MIN_CHUNK:
        raise ApiError(422, "model_too_large",
                       f"even chunks of {MIN_CHUNK} per side would pass the {budget:,} bytes a task's window may use "
                       "on this server (half of max_job_memory) for this model and input; raise it")  # fmt: skip
    return fitting, memory(fitting)


def _default_chunk(array: LazyArray) -> int:
    """The longest side of the output chunks the engine chooses for ``array`` by itself."""
    return max(output_chunks(array, None))


def _largest_fitting(fits) -> int:
    """The largest power of two from MIN_CHUNK to MAX_CHUNK for which ``fits(side)``; MIN_CHUNK // 2 if none."""
    side = MIN_CHUNK // 2
    while side * 2 <= MAX_CHUNK and fits(side * 2):
        side *= 2
    return side
