"""``densecnn bench``: the benchmark suite (JSON + Markdown + PNG plots)."""

from __future__ import annotations

from pathlib import Path

from ..bench import ITEMS
from ..errors import InvalidInputError


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "bench", help="benchmark densecnn against patch-by-patch, fast scanning and native dilated conversion"
    )
    parser.add_argument(
        "--out",
        default="bench-results",
        help="output folder (default: bench-results in the current folder; make bench writes docs/benchmarks)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="tiny sizes, seconds in all: checks the pipeline, not the speed"
    )
    parser.add_argument(
        "--only",
        type=lambda text: text.split(","),
        default=None,
        metavar="ITEM[,ITEM...]",
        help=f"run these items only ({', '.join(ITEMS)})",
    )
    parser.set_defaults(run=run)


def run(args) -> int:
    from ..atomic import unwritable_folder
    from ..bench import run as run_benchmarks

    out = Path(args.out)
    problem = None
    if out.exists() and not out.is_dir():
        problem = f"{out} is not a folder"
    else:
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            problem = f"cannot create the folder {out}: {exc.strerror or exc}"
    problem = problem or unwritable_folder(out)
    if problem is not None:  # found before the benchmark runs, not after it
        raise InvalidInputError(f"--out {args.out}: {problem}; give a folder you can write to")
    try:
        run_benchmarks(out, quick=args.quick, only=args.only)
    except OSError as exc:
        raise InvalidInputError(
            f"could not write the results into {out}: {exc.strerror or exc}; the previous results there are left as "
            "they were: free space there or give another --out"
        ) from None
    return 0
