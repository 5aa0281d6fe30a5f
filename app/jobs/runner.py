"""Running jobs: a bounded executor (``max_running_jobs`` threads, never the event loop) that labels each job's input
with :func:`densecnn.blockwise.label`, the engine of ``densecnn predict``, on a local Dask cluster or a scheduler.

Progress is written to the database at most every :data:`REPORT_SECONDS`; a cancel (from this worker or, through
the database, from another) stops a job after the blocks in flight; a server that stops releases its unfinished jobs,
and the next one to start resumes them from the chunks already written (the engine skips them). A finished zarr
result small enough for the image limits is also written as a label PNG (2-D) or TIFF.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from densecnn.errors import Cancelled, DenseCNNError

from ..metrics import Metrics
from ..settings import Settings
from . import uploads
from .db import JobRecord, State
from .store import JobStore

logger = logging.getLogger("densecnn.app")

REPORT_SECONDS = 0.5  # between two progress writes of a job
STALE_PERIODS = 3  # a job whose worker's heartbeat is older than this many poll periods is taken over
LABELS_ZARR, LABELS_PNG, LABELS_TIFF = "labels.zarr", "labels.png", "labels.tif"


class JobRunner:
    """Runs the jobs this worker process holds; one per process, in ``app.state.jobs``."""

    def __init__(self, settings: Settings, store: JobStore, metrics: Metrics):
        # a failing block is reported once, in the job's error, not as Dask's log of every attempt
        os.environ.setdefault("DASK_LOGGING__DISTRIBUTED", "error")
        self.settings, self.store, self.metrics = settings, store, metrics
        self.name = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.root = settings.data_dir / "jobs"
        self.root.mkdir(parents=True, exist_ok=True)
        self._executor = ThreadPoolExecutor(settings.max_running_jobs, thread_name_prefix="job")
        self._lock = threading.Lock()
        self._held: dict[str, threading.Event] = {}  # job id -> set to stop it
        self._stopping = False

    def directory(self, job_id: str) -> Path:
        return self.root / job_id

    def submit(self, job_id: str) -> None:
        """Queue a job this worker holds (claimed, or just created with ``runner=self.name``)."""
        with self._lock:
            if self._stopping or job_id in self._held:
                return
            self._held[job_id] = threading.Event()
        self._executor.submit(self._run, job_id)

    def cancel(self, job_id: str) -> None:
        """Stop the job after its blocks in flight, if this worker runs it (the database says so to the others)."""
        with self._lock:
            stop = self._held.get(job_id)
        if stop is not None:
            stop.set()

    def maintain(self) -> None:
        """Renew this worker's heartbeats, take over the jobs nobody holds, delete expired jobs. Blocking."""
        with self._lock:
            held = list(self._held)
        self.store.renew(held, self.name)
        if not self._stopping:
            stale = time.time() - STALE_PERIODS * self.settings.job_poll_seconds
            for job in self.store.claimable(stale_before=stale):
                if job.id not in held and self.store.claim(job, self.name):
                    logger.info("resuming job %s (%s)", job.id, job.input_name)
                    self.submit(job.id)
        for job in self.store.expired(finished_before=time.time() - self.settings.job_retention):
            self.remove(job.id)
        uploads.remove_expired(self.root, created_before=time.time() - self.settings.job_retention)

    def remove(self, job_id: str) -> None:
        """Delete a finished job's files and record."""
        shutil.rmtree(self.directory(job_id), ignore_errors=True)
        self.store.delete(job_id)

    def stop(self) -> None:
        """Stop every job after its blocks in flight and release them, so that the next start resumes them."""
        with self._lock:
            self._stopping = True
            held = list(self._held)
            for stop in self._held.values():
                stop.set()
        self._executor.shutdown(wait=True, cancel_futures=True)
        self.store.release(held, self.name)

    def _run(self, job_id: str) -> None:
        try:
            job = self.store.get(job_id)
            if job is None or job.state != State.queued.value or job.runner != self.name or self._stopping:
                return  # cancelled or deleted while queued, or taken over, or the server stops
            self._label(job)
        finally:
            with self._lock:
                self._held.pop(job_id, None)

    def _label(self, job: JobRecord) -> None:
        from densecnn.blockwise import BlockwiseOptions, label
        from densecnn.io import Intensity

        stop = self._held[job.id]
        directory = self.directory(job.id)
        chunked = job.result == "zarr"  # as planned at submission: a zarr store, or one label image
        output = directory / (LABELS_ZARR if chunked else LABELS_PNG)
        started = time.time()
        self.store.set(job.id, state=State.running.value, started=started, error=None, blocks_done=0,
                       blocks_computed=0, pixels=0, run_seconds=0.0)  # fmt: skip
        report = _Reporter(self, job.id, stop, started)
        options = BlockwiseOptions(
            level=job.level,
            scheduler=self.settings.job_scheduler,
            workers=self.settings.job_workers,
            chunk=job.chunk,
            block=self.settings.job_block,
            max_memory=self.settings.job_task_memory,
            intensity=Intensity.parse(job.intensity) if job.intensity else None,
            progress=False,
            on_progress=report,
        )
        try:
            summary = label(self.settings.model_dir / job.model, job.input, output, options)
            if summary.failures:
                raise DenseCNNError("; ".join(why for _, why in summary.failures))
            extra = self._small_copy(job, output) if chunked else _image_shape(output)
            report.final(summary)
            self.store.finish(job.id, State.succeeded, **extra)
            self.metrics.jobs_finished.labels(State.succeeded.value).inc()
        except Cancelled:
            current = self.store.get(job.id)
            if current is None:  # deleted meanwhile
                return
            if self._stopping and not current.cancel_requested:
                logger.info("job %s stopped with the server; the next start resumes it", job.id)
                return  # released by stop()
            self.store.finish(job.id, State.cancelled)
            self.metrics.jobs_finished.labels(State.cancelled.value).inc()
        except (
            DenseCNNError
        ) as exc:  # its message names the input as the caller knows it, not where it lies here
            self.store.finish(job.id, State.failed, error=str(exc).replace(job.input, job.input_name))
            self.metrics.jobs_finished.labels(State.failed.value).inc()
        except Exception as exc:  # a bug, or an error of a library; the job says so and the server goes on
            logger.exception("job %s failed", job.id)
            self.store.finish(
                job.id, State.failed, error=f"the job failed unexpectedly ({exc}); it was logged"
            )
            self.metrics.jobs_finished.labels(State.failed.value).inc()

    def _small_copy(self, job: JobRecord, output: Path) -> dict:
        """A label PNG (2-D) or TIFF of a zarr result within the image limits; the result's shape either way."""
        import zarr

        from densecnn.io import labels_tiff, write_labels

        array = zarr.open_array(str(output), mode="r")
        shape = {"height": array.shape[-2] if array.ndim >= 2 else 1, "width": array.shape[-1]}
        if int(np.prod(array.shape)) > self.settings.max_image_pixels:
            return shape
        labels = array[...]
        if labels.ndim == 2:
            palette = _palette(self.settings.model_dir / job.model)
            write_labels(self.directory(job.id) / LABELS_PNG, labels, palette)
            return {**shape, "result": "zarr+png"}
        (self.directory(job.id) / LABELS_TIFF).write_bytes(labels_tiff(labels, int(labels.max()) + 1))
        return {**shape, "result": "zarr+tiff"}


def _image_shape(path: Path) -> dict:
    from PIL import Image

    with Image.open(path) as image:
        return {"width": image.width, "height": image.height}


def _palette(model_dir: Path) -> list[list[int]]:
    from densecnn.modelfile import load

    return load(model_dir).palette


class _Reporter:
    """The engine's ``on_progress``: writes a job's progress (throttled), stops it when asked to."""

    def __init__(self, runner: JobRunner, job_id: str, stop: threading.Event, started: float):
        self.runner, self.job_id, self.stop, self.started = runner, job_id, stop, started
        self.written, self.computed = 0.0, 0

    def __call__(self, summary) -> None:
        if self.stop.is_set():
            raise Cancelled(f"job {self.job_id} was asked to stop")
        self.runner.metrics.job_blocks.inc(summary.computed - self.computed)
        self.computed = summary.computed
        now = time.monotonic()
        if now - self.written < REPORT_SECONDS and summary.computed + summary.skipped < summary.total:
            return
        self.written = now
        job = self.runner.store.get(self.job_id)
        if job is None or job.cancel_requested:  # deleted, or cancelled through another worker
            raise Cancelled(f"job {self.job_id} was cancelled")
        self.final(summary)

    def final(self, summary) -> None:
        self.runner.store.set(
            self.job_id,
            blocks_done=summary.skipped + summary.computed,
            blocks_total=summary.total,
            blocks_computed=summary.computed,
            pixels=summary.pixels,
            run_seconds=time.time() - self.started,
        )
