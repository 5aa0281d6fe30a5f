"""Where ``densecnn predict`` writes chunked outputs: zarr arrays, chunk by chunk (label files for single images are
written by :func:`densecnn.io.write_labels`).

A zarr output is created once by the driver, with its description in the attributes; each task then writes whole
chunks, and each chunk write is one store write, atomic (zarr's local store writes a temporary file and renames it;
object stores replace objects whole), so a chunk is either absent or complete, and flushed to the disk
(:func:`persist_chunk`) before the task reports it. A chunk's presence in the store is
what resume checks: the array is created with ``write_empty_chunks`` so that a chunk of background is stored too.
"""

from __future__ import annotations

import errno
import itertools
import os
from pathlib import Path

import numpy as np

from ..errors import Fix, PredictInputError


def create_output(
    path: str | Path,
    *,
    shape: tuple[int, ...],
    chunks: tuple[int, ...],
    dtype,
    attributes: dict,
    resume: bool,
    zarr_format: int = 3,
    dimension_names: tuple[str, ...] | None = None,
):
    """Create the zarr array ``path`` (zarr v3, or v2 with "/"-separated chunk keys as NGFF 0.4 wants), or with
    ``resume`` reopen one written for the same ``attributes``; ``dimension_names``: the axes' names (zarr v3,
    as NGFF 0.5 requires).

    Raises:
        PredictInputError: ``path`` exists and describes another prediction (other model, input, shape or chunks).
    """
    import zarr

    path = Path(path)
    if resume and path.exists():
        try:
            existing = zarr.open_array(str(path), mode="r")
        except Exception as exc:  # not an array, or unreadable metadata
            raise PredictInputError(
                f"{path} exists and is not a zarr array ({exc}); remove it or choose another"
            ) from None
        wanted = {"shape": tuple(shape), "chunks": tuple(chunks), "dtype": np.dtype(dtype)}
        found = {"shape": existing.shape, "chunks": existing.chunks, "dtype": existing.dtype}
        if found != wanted or existing.attrs.get("densecnn") != attributes:
            raise PredictInputError(
                f"{path} exists but holds another prediction ({_differences(found, wanted, existing, attributes)})",
                fix=Fix("remove it, choose another output, or start over", (("overwrite", ""),)),
            )
        return existing
    try:
        return zarr.create_array(
            store=str(path),
            shape=shape,
            chunks=chunks,
            dtype=dtype,
            fill_value=0,
            config={"write_empty_chunks": True},
            attributes={"densecnn": attributes},
            overwrite=True,
            zarr_format=zarr_format,
            **({"chunk_key_encoding": {"name": "v2", "separator": "/"}} if zarr_format == 2 else {}),
            **({"dimension_names": dimension_names} if zarr_format == 3 and dimension_names else {}),
        )
    except OSError as exc:  # read-only, no permission, a file in the way, disk full
        raise PredictInputError(f"{path}: {storage_problem(exc)}") from None


STORAGE_ERRORS = {
    errno.ENOSPC,
    errno.EDQUOT,
    errno.EACCES,
    errno.EPERM,
    errno.EROFS,
    errno.ENOTDIR,
    errno.EEXIST,
}


def storage_problem(exc: OSError) -> str:
    """What a failed write means and what to do, in one line; for the errors retrying cannot fix
    (:data:`STORAGE_ERRORS`) and any other."""
    what = exc.strerror or str(exc)
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"cannot be written ({what}); free space on its disk or choose another output, then run again to resume"
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return f"cannot be written ({what}); choose a writable location"
    return f"cannot be written ({what}); choose another output"


# what an output's record differing in a digest means (the digests themselves say nothing to a reader)
CHANGED_SINCE = {
    "weights": "the model's weights changed since the partial run (retrained in place?)",
    "input_identity": "the input changed since the partial run (or was not recorded)",
    "foreground_identity": "the foreground mask changed since the partial run (or was not recorded)",
    "config": "the model's model.json changed since the partial run (or was not recorded)",
}


def _differences(found: dict, wanted: dict, existing, attributes: dict) -> str:
    diffs = [f"{k} {found[k]} vs {wanted[k]}" for k in found if found[k] != wanted[k]]
    stored = existing.attrs.get("densecnn") or {}
    diffs += [
        CHANGED_SINCE.get(k, f"{k} {stored.get(k)!r} vs {v!r}")
        for k, v in attributes.items()
        if stored.get(k) != v
    ]
    return "; ".join(diffs) or "written by something else"


def open_output(path: str):
    """The output array at ``path`` (opened by each task: cheap, and never stale when a run starts over).

    ``write_empty_chunks`` is a setting of the opened array, not of the stored one: set it on every opening.
    """
    import zarr

    return zarr.open_array(path, mode="r+").with_config({"write_empty_chunks": True})


def _chunk_key(array, index: tuple[int, ...]) -> str:
    key = array.metadata.encode_chunk_key(index)
    return f"{array.path}/{key}" if array.path else key


def chunk_written(array, index: tuple[int, ...]) -> bool:
    """Whether the chunk at grid ``index`` of a spatial output (leading class axis of probabilities at 0) exists."""
    from zarr.core.sync import sync

    index = (0,) * (array.ndim - len(index)) + tuple(index)
    return sync(array.store.exists(_chunk_key(array, index)))


def persist_chunk(array, index: tuple[int, ...]) -> None:
    """Flush the chunk at grid ``index`` to the disk (fsync of its file and directory) when the store is a local
    directory, so a chunk counted as written survives a power cut, not only a killed process (object stores
    acknowledge a write once it is durable)."""
    root = getattr(array.store, "root", None)
    if root is None:
        return
    index = (0,) * (array.ndim - len(index)) + tuple(index)
    path = Path(root) / _chunk_key(array, index)
    for target in (path, path.parent):
        descriptor = os.open(target, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)


def written_chunks(array, spatial_dims: int) -> set[tuple[int, ...]]:
    """The grid indices of the chunks already in the store (one listing, not one request per chunk)."""
    from zarr.core.sync import sync

    async def keys():
        return [key async for key in array.store.list_prefix(array.path)]

    lead = array.ndim - spatial_dims
    grid = [range(-(-n // c)) for n, c in zip(array.shape, array.chunks, strict=True)]
    wanted = {
        _chunk_key(array, index): index[lead:]
        for index in itertools.product(*grid)
        if all(i == 0 for i in index[:lead])
    }
    return {wanted[k] for k in sync(keys()) if k in wanted}
