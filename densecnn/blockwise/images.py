"""Labelling image files: one image in this process, or a set of images on the cluster, one task per image
(:mod:`~densecnn.blockwise.files`); an image that cannot be read is listed in the summary and the set goes on.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from ..errors import BlockFailedError, DenseCNNError, ImageTooLargeError, PredictInputError
from ..io import decode_array, write_labels
from ..io.labels import check_label_path, labels_file_name
from .cancel import stop_name
from .cluster import task_memory, worker_count
from .files import FileJob, label_file
from .options import BlockwiseOptions
from .scheduling import is_storage_error, run_tasks
from .sinks import storage_problem
from .summary import Summary
from .worker import model_on


def label_image_set(
    client, threads: int | None, model: str, images: list[Path], output: Path, options: BlockwiseOptions
) -> Summary:
    """Write the label map of each of ``images`` into the directory ``output``, under the image's name."""
    targets = [output / labels_file_name(image) for image in images]
    clashes = {t for t in targets if targets.count(t) > 1}
    if clashes:
        raise PredictInputError(
            f"images would write the same label map ({', '.join(sorted(t.name for t in clashes))}); "
            "give images with distinct names"
        )
    try:
        output.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PredictInputError(f"{output}: {storage_problem(exc)}") from None
    if options.overwrite:
        for target in targets:
            target.unlink(missing_ok=True)
    todo = [(str(i), str(t)) for i, t in zip(images, targets) if not t.exists()]
    job = FileJob(model, options.device, threads, task_memory(client, options.max_memory), options.intensity,
                  options.nonfinite, stop_name())  # fmt: skip
    start = Summary(
        "images", total=len(images), skipped=len(images) - len(todo), workers=worker_count(client)
    )

    def failed(item: tuple, exc: BaseException, attempts: int) -> DenseCNNError:
        if is_storage_error(exc):  # every other image would fail alike: the run stops
            return BlockFailedError(f"{output}: {storage_problem(exc)}")
        return BlockFailedError(f"failed {attempts} times: {exc}")

    return run_tasks(
        client, label_file, job, todo, start, options, stop=job.stop, describe=failed, keep_going=True
    )


def _decodable_bytes() -> int:
    """A quarter of this machine's memory: an image decoded whole, its float input and the net's maps fit beside."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 4


def label_one_image(loaded, input: Path, output: Path, options: BlockwiseOptions) -> Summary:
    """Write the label map of the image file ``input`` to ``output``, in this process (no cluster)."""
    check_label_path(output)
    started = time.perf_counter()
    dense = model_on(loaded, options.device)
    try:
        pixels = decode_array(input, max_bytes=_decodable_bytes())  # (H, W[, C])
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
