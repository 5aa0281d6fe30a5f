"""Where a run's tasks go: the caller's Dask client, a scheduler's cluster, or a local cluster started for the run;
and how much memory one task may use there.

Without a scheduler address a local cluster is started in this process (one worker thread; torch's own threads use
the cores) or, with ``workers > 1``, as that many worker processes sharing the cores out. It listens on loopback
only.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator

from ..errors import PredictInputError
from .options import BlockwiseOptions

WORKER_BASELINE = 512 * 2**20  # a worker process with torch, Dask and a model loaded, before any task
CONNECT_SECONDS = 10  # to reach a scheduler (Dask's own default waits 30 s, then prints a long traceback)
TASK_SHARE = 0.5  # of what is left under a worker slot's memory limit, given to a task; the rest is headroom


@contextlib.contextmanager
def connect(options: BlockwiseOptions) -> Iterator[tuple[object, int | None]]:
    """The caller's distributed Client, or one for the scheduler, or for a local cluster; and the torch threads per
    task to set (None: the workers keep their own thread settings).

    >>> with connect(BlockwiseOptions(workers=2)) as (client, threads):
    ...     print(worker_count(client))
    2
    """
    if options.client is not None:
        yield options.client, None  # the caller's: left open
    elif options.scheduler is not None:
        with _scheduler_client(options.scheduler) as client:
            yield client, None
    else:
        with _local_client(options.workers) as (client, threads):
            yield client, threads


@contextlib.contextmanager
def _scheduler_client(scheduler: str) -> Iterator[object]:
    from distributed import Client

    try:
        client = Client(scheduler, timeout=CONNECT_SECONDS)
    except (OSError, TimeoutError) as exc:
        raise PredictInputError(
            f"cannot reach the Dask scheduler at {scheduler} within {CONNECT_SECONDS} s ({exc}); check the "
            "address and that the scheduler runs, or give no scheduler to run on this machine"
        ) from None
    with client:
        if "dashboard" in client.scheduler_info().get("services", {}):
            print(f"densecnn predict: Dask dashboard at {client.dashboard_link}", file=sys.stderr)
        yield client


@contextlib.contextmanager
def _local_client(workers: int) -> Iterator[tuple[object, int | None]]:
    from distributed import Client, LocalCluster

    if workers < 1:
        raise PredictInputError(f"workers must be at least 1, got {workers}")
    # Dask's scheduler and workers always serve HTTP (health, metrics; the dashboard when bokeh is installed), on
    # every interface unless told otherwise: a local cluster listens on loopback only, on free ports
    loopback = {"dashboard_address": "127.0.0.1:0", "worker_dashboard_address": "127.0.0.1:0"}
    with ctrl_c_held() as pressed, _interrupted_if(pressed):
        if workers == 1:  # one worker thread in this process, with this process's torch threads
            cluster = LocalCluster(n_workers=1, threads_per_worker=1, processes=False, **loopback)
            threads = None
        else:  # Dask starts worker processes with one OpenMP thread: share the cores out
            cluster = LocalCluster(
                n_workers=workers, threads_per_worker=1, processes=True, host="127.0.0.1", **loopback
            )
            threads = max(1, (os.cpu_count() or 1) // workers)
    with cluster:
        if pressed.is_set():
            raise KeyboardInterrupt  # once the cluster started: it closes whole
        with Client(cluster) as client:
            yield client, threads


@contextlib.contextmanager
def _interrupted_if(pressed: threading.Event) -> Iterator[None]:
    """A cluster failing to start after Ctrl-C (a worker process it reached first) raises KeyboardInterrupt."""
    try:
        yield
    except Exception:
        if pressed.is_set():
            raise KeyboardInterrupt from None
        raise


@contextlib.contextmanager
def ctrl_c_held() -> Iterator[threading.Event]:
    """Run the block with Ctrl-C held back, the event set if it was pressed meanwhile (for the caller to act on).

    A local cluster cut short while it starts leaves nannies half started, which distributed fails to close at exit
    with tracebacks. Held only in the main thread, and only where Ctrl-C raises KeyboardInterrupt (Python's own
    handler): a caller's handler is left alone.
    """
    pressed = threading.Event()
    if threading.current_thread() is not threading.main_thread() or (
        signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield pressed
        return
    previous = signal.signal(signal.SIGINT, lambda signum, frame: pressed.set())
    try:
        yield pressed
    finally:
        signal.signal(signal.SIGINT, previous)


def task_memory(client, max_memory: int | None) -> int:
    """Bytes one task may use: ``max_memory``, or a share of what the smallest worker slot has left.

    A worker's memory limit less its baseline (the process with torch and the model), split among its threads;
    half of that, so that Dask's pause at 80% of the limit is not reached.
    """
    if max_memory is not None:
        return max_memory
    import psutil

    slots = []
    for info in client.scheduler_info()["workers"].values():
        limit = info.get("memory_limit") or psutil.virtual_memory().total
        used = max(info.get("metrics", {}).get("memory", 0), WORKER_BASELINE)
        slots.append((limit - used) / max(info.get("nthreads", 1), 1))
    budget = int(TASK_SHARE * min(slots, default=psutil.virtual_memory().total))
    if budget <= 0:
        raise PredictInputError(
            f"the workers' memory limit leaves nothing for a task (a worker itself needs about "
            f"{WORKER_BASELINE // 2**20} MiB); give the workers more memory, or fewer threads each"
        )
    return budget


def worker_count(client) -> int:
    """The workers the cluster has now."""
    return len(client.scheduler_info()["workers"])


def task_slots(client) -> int:
    """The tasks the cluster's workers run at once: their threads, all together."""
    return sum(info.get("nthreads", 1) for info in client.scheduler_info()["workers"].values())
