"""The driver of ``densecnn predict``: decide what the input is, start or join a Dask cluster, run the tasks, sum up.

Work goes to Dask's distributed scheduler as futures: one task per output chunk for a chunked array
(:mod:`densecnn.blockwise.blocks`), one per image for an image set (:mod:`densecnn.blockwise.files`). Without a
scheduler address a local cluster is started in this process (one worker thread; torch's own threads use the
cores) or, with ``workers > 1``, as that many worker processes sharing the cores out. The driver keeps only a window of tasks in flight, resubmits a
failed task up to ``retries`` times (counting them for the summary), and stops at a block that keeps failing,
naming its coordinates; an image that cannot be read is listed in the summary and the set goes on.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from ..errors import (
    BlockFailedError,
    Cancelled,
    DenseCNNError,
    Fix,
    ImageReadError,
    NonFiniteInputError,
    PredictInputError,
)
from ..io import (
    LazyArray,
    Scaling,
    array_scaling,
    image_files,
    is_zarr,
    label_dtype,
    open_array,
    unit_planes,
    write_labels,
)
from ..io.arrays import ome_levels
from ..io.formats import IMAGE_SUFFIXES, TIFF_SUFFIXES
from ..io.labels import check_label_path, labels_file_name
from ..io.slides import SLIDE_SUFFIXES
from ..modelfile.format import WEIGHTS_FILE
from .blocks import BlockJob, bounding_region, halo, label_block
from .cancel import stop_name, watching
from .files import FileJob, label_file
from .foreground import foreground
from .ngff import (
    NgffTarget,
    PyramidJob,
    create_levels,
    downsample_chunk,
    labels_target,
    standalone_target,
    write_metadata,
)
from .options import BlockwiseOptions
from .planning import bytes_per_pixel, output_chunks, task_group, task_windows
from .sinks import STORAGE_ERRORS, create_output, storage_problem, written_chunks
from .summary import Summary

WORKER_BASELINE = 512 * 2**20  # a worker process with torch, Dask and a model loaded, before any task
CONNECT_SECONDS = 10  # to reach a scheduler (Dask's own default waits 30 s, then prints a long traceback)
TASK_SHARE = 0.5  # of what is left under a worker slot's memory limit, given to a task; the rest is headroom


def label(
    model: str | Path,
    input: str | Path,
    output: str | Path | None,
    options: BlockwiseOptions | None = None,
) -> Summary:
    """Label an image file, a set of images, or a chunked array too large for memory, with a saved model.

    - ``input`` an image file -> ``output`` a label map (.png with the model's palette, .tif or .npy).
    - ``input`` a directory or glob of images -> ``output`` a directory of label maps with the same names.
    - ``input`` a zarr array, OME-Zarr group (the level at the model's pixel size, or ``options.level``), TIFF, whole-slide image or .npy -> ``output`` a zarr array of
      labels (uint8, uint16 past 255 classes) chunked like the input (or ``options.chunk``), and optionally the class
      probabilities; ``output`` ending in ``.ome.zarr``, or ``options.labels_into``, a multiscale OME-Zarr label
      image (:mod:`densecnn.blockwise.ngff`). The
      array has the model's spatial axes, (H, W) for a 2-D model, (D, H, W) for a 3-D one, (L) for a 1-D one, and
      optionally a channel axis; image files are for 2-D models. A task computes about ``options.block`` pixels per
      side (whole chunks) in one pass and writes each chunk.

    The result equals one pass of the dense net over the whole image, to rounding. ``options`` (:class:`BlockwiseOptions`)
    say where it runs (a scheduler's cluster, or a local one), with how much memory per task, and how it resumes and
    retries.

    >>> summary = label("models/nuclei", "slide.ome.zarr", "slide-labels.zarr", BlockwiseOptions(workers=2))
    >>> print(summary.pixels_per_second)

    Raises:
        PredictInputError: the input or output cannot be used (the message says what to give instead).
        BlockFailedError: a block kept failing; the message names its chunk and pixel coordinates.
    """
    from ..modelfile import load

    _require_dist()
    options = options or BlockwiseOptions()
    loaded = load(model)
    model = str(Path(model).resolve())
    input = Path(input)
    if output is None and options.labels_into is None:
        raise PredictInputError(
            "no output given",
            fix=Fix("give an output, or write into the input OME-Zarr image", (("labels_into", "NAME"),)),
        )
    if options.labels_into is not None and output is not None:
        raise PredictInputError(
            f"the labels go into {input}/labels/{options.labels_into}: give no output besides"
        )
    output = None if output is None else Path(output)
    if output is None or output.suffix == ".zarr" or is_zarr(output):
        return _label_chunked(loaded, model, input, output, options)
    return _label_files(loaded, model, input, output, options)


def _label_chunked(
    loaded, model: str, input: Path, output: Path | None, options: BlockwiseOptions
) -> Summary:
    """An array (zarr, OME-Zarr, TIFF, slide) -> a zarr array or OME-Zarr label image, block by block."""
    with _input_errors():
        level = options.level if options.level is not None else _matching_level(input, loaded)
        source = _chunked_source(input, options.channel_axis, len(loaded.patch_size), level)
    _check_channels(source.channels, loaded.in_channels, source.path)
    target = None
    if options.labels_into is not None:
        target = labels_target(input, options.labels_into, source, level)
    elif str(output).endswith(".ome.zarr"):
        target = standalone_target(output, source)
    with _client(options) as (client, threads):
        return _label_array(client, threads, loaded, model, source, output, options, target)


def _label_files(loaded, model: str, input: Path, output: Path, options: BlockwiseOptions) -> Summary:
    """An image file -> a label file; a directory or glob of images -> a directory of label files."""
    dims = len(loaded.patch_size)
    if dims != 2:
        kind = {1: "signal", 3: "volume"}[dims]
        raise PredictInputError(
            f"{input} -> {output}: a {dims}-D model labels a chunked {kind}, not image files; give a zarr array, "
            f"OME-Zarr group or TIFF holding the {kind} as input and an output ending in .zarr"
        )
    if options.probabilities is not None or options.foreground is not None:
        what = "probabilities are" if options.probabilities is not None else "background skipping is"
        raise PredictInputError(f"{what} for zarr outputs only; give an output ending in .zarr")
    if is_zarr(input) or input.suffix.lower() in SLIDE_SUFFIXES:
        kind = "a zarr array" if is_zarr(input) else "a whole-slide image"
        raise PredictInputError(
            f"{input} is {kind}: its labels go to a zarr array; give an output ending in .zarr"
        )
    if input.is_dir() or any(ch in str(input) for ch in "*?["):
        with _input_errors():
            images = image_files(input)
        with _client(options) as (client, threads):
            return _label_images(client, threads, model, images, output, options)
    if not input.is_file():
        raise PredictInputError(f"{input}: no such file, directory or zarr array")
    with _input_errors():
        return _label_one_image(loaded, input, output, options)


@contextlib.contextmanager
def _input_errors() -> Iterator[None]:
    """densecnn.io's errors (an input it cannot read, an output it cannot write) as PredictInputError."""
    try:
        yield
    except ImageReadError as exc:
        raise PredictInputError(exc.problem, fix=exc.fix) from None


def _require_dist() -> None:
    try:
        import distributed  # noqa: F401
        import zarr  # noqa: F401
    except ImportError as exc:
        raise PredictInputError(
            f"densecnn predict needs the 'dist' extra ({exc.name} is missing): pip install 'densecnn[dist]'"
        ) from None


PIXEL_SIZE_TOLERANCE = 0.2  # a level within 20% of the model's pixel size along every axis matches it


def _matching_level(input: Path, loaded) -> int:
    """The level of an OME-Zarr ``input`` at the model's pixel size (the closest within 20%); 0 when the model
    records none or the input has no levels."""
    levels = ome_levels(input, spatial_dims=len(loaded.patch_size))
    if loaded.pixel_size is None or not levels:
        return 0
    wanted = np.array(loaded.pixel_size)
    errors = [np.abs(np.log(np.array(p) / wanted)).max() if p is not None else np.inf for p in levels]
    best = int(np.argmin(errors))
    if errors[best] > np.log1p(PIXEL_SIZE_TOLERANCE):
        sizes = ", ".join(
            f"{k}: {'x'.join(f'{v:g}' for v in p) if p else 'unknown'}" for k, p in enumerate(levels)
        )
        raise PredictInputError(
            f"{input}: no level has the model's pixel size ({'x'.join(f'{v:g}' for v in wanted)} um; the levels "
            f"have {sizes} um)",
            fix=Fix("choose one (the labels are then at that level's resolution)", (("level", "N"),)),
        )
    return best


def _chunked_source(input: Path, channel_axis: int | None, spatial_dims: int, level: int = 0) -> LazyArray:
    if input.is_file() and input.suffix.lower() in set(IMAGE_SUFFIXES) - set(TIFF_SUFFIXES):
        raise PredictInputError(
            f"{input}: a {input.suffix} image is decoded whole; write its labels to a .png/.tif/.npy file, or give "
            "a zarr array or TIFF for chunked output"
        )
    return open_array(input, channel_axis=channel_axis, spatial_dims=spatial_dims, level=level)


def _check_channels(have: int, want: int, where: str) -> None:
    try:
        unit_planes(np.zeros((1, 1, have), np.float32), want)
    except ImageReadError:
        raise PredictInputError(
            f"{where}: {have} channels cannot feed a model of {want}",
            fix=Fix("if the channels are not the first axis, name their axis", (("channel_axis", "N"),)),
        ) from None


def _label_one_image(loaded, input: Path, output: Path, options: BlockwiseOptions) -> Summary:
    from ..io import read_array

    check_label_path(output)
    started = time.perf_counter()
    dense = loaded.dense().to(options.device).eval()
    pixels = read_array(input)  # (H, W[, C])
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


@contextlib.contextmanager
def _client(options: BlockwiseOptions) -> Iterator[tuple[object, int | None]]:
    """The caller's distributed Client, or one for the scheduler, or for a local cluster; and the torch threads per
    task to set."""
    from distributed import Client, LocalCluster

    scheduler, workers = options.scheduler, options.workers
    if options.client is not None:
        yield options.client, None  # the caller's: left open, its workers keep their own thread settings
        return
    if scheduler is not None:
        try:
            client = Client(scheduler, timeout=CONNECT_SECONDS)
        except (OSError, TimeoutError) as exc:
            raise PredictInputError(
                f"cannot reach the Dask scheduler at {scheduler} within {CONNECT_SECONDS} s ({exc}); check the "
                "address and that the scheduler runs, or give no scheduler to run on this machine"
            ) from None
        with client:
            if "dashboard" in client.scheduler_info().get("services", {}):
                print(f"densecnn predict: Dask dashboard at {client.dashboard_link}", file=sys.stderr)
            yield client, None  # the cluster's workers keep their own thread settings
        return
    if workers < 1:
        raise PredictInputError(f"workers must be at least 1, got {workers}")
    # Dask's scheduler and workers always serve HTTP (health, metrics; the dashboard when bokeh is installed), on
    # every interface unless told otherwise: a local cluster listens on loopback only, on free ports
    loopback = {"dashboard_address": "127.0.0.1:0", "worker_dashboard_address": "127.0.0.1:0"}
    if workers == 1:  # one worker thread in this process, with this process's torch threads
        cluster = LocalCluster(n_workers=1, threads_per_worker=1, processes=False, **loopback)
        threads = None
    else:  # Dask starts worker processes with one OpenMP thread: share the cores out
        cluster = LocalCluster(
            n_workers=workers, threads_per_worker=1, processes=True, host="127.0.0.1", **loopback
        )
        threads = max(1, (os.cpu_count() or 1) // workers)
    with cluster, Client(cluster) as client:
        yield client, threads


def _task_memory(client, max_memory: int | None) -> int:
    """Bytes one task may use: ``max_memory``, or a share of what the smallest worker slot has left.

    A worker's memory limit less its baseline (the process with torch and the model), split among its threads;
    half of that, so that Dask's pause at 80% of the limit is not reached.
    """
    if max_memory is not None:
        return max_memory
    import psutil

    slots = []
    for info in client.scheduler_info()["workers"].values():
        limit = info.get("memory_limit") or psutil.virtual_memory().total
        used = max(info.get("metrics", {}).get("memory", 0), WORKER_BASELINE)
        slots.append((limit - used) / max(info.get("nthreads", 1), 1))
    budget = int(TASK_SHARE * min(slots, default=psutil.virtual_memory().total))
    if budget <= 0:
        raise PredictInputError(
            f"the workers' memory limit leaves nothing for a task (a worker itself needs about "
            f"{WORKER_BASELINE // 2**20} MiB); give the workers more memory, or fewer threads each"
        )
    return budget


def weights_digest(model_dir: Path) -> str:
    """The SHA-256 of a model directory's weights file: what a resumed output must have been computed with."""
    digest = hashlib.sha256()
    with (model_dir / WEIGHTS_FILE).open("rb") as weights:
        for block in iter(lambda: weights.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _label_array(
    client, threads, loaded, model: str, source: LazyArray, output: Path | None, options: BlockwiseOptions,
    target: NgffTarget | None,
) -> Summary:  # fmt: skip
    dense = loaded.dense()
    shape = source.spatial_shape
    chunks = output_chunks(source, options.chunk)
    margins = halo(dense.patch_size, dense.receptive_field)
    budget = _task_memory(client, options.max_memory)
    group = task_group(chunks, shape, margins, options.block, bytes_per_pixel(source), budget)
    windows = task_windows(chunks, group, shape, margins)
    held = math.prod(windows) * bytes_per_pixel(source)
    if held >= budget:
        raise PredictInputError(
            f"a task's window of {'x'.join(map(str, windows))} pixels needs about {held:,} bytes for its input and "
            f"labels, more than the {budget:,} bytes a task may use",
            fix=Fix(
                "choose a smaller chunk or a larger memory cap", (("chunk", "N"), ("max_memory", "BYTES"))
            ),
        )
    scaling = _whole_image_scaling(source, options.intensity or loaded.intensity)
    with _input_errors():
        where = foreground(options.foreground, source, scaling) if options.foreground else None
    # what the output was computed from: resuming with other weights (a model retrained in place), another
    # intensity scaling or another foreground is refused
    description = {"model": model, "weights": weights_digest(Path(model)), "input": str(Path(source.path).resolve()),
                   "array": source.key, "classes": list(loaded.class_names),
                   "intensity": [scaling.low, scaling.high], "foreground": options.foreground}  # fmt: skip
    output, probabilities, done, pyramids = _create_outputs(loaded, source, chunks, output, target, description,
                                                            options)  # fmt: skip
    job = BlockJob(
        model=model, device=options.device, threads=threads, max_memory=budget - held, source=source,
        labels=str(output), probabilities=None if probabilities is None else str(probabilities), chunks=chunks,
        group=group, halo=margins, windows=windows, scaling=scaling, foreground=where, nonfinite=options.nonfinite,
        stop=stop_name(),
    )  # fmt: skip
    grid = job.chunk_grid()
    blocks: dict[tuple[int, ...], list[tuple[int, ...]]] = {}
    for index in grid:
        if index not in done:
            blocks.setdefault(job.block_of(index), []).append(index)
    summary = Summary("chunks", total=len(grid), workers=_workers(client))
    if scaling.constant is not None:
        summary.warnings.append((str(source.path), scaling.note()))
    summary.skipped = len(grid) - sum(len(indices) for indices in blocks.values())

    def failed(item, exc, attempts):
        region = bounding_region([job.chunk_region(index) for index in item[0]])
        where = ", ".join(
            f"{axis} {r.start}..{r.stop - 1}" for axis, r in zip(_axis_names(len(region)), region)
        )
        if isinstance(exc, OSError) and exc.errno in STORAGE_ERRORS:
            raise BlockFailedError(f"{output}: {storage_problem(exc)}")
        if isinstance(exc, NonFiniteInputError):  # the window's pixels, not the task: its fix is an option
            raise BlockFailedError(
                f"the block of chunks {list(item[0])} ({where}): {exc.problem}", fix=exc.fix
            )
        raise BlockFailedError(
            f"the block of chunks {list(item[0])} ({where}) failed {attempts} times: {exc}"
        )

    items = [(tuple(b),) for b in blocks.values()]
    _run(client, label_block, job, items, summary, options.retries, options.progress, failed, options.on_progress,
         options.cancel, job.stop)  # fmt: skip
    for pyramid, levels, mean, metadata in pyramids:  # the metadata last: until then readers see no image
        _build_pyramid(client, pyramid, levels, shape, chunks, mean, options)
        write_metadata(pyramid, len(levels), **metadata)
    return summary


def _whole_image_scaling(source: LazyArray, intensity) -> Scaling:
    """The intensity scaling of the whole array, from its sample windows (every block is scaled by it)."""
    try:
        return array_scaling(source, intensity)
    except (OSError, RuntimeError, ValueError) as exc:
        if isinstance(exc, DenseCNNError):  # the values do not fit the intensity scaling: its own message
            raise
        raise PredictInputError(
            f"{source.path}: reading a sample of the image (to scale its intensities) failed: {exc}; "
            "check the file is complete and readable"
        ) from None


def _create_outputs(loaded, source: LazyArray, chunks, output: Path | None, target: NgffTarget | None,
                    description: dict, options: BlockwiseOptions) -> tuple:  # fmt: skip
    """Create (or reopen, resuming) the labels and probabilities outputs: (labels path, probabilities path or
    None, the chunks already written to every output, the multiscale outputs whose pyramid and metadata follow)."""
    shape, probabilities = source.spatial_shape, options.probabilities
    pyramids = []  # (target, levels, mean, metadata) of the multiscale outputs: levels 1.. follow level 0
    if target is None:
        labels = create_output(output, shape=shape, chunks=chunks, dtype=label_dtype(loaded.num_classes),
                               attributes={**description, "content": "labels"}, resume=not options.overwrite)  # fmt: skip
    else:
        levels = create_levels(target, shape, chunks, label_dtype(loaded.num_classes),
                               {**description, "content": "labels"}, resume=not options.overwrite)  # fmt: skip
        labels, output = levels[0], Path(target.level(0))
        pyramids.append(
            (target, levels, False, {"palette": loaded.palette, "class_names": loaded.class_names})
        )
    done = written_chunks(labels, len(shape))
    if probabilities is not None:
        attributes = {**description, "content": "probabilities"}
        if str(probabilities).endswith(".ome.zarr"):
            image = standalone_target(Path(probabilities), source, channels=loaded.num_classes)
            levels = create_levels(image, shape, chunks, np.float16, attributes, resume=not options.overwrite)
            scores, probabilities = levels[0], Path(image.level(0))
            pyramids.append((image, levels, True, {}))
        else:
            scores = create_output(probabilities, shape=(loaded.num_classes, *shape),
                                   chunks=(loaded.num_classes, *chunks), dtype=np.float16, attributes=attributes,
                                   resume=not options.overwrite)  # fmt: skip
        done &= written_chunks(scores, len(shape))
    return output, probabilities, done, pyramids


def _build_pyramid(client, target: NgffTarget, levels: list, shape, chunks, mean: bool, options) -> None:
    """Levels 1.. of a multiscale output, each chunk from the level before (resumable like level 0)."""
    for k, (level, level_shape) in enumerate(zip(levels, target.level_shapes(shape, chunks)), start=0):
        if k == 0:
            continue
        job = PyramidJob(previous=target.level(k - 1), level=target.level(k), chunks=chunks, shape=level_shape,
                         mean=mean)  # fmt: skip
        done = written_chunks(level, len(shape))
        items = [(index,) for index in job.chunk_grid() if index not in done]

        def failed(item, exc, attempts, k=k):
            raise BlockFailedError(
                f"{target.root}: level {k}'s chunk {item[0]} failed {attempts} times: {exc}"
            )

        _run(client, downsample_chunk, job, items, Summary("chunks"), options.retries, False, failed,
             cancel=options.cancel, stop=stop_name())  # fmt: skip


def _axis_names(n: int) -> tuple[str, ...]:
    return ("planes", "rows", "columns")[-n:]


def _label_images(
    client, threads, model, images: list[Path], output: Path, options: BlockwiseOptions
) -> Summary:
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
    job = FileJob(model, options.device, threads, _task_memory(client, options.max_memory), options.intensity,
                  options.nonfinite, stop_name())  # fmt: skip
    summary = Summary("images", total=len(images), skipped=len(images) - len(todo), workers=_workers(client))

    def failed(item, exc, attempts):
        if isinstance(exc, OSError) and exc.errno in STORAGE_ERRORS:  # every other image would fail alike
            raise BlockFailedError(f"{output}: {storage_problem(exc)}")
        summary.failures.append((item[0], BlockFailedError(f"failed {attempts} times: {exc}")))

    _run(client, label_file, job, todo, summary, options.retries, options.progress, failed, options.on_progress,
         options.cancel, job.stop)  # fmt: skip
    return summary


def _workers(client) -> int:
    return len(client.scheduler_info()["workers"])


def _reruns(dask_scheduler, keys: list) -> int:
    """Runs on the scheduler: how many times the tasks ``keys`` were running on a worker that was lost (Dask then
    runs them again by itself; ``TaskState.suspicious`` counts it)."""
    return sum(dask_scheduler.tasks[key].suspicious for key in keys if key in dask_scheduler.tasks)


def _run(
    client, task: Callable, job, items: list[tuple], summary: Summary, retries: int, progress: bool,
    failed: Callable, on_progress: Callable[[Summary], None] | None = None,
    cancel: threading.Event | None = None, stop: str | None = None,
) -> None:  # fmt: skip
    """Run ``task(job, *item)`` for every item, a window of them in flight; retry, count, report to ``summary``
    (and to ``on_progress``, whose exception stops the run). Once ``cancel`` is set, no task starts, the tasks
    in flight are cancelled and told to stop through the cluster-wide event ``stop`` (:mod:`.cancel`), and
    :class:`~densecnn.errors.Cancelled` is raised."""
    from distributed import as_completed
    from tqdm.auto import tqdm

    started = time.perf_counter()
    slots = sum(info.get("nthreads", 1) for info in client.scheduler_info()["workers"].values())
    pending = iter(items)
    attempts: dict[object, tuple[tuple, int]] = {}

    finished = []  # kept until the end, so that the scheduler still knows them when asked about re-runs

    def submit(item: tuple, attempt: int) -> object:
        future = client.submit(task, job, *item, pure=False)
        attempts[future] = (item, attempt)
        return future

    first = [submit(item, 1) for item in itertools.islice(pending, 2 * slots + 2)]
    bar = tqdm(
        total=len(items), desc="densecnn predict", unit=summary.what[:-1], disable=None if progress else True
    )
    queue = as_completed(first, with_results=False)
    with watching(client, cancel, stop, lambda: list(attempts)):
        try:
            if on_progress is not None:
                on_progress(summary)
            for future in queue:
                if cancel is not None and cancel.is_set():
                    raise Cancelled(
                        "the run was cancelled; what was written is kept, and the same run resumes it"
                    )
                item, attempt = attempts.pop(future)
                finished.append(future)
                if future.status == "error":
                    exc = future.exception()
                    final = (isinstance(exc, OSError) and exc.errno in STORAGE_ERRORS) or isinstance(
                        exc, NonFiniteInputError
                    )  # retrying cannot fix it
                    if attempt <= retries and not final:
                        summary.retries += 1
                        queue.add(submit(item, attempt + 1))
                        continue
                    failed(item, exc, attempt)
                else:
                    summary.add(future.result())
                bar.update()
                if on_progress is not None:
                    on_progress(summary)
                following = next(pending, None)
                if following is not None:
                    queue.add(submit(following, 1))
        finally:
            bar.close()
            client.cancel(list(attempts))
            summary.seconds = time.perf_counter() - started
            with contextlib.suppress(
                Exception
            ):  # a scheduler that runs no functions sent to it: nothing to count
                summary.reruns = client.run_on_scheduler(_reruns, keys=[f.key for f in finished])
            del finished
            summary.skipped = summary.total - summary.computed - len(summary.failures)
