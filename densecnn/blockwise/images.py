"""Labelling image files: one image in this process, or a set of images on the cluster, one task per image
(:mod:`~densecnn.blockwise.files`); an image that cannot be read is listed in the summary and the set goes on. A
folder of label maps records what they were made from (:mod:`~densecnn.blockwise.provenance`), so that a re-run
keeps only maps it would make itself.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import BlockFailedError, DenseCNNError, ImageTooLargeError, PredictInputError
from ..io import decode_array, write_labels
from ..io.labels import check_label_path, labels_file_name
from ..tiling import physical_memory
from .cancel import stop_name
from .cluster import task_memory, worker_count
from .files import FileJob, label_file
from .options import BlockwiseOptions
from .provenance import ImageSetRecord
from .scheduling import is_storage_error, run_tasks
from .sinks import storage_problem
from .summary import Summary
from .worker import model_on


@dataclass(frozen=True)
class ImageSetPlan:
    """An image set's run, checked and recorded: the ``output`` folder, how many images in ``total``, and the
    (image, label map) pairs ``todo`` (the others' maps are written already)."""

    output: Path
    total: int
    todo: list[tuple[str, str]]


def plan_image_set(model: str, images: list[Path], output: Path, options: BlockwiseOptions) -> ImageSetPlan:
    """Check and record, before any work, a run writing the label map of each of ``images`` into the folder
    ``output`` under the image's name: maps already there are kept only if the folder's record says this model and
    these options made them from the images as they are (:class:`~densecnn.blockwise.provenance.ImageSetRecord`);
    ``options.overwrite`` removes them instead."""
    targets = [output / labels_file_name(image) for image in images]
    clashes = {t for t in targets if targets.count(t) > 1}
    if clashes:
        raise PredictInputError(
            f"images would write the same label map ({', '.join(sorted(t.name for t in clashes))}); "
            "give images with distinct names"
        )
    record = ImageSetRecord.for_run(model, images, targets, options)
    if options.overwrite:
        for target in targets:
            target.unlink(missing_ok=True)
    else:
        record.check_resumes(output, [t for t in targets if t.exists()])
    try:
        output.mkdir(parents=True, exist_ok=True)
        record.merged_into(output).write(output)
    except OSError as exc:
        raise PredictInputError(f"{output}: {storage_problem(exc)}") from None
    todo = [(str(i), str(t)) for i, t in zip(images, targets) if not t.exists()]
    return ImageSetPlan(output, len(images), todo)


def label_image_set(
    client, threads: int | None, model: str, plan: ImageSetPlan, options: BlockwiseOptions
) -> Summary:
    """Write the label maps ``plan`` has to do, one task per image on ``client``'s cluster."""
    job = FileJob(model, options.device, threads, task_memory(client, options.max_memory), options.intensity,
                  options.nonfinite, stop_name())  # fmt: skip
    start = Summary(
        "images", total=plan.total, skipped=plan.total - len(plan.todo), workers=worker_count(client)
    )

    def failed(item: tuple, exc: BaseException, attempts: int) -> DenseCNNError:
        if is_storage_error(exc):  # every other image would fail alike: the run stops
            return BlockFailedError(f"{plan.output}: {storage_problem(exc)}")
        return BlockFailedError(f"failed {attempts} times: {exc}")

    return run_tasks(
        client, label_file, job, plan.todo, start, options, stop=job.stop, describe=failed, keep_going=True
    )


def _decodable_bytes() -> int | None:
    """A quarter of this machine's memory: an image decoded whole, its float input and the net's maps fit beside."""
    memory = physical_memory()
    return None if memory is None else memory // 4


def label_one_image(loaded, input: Path, output: Path, options: BlockwiseOptions) -> Summary:
    """Write the label map of the image file ``input`` to ``output``, in this process (no cluster)."""
    check_label_path(output)
    started = time.perf_counter()
    dense = model_on(loaded, options.device)
    try:
        pixels = decode_array(input, max_bytes=_decodable_bytes(), channels=loaded.in_channels)  # (H, W[, C])
    except ImageTooLargeError as exc:
        raise PredictInputError(
            f"{exc}. An image this large is labelled block by block: write its labels to a .zarr output (a TIFF "
            "is read a block at a time)"
        ) from None
    scaling = loaded.scaling(pixels, intensity=options.intensity, nonfinite=options.nonfinite)
    x = loaded.input(pixels, scaling=scaling, nonfinite=options.nonfinite)  # (1, C, H, W)
    run = dict(max_memory=options.max_memory, dense=dense, nonfinite=options.nonfinite)
    labels = loaded.labels(x, **run)[0]  # (H, W)
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        write_labels(output, labels, loaded.palette)
    except OSError as exc:
        raise PredictInputError(f"{output}: {storage_problem(exc)}") from None
    summary = Summary(
        "images", total=1, computed=1, pixels=labels.size, seconds=time.perf_counter() - started
    )
    if scaling.constant is not None:
        summary.warnings.append((str(input), scaling.note()))
    return summary
