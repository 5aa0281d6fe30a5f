"""Labelling a chunked array on the cluster: plan the tasks, scale the whole image once, create (or reopen, to
resume) the outputs, run one task per block of output chunks (:mod:`~densecnn.blockwise.blocks`), then build the
multiscale outputs' further levels and write their metadata.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import BlockFailedError, DenseCNNError, NonFiniteInputError, PredictInputError
from ..io import LazyArray, Scaling, array_scaling, label_dtype
from ..io.identity import input_identity
from .blocks import BlockJob, bounding_region, label_block
from .cancel import stop_name
from .cluster import task_memory, worker_count
from .foreground import MODES as FOREGROUND_MODES
from .foreground import foreground
from .inputs import input_errors
from .ngff import (
    NgffTarget,
    PyramidJob,
    create_levels,
    downsample_chunk,
    is_ome_zarr,
    standalone_target,
    write_metadata,
)
from .options import BlockwiseOptions
from .planning import TaskPlan, plan_tasks
from .provenance import config_digest, weights_digest
from .scheduling import is_storage_error, run_tasks
from .sinks import create_output, storage_problem, written_chunks
from .summary import Summary


def label_array(
    client, threads: int | None, loaded, model: str, source: LazyArray, output: Path | None,
    options: BlockwiseOptions, target: NgffTarget | None,
) -> Summary:  # fmt: skip
    """Label ``source`` into the zarr array ``output``, or the OME-Zarr ``target``, on ``client``'s cluster."""
    budget = task_memory(client, options.max_memory)
    plan = plan_tasks(source, loaded.dense(), options.chunk, options.block, budget)
    scaling = whole_image_scaling(
        source, options.intensity or loaded.intensity, finite=options.nonfinite != "propagate"
    )
    with input_errors():
        where = foreground(options.foreground, source, scaling) if options.foreground else None
    description = _description(loaded, model, source, scaling, options)
    outputs = create_outputs(loaded, source, plan.chunks, output, target, description, options)
    job = BlockJob(
        model=model, device=options.device, threads=threads, max_memory=budget - plan.held, source=source,
        labels=str(outputs.labels), probabilities=None if outputs.probabilities is None else str(outputs.probabilities),
        chunks=plan.chunks, group=plan.group, halo=plan.halo, windows=plan.windows, scaling=scaling,
        foreground=where, nonfinite=options.nonfinite, stop=stop_name(),
    )  # fmt: skip
    blocks = _blocks_to_compute(job, outputs.done)
    total = len(job.chunk_grid())
    start = Summary("chunks", total=total, workers=worker_count(client),
                    skipped=total - sum(len(block) for block in blocks))  # fmt: skip
    if scaling.constant is not None:
        start.warnings.append((str(source.path), scaling.note()))
    describe = functools.partial(_block_failed, job, outputs.labels)
    summary = run_tasks(client, label_block, job, [(block,) for block in blocks], start, options, stop=job.stop,
                        describe=describe)  # fmt: skip
    for pyramid in outputs.pyramids:  # the metadata last: until then readers see no image
        build_pyramid(client, pyramid, source.spatial_shape, plan, options)
        write_metadata(pyramid.target, len(pyramid.levels), mean=pyramid.mean, **pyramid.metadata)
    return summary


def whole_image_scaling(source: LazyArray, intensity, *, finite: bool) -> Scaling:
    """The intensity scaling of the whole array, from its sample windows (every block is scaled by it); ``finite``:
    NaN/±Inf values in them are refused before any output is made."""
    try:
        return array_scaling(source, intensity, finite=finite)
    except (OSError, RuntimeError, ValueError) as exc:
        if isinstance(exc, DenseCNNError):  # the values do not fit the intensity scaling: its own message
            raise
        raise PredictInputError(
            f"{source.path}: reading a sample of the image (to scale its intensities) failed: {exc}; "
            "check the file is complete and readable"
        ) from None


def _description(loaded, model: str, source: LazyArray, scaling: Scaling, options: BlockwiseOptions) -> dict:
    """What the output is computed from: resuming with other weights (a model retrained in place), another
    ``model.json``, an input changed since (:func:`~densecnn.io.identity.input_identity`), another
    intensity scaling or another foreground (or mask) is refused."""
    mask = options.foreground not in (None, *FOREGROUND_MODES)
    return {
        "model": model, "weights": weights_digest(Path(model)), "config": config_digest(Path(model)),
        "input": str(Path(source.path).resolve()), "array": source.key,
        "input_identity": input_identity(source.path, source.key if source.kind == "zarr" else ""),
        "classes": list(loaded.class_names), "intensity": [scaling.low, scaling.high],
        "foreground": options.foreground,
        "foreground_identity": input_identity(options.foreground) if mask else None,
    }  # fmt: skip


def _blocks_to_compute(job: BlockJob, done: set) -> list[tuple[tuple[int, ...], ...]]:
    """The task blocks, each the chunks of it not yet written (blocks with none left out)."""
    blocks: dict[tuple[int, ...], list[tuple[int, ...]]] = {}
    for index in job.chunk_grid():
        if index not in done:
            blocks.setdefault(job.block_of(index), []).append(index)
    return [tuple(chunks) for chunks in blocks.values()]


def _block_failed(
    job: BlockJob, output: Path, item: tuple, exc: BaseException, attempts: int
) -> DenseCNNError:
    """The error stopping the run at the block ``item``: its chunks and pixel coordinates, and why."""
    chunks = item[0]
    region = bounding_region([job.chunk_region(index) for index in chunks])
    where = ", ".join(f"{axis} {r.start}..{r.stop - 1}" for axis, r in zip(_axis_names(len(region)), region))
    if is_storage_error(exc):
        return BlockFailedError(f"{output}: {storage_problem(exc)}")
    if isinstance(exc, NonFiniteInputError):  # the window's pixels, not the task: its fix is an option
        return BlockFailedError(f"the block of chunks {list(chunks)} ({where}): {exc.problem}", fix=exc.fix)
    return BlockFailedError(f"the block of chunks {list(chunks)} ({where}) {failed_after(attempts)}: {exc}")


def failed_after(attempts: int) -> str:
    """ "failed", or "failed N times" after retries."""
    return "failed" if attempts == 1 else f"failed {attempts} times"


def _axis_names(n: int) -> tuple[str, ...]:
    return ("planes", "rows", "columns")[-n:]


@dataclass(frozen=True)
class Pyramid:
    """A multiscale output: its OME-Zarr ``target``, its ``levels`` (zarr arrays; level 0 is written by the
    blocks), whether a level is the ``mean`` of the one before (probabilities) or its nearest pixels (labels), and
    the ``metadata`` written once every level is."""

    target: NgffTarget
    levels: list
    mean: bool
    metadata: dict


@dataclass(frozen=True)
class Outputs:
    """A run's outputs, created or reopened: the labels array's path, the probabilities' (or None), the chunks
    already written to every output, and the multiscale outputs whose further levels follow level 0."""

    labels: Path
    probabilities: Path | None
    done: set
    pyramids: list[Pyramid]


def create_outputs(loaded, source: LazyArray, chunks, output: Path | None, target: NgffTarget | None,
                   description: dict, options: BlockwiseOptions) -> Outputs:  # fmt: skip
    """Create (or reopen, resuming unless ``options.overwrite``) the labels and probabilities outputs."""
    shape, resume = source.spatial_shape, not options.overwrite
    pyramids = []
    attributes = {**description, "content": "labels"}
    if target is None:
        labels = create_output(output, shape=shape, chunks=chunks, dtype=label_dtype(loaded.num_classes),
                               attributes=attributes, resume=resume)  # fmt: skip
    else:
        levels = create_levels(
            target, shape, chunks, label_dtype(loaded.num_classes), attributes, resume=resume
        )
        labels, output = levels[0], Path(target.level(0))
        metadata = {"palette": loaded.palette, "class_names": loaded.class_names}
        pyramids.append(Pyramid(target, levels, False, metadata))
    done = written_chunks(labels, len(shape))
    probabilities = options.probabilities
    if probabilities is not None:
        attributes = {**description, "content": "probabilities"}
        if is_ome_zarr(probabilities):
            image = standalone_target(Path(probabilities), source, channels=loaded.num_classes)
            levels = create_levels(image, shape, chunks, np.float16, attributes, resume=resume)
            scores, probabilities = levels[0], Path(image.level(0))
            pyramids.append(Pyramid(image, levels, True, {}))
        else:
            scores = create_output(probabilities, shape=(loaded.num_classes, *shape),
                                   chunks=(loaded.num_classes, *chunks), dtype=np.float16, attributes=attributes,
                                   resume=resume)  # fmt: skip
        done &= written_chunks(scores, len(shape))
    return Outputs(output, probabilities, done, pyramids)


def build_pyramid(client, pyramid: Pyramid, shape, plan: TaskPlan, options: BlockwiseOptions) -> None:
    """Levels 1.. of a multiscale output, each chunk from the level before (resumable like level 0)."""
    target, chunks = pyramid.target, plan.chunks
    quiet = BlockwiseOptions(retries=options.retries, progress=False, cancel=options.cancel)
    for k, (level, level_shape) in enumerate(zip(pyramid.levels, target.level_shapes(shape, chunks))):
        if k == 0:
            continue
        job = PyramidJob(previous=target.level(k - 1), level=target.level(k), chunks=chunks, shape=level_shape,
                         mean=pyramid.mean)  # fmt: skip
        done = written_chunks(level, len(shape))
        items = [(index,) for index in job.chunk_grid() if index not in done]

        def failed(item, exc, attempts, k=k) -> DenseCNNError:
            return BlockFailedError(
                f"{target.root}: level {k}'s chunk {item[0]} {failed_after(attempts)}: {exc}"
            )

        run_tasks(
            client, downsample_chunk, job, items, Summary("chunks"), quiet, stop=stop_name(), describe=failed
        )
