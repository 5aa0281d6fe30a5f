"""Ctrl-C while a model directory is written: held until it is written, then raised.

A run stopped by Ctrl-C writes its model directory on the way out (:mod:`densecnn.train.from_strokes`,
:mod:`densecnn.train.loop`). A second Ctrl-C, or one that lands just as the run ends, must not cut that write short:
:func:`interrupts_deferred` holds SIGINT while the block runs and raises :class:`KeyboardInterrupt` after it, so the
directory is whole and the run still stops.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator


@contextlib.contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Run the block with SIGINT held; a SIGINT that arrived meanwhile raises KeyboardInterrupt when it is done.

    Outside the main thread (where Python delivers signals) the block runs as it is.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    try:
        previous = signal.signal(signal.SIGINT, lambda signum, frame: received.append(signum))
    except ValueError:  # no signals here (an embedded interpreter)
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous if previous is not None else signal.default_int_handler)
    if received:
        raise KeyboardInterrupt


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C during a run, with how far it got: ``steps`` taken and ``model_dir`` if it was written (None)."""

    def __init__(self, steps: int, model_dir=None):
        super().__init__(steps, model_dir)
        self.steps, self.model_dir = steps, model_dir

    def message(self) -> str:
        """What ``densecnn train`` says: the steps taken and where the model is."""
        if self.model_dir is None:
            return f"interrupted after {self.steps} step(s); no model written"
        if self.steps == 0:
            return f"interrupted before the first step; {self.model_dir} holds the untrained model"
        return f"interrupted after {self.steps} step(s); the model so far is in {self.model_dir}"
