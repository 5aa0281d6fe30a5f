"""``densecnn predict MODEL INPUT OUTPUT``: label an image, a set of images, or a chunked array, on Dask."""

from __future__ import annotations

import argparse

EPILOG = """\
inputs and outputs:
  IMAGE.png|.jpg|.tif     -> OUTPUT.png (palette: pixel values are class ids), .tif or .npy
  DIR or 'GLOB'           -> OUTPUT directory of label maps with the same names (.png for JPEG/BMP)
  ARRAY.zarr, OME-Zarr group (level 0), (Big)TIFF or whole slide (.svs, .ndpi, .scn, .bif) read lazily;
  (D, H, W) volumes for 3-D models
                          -> OUTPUT.zarr: labels (uint8; uint16 past 256 classes), chunked like the input
                          -> OUTPUT.ome.zarr: a multiscale OME-Zarr label image (colours, class names)
  IMAGE.ome.zarr --labels-into NAME
                          -> IMAGE.ome.zarr/labels/NAME: the labels inside the image, as viewers expect

examples:
  densecnn predict models/nuclei cells.png cells-labels.png
  densecnn predict models/nuclei fields/ fields-labels/ --workers 2
  densecnn predict models/nuclei slide.ome.zarr --labels-into nuclei --probabilities probs.ome.zarr
  densecnn predict models/nuclei slide.tif labels.zarr --scheduler tcp://scheduler:8786 --chunk 2048
  densecnn predict models/he tissue.svs tissue-labels.ome.zarr --foreground auto

A re-run with the same arguments skips chunks and images already written (--overwrite starts over).
"""


def _chunk(text: str) -> int | tuple[int, ...]:
    try:
        sizes = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected N, H,W or D,H,W, got {text!r}") from None
    return sizes[0] if len(sizes) == 1 else sizes


def _bytes(text: str) -> int:
    units = {"k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
    text = text.strip().lower().removesuffix("ib").removesuffix("b")
    try:
        return int(float(text[:-1]) * units[text[-1]]) if text and text[-1] in units else int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected bytes such as 2000000000 or 2GiB, got {text!r}") from None


def _intensity(text: str):
    from ..errors import IntensityError, cli_option
    from ..io import Intensity

    try:
        return Intensity.parse(text)
    except IntensityError as exc:
        raise argparse.ArgumentTypeError(exc.render(cli_option)) from None


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
    parser.add_argument(
        "--level",
        type=int,
        help="the OME-Zarr input's resolution level (default: the one at the model's pixel size, else 0)",
    )
    parser.add_argument(
        "--labels-into",
        metavar="NAME",
        help="write the labels into the input OME-Zarr image's labels/NAME group (a multiscale label image)",
    )
    parser.add_argument(
        "--probabilities",
        metavar="PATH.zarr",
        help="also write (K, H, W) or (K, D, H, W) float16 probabilities (a multiscale image if PATH ends .ome.zarr)",
    )
    parser.add_argument(
        "--scheduler", metavar="ADDRESS", help="a running Dask scheduler, e.g. tcp://host:8786"
    )
    parser.add_argument(
        "--workers", type=int, default=1, help="local worker processes (default 1, all cores)"
    )
    parser.add_argument(
        "--chunk", type=_chunk, help="output chunk N, H,W or D,H,W (default: the input's chunks)"
    )
    parser.add_argument(
        "--block", type=_chunk, default=1024, help="pixels per side one task computes (default 1024)"
    )
    parser.add_argument(
        "--max-memory", type=_bytes, help="bytes per task, e.g. 2GiB (default: from the workers)"
    )
    parser.add_argument("--model-device", default="cpu", help="torch device the workers run the model on")
    parser.add_argument(
        "--channel-axis", type=int, help="the input array's channel axis when it is not first"
    )
    parser.add_argument(
        "--foreground",
        metavar="auto|bright|dark|MASK",
        help="label output chunks holding no foreground as background (class 0) without computing them: auto "
        "(Otsu's threshold; dark foreground for RGB, bright otherwise), bright, dark, or a mask image/array "
        "(nonzero = foreground, any resolution); zarr outputs only",
    )
    parser.add_argument(
        "--intensity",
        type=_intensity,
        metavar="MODE",
        help="how input values are scaled to [0, 1], overriding the model's declaration: dtype (integers by their "
        "dtype's range, floats as they are), range:LOW,HIGH or percentiles:LOW,HIGH (e.g. percentiles:1,99.8)",
    )
    parser.add_argument("--retries", type=int, default=2, help="resubmissions of a failing task (default 2)")
    parser.add_argument("--overwrite", action="store_true", help="start over instead of resuming")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.set_defaults(run=run)


def run(args) -> int:
    import os
    import sys

    # a failing task is reported once, in the summary or the error; not also as Dask's log of every attempt, with
    # tracebacks, from each worker process (which reads this when it starts)
    os.environ.setdefault("DASK_LOGGING__DISTRIBUTED", "error")

    from ..blockwise import BlockwiseOptions, label
    from ..errors import BlockFailedError, cli_option

    options = BlockwiseOptions(
        probabilities=args.probabilities,
        labels_into=args.labels_into,
        level=args.level,
        scheduler=args.scheduler,
        workers=args.workers,
        chunk=args.chunk,
        block=args.block,
        max_memory=args.max_memory,
        device=args.model_device,
        channel_axis=args.channel_axis,
        foreground=args.foreground,
        intensity=args.intensity,
        resume=not args.overwrite,
        retries=args.retries,
        progress=not args.no_progress,
    )
    try:
        summary = label(args.model, args.input, args.output, options)
    except BlockFailedError as exc:
        print(f"densecnn predict: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(
            "densecnn predict: interrupted; what was written is kept: run the same command again to resume",
            file=sys.stderr,
        )
        return 130
    for what, note in summary.warnings:
        print(f"densecnn predict: warning: {what}: {note}", file=sys.stderr)
    print(summary.render(cli_option))
    return 1 if summary.failures else 0
