"""Running jobs: a bounded executor (``max_running_jobs`` threads, never the event loop) that labels each job's input
with :func:`densecnn.blockwise.predict_to_disk`, the engine of ``densecnn predict``, on a local Dask cluster or a scheduler.

Progress is written to the database at most every :data:`REPORT_SECONDS`, with the job's heartbeat (renewed
also by each maintenance period, for a job whose blocks are long); a cancel (from this worker or, through
the database, from another) stops a job after the blocks in flight; a server that stops releases its unfinished jobs,
and the next one to start resumes them from the chunks already written (the engine skips them). A finished zarr
result small enough for the image limits is also written as a label PNG (2-D) or TIFF.

A job runs the model the service serves under its name when it first starts (:meth:`ServiceState.model`: the same
reload-on-change rule as ``/segment``, gone or unloadable alike), and records that version (the served model's
identity) in its record. The engine's tasks load a model from a directory, in this process or in Dask's worker
processes, so the served object itself cannot be handed to them: the job copies that version's files into its own
directory, checked to be the version served, and the engine reads that copy, for this run and any resumed run; a
model replaced on the server meanwhile cannot change the weights of a job in flight, and the copy is deleted when
the job ends.

Every job ends: an outcome the database cannot take (its disk is full) is kept in memory, shown by the API, and
written by the next maintenance that can. Maintenance also deletes what nobody owns any more: directories of jobs
without a record (a killed upload, a job deleted while its last block was written), uploads idle for
``upload_idle_seconds``, and reservations of neither; each step on its own, tolerant of files vanishing meanwhile.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import shutil
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from sqlalchemy.exc import SQLAlchemyError

from densecnn.atomic import atomic_write
from densecnn.errors import Cancelled, DenseCNNError
from densecnn.modelfile import CONFIG_FILE, WEIGHTS_FILE, read_classes

from ..errors import JOB_OPTIONS, ApiError, service_message
from ..prometheus import Metrics
from ..registry import ServedModel, model_identity
from ..settings import Settings
from ..state import ServiceState
from . import upload_store
from .admission import task_memory
from .db import JobRecord, State
from .inputs import JobInput, opened_server_input
from .quota import Quota, disk_usage, upload_reservation
from .store import JobStore

logger = logging.getLogger("densecnn.app")

REPORT_SECONDS = 0.5  # between two progress writes of a job
STALE_PERIODS = 3  # a job whose worker's heartbeat is older than this many poll periods is taken over
LABELS_ZARR, LABELS_PNG, LABELS_TIFF = "labels.zarr", "labels.png", "labels.tif"
INPUT_FINGERPRINT = "input.fingerprint"  # in the job's directory: its input as the job first read it
CLASSES_JSON = "classes.json"  # in the job's directory: its model's classes, kept for its results
MODEL_COPY = "model"  # in the job's directory: the files of the model version it runs with, until it ends
MODEL_COPY_ATTEMPTS = 3  # copies of a model whose files change while they are copied, before the job fails
LOADED_WAIT_SECONDS = 0.1  # between two checks, while the models load, that the job has not been stopped


class JobRunner:
    """Runs the jobs this worker process holds; one per process, in ``app.state.jobs``."""

    def __init__(
        self, settings: Settings, store: JobStore, quota: Quota, metrics: Metrics, service: ServiceState
    ):
        """``service``: the models the jobs run, as ``/segment`` serves them."""
        # a failing block is reported once, in the job's error, not as Dask's log of every attempt
        os.environ.setdefault("DASK_LOGGING__DISTRIBUTED", "error")
        self.settings, self.store, self.quota, self.metrics = settings, store, quota, metrics
        self.service = service
        self.name = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.root = settings.data_dir / "jobs"
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._executor = ThreadPoolExecutor(settings.max_running_jobs, thread_name_prefix="job")
        self._lock = threading.Lock()
        self._held: dict[str, threading.Event] = {}  # job id -> set to stop it
        self._unrecorded: dict[str, dict] = {}  # job id -> its outcome, until the database takes it
        self._removed: set[str] = (
            set()
        )  # jobs deleted while a block was still being written into their directory
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
        """Record outcomes the database could not take, renew this worker's heartbeats, take over the jobs nobody
        holds, delete expired jobs, idle uploads and orphans. Blocking; each step goes on when another fails."""
        for step in (self._record_pending, self._renew_and_claim, self._expire, self._remove_orphans):
            try:
                step()
            except (
                OSError,
                SQLAlchemyError,
            ):  # a full disk, a database hiccup: logged, tried again next period
                logger.exception("job maintenance: %s failed", step.__name__)

    def _renew_and_claim(self) -> None:
        with self._lock:
            held = list(self._held)
        self.store.renew(held, self.name)
        if not self._stopping:
            stale = time.time() - STALE_PERIODS * self.settings.job_poll_seconds
            for job in self.store.claimable(stale_before=stale):
                if job.id not in held and job.id not in self._unrecorded and self.store.claim(job, self.name):
                    logger.info("resuming job %s (%s)", job.id, job.input_name)
                    self.submit(job.id)

    def _expire(self) -> None:
        for job in self.store.expired(finished_before=time.time() - self.settings.job_retention):
            self.remove(job.id)
        for upload_id in upload_store.remove_idle(
            self.root, active_before=time.time() - self.settings.upload_idle_seconds
        ):
            self.quota.release(upload_reservation(upload_id))

    def _remove_orphans(self) -> None:
        """Directories of jobs without a record, idle for ``upload_idle_seconds`` (a killed upload) or of jobs
        removed here; reservations of neither a job nor an upload."""
        idle_before = time.time() - self.settings.upload_idle_seconds
        with self._lock:
            held = set(self._held)
        for directory in _subdirectories(self.root):
            if directory.name == upload_store.UPLOADS or directory.name in held:
                continue
            if directory.name in self._removed or (
                self.store.get(directory.name) is None and _last_activity(directory) < idle_before
            ):
                shutil.rmtree(directory, ignore_errors=True)
                self._removed.discard(directory.name)
        present = {d.name for d in _subdirectories(self.root)}
        present |= {upload_reservation(d.name) for d in _subdirectories(upload_store.uploads_root(self.root))}
        for name in self.quota.names() - present:
            if self.store.get(name) is None:
                self.quota.release(name)

    def remove(self, job_id: str) -> None:
        """Delete a finished job's record, files and reservation (what a block still being written leaves is
        deleted by maintenance, the job having no record)."""
        self.discard(job_id)
        self.store.delete(job_id)

    def discard(self, job_id: str) -> None:
        """Delete a job's directory and its reservation (a job refused at admission, or removed); what a writer
        still adds meanwhile is deleted by the next maintenance."""
        shutil.rmtree(self.directory(job_id), ignore_errors=True)
        if self.directory(job_id).exists():
            self._removed.add(job_id)
        self.quota.release(job_id)

    def take_upload(self, upload_id: str, owner: str, job_id: str) -> JobInput:
        """The caller's complete resumable upload moved into the job's directory, its reservation now the job's."""
        job_input = upload_store.take(self.root, upload_id, owner, self.directory(job_id))
        self.quota.rename(upload_reservation(upload_id), job_id)
        return job_input

    def give_back_upload(self, upload_id: str, job_id: str, taken: Path) -> None:
        """Undo :meth:`take_upload` (the job was refused): the upload and its reservation are whole again."""
        upload_store.give_back(self.root, upload_id, taken)
        self.quota.rename(job_id, upload_reservation(upload_id))

    def outcome(self, job: JobRecord) -> JobRecord:
        """``job`` as this worker knows it: with the outcome the database has not yet taken, if any."""
        pending = self._unrecorded.get(job.id)
        if pending is not None:
            for key, value in pending.items():
                setattr(job, key, value)
        return job

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
            if not self._models_loaded(job_id):
                return  # the server stops
            job = self.store.get(job_id)
            if job is None or job.state != State.queued.value or job.runner != self.name or self._stopping:
                return  # cancelled or deleted while queued, or taken over, or the server stops
            self._label(job)
        except Exception:  # the database failed before the job began: it stays queued, to be claimed again
            logger.exception("job %s could not start", job_id)
        finally:
            with self._lock:
                self._held.pop(job_id, None)

    def _models_loaded(self, job_id: str) -> bool:
        """Wait until the service has loaded its models (a job resumed at start-up runs the models it serves, not
        none); False when the job is stopped meanwhile."""
        stop = self._held[job_id]
        while not self.service.wait_loaded(LOADED_WAIT_SECONDS):
            if stop.is_set():
                return False
        return True

    def _label(self, job: JobRecord) -> None:
        from densecnn.blockwise import predict_to_disk

        stop = self._held[job.id]
        directory = self.directory(job.id)
        chunked = job.result == "zarr"  # as planned at submission: a zarr store, or one label image
        output = directory / (LABELS_ZARR if chunked else LABELS_PNG)
        started = time.time()
        self.store.set(job.id, state=State.running.value, started=started, error=None, blocks_done=0,
                       blocks_computed=0, pixels=0, run_seconds=0.0)  # fmt: skip
        report = _Reporter(self, job.id, stop, started)
        # a one-image job rerun (its server stopped before it was marked done) replaces its own label image; a
        # zarr store is resumed from the chunks already written
        options = self._options(job, stop, report, replace=not chunked)
        where = str(directory)
        try:
            model = self._job_model(job)
            with self._input(job) as job_input:
                where = str(job_input.path)
                self._check_input_unchanged(job, job_input)
                summary = predict_to_disk(model, job_input.path, output, options)
                self._check_input_unchanged(job, job_input)
            if summary.failures:
                raise DenseCNNError("; ".join(why for _, why in summary.failures))
            extra = self._finish_result(job, output) if chunked else _image_shape(output)
            report.final(summary)
            self._finish(job.id, State.succeeded, **extra)
            self.quota.set(job.id, disk_usage(directory))  # the reservation becomes the blocks really taken
        except Cancelled:
            current = self.store.get(job.id)
            if current is None:  # deleted meanwhile
                return
            if self._stopping and not current.cancel_requested:
                logger.info("job %s stopped with the server; the next start resumes it", job.id)
                return  # released by stop()
            self._finish(job.id, State.cancelled)
        except ApiError as exc:  # the server-side input or the model is no longer there
            self._finish(job.id, State.failed, error=exc.message)
        except Exception as exc:
            storage = _storage_problem(exc)
            if storage is not None:  # the server's disk: nothing the caller's options can fix
                logger.error("job %s: cannot write its files: %s", job.id, exc)
                self._finish(job.id, State.failed, error=storage)
            elif isinstance(exc, DenseCNNError):  # named as the caller knows it, not where it lies here
                message = self._scrubbed(service_message(exc, JOB_OPTIONS), where, job)
                self._finish(job.id, State.failed, error=message)
            else:  # a bug, or an error of a library; the job says so, the server goes on
                logger.exception("job %s failed", job.id)
                self._finish(job.id, State.failed, error=f"the job failed unexpectedly "
                             f"({self._scrubbed(str(exc), where, job)}); it was logged")  # fmt: skip

    def _scrubbed(self, message: str, where: str, job: JobRecord) -> str:
        """``message`` without the server's paths: the input as the caller named it, the job's copy of its model
        and the model's directory as the model's name, the job's directory as "the job"."""
        named = f"model {job.model!r}"
        copy, model = self.directory(job.id) / MODEL_COPY, self.settings.model_dir / job.model
        for path, name in ((where, job.input_name), (str(copy.resolve()), named), (str(copy), named),
                           (str(model.resolve()), named), (str(model), named),
                           (str(self.directory(job.id)), "the job")):  # fmt: skip
            message = message.replace(path, name)
        return message

    def _job_model(self, job: JobRecord) -> Path:
        """The directory of the model version the job runs with: the job's own copy of the model the service
        served under its name when the job first started (that version recorded in the job), kept for its resumed
        runs. 410 when the model is gone, 503 while its files cannot be loaded or keep changing."""
        copy = self.directory(job.id) / MODEL_COPY
        if job.model_version and (copy / CONFIG_FILE).is_file():
            return copy  # a resumed run: the version its first run started with
        # a server-side input's job: its directory is made when it runs
        copy.parent.mkdir(mode=0o700, exist_ok=True)
        for _ in range(MODEL_COPY_ATTEMPTS):
            served = self._served_model(job)
            if _copied_model(served, copy):
                self._keep_classes(job, copy)
                self.store.set(job.id, model_version=served.identity)
                return copy
        raise ApiError(503, "model_unavailable", _model_unloadable(job.model, "its files kept changing"))

    def _served_model(self, job: JobRecord) -> ServedModel:
        """The model the service serves under the job's model name now, as ``/segment`` gets it; 410 when it is
        gone, 503 while its files cannot be loaded."""
        try:
            served = self.service.model(job.model)
        except ApiError:  # 503 model_unavailable, said as a job's caller can act on it
            why = "its files are being updated on the server, or are broken"
            raise ApiError(503, "model_unavailable", _model_unloadable(job.model, why)) from None
        if served is None:
            raise ApiError(410, "model_removed", _model_gone(job.model))
        return served

    def _keep_classes(self, job: JobRecord, model: Path) -> None:
        """Write the class count, names and colours of the model in ``model`` (the job's copy) into the job's
        directory, so that its results (TIFF, GeoJSON) are read without the model, which may be removed or
        replaced later."""
        described = _described_classes(model)
        atomic_write(self.directory(job.id) / CLASSES_JSON, lambda tmp: tmp.write_text(json.dumps(described)))

    def _classes(self, job: JobRecord) -> dict:
        """The job's classes as kept in its directory (for a job finished before they were kept: its model's, or
        410 ``model_removed`` when the model is gone)."""
        with contextlib.suppress(FileNotFoundError):
            return json.loads((self.directory(job.id) / CLASSES_JSON).read_text())
        try:
            return _described_classes(self.settings.model_dir / job.model)
        except DenseCNNError:
            raise ApiError(410, "model_removed",
                           f"job {job.id}'s model {job.model!r} was removed from the server, and this result needs "
                           "its classes; download result.png or result.zarr instead") from None  # fmt: skip

    def _check_input_unchanged(self, job: JobRecord, job_input: JobInput) -> None:
        """Fail the job when its input is not what it was when the job first started (a chunk of a zarr store
        deleted or rewritten while its blocks were read, a file cut): read from the pieces of two inputs, or a
        missing chunk's fill value, its labels would be wrong. The first start records the input's identity in
        the job's directory; each start and the end of each run compare it (a resumed job's earlier blocks count)."""
        from densecnn.io.identity import input_identity

        recorded = self.directory(job.id) / INPUT_FINGERPRINT
        now = input_identity(job_input.path)["digest"]
        if not recorded.exists():
            atomic_write(recorded, lambda tmp: tmp.write_text(now))
        elif recorded.read_text() != now:
            raise ApiError(409, "input_changed",
                           f"{job_input.name} changed or vanished while the job read it (files of it were deleted, "
                           "added or rewritten), so its labels would not be those of one input; submit the job "
                           "again once the input is complete and stays unchanged")  # fmt: skip

    def _options(self, job: JobRecord, stop: threading.Event, report: _Reporter, *, replace: bool):
        """The engine's options for ``job``: its own (level, chunk, intensity, nonfinite) and the server's;
        ``replace``: an output already in the job's directory is replaced."""
        from densecnn.blockwise import BlockwiseOptions
        from densecnn.io import Intensity

        return BlockwiseOptions(
            level=job.level,
            scheduler=self.settings.job_scheduler,
            workers=self.settings.job_workers,
            chunk=job.chunk,
            block=self.settings.job_block,
            max_memory=task_memory(self.settings),
            intensity=Intensity.parse(job.intensity) if job.intensity else None,
            nonfinite=job.nonfinite,
            overwrite=replace,
            progress=False,
            cancel=stop,  # set: no block starts, and a block in flight writes no further chunk
            on_progress=report,
        )

    def classes(self, job: JobRecord) -> list[tuple[str, list[int]]]:
        """The job's model's classes: name and colour per class id."""
        classes = self._classes(job)
        return list(zip(classes["names"], classes["palette"]))

    def result_labels(self, job: JobRecord):
        """A succeeded job's labels, read lazily where they are a zarr store: (H, W) or (D, H, W)."""
        directory = self.directory(job.id)
        if "zarr" in job.result.split("+"):
            import zarr

            return zarr.open_array(str(directory / LABELS_ZARR), mode="r")
        from PIL import Image

        with Image.open(directory / LABELS_PNG) as image:  # its pixel values are the class ids
            return np.asarray(image)

    def tiff_of_png(self, job: JobRecord) -> None:
        """Write a PNG result's labels as a TIFF of class ids beside it (uint16 past 255 classes)."""
        from densecnn.atomic import atomic_write
        from densecnn.io import labels_tiff

        labels = self.result_labels(job)[...]  # within the image limits
        data = labels_tiff(labels, self._classes(job)["num_classes"])
        atomic_write(self.directory(job.id) / LABELS_TIFF, lambda tmp: tmp.write_bytes(data))

    @contextlib.contextmanager
    def _input(self, job: JobRecord) -> Iterator[JobInput]:
        """The job's input, opened now: an upload in its directory, or the server-side path opened beneath its data
        root again (what was swapped in since the job was submitted is judged anew)."""
        directory = self.directory(job.id)
        upload = Path(job.input)  # its name in the job's directory ("" for a server-side input)
        if job.input and (not upload.is_absolute() or upload.parent == directory):
            yield JobInput(directory / upload.name, job.input_name)
            return
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        with opened_server_input(job.input_name, self.settings.data_roots, directory) as job_input:
            yield job_input

    def _finish(self, job_id: str, state: State, **values) -> None:
        """End the job in ``state`` and delete its copy of its model; when the database cannot take it (a full
        disk), keep it in memory until the next maintenance writes it: the job never stays running."""
        shutil.rmtree(self.directory(job_id) / MODEL_COPY, ignore_errors=True)
        values = {"state": state.value, "finished": time.time(), "runner": None, **values}
        try:
            self.store.set(job_id, **values)
        except SQLAlchemyError:
            logger.exception(
                "job %s: its outcome (%s) is kept until the database takes it", job_id, state.value
            )
            self._unrecorded[job_id] = values
        self.metrics.jobs_finished.labels(state.value).inc()

    def _record_pending(self) -> None:
        for job_id, values in list(self._unrecorded.items()):
            self.store.set(job_id, **values)
            del self._unrecorded[job_id]

    def _finish_result(self, job: JobRecord, output: Path) -> dict:
        """The result's metadata names the model and input as the caller does (never where they lie on the
        server); a label PNG (2-D) or TIFF beside a zarr result within the image limits; the result's shape."""
        import zarr

        from densecnn.io import labels_tiff, write_labels

        array = zarr.open_array(str(output), mode="r+")
        described = dict(array.attrs.get("densecnn") or {})
        if described:
            array.attrs["densecnn"] = {**described, "model": job.model, "input": job.input_name}
        shape = {"height": array.shape[-2] if array.ndim >= 2 else 1, "width": array.shape[-1]}
        if int(np.prod(array.shape)) > self.settings.max_image_pixels:
            return shape
        labels = array[...]
        classes = self._classes(job)
        if labels.ndim == 2:
            write_labels(self.directory(job.id) / LABELS_PNG, labels, [tuple(c) for c in classes["palette"]])
            return {**shape, "result": "zarr+png"}
        (self.directory(job.id) / LABELS_TIFF).write_bytes(labels_tiff(labels, classes["num_classes"]))
        return {**shape, "result": "zarr+tiff"}


def _described_classes(model_dir: Path) -> dict:
    """A model's class count, names and colours, as a job's directory keeps them (JSON)."""
    classes = read_classes(model_dir)
    return {"num_classes": classes.num_classes, "names": list(classes.class_names),
            "palette": [list(map(int, colour)) for colour in classes.palette]}  # fmt: skip


def _model_gone(model: str) -> str:
    return (f"model {model!r} was removed from the server after the job was submitted; submit the job again with a "
            "model the server serves (GET /v1/models)")  # fmt: skip


def _model_unloadable(model: str, why: str) -> str:
    return (f"model {model!r} could not be loaded when the job started ({why}); submit the job again in a "
            "moment, or with another model (GET /v1/models)")  # fmt: skip


def _copied_model(served: ServedModel, copy: Path) -> bool:
    """Copy the files of ``served``'s model directory that make the model (model.json and its weights) to the
    directory ``copy``: True when the directory's files are still the version ``served`` is once they are copied
    (so the copy is that version), else False (changed meanwhile, or removed) with nothing left at ``copy``."""
    source = served.loaded.path
    partial = copy.with_name(f"{copy.name}.partial")
    for stale in (copy, partial):
        shutil.rmtree(stale, ignore_errors=True)
    partial.mkdir(mode=0o700)
    try:
        for name in (CONFIG_FILE, WEIGHTS_FILE):
            shutil.copyfile(source / name, partial / name)
    except FileNotFoundError:
        shutil.rmtree(partial)
        return False
    if model_identity(source) != served.identity:
        shutil.rmtree(partial)
        return False
    partial.rename(copy)
    return True


DISK_FULL = {errno.ENOSPC, errno.EDQUOT}
NOT_WRITABLE = {errno.EACCES, errno.EPERM, errno.EROFS}


def _storage_problem(exc: BaseException) -> str | None:
    """A caller's message for a job the server's disk stopped (full, or not writable), None for another error:
    what the caller can do (submit again later) and that the server's operator must act."""
    seen, errors, depth = exc, set(), 0
    while seen is not None and depth < 20:  # the error and what it was raised from or during
        if isinstance(seen, OSError) and seen.errno is not None:
            errors.add(seen.errno)
        seen, depth = seen.__cause__ or seen.__context__, depth + 1
    text = str(exc)
    written = "cannot be written (" in text  # densecnn's own words for an output it could not write
    if errors & DISK_FULL or (written and any(os.strerror(code) in text for code in DISK_FULL)):
        return ("the server ran out of disk space while writing the job's labels; submit the job again later "
                "(POST /v1/jobs), once the server's operator has freed space on its disk")  # fmt: skip
    if written and any(os.strerror(code) in text for code in NOT_WRITABLE):
        return ("the server cannot write the job's labels (its data directory is not writable); tell the server's "
                "operator, then submit the job again (POST /v1/jobs)")  # fmt: skip
    return None


def _image_shape(path: Path) -> dict:
    from PIL import Image

    with Image.open(path) as image:
        return {"width": image.width, "height": image.height}


def _subdirectories(path: Path) -> list[Path]:
    try:
        return [entry for entry in path.iterdir() if entry.is_dir() and not entry.is_symlink()]
    except FileNotFoundError:
        return []


def _last_activity(directory: Path) -> float:
    """The latest modification under ``directory`` (files vanishing meanwhile skipped)."""
    latest = 0.0
    for root, dirs, files in os.walk(directory):
        for name in (*dirs, *files, "."):
            with contextlib.suppress(FileNotFoundError):
                latest = max(latest, os.lstat(os.path.join(root, name)).st_mtime)
    return latest


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
            self.stop.set()  # the blocks in flight write no further chunk
            raise Cancelled(f"job {self.job_id} was cancelled")
        self.final(summary)

    def final(self, summary) -> None:
        now = time.time()
        self.runner.store.set(
            self.job_id,
            blocks_done=summary.skipped + summary.computed,
            blocks_total=summary.total,
            blocks_computed=summary.computed,
            pixels=summary.pixels,
            run_seconds=now - self.started,
            # the job's own thread says it is alive too, in the same write: a maintenance period slowed by a loaded
            # machine or a busy database then does not let another worker take over a job that is making progress
            heartbeat=now,
        )
