"""Running a run's tasks on the cluster (:func:`run_tasks`): a window of them in flight, distributed's own retries
for a task that fails, each failure described by the caller, cancel, progress, and the counts of the summary.

A failing task is run again by the scheduler itself (``client.submit(..., retries=n)``), and the summary's retries
and re-runs are read from the scheduler's task states when the run ends: ``TaskState.retries`` counts the retries
left, ``TaskState.suspicious`` the runs lost with their worker (Dask runs those again by itself, without retries).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import time
from collections.abc import Callable, Iterator
from typing import Any

from ..errors import Cancelled, DenseCNNError, ImageReadError
from ..io import LazyArray
from .cancel import watching
from .cluster import task_slots
from .options import BlockwiseOptions
from .sinks import STORAGE_ERRORS
from .summary import Summary
from .worker import TaskResult

# the modules whose errors, raised while an input window is read, are of the stored bytes themselves
_DECODERS = ("zarr.codecs", "numcodecs", "imagecodecs", "tifffile")
SETTLE_SECONDS = 5  # for the reads a failed read left running to end
Describe = Callable[[tuple, BaseException, int], DenseCNNError]  # (item, error, attempts) -> the run's error


def run_tasks(
    client, task: Callable, job, items: list[tuple], start: Summary, options: BlockwiseOptions, *, stop: str,
    describe: Describe, keep_going: bool = False,
) -> Summary:  # fmt: skip
    """Run ``task(job, *item)`` for every item, a window of them in flight, each retried ``options.retries``
    times; the summary ``start`` with the tasks' outputs, retries and time added.

    A task that keeps failing stops the run with ``describe(item, error, attempts)``; with ``keep_going`` it is
    listed in the summary's failures and the others go on, unless its output cannot be written (every other task
    would fail alike). ``options.on_progress`` is called with the summary so far at the start and after each
    task (its exception stops the run). Once ``options.cancel`` is set, no task starts, the tasks in flight are
    cancelled and told to stop through the cluster-wide event ``stop`` (:mod:`.cancel`), and
    :class:`~densecnn.errors.Cancelled` is raised.
    """
    from tqdm.auto import tqdm

    started = time.perf_counter()
    summary = dataclasses.replace(start, failures=[*start.failures], warnings=[*start.warnings])
    window = _Window(client, task, job, items, options.retries)
    bar = tqdm(total=len(items), desc="densecnn predict", unit=summary.what[:-1],
               disable=None if options.progress else True)  # fmt: skip
    with watching(client, options.cancel, stop, window.in_flight), contextlib.closing(bar):
        try:
            _report(options.on_progress, summary)
            for future, item in window.completed():
                if options.cancel is not None and options.cancel.is_set():
                    raise Cancelled(
                        "the run was cancelled; what was written is kept, and the same run resumes it"
                    )
                summary.add(_result(future, item, options.retries, describe, keep_going))
                bar.update()
                _report(options.on_progress, summary)
        finally:
            client.cancel(window.in_flight())
            summary.seconds = time.perf_counter() - started
            summary.retries, summary.reruns = _retries_and_reruns(client, window.finished, options.retries)
            summary.skipped = summary.total - summary.computed - len(summary.failures)
    return summary


@dataclasses.dataclass(frozen=True)
class Unretryable:
    """What a task returns in place of an error that running it again cannot fix: its output cannot be written
    (a full disk, no permission), its pixels hold NaN under the refuse policy, densecnn refused its input (its own
    error: a device the worker lacks, a store key refused), or the input's stored data cannot be decoded (a damaged
    chunk reads the same every time).

    distributed retries every exception a task raises, so such an error is handed back as a value; the driver then
    fails at its first attempt instead of after ``retries`` more.
    """

    error: BaseException


def attempt(task: Callable, job, *item) -> Any:
    """In a Dask task: ``task(job, *item)``, an error that retrying cannot fix returned as :class:`Unretryable`."""
    try:
        return task(job, *item)
    except OSError as exc:
        if exc.errno not in STORAGE_ERRORS:
            raise  # a transient read error: distributed retries it
        return Unretryable(exc)
    except DenseCNNError as exc:
        return Unretryable(exc)
    except Exception as exc:
        array = _array_decoding(exc)
        if array is None:
            raise  # distributed retries it
        _settle_reads()
        return Unretryable(
            ImageReadError(
                f"{array.path}: a chunk of it that this block reads cannot be decoded ({_first_line(exc)}); "
                "the input is damaged: check it was written completely, or write it again"
            )
        )


def _array_decoding(exc: BaseException) -> LazyArray | None:
    """The input array whose :meth:`~densecnn.io.LazyArray.read` raised ``exc`` in a decoder (zarr's codecs,
    numcodecs, imagecodecs, tifffile), or None: an error of the stored bytes themselves, not of reading them."""
    if isinstance(exc, MemoryError):
        return None
    array, decoding = None, False
    tb = exc.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        if frame.f_code is LazyArray.read.__code__:
            array = frame.f_locals.get("self")
        elif array is not None:
            decoding = decoding or str(frame.f_globals.get("__name__", "")).startswith(_DECODERS)
        tb = tb.tb_next
    return array if decoding else None


def _settle_reads() -> None:
    """Wait (a few seconds at most) for the reads still running on zarr's event loop: a read that failed leaves
    the other chunks of its window being read, and those left pending when the process ends are each printed
    with a traceback ("Task was destroyed but it is pending!")."""
    import asyncio

    from zarr.core import sync

    async def others() -> None:
        current = asyncio.current_task()
        await asyncio.gather(*(t for t in asyncio.all_tasks() if t is not current), return_exceptions=True)

    loop = sync.loop[0]
    if loop is not None and loop.is_running():
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(others(), loop).result(timeout=SETTLE_SECONDS)


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def is_storage_error(exc: BaseException) -> bool:
    """Whether ``exc`` says an output cannot be written (:data:`~densecnn.blockwise.sinks.STORAGE_ERRORS`)."""
    return isinstance(exc, OSError) and exc.errno in STORAGE_ERRORS


def _result(future, item: tuple, retries: int, describe: Describe, keep_going: bool) -> TaskResult:
    """The finished task's result; or, for a failure, its description raised, or listed with ``keep_going``."""
    if future.status == "error":
        exc, attempts = future.exception(), retries + 1
    else:
        outcome = future.result()
        if not isinstance(outcome, Unretryable):
            return outcome
        exc, attempts = outcome.error, 1
    error = describe(item, exc, attempts)
    if not keep_going or is_storage_error(exc):
        raise error
    return TaskResult(item[0], 0, 0, 0.0, error)


def _report(on_progress: Callable[[Summary], None] | None, summary: Summary) -> None:
    if on_progress is not None:
        on_progress(summary)


class _Window:
    """The tasks in flight: a few per worker thread, the next item submitted as the caller takes one that ended.

    Not all at once: a slide has tens of thousands of blocks, and a window keeps the scheduler's tasks and this
    process's futures few, and a cancel leaves only the window to stop. The ended tasks' futures are kept to the
    end of the run, so that the scheduler still knows their retries.
    """

    def __init__(self, client, task: Callable, job, items: list[tuple], retries: int):
        from distributed import as_completed

        self._submit = functools.partial(client.submit, attempt, task, job, pure=False, retries=retries)
        self._pending = iter(items)
        self._items: dict[object, tuple] = {}  # future -> item, of the tasks in flight
        self.finished: list = []
        first = itertools.islice(self._pending, 2 * task_slots(client) + 2)
        self._queue = as_completed([self._start(item) for item in first], with_results=False)

    def _start(self, item: tuple):
        future = self._submit(*item)
        self._items[future] = item
        return future

    def in_flight(self) -> list:
        return list(self._items)

    def completed(self) -> Iterator[tuple[object, tuple]]:
        """Each task as it ends (or is cancelled), with its item."""
        for future in self._queue:
            item = self._items.pop(future)
            self.finished.append(future)
            yield future, item
            following = next(self._pending, None)
            if following is not None:
                self._queue.add(self._start(following))


def _retries_and_reruns(client, futures: list, allowed: int) -> tuple[int, int]:
    """How many times the tasks of ``futures`` were retried after an error, and run again after their worker was
    lost; (0, 0) from a scheduler that runs no functions sent to it."""
    with contextlib.suppress(Exception):
        return client.run_on_scheduler(_count_on_scheduler, keys=[f.key for f in futures], allowed=allowed)
    return 0, 0


def _count_on_scheduler(dask_scheduler, keys: list, allowed: int) -> tuple[int, int]:
    """Runs on the scheduler: the retries the tasks ``keys`` used of the ``allowed`` each, and their re-runs."""
    tasks = [dask_scheduler.tasks[key] for key in keys if key in dask_scheduler.tasks]
    return sum(allowed - ts.retries for ts in tasks), sum(ts.suspicious for ts in tasks)
