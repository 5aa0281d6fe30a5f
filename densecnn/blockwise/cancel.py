"""Stopping a run between blocks (:attr:`BlockwiseOptions.cancel <densecnn.blockwise.BlockwiseOptions>`): once the
caller's event is set, no task starts, the driver raises :class:`~densecnn.errors.Cancelled` at the next task that
ends (or is cancelled), and a task in flight writes no further chunk: before each chunk it checks a cluster-wide
``distributed.Event`` that the driver sets. What was written stays complete, so the run resumes from it.
"""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Callable, Iterator

POLL_SECONDS = 0.1  # how often the driver's watcher looks at the caller's event


def stop_name() -> str:
    """A fresh name for a run's cluster-wide stop event."""
    return f"densecnn-stop-{uuid.uuid4().hex}"


def stopped(name: str | None) -> bool:
    """In a task: whether the run whose stop event is ``name`` was cancelled (None: it cannot be)."""
    if name is None:
        return False
    from distributed import Event

    return Event(name).is_set()


@contextlib.contextmanager
def watching(
    client, cancel: threading.Event | None, name: str, in_flight: Callable[[], list]
) -> Iterator[None]:
    """While the block runs: once ``cancel`` is set, set the cluster-wide event ``name`` and cancel the futures
    ``in_flight()`` returns (so the driver's wait for the next task ends at once)."""
    if cancel is None:
        yield
        return
    from distributed import Event

    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            if cancel.wait(POLL_SECONDS):
                Event(name, client=client).set()
                client.cancel(in_flight())
                return

    watcher = threading.Thread(target=watch, name="densecnn-cancel-watcher", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join()
