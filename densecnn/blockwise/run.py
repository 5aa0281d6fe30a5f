"""The driver of ``densecnn predict`` (:func:`predict_to_disk`): decide what the input is, start or join a Dask
cluster, run the tasks, sum up.

Work goes to Dask's distributed scheduler as futures: one task per block of output chunks for a chunked array
(:mod:`~densecnn.blockwise.chunked`), one per image for an image set (:mod:`~densecnn.blockwise.images`). What the
input is: :mod:`~densecnn.blockwise.inputs`; the cluster: :mod:`~densecnn.blockwise.cluster`; tasks in flight,
retries and cancel: :mod:`~densecnn.blockwise.scheduling`.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import Fix, PredictInputError
from ..io import image_files
from .chunked import label_array
from .cluster import connect
from .destinations import check_destinations
from .images import label_image_set, label_one_image, plan_image_set
from .inputs import check_image_files, input_errors, is_image_set, open_chunked, require_dist, writes_chunked
from .ngff import check_spatial_axes, is_ome_zarr, labels_target, standalone_target
from .options import BlockwiseOptions
from .summary import Summary
from .worker import check_device


def predict_to_disk(
    model: str | Path,
    input: str | Path,
    output: str | Path | None,
    options: BlockwiseOptions | None = None,
) -> Summary:
    """Label an image file, a set of images, or a chunked array too large for memory with a saved model, writing
    the labels to disk.

    - ``input`` an image file -> ``output`` a label map (.png with the model's palette, .tif or .npy).
    - ``input`` a directory or glob of images -> ``output`` a directory of label maps with the same names.
    - ``input`` a zarr array, OME-Zarr group (the level at the model's pixel size, or ``options.level``), TIFF,
      whole-slide image or .npy -> ``output`` a zarr array of labels (uint8, uint16 past 255 classes) chunked like
      the input (or ``options.chunk``), and optionally the class probabilities; ``output`` ending in
      ``.ome.zarr``, or ``options.labels_into``, a multiscale OME-Zarr label image (:mod:`densecnn.blockwise.ngff`).
      The array has the model's spatial axes, (H, W) for a 2-D model, (D, H, W) for a 3-D one, (L) for a 1-D one,
      and optionally a channel axis; image files are for 2-D models. A task computes about ``options.block``
      pixels per side (whole chunks) in one pass and writes each chunk.

    The result equals one pass of the dense net over the whole image, to rounding. ``options``
    (:class:`BlockwiseOptions`) say where it runs (a scheduler's cluster, or a local one), with how much memory per
    task, and how it resumes and retries.

    >>> summary = predict_to_disk("models/nuclei", "slide.ome.zarr", "slide-labels.zarr", BlockwiseOptions(workers=2))
    >>> print(summary.pixels_per_second)

    No output may be an input, hold one or share a path with another output: such a run is refused before any
    work (:func:`~densecnn.blockwise.destinations.check_destinations`).

    Raises:
        PredictInputError: the input or output cannot be used (the message says what to give instead).
        BlockFailedError: a block kept failing; the message names its chunk and pixel coordinates.
    """
    from ..modelfile import load

    require_dist()
    options = options or BlockwiseOptions()
    check_options(options)
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
    check_destinations(model, input, output, options)
    check_spatial_axes(output, options.probabilities, len(loaded.patch_size))
    if writes_chunked(output):
        return _label_chunked(loaded, model, input, output, options)
    return _label_files(loaded, model, input, output, options)


def check_options(options: BlockwiseOptions) -> None:
    """Refuse, before any work, options no run can use: negative retries, or a device that the local cluster (or
    this process, for one image) does not have; a scheduler's workers are not checked from here."""
    if options.retries < 0:
        raise PredictInputError(
            f"retries must be 0 or more, got {options.retries}",
            fix=Fix("give how many times a failing task is run again", (("retries", "0"),)),
        )
    if options.client is None and options.scheduler is None:
        check_device(options.device)


def _label_chunked(
    loaded, model: str, input: Path, output: Path | None, options: BlockwiseOptions
) -> Summary:
    """An array (zarr, OME-Zarr, TIFF, slide) -> a zarr array or OME-Zarr label image, block by block."""
    source, level = open_chunked(input, loaded, options)
    target = None
    if options.labels_into is not None:
        target = labels_target(input, options.labels_into, source, level)
    elif is_ome_zarr(output):
        target = standalone_target(output, source)
    with connect(options) as (client, threads):
        return label_array(client, threads, loaded, model, source, output, options, target)


def _label_files(loaded, model: str, input: Path, output: Path, options: BlockwiseOptions) -> Summary:
    """An image file -> a label file; a directory or glob of images -> a directory of label files."""
    check_image_files(input, output, len(loaded.patch_size), options)
    if is_image_set(input):
        with input_errors():
            images = image_files(input)
        plan = plan_image_set(model, images, output, options)
        with connect(options) as (client, threads):
            return label_image_set(client, threads, model, plan, options)
    with input_errors():
        return label_one_image(loaded, input, output, options)
