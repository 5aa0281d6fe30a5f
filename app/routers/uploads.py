"""Resumable uploads for jobs, by the tus 1.0 protocol (core, creation, termination): any tus client (tus-js-client,
tuspy, Uppy) sends a multi-GB image in pieces and resumes after a cut-off; ``POST /v1/jobs`` with ``{"upload": ID}``
then labels it.

    POST   /v1/uploads        Upload-Length: N [Upload-Metadata: filename BASE64]  -> 201, Location
    HEAD   /v1/uploads/{id}   -> Upload-Offset (bytes held), Upload-Length
    PATCH  /v1/uploads/{id}   Upload-Offset: K, Content-Type: application/offset+octet-stream, bytes K.. -> 204
    DELETE /v1/uploads/{id}   -> 204
"""

from __future__ import annotations

import asyncio
import re
from typing import Annotated

from fastapi import APIRouter, Header, Path, Request, Response

from ..auth import CallerDep
from ..dependencies import SettingsDep
from ..errors import ApiError, ErrorBody
from ..jobs import upload_store
from ..jobs.inputs import WRITE_BATCH
from ..jobs.quota import GrowingReservation, QuotaExceeded, disk_blocks, upload_reservation
from .jobs import RunnerDep

router = APIRouter(prefix="/v1/uploads", tags=["uploads"])

TUS_VERSION = "1.0.0"
TUS = {"Tus-Resumable": TUS_VERSION}
TUS_REQUEST_HEADERS = ["Tus-Resumable", "Upload-Length", "Upload-Offset", "Upload-Metadata"]  # for CORS
TUS_RESPONSE_HEADERS = ["Tus-Resumable", "Tus-Version", "Tus-Extension", "Tus-Max-Size", "Upload-Offset",
                        "Upload-Length"]  # fmt: skip
OFFSET_TYPE = "application/offset+octet-stream"
UploadId = Annotated[str, Path(description="the upload's id, from its Location", max_length=64)]
BYTE_COUNT = re.compile(r"[0-9]{1,19}")  # ASCII digits only, below 2**63: Upload-Length, Upload-Offset


def _byte_count(value: str | None) -> int | None:
    """The header's whole number of bytes, or None when it is missing or not 1-19 ASCII digits."""
    return int(value) if value is not None and BYTE_COUNT.fullmatch(value) else None


def _error(description: str) -> dict:
    return {"model": ErrorBody, "description": description}


def _require_tus(version: str | None) -> None:
    if version != TUS_VERSION:
        raise ApiError(412, "tus_version",
                       f"send Tus-Resumable: {TUS_VERSION} (the tus protocol version this server speaks)",
                       {"Tus-Version": TUS_VERSION})  # fmt: skip


@router.options(
    "", status_code=204, summary="What the uploads speak: tus version, extensions, the largest upload"
)
def capabilities(settings: SettingsDep) -> Response:
    return Response(status_code=204, headers={
        **TUS, "Tus-Version": TUS_VERSION, "Tus-Extension": "creation,termination",
        "Tus-Max-Size": str(settings.max_job_upload_bytes),
    })  # fmt: skip


@router.post(
    "",
    status_code=201,
    summary="Create an upload of Upload-Length bytes (tus creation)",
    responses={201: {"description": "created; send its bytes to the Location with PATCH"},
               400: _error("no valid Upload-Length or Upload-Metadata"), 412: _error("not tus 1.0.0"),
               413: _error("over max_job_upload_bytes"), 429: _error("max_uploads_per_key unfinished uploads"),
               507: _error("over the jobs' disk quota")},
)  # fmt: skip
def create_upload(
    caller: CallerDep,
    settings: SettingsDep,
    runner: RunnerDep,
    tus_resumable: Annotated[str | None, Header()] = None,
    upload_length: Annotated[str | None, Header(description="the upload's size in bytes")] = None,
    upload_metadata: Annotated[str | None, Header(description="tus metadata: filename BASE64")] = None,
) -> Response:
    _require_tus(tus_resumable)
    length = _byte_count(upload_length)
    if not length:
        raise ApiError(400, "invalid_upload_length",
                       "send Upload-Length: the image's size in bytes, a whole number above 0 in ASCII digits")  # fmt: skip
    if length > settings.max_job_upload_bytes:
        raise ApiError(413, "payload_too_large",
                       f"an upload is at most {settings.max_job_upload_bytes:,} bytes (max_job_upload_bytes); this "
                       f"one declares {length:,}")  # fmt: skip
    name = upload_store.file_name(upload_metadata)
    room = runner.quota.room()
    if disk_blocks(length) > room:  # refused at once; the bytes are reserved as they arrive
        raise QuotaExceeded(room)
    upload_id = upload_store.new_id()
    runner.quota.reserve(upload_reservation(upload_id), 0)
    try:
        upload_store.create(
            runner.root, upload_id, caller.owner, length, name, most=settings.max_uploads_per_key
        )
    except BaseException:
        runner.quota.release(upload_reservation(upload_id))
        raise
    return Response(status_code=201, headers={**TUS, "Location": f"/v1/uploads/{upload_id}"})


@router.head("/{upload_id}", summary="How many bytes the upload holds (Upload-Offset)",
             responses={404: {"description": "no such upload of yours"}})  # fmt: skip
def upload_offset(upload_id: UploadId, caller: CallerDep, runner: RunnerDep) -> Response:
    described, offset = upload_store.info(runner.root, upload_id, caller.owner)
    return Response(status_code=200, headers={
        **TUS, "Upload-Offset": str(offset), "Upload-Length": str(described.length), "Cache-Control": "no-store",
    })  # fmt: skip


@router.patch(
    "/{upload_id}",
    status_code=204,
    summary="Send bytes from Upload-Offset on; bytes received before a cut-off are kept",
    openapi_extra={"requestBody": {"required": True, "content": {
        OFFSET_TYPE: {"schema": {"type": "string", "format": "binary"}}}}},
    responses={400: _error("no valid Upload-Offset"), 404: _error("no such upload of yours"),
               409: _error("Upload-Offset is not the bytes held"), 412: _error("not tus 1.0.0"),
               413: _error("more bytes than Upload-Length"), 415: _error(f"not {OFFSET_TYPE}")},
)  # fmt: skip
async def send_bytes(
    upload_id: UploadId,
    request: Request,
    caller: CallerDep,
    runner: RunnerDep,
    tus_resumable: Annotated[str | None, Header()] = None,
    upload_offset: Annotated[str | None, Header(description="where these bytes start")] = None,
) -> Response:
    _require_tus(tus_resumable)
    if request.headers.get("content-type", "").partition(";")[0].strip().lower() != OFFSET_TYPE:
        raise ApiError(415, "unsupported_media_type", f"send the bytes as Content-Type: {OFFSET_TYPE}")
    given = _byte_count(upload_offset)
    if given is None:
        raise ApiError(400, "invalid_upload_offset",
                       "send Upload-Offset: where these bytes start (HEAD gives it), in ASCII digits")  # fmt: skip
    described, offset = await asyncio.to_thread(upload_store.info, runner.root, upload_id, caller.owner)
    if given != offset:
        raise upload_store.offset_mismatch(upload_id, given, offset)
    reservation = await asyncio.to_thread(
        GrowingReservation, runner.quota, upload_reservation(upload_id), disk_blocks(described.length)
    )

    async def append(data: bytes) -> int:  # the disk reserved first (507 past the quota), then written
        await asyncio.to_thread(reservation.cover, disk_blocks(offset + len(data)))
        return await asyncio.to_thread(upload_store.append, runner.root, upload_id, offset, data)

    batch = bytearray()
    try:
        async for chunk in request.stream():
            if offset + len(batch) + len(chunk) > described.length:
                raise ApiError(413, "upload_too_long",
                               f"upload {upload_id} declared {described.length:,} bytes; these go past it")  # fmt: skip
            batch += chunk
            if len(batch) >= WRITE_BATCH:
                offset = await append(bytes(batch))
                batch.clear()
    finally:  # what arrived before a cut-off or a refusal is kept: the client resumes after it
        if batch:
            offset = await append(bytes(batch))
    return Response(status_code=204, headers={**TUS, "Upload-Offset": str(offset)})


@router.delete("/{upload_id}", status_code=204, summary="Delete an upload (tus termination)",
               responses={404: _error("no such upload of yours"), 412: _error("not tus 1.0.0")})  # fmt: skip
def delete_upload(
    upload_id: UploadId,
    caller: CallerDep,
    runner: RunnerDep,
    tus_resumable: Annotated[str | None, Header()] = None,
) -> Response:
    _require_tus(tus_resumable)
    upload_store.info(runner.root, upload_id, caller.owner)
    upload_store.remove(runner.root, upload_id)
    runner.quota.release(upload_reservation(upload_id))
    return Response(status_code=204, headers=TUS)
