"""``densecnn bench``: the benchmark suite (JSON + Markdown + PNG plots)."""

from __future__ import annotations

from pathlib import Path

from ..bench import ITEMS


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
    from ..bench import run as run_benchmarks

    run_benchmarks(Path(args.out), quick=args.quick, only=args.only)
    return 0
