"""Jobs: label an image of any size in the background (an upload streamed to disk, or a server-side input), follow
its progress, cancel it, download its labels (one image, or the zarr store file by file)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import re
import stat
import time
import uuid
from pathlib import Path as FilePath
from typing import Annotated, Literal

import anyio
from fastapi import APIRouter, Depends, Path, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, StreamingResponse
from pydantic import ValidationError
from starlette.concurrency import iterate_in_threadpool

from densecnn.io import Intensity
from densecnn.io.beneath import PathRefusedError, open_beneath
from densecnn.io.geojson import GEOJSON, geojson_text

from ..auth import CallerDep
from ..dependencies import ReadyServiceDep, SettingsDep, unknown_model
from ..errors import ApiError, ErrorBody
from ..jobs import upload_store
from ..jobs.admission import MAX_CHUNK, MAX_LEVEL, MIN_CHUNK, admit
from ..jobs.db import UNFINISHED, JobRecord, State
from ..jobs.inputs import JobInput, opened_server_input, save_upload
from ..jobs.quota import GrowingReservation, disk_usage
from ..jobs.runner import LABELS_PNG, LABELS_TIFF, LABELS_ZARR, JobRunner
from ..jobs.schemas import Job, JobList, JobRequest
from .get_and_head import get_and_head

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])

MAX_JSON_BYTES = 64 * 1024
BINARY = {"schema": {"type": "string", "format": "binary"}}
JOB_BODY = {
    "required": True,
    "description": "JSON naming a server-side input (`JobRequest`), or an upload: multipart field `image`, or the raw "
                   "body (then the options are query parameters). Uploads are streamed to disk.",
    "content": {
        "application/json": {"schema": JobRequest.model_json_schema()},
        "multipart/form-data": {
            "schema": {"type": "object", "properties": {"image": {"type": "string", "format": "binary"}},
                       "required": ["image"]},
        },
        "image/tiff": BINARY,
        "application/octet-stream": BINARY,
    },
}  # fmt: skip


def get_runner(request: Request) -> JobRunner:
    return request.app.state.jobs


RunnerDep = Annotated[JobRunner, Depends(get_runner)]
CHUNK_HELP = (f"output chunk side, {MIN_CHUNK} to {MAX_CHUNK} (uploads; default: the input's chunks); a chunk whose "
              "estimated memory passes the server's max_job_memory gets 422")  # fmt: skip
JobId = Annotated[str, Path(description="the job's id, from its Location", max_length=64)]


def _error(description: str) -> dict:
    return {"model": ErrorBody, "description": description}


def _owned(runner: JobRunner, job_id: str, owner: str) -> JobRecord:
    """The caller's job, or 404 (also for another caller's job: ids are not confirmed to strangers)."""
    job = runner.store.get(job_id, owner)
    if job is None:
        raise ApiError(404, "unknown_job", f"no job {job_id!r} of yours; GET /v1/jobs lists them")
    return runner.outcome(job)


@router.post(
    "",
    status_code=202,
    response_model=Job,
    summary="Start a job: label an image of any size block by block, in the background",
    description="Answers 202 with the job and its `Location`; poll it until its state is `succeeded`, `failed` or "
    "`cancelled`. Inputs read block by block (zarr, OME-Zarr, (Big)TIFF, whole-slide images, .npy) may be of any "
    "size; other image files are decoded whole and must fit the image limits.",
    openapi_extra={"requestBody": JOB_BODY},
    responses={
        400: _error("unreadable input, '..' in a path, bad intensity"),
        403: _error("a server-side path outside the data roots, or the server reads none"),
        404: _error("no such model, or nothing at the server-side path"),
        413: _error(
            "the upload is over max_job_upload_bytes, or an image decoded whole is over the image limits"
        ),
        415: _error("not an image in a format read here"),
        422: _error("invalid or unknown options, or an input of other dimensions than the model's"),
        429: _error("the key has max_jobs_per_key jobs queued or running, or is over its request rate"),
        507: _error("the jobs' disk quota is used up"),
    },
)
async def create_job(
    request: Request,
    caller: CallerDep,
    service: ReadyServiceDep,
    settings: SettingsDep,
    runner: RunnerDep,
    model: Annotated[str | None, Query(description="model name (uploads)", max_length=200)] = None,
    chunk: Annotated[int | None, Query(ge=MIN_CHUNK, le=MAX_CHUNK, description=CHUNK_HELP)] = None,
    level: Annotated[int | None, Query(ge=0, le=MAX_LEVEL, description="OME-Zarr level (uploads)")] = None,
    intensity: Annotated[str | None, Query(description="intensity scaling (uploads)", max_length=100)] = None,
    nonfinite: Annotated[
        Literal["refuse", "propagate"],
        Query(description="NaN/±Inf pixels: refuse or propagate as no-data (uploads)"),
    ] = "refuse",
) -> JSONResponse:
    if await asyncio.to_thread(runner.store.unfinished, caller.owner) >= settings.max_jobs_per_key:
        raise _too_many_jobs(settings)  # before any byte of an upload is read
    json_body = _is_json(request.headers.get("content-type", ""))
    spec = await _json_request(request) if json_body else None
    if spec is not None:
        model, chunk, level, intensity, nonfinite = (
            spec.model,
            spec.chunk,
            spec.level,
            spec.intensity,
            spec.nonfinite,
        )
    served = await asyncio.to_thread(_check_model_and_intensity, service, model, intensity)
    job_id = uuid.uuid4().hex
    directory = runner.directory(job_id)
    directory.mkdir(mode=0o700, parents=True)
    taken = None  # a resumable upload's data, moved into the job's directory (with its reservation)
    try:
        with contextlib.ExitStack() as held:
            job_input, taken = await _job_input(request, spec, caller, settings, runner, job_id, held)
            plan = await asyncio.to_thread(admit, job_input, served, settings, level=level, chunk=chunk)
        await asyncio.to_thread(runner.quota.grow, job_id, plan.output_bytes)
        record = JobRecord(
            id=job_id, owner=caller.owner, model=model, input=job_input.path.name if spec is None or taken else "",
            input_name=job_input.name, intensity=intensity, nonfinite=nonfinite, level=level, chunk=plan.chunk, result=plan.result,
            state=State.queued.value, runner=runner.name, heartbeat=time.time(), created=time.time(),
        )  # fmt: skip
        if not await asyncio.to_thread(runner.store.add, record, settings.max_jobs_per_key):
            raise _too_many_jobs(settings)
    except BaseException:
        if taken is not None:  # the upload stays whole: the caller fixes the request and tries again
            await asyncio.to_thread(runner.give_back_upload, spec.upload, job_id, taken.path)
        await asyncio.to_thread(runner.discard, job_id)
        raise
    if taken is not None:
        await asyncio.to_thread(upload_store.remove, runner.root, spec.upload)
    recorded = await asyncio.to_thread(runner.store.get, job_id)  # with the database's defaults
    runner.submit(job_id)
    headers = {"Location": f"/v1/jobs/{job_id}"}
    return JSONResponse(Job.of(recorded).model_dump(mode="json"), status_code=202, headers=headers)


def _check_model_and_intensity(service, model: str | None, intensity: str | None):
    """The served model, as its files are now (blocking); 422 without a model, 404 for one not served (its
    directory removed included), 400 for an intensity rule that cannot be read."""
    if model is None:
        raise ApiError(422, "missing_model", "name the model: ?model=NAME (see GET /v1/models)")
    served = service.model(model)
    if served is None:
        raise unknown_model(service, model)
    if intensity is not None:
        Intensity.parse(intensity)  # 400 intensity_out_of_range when unreadable
    return served


async def _job_input(
    request: Request, spec: JobRequest | None, caller, settings, runner: JobRunner, job_id: str, held
) -> tuple[JobInput, JobInput | None]:
    """The job's input and, for a finished resumable upload, the same input as taken into the job's directory
    (else None): the upload named in ``spec``, the server-side input it names (kept open in ``held``), or the
    request's body streamed to disk."""
    directory = runner.directory(job_id)
    if spec is not None and spec.upload is not None:
        taken = await asyncio.to_thread(runner.take_upload, spec.upload, caller.owner, job_id)
        return taken, taken
    if spec is not None:
        opened = opened_server_input(spec.input, settings.data_roots, directory)
        job_input = await asyncio.to_thread(held.enter_context, opened)
        await asyncio.to_thread(runner.quota.reserve, job_id, 0)
        return job_input, None
    return await _receive_upload(request, runner, settings, job_id, directory), None


async def _receive_upload(request: Request, runner: JobRunner, settings, job_id: str, directory) -> JobInput:
    """Stream the upload to the job's directory, reserving its disk as its bytes arrive (a declared length the
    quota has no room for is refused at once), within ``upload_timeout`` seconds between any two of its chunks;
    the reservation then becomes the disk its file takes."""
    await asyncio.to_thread(runner.quota.reserve, job_id, 0)
    reservation = GrowingReservation(runner.quota, job_id, limit=settings.max_job_upload_bytes)
    room = await asyncio.to_thread(runner.quota.room)
    job_input = await save_upload(request, directory, room=room, reservation=reservation,
                                  idle_seconds=settings.upload_timeout)  # fmt: skip
    await asyncio.to_thread(runner.quota.set, job_id, disk_usage(job_input.path))
    return job_input


def _too_many_jobs(settings) -> ApiError:
    return ApiError(429, "too_many_jobs",
                    f"you have {settings.max_jobs_per_key} jobs queued or running (max_jobs_per_key); wait for one "
                    "to finish or cancel one (DELETE /v1/jobs/ID)",
                    {"Retry-After": str(max(1, round(settings.job_poll_seconds)))})  # fmt: skip


async def _json_request(request: Request) -> JobRequest:
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_JSON_BYTES:
            raise ApiError(
                413, "payload_too_large", f"a JSON job request is at most {MAX_JSON_BYTES:,} bytes"
            )
    example = '{"model": "nuclei", "input": "slide.tif"} or {"model": "nuclei", "upload": "ID"}'
    try:
        parsed = json.loads(bytes(body))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        why = (
            f"{exc.msg} at line {exc.lineno} column {exc.colno}"
            if isinstance(exc, json.JSONDecodeError)
            else exc
        )
        raise ApiError(422, "invalid_request",
                       f"the body is not valid JSON ({why}); send a JSON object such as {example}") from None  # fmt: skip
    if not isinstance(parsed, dict):
        raise ApiError(422, "invalid_request",
                       f"the body is a JSON {_JSON_TYPES.get(type(parsed), type(parsed).__name__)}, not an object; "
                       f"send one job as a JSON object such as {example}")  # fmt: skip
    try:
        return JobRequest.model_validate(parsed)
    except ValidationError as exc:
        raise RequestValidationError(exc.errors()) from None


_JSON_TYPES = {
    list: "array",
    str: "string",
    int: "number",
    float: "number",
    bool: "boolean",
    type(None): "null",
}


def _is_json(content_type: str) -> bool:
    """``application/json`` or any JSON media type (``application/vnd.api+json``, ``...+json``)."""
    media = content_type.partition(";")[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


@router.get("", response_model=JobList, summary="Your jobs, newest first (at most 100)")
def list_jobs(caller: CallerDep, runner: RunnerDep) -> JobList:
    return JobList(jobs=[Job.of(runner.outcome(job)) for job in runner.store.list(caller.owner)])


@router.get("/{job_id}", response_model=Job, summary="A job: its state, progress and results",
            responses={404: _error("no such job of yours")})  # fmt: skip
def get_job(job_id: JobId, caller: CallerDep, runner: RunnerDep) -> Job:
    return Job.of(_owned(runner, job_id, caller.owner))


@router.delete(
    "/{job_id}",
    summary="Cancel a queued or running job (202), or delete a finished one and its files (204)",
    description="A running job stops after its blocks in flight; its state is then `cancelled` and its slot free. "
    "Delete it afterwards to free its disk.",
    status_code=202,
    response_model=Job,
    responses={204: {"description": "deleted"}, 404: _error("no such job of yours")},
)
def delete_job(job_id: JobId, caller: CallerDep, runner: RunnerDep) -> Response:
    job = _owned(runner, job_id, caller.owner)
    if job.state in UNFINISHED:
        runner.store.request_cancel(job_id)
        runner.cancel(job_id)
        job = runner.outcome(runner.store.get(job_id))
        return JSONResponse(Job.of(job).model_dump(mode="json"), status_code=202)
    runner.remove(job_id)
    return Response(status_code=204)


def _finished(runner: JobRunner, job_id: str, owner: str, kind: str) -> FilePath:
    """The directory of the caller's succeeded job, which has a ``kind`` result; 409 or 404 otherwise."""
    job = _owned(runner, job_id, owner)
    if job.state != State.succeeded.value:
        raise ApiError(409, "job_not_finished", _no_results_yet(job))
    if kind not in job.result.split("+"):
        if kind == "zarr":
            why = f"job {job_id} labelled an image file: get /v1/jobs/{job_id}/result.png"
        else:
            why = (f"job {job_id}'s labels are too large for one image; read the zarr store at "
                   f"/v1/jobs/{job_id}/result.zarr/ (e.g. zarr.open_array over HTTP)")  # fmt: skip
        raise ApiError(404, "no_such_result", why)
    return runner.directory(job_id)


def _no_results_yet(job: JobRecord) -> str:
    """Why a job that has not succeeded has no results, and what to do: wait for one queued or running; submit a
    failed or cancelled one again (it never will succeed)."""
    if job.state in UNFINISHED:
        return (
            f"job {job.id} is {job.state}; results exist once it has succeeded (poll GET /v1/jobs/{job.id})"
        )
    if job.state == State.failed.value:
        return (f"job {job.id} failed, so it has no results (its error, in GET /v1/jobs/{job.id}, says why); fix "
                "what the error names and submit the job again (POST /v1/jobs)")  # fmt: skip
    return (f"job {job.id} was cancelled, so it has no results; submit the job again (POST /v1/jobs) to label "
            "its input")  # fmt: skip


def _vanished(runner: JobRunner, job_id: str, owner: str, what: str) -> ApiError:
    """What a result that vanished while it was read means: 404 ``unknown_job`` for a job deleted meanwhile (its
    results go with it), else 404 ``no_such_result``."""
    _owned(runner, job_id, owner)  # 404 unknown_job when it was deleted
    return ApiError(404, "no_such_result", f"job {job_id}'s {what} is no longer on the server; submit the job again "
                    "(POST /v1/jobs)")  # fmt: skip


class _OpenedFileResponse(FileResponse):
    """A file response that sends a file already open: a file deleted after the route found it (its job deleted
    meanwhile) is still sent whole, never a failure half-way."""

    def __init__(self, file, path: FilePath, **kwargs):
        super().__init__(path, stat_result=os.fstat(file.fileno()), **kwargs)
        self._file = file

    async def __call__(self, scope, receive, send) -> None:
        extensions = {k: v for k, v in scope.get("extensions", {}).items() if k != "http.response.pathsend"}
        try:
            await super().__call__({**scope, "extensions": extensions}, receive, send)
        finally:
            self._file.close()

    @contextlib.asynccontextmanager
    async def _open_file(self):
        self._file.seek(0)
        yield anyio.wrap_file(self._file)


def _file(
    path: FilePath,
    request: Request,
    media_type: str,
    filename: str | None = None,
    *,
    gone,
    fd: int | None = None,
) -> FileResponse:
    """``path`` (or the file open as ``fd``, which it then owns) as a response (HEAD: its headers only), opened
    now (``gone()``, the error to raise, when it has vanished), a ``Range`` refused in the JSON error shape: 400 when
    it is malformed, 416 when it starts past the end."""
    try:
        file = os.fdopen(fd, "rb") if fd is not None else open(path, "rb")  # noqa: SIM115 (the response closes it)
    except FileNotFoundError:
        raise gone() from None
    try:
        return _range_checked(file, path, request, media_type, filename)
    except BaseException:
        file.close()
        raise


def _range_checked(
    file, path: FilePath, request: Request, media_type: str, filename: str | None
) -> FileResponse:
    size = os.fstat(file.fileno()).st_size
    requested = request.headers.get("range")
    if requested is not None:
        ranges = RANGE.fullmatch(requested.strip())
        if ranges is None:
            raise ApiError(
                400, "invalid_range", "Range must be 'bytes=START-END' (or several, comma-separated)"
            )
        for start, end in re.findall(r"(\d*)-(\d*)", ranges.group(1)):
            if (
                (start == end == "")
                or (start and int(start) >= size)
                or (start and end and int(end) < int(start))
                or (not start and int(end) == 0)  # a suffix of no bytes
            ):
                raise ApiError(416, "range_not_satisfiable",
                               f"the file has {size:,} bytes; ask for a range within them",
                               {"Content-Range": f"bytes */{size}"})  # fmt: skip
    return _OpenedFileResponse(file, path, media_type=media_type, filename=filename)


RANGE = re.compile(r"bytes=((?:\d{0,19}-\d{0,19})(?:\s*,\s*\d{0,19}-\d{0,19}){0,15})")


@get_and_head(router, "/{job_id}/result.png",
              summary="The labels as one palette PNG (results within the image limits)",
              response_class=FileResponse, responses={200: {"content": {"image/png": BINARY}},
                                                      404: _error("none"), 409: _error("not finished")})  # fmt: skip
def result_png(job_id: JobId, request: Request, caller: CallerDep, runner: RunnerDep) -> FileResponse:
    directory = _finished(runner, job_id, caller.owner, "png")
    gone = functools.partial(_vanished, runner, job_id, caller.owner, "label PNG")
    return _file(directory / LABELS_PNG, request, "image/png", f"{job_id}-labels.png", gone=gone)


@get_and_head(router, "/{job_id}/result.tif",
              summary="The labels as one TIFF of class ids (results within the image limits)",
              response_class=Response, responses={200: {"content": {"image/tiff": BINARY}}, 404: _error("none"),
                                                  409: _error("not finished")})  # fmt: skip
def result_tiff(job_id: JobId, request: Request, caller: CallerDep, runner: RunnerDep) -> Response:
    job = _owned(runner, job_id, caller.owner)
    directory = _finished(runner, job_id, caller.owner, "tiff" if "tiff" in job.result else "png")
    gone = functools.partial(_vanished, runner, job_id, caller.owner, "label TIFF")
    if not (
        directory / LABELS_TIFF
    ).is_file():  # written once, from the PNG (its pixel values are the class ids)
        try:
            runner.tiff_of_png(job)
        except ApiError:
            raise
        except Exception:  # its files deleted meanwhile (the job deleted): 404; anything else is a bug
            if not directory.is_dir():
                raise gone() from None
            raise
    return _file(directory / LABELS_TIFF, request, "image/tiff", f"{job_id}-labels.tif", gone=gone)


@get_and_head(router, "/{job_id}/result.geojson",
              summary="The labels as GeoJSON polygons: one feature per connected region of a class (QuPath "
                      "reads them: File > Import objects)",
              response_class=StreamingResponse,
              responses={200: {"content": {GEOJSON: {"schema": {"type": "object"}}}}, 404: _error("none"),
                         409: _error("not finished")})  # fmt: skip
def result_geojson(
    job_id: JobId,
    request: Request,
    caller: CallerDep,
    runner: RunnerDep,
    background: Annotated[bool, Query(description="include the background class (class 0)")] = False,
) -> Response:
    job = _owned(runner, job_id, caller.owner)
    _finished(runner, job_id, caller.owner, "zarr" if "zarr" in job.result else "png")
    headers = {"Content-Disposition": f'attachment; filename="{job_id}-labels.geojson"'}
    if request.method == "HEAD":  # GET's headers: streamed, of no length known beforehand
        return StreamingResponse(iter(()), media_type=GEOJSON, headers=headers)
    try:
        labels = runner.result_labels(job)
        classes = runner.classes(job)
    except ApiError:
        raise
    except Exception:  # its files deleted meanwhile (the job deleted): 404; anything else is a bug
        if not runner.directory(job_id).is_dir():
            raise _vanished(runner, job_id, caller.owner, "label map") from None
        raise
    features = geojson_text(labels, classes, skip=() if background else (0,))
    return StreamingResponse(iterate_in_threadpool(features), media_type=GEOJSON, headers=headers)


@get_and_head(
    router,
    "/{job_id}/result.zarr/{key:path}",
    summary="A file of the labels' zarr store (zarr.json, chunks), for zarr clients reading over HTTP",
    response_class=FileResponse,
    responses={200: {"content": {"application/octet-stream": BINARY}}, 404: _error("no such file"),
               409: _error("not finished")},
)  # fmt: skip
def result_zarr(
    job_id: JobId, key: str, request: Request, caller: CallerDep, runner: RunnerDep
) -> FileResponse:
    store = _finished(runner, job_id, caller.owner, "zarr") / LABELS_ZARR
    if ".." in FilePath(key).parts:
        raise ApiError(400, "path_traversal", f"{key!r} contains '..'; give a key inside the store")
    try:
        fd = open_beneath(store, key) if "\0" not in key and key.strip("/") else None
    except (PathRefusedError, OSError):  # outside, a FIFO, missing, a name too long for the file system
        fd = None
    if fd is None or not stat.S_ISREG(os.fstat(fd).st_mode):
        if fd is not None:
            os.close(fd)
        _owned(runner, job_id, caller.owner)  # a job deleted meanwhile: 404 unknown_job
        raise ApiError(404, "no_such_key", f"the store has no {key[:200]!r}")
    gone = functools.partial(_vanished, runner, job_id, caller.owner, "zarr store")
    return _file(store / key, request, "application/octet-stream", gone=gone, fd=fd)
