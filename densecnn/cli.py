"""The ``densecnn`` command: one subcommand per module, each providing ``add_parser(subparsers)``."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import os
import sys
import warnings

from .command_interrupts import INTERRUPTED

# subcommand modules, in the order `densecnn --help` lists them
COMMANDS = [
    "densecnn.commands.info",
    "densecnn.commands.train",
    "densecnn.commands.tune",
    "densecnn.commands.calibrate",
    "densecnn.commands.predict",
    "densecnn.commands.bench",
    "densecnn.commands.serve",
    "densecnn.commands.keys",
    "densecnn.commands.export_onnx",
    "densecnn.commands.export_bioimageio",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="densecnn", description="Exact whole-image CNN pixel classification."
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in COMMANDS:
        importlib.import_module(module).add_parser(subparsers)
    return parser


# the exit status of a command whose output's reader went away (``densecnn info MODEL | head -1``): 128 + SIGPIPE,
# as shells report cat, grep or git ended by it
CLOSED_PIPE = 141


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` and run the chosen subcommand; errors a user can fix print one line, not a traceback, and so
    does Ctrl-C where the subcommand does not say more itself (exit status :data:`INTERRUPTED`). Output to a pipe
    whose reader closed it ends the command quietly (exit status :data:`CLOSED_PIPE`)."""
    try:
        try:
            return _parse_and_run(argv)
        finally:
            # a reader gone is found here, not at exit, where Python would report it with a traceback
            sys.stdout.flush()
    except KeyboardInterrupt:
        print("densecnn: interrupted", file=sys.stderr)
        return INTERRUPTED
    except BrokenPipeError:
        _discard_stdout()
        return CLOSED_PIPE


def _discard_stdout() -> None:
    """Point standard output at the null device, so that what is still buffered for the closed pipe is dropped
    when Python flushes it at exit (Python's own advice for SIGPIPE)."""
    try:
        descriptor = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        # not a file (a test's capture): nothing of it is flushed to the pipe
        return
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, descriptor)
    os.close(null)


def _parse_and_run(argv: list[str] | None) -> int:
    from .errors import DenseCNNError, InvalidInputError, cli_option, render
    from .ops.config import get_config

    try:
        get_config()  # an invalid DENSECNN_* setting is said first, in one line, whatever the command (--help too)
    except InvalidInputError as exc:
        print(f"densecnn: error: {exc}", file=sys.stderr)
        return 2
    # a corrupt TIFF is reported once, as densecnn's own error naming the file, not also as tifffile's log line
    logging.getLogger("tifffile").setLevel(logging.ERROR)
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:
        # named by the subcommand they were given to, with its usage (argparse would name the top level's)
        _chosen(parser, args).error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        with _warnings_as_lines(f"densecnn {args.command}"):
            return args.run(args) or 0
    except (DenseCNNError, FileNotFoundError) as exc:
        print(f"densecnn {args.command}: error: {render(exc, cli_option)}", file=sys.stderr)
        return 2


@contextlib.contextmanager
def _warnings_as_lines(prefix: str):
    """densecnn's own warnings said as one line each on stderr, ``densecnn predict: warning: ...``, once per
    message (a model loaded twice warns once); others as Python shows them."""
    show_python_warning, said = warnings.showwarning, set()

    def show(message, category, filename, lineno, file=None, line=None):
        if not category.__module__.startswith("densecnn."):
            show_python_warning(message, category, filename, lineno, file, line)
        elif str(message) not in said:
            said.add(str(message))
            print(f"{prefix}: warning: {message}", file=sys.stderr)

    warnings.showwarning = show
    try:
        yield
    finally:
        warnings.showwarning = show_python_warning


def _chosen(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The (sub)parser of the command ``args`` chose: ``densecnn keys add``'s, not ``densecnn``'s."""
    while True:
        found = [action for action in parser._actions if isinstance(action, argparse._SubParsersAction)]
        name = getattr(args, found[0].dest, None) if found else None
        if name not in (found[0].choices if found else {}):
            return parser
        parser = found[0].choices[name]


if __name__ == "__main__":
    sys.exit(main())
