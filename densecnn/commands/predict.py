"""``densecnn predict MODEL INPUT OUTPUT``: label an image, a set of images, or a chunked array, on Dask."""

from __future__ import annotations

import argparse
import dataclasses
import typing
from pathlib import Path

from ..command_interrupts import INTERRUPTED
from ..errors import DenseCNNError, cli_option

EPILOG = """\
inputs and outputs:
  IMAGE.png|.jpg|.tif     -> OUTPUT.png (palette: pixel values are class ids), .tif or .npy
  DIR or 'GLOB'           -> OUTPUT directory of label maps with the same names (.png for JPEG/BMP)
  ARRAY.zarr, OME-Zarr group (the level at the model's pixel size, or --level N), (Big)TIFF or whole slide (.svs, .ndpi, .scn, .bif) read lazily;
  (D, H, W) volumes for 3-D models
                          -> OUTPUT.zarr: labels (uint8; uint16 past 255 classes), chunked like the input
                          -> OUTPUT.ome.zarr: a multiscale OME-Zarr label image (colours, class names)
  IMAGE.ome.zarr --labels-into NAME
                          -> IMAGE.ome.zarr/labels/NAME: the labels inside the image, as viewers expect

examples:
  densecnn predict models/nuclei cells.png cells-labels.png
  densecnn predict models/nuclei fields/ fields-labels/ --workers 2
  densecnn predict models/nuclei slide.ome.zarr --labels-into nuclei --probabilities probs.ome.zarr
  densecnn predict models/nuclei slide.tif labels.zarr --scheduler tcp://scheduler:8786 --chunk 2048
  densecnn predict models/he tissue.svs tissue-labels.ome.zarr --foreground auto

A re-run with the same arguments skips chunks and images already written by the same model and options from
the input as it is now, and refuses any others (--overwrite starts over). A file already at a single-file output
(a label map, --geojson) is replaced only with --overwrite. No output may be an input, hold one, or share a path
with another output.
"""


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "predict",
        help="label images, image sets, and chunked arrays too large for memory (locally or on a Dask cluster)",
        description="Label an image file, a set of images, or a chunked array too large for memory, locally or on "
        "a Dask cluster; the result equals one pass of the dense net over the whole image.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("model", help="model directory (model.json + weights.safetensors)")
    parser.add_argument(
        "input",
        help="image file, directory or glob of images, zarr array / OME-Zarr group, TIFF, whole-slide image",
    )
    parser.add_argument(
        "output",
        nargs="?",
        help="label file, output directory, .zarr array or .ome.zarr label image (none with --labels-into)",
    )
    add_options(parser)
    parser.add_argument(
        "--geojson",
        metavar="FILE",
        help="also write the labels' regions as GeoJSON polygons, one feature per connected region with its class "
        "name and colour (QuPath: File > Import objects); for one 2-D label map (the geojson extra)",
    )
    parser.set_defaults(run=run)


def add_options(parser: argparse.ArgumentParser) -> None:
    """One option per :class:`~densecnn.blockwise.BlockwiseOptions` field with a command-line form, generated
    from the field: its flag, type, default and help are declared there once."""
    from ..blockwise import BlockwiseOptions

    hints = typing.get_type_hints(BlockwiseOptions)
    for spec in _cli_fields():
        meta, default = spec.metadata, spec.default
        kwargs = {"help": meta["help"], "default": default, "dest": spec.name}
        if hints[spec.name] is bool:
            kwargs["action"] = "store_true" if default is False else argparse.BooleanOptionalAction
        else:
            kinds = [
                t for t in typing.get_args(hints[spec.name]) or (hints[spec.name],) if t is not type(None)
            ]
            kwargs |= {"type": _argument_type(meta["parse"] or kinds[0]), "metavar": meta["metavar"]}
        parser.add_argument(meta["flag"] or cli_option(spec.name, ""), **kwargs)


def _cli_fields() -> list[dataclasses.Field]:
    from ..blockwise import BlockwiseOptions

    return [spec for spec in dataclasses.fields(BlockwiseOptions) if spec.metadata]


def _argument_type(parse):
    """``parse`` for argparse: an error becomes argparse's message, naming options as the command line does."""

    def argument(text: str):
        try:
            return parse(text)
        except DenseCNNError as exc:
            raise argparse.ArgumentTypeError(exc.render(cli_option)) from None

    argument.__name__ = getattr(parse, "__name__", "value")
    return argument


def run(args) -> int:
    import sys

    quiet_dask_logs()

    from ..blockwise import BlockwiseOptions, predict_to_disk
    from ..blockwise.destinations import check_destinations
    from ..errors import BlockFailedError

    options = BlockwiseOptions(**{spec.name: getattr(args, spec.name) for spec in _cli_fields()})
    if args.geojson is not None:
        check_geojson(args.model, Path(args.input), args.output, Path(args.geojson))
    check_destinations(args.model, args.input, args.output, options, geojson=args.geojson)
    try:
        summary = predict_to_disk(args.model, args.input, args.output, options)
    except BlockFailedError as exc:
        print(f"densecnn predict: error: {exc.render(cli_option)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(
            "densecnn predict: interrupted; what was written is kept: run the same command again to resume",
            file=sys.stderr,
        )
        return INTERRUPTED
    for what, note in summary.warnings:
        print(f"densecnn predict: warning: {what}: {note}", file=sys.stderr)
    if args.geojson and not summary.failures:
        write_regions(args.model, Path(args.output), Path(args.geojson))
    print(summary.render(cli_option))
    return 1 if summary.failures else 0


def quiet_dask_logs() -> None:
    """A failing task is reported once, in the summary or the error; not also as Dask's log of every attempt
    ("Compute Failed", logged as an error, with its traceback), from this process and from each worker process
    (which reads the environment when it starts)."""
    import contextlib
    import logging
    import os

    if "DASK_LOGGING__DISTRIBUTED" in os.environ:
        return  # the user's own choice
    os.environ["DASK_LOGGING__DISTRIBUTED"] = "critical"
    with contextlib.suppress(ImportError):  # it sets its loggers' levels when first imported
        import distributed  # noqa: F401
    # tornado's log holds the errors of distributed's callbacks cut short by Ctrl-C
    for name in ("distributed", "tornado.application"):
        logging.getLogger(name).setLevel(logging.CRITICAL)


def check_geojson(model: str, input: Path, output: str | None, geojson: Path) -> None:
    """Refuse, before any work, a ``--geojson`` that cannot be written: no OUTPUT, an image set (GeoJSON holds
    one label map), a model that is not 2-D (GeoJSON holds 2-D polygons), a folder (it takes a file path), or a
    path whose folder is missing or read-only."""
    import os

    from ..blockwise.destinations import is_set_of_images
    from ..errors import PredictInputError
    from ..modelfile import load

    if output is None:
        raise PredictInputError("--geojson writes the regions of OUTPUT: give an OUTPUT")
    if is_set_of_images(input):
        raise PredictInputError(
            f"--geojson writes the regions of one label map, and {input} is a set of images; give one image or "
            "array as INPUT, or leave out --geojson"
        )
    dims = len(load(model).patch_size)
    if dims != 2:
        raise PredictInputError(
            f"--geojson writes 2-D polygons, and the model labels {dims}-D inputs; leave out --geojson"
        )
    if geojson.is_dir():
        raise PredictInputError(
            f"--geojson {geojson} is a folder, and --geojson takes a file path; give one such as "
            f"{geojson / 'regions.geojson'}"
        )
    folder = geojson.parent
    if not folder.is_dir():
        raise PredictInputError(
            f"--geojson {geojson}: its folder {folder} does not exist; create it or choose another path"
        )
    if not os.access(folder, os.W_OK):
        raise PredictInputError(
            f"--geojson {geojson}: its folder {folder} is not writable; choose another path"
        )


def write_regions(model: str, output: Path, geojson: Path) -> None:
    """Write the regions of the label map ``output`` to ``geojson``, one feature per connected region of a class
    (background and no-data have none)."""
    from ..blockwise.sinks import storage_problem
    from ..errors import PredictInputError
    from ..io.geojson import read_label_map, write_geojson
    from ..io.labels import no_data_value
    from ..modelfile import read_classes

    classes = read_classes(model)
    no_regions = (0, no_data_value(classes.num_classes))  # background and no-data
    try:
        write_geojson(geojson, read_label_map(output), list(zip(classes.class_names, classes.palette)),
                      skip=no_regions)  # fmt: skip
    except OSError as exc:
        raise PredictInputError(f"--geojson {geojson}: {storage_problem(exc)}") from None
