"""``densecnn export-bioimageio MODEL_DIR OUT.zip --image IMAGE``: the model as a bioimage.io model package."""

from __future__ import annotations

import sys
import warnings


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "export-bioimageio",
        help="export a model as a bioimage.io model package (TorchScript + ONNX, preprocessing, halo, tests)",
        description="Write MODEL as a bioimage.io model package (spec 0.5, a .zip): the dense net as TorchScript "
        "and ONNX, the model's intensity scaling and normalisation as preprocessing, the receptive field as the "
        "output's halo, IMAGE and its dense scores as test tensors, a cover and a README. Opens in bioimageio.core, "
        "deepImageJ and ilastik (docs/bioimageio.md). Needs: pip install 'densecnn[bioimageio]'.",
    )
    parser.add_argument("model", help="model directory (model.json + weights.safetensors)")
    parser.add_argument("out", help="the .zip package to write")
    parser.add_argument(
        "--image",
        required=True,
        help="the test image: an image file, a TIFF stack or a .npy array (channel first), raw as the model reads "
        "it; its dtype becomes the package's input dtype (float32, its values as floats, where that dtype cannot hold "
        "a zero-padded model's padding)",
    )
    parser.add_argument("--name", help="the package's name (default: the model directory's name)")
    parser.add_argument("--description", help="one line on what the model does")
    parser.add_argument(
        "--author",
        action="append",
        dest="authors",
        metavar="NAME",
        help="an author (repeat for several; default: model.json's extra.authors, else 'densecnn contributors')",
    )
    parser.add_argument(
        "--maintainer",
        action="append",
        dest="maintainers",
        metavar="GITHUB_USER",
        help="a maintainer's GitHub user name (repeat for several; bioimage.io wants one to accept an upload)",
    )
    parser.add_argument("--license", default="MIT", help="the weights' licence, an SPDX id (default: MIT)")
    parser.set_defaults(run=run)


def run(args) -> int:
    from ..bioimageio_export import export_bioimageio
    from ..errors import BioimageioExportWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", BioimageioExportWarning)
        path = export_bioimageio(
            args.model,
            args.out,
            image=args.image,
            name=args.name,
            description=args.description,
            authors=args.authors,
            maintainers=args.maintainers,
            license=args.license,
        )
    from bioimageio.spec import load_description  # installed: the export needs it too

    summary = load_description(path).validation_summary  # the spec's own validator, on the written package
    print(f"wrote {path}; bioimage.io validation: {summary.status}")
    for warning in summary.warnings:
        where = ".".join(map(str, warning.loc))
        print(f"  warning: {where + ': ' if where else ''}{warning.msg}")
    for caught_warning in caught:  # where consumers' scores differ from densecnn's: said once, on stderr
        if issubclass(caught_warning.category, BioimageioExportWarning):
            print(f"densecnn export-bioimageio: warning: {caught_warning.message}", file=sys.stderr)
        else:  # anything else as Python shows it
            warnings.showwarning(
                caught_warning.message,
                caught_warning.category,
                caught_warning.filename,
                caught_warning.lineno,
            )
    return 0
