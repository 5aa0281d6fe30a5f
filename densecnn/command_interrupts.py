"""Ctrl-C in the ``densecnn`` command: its exit status (and a run's stopped by SIGTERM), and one line instead of a
traceback while it starts.

Kept apart from :mod:`densecnn.cli` (which ``python -m densecnn.cli`` runs as ``__main__``): the package's own
imports run under :func:`quiet_interrupt_while_starting`.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

# the exit status of a command stopped by Ctrl-C: 128 + SIGINT, as shells report it
INTERRUPTED = 130
# the exit status of a run stopped by SIGTERM (kill, docker stop, a scheduler's preemption): 128 + SIGTERM
TERMINATED = 143


@contextlib.contextmanager
def quiet_interrupt_while_starting() -> Iterator[None]:
    """Run the block (densecnn's own imports: torch, seconds) so that Ctrl-C during it ends the ``densecnn`` command
    as its other interrupts do, with one line and exit status :data:`INTERRUPTED`, not a traceback. Only in the
    command's own process (its console script); a program importing densecnn gets its KeyboardInterrupt."""
    try:
        yield
    except KeyboardInterrupt:
        # the console script's name, as it reads it itself
        if Path(getattr(sys, "argv", [""])[0]).name.removesuffix(".exe") != "densecnn":
            raise
        print("densecnn: interrupted while starting", file=sys.stderr)
        raise SystemExit(INTERRUPTED) from None
