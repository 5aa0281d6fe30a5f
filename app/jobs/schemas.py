"""The bodies of the jobs API (they are also its OpenAPI schemas)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .admission import MAX_CHUNK, MAX_LEVEL, MIN_CHUNK
from .db import JobRecord, State


class JobRequest(BaseModel):
    """A job on a server-side input or a finished resumable upload (an upload in the body takes the same options
    as query parameters)."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(description="model name, see GET /v1/models", max_length=200)
    input: str | None = Field(
        None,
        description="a zarr array or OME-Zarr image, (Big)TIFF, whole-slide image, .npy or image file, relative to "
        "one of the server's data roots (or absolute inside one)",
        examples=["slides/tissue.ome.zarr"],
    )
    upload: str | None = Field(
        None,
        max_length=64,
        description="the id of a complete resumable upload (POST /v1/uploads); it becomes the job's input",
    )
    chunk: int | None = Field(
        None,
        ge=MIN_CHUNK,
        le=MAX_CHUNK,
        strict=True,
        description="output chunk side (default: the input's chunks, made smaller where they would not fit the "
        "server's max_job_memory); a chunk whose estimated memory passes max_job_memory gets 422",
    )
    level: int | None = Field(
        None, ge=0, le=MAX_LEVEL, strict=True, description="the OME-Zarr input's resolution level"
    )
    intensity: str | None = Field(
        None,
        max_length=100,
        description="dtype, range:LOW,HIGH or percentiles:LOW,HIGH; default: as the model declares",
    )
    nonfinite: Literal["refuse", "propagate"] = Field(
        "refuse",
        description="NaN/±Inf pixels: fail the job (default), or propagate them as no-data (the label type's "
        "maximum, 255 in uint8, 65535 in uint16, where a pixel's patch reads one)",
    )

    @model_validator(mode="after")
    def one_input(self) -> JobRequest:
        if (self.input is None) == (self.upload is None):
            raise ValueError(
                "name the input: either 'input' (a server-side path) or 'upload' (an upload's id)"
            )
        if self.input is not None and not self.input.strip():
            raise ValueError(
                "'input' is empty; give the path of an image, TIFF, .npy or zarr store under one of the "
                "server's data roots"
            )
        if self.upload is not None and not self.upload.strip():
            raise ValueError("'upload' is empty; give the id of a complete upload (POST /v1/uploads)")
        return self


class Progress(BaseModel):
    blocks_done: int = Field(description="output chunks written (a whole image counts as one)")
    blocks_total: int = Field(description="0 until the job has started")
    fraction: float
    pixels_per_second: float | None = Field(description="in the current run; None before its first block")
    eta_seconds: float | None = Field(description="at the current run's pace; None before its first block")


class Job(BaseModel):
    id: str
    state: State
    model: str
    model_version: str | None = Field(
        description="the version of the model the job runs with: the model's `version` (GET /v1/models/NAME) "
        "when the job first started, kept for the whole job; null until it starts"
    )
    input: str = Field(description="the upload's file name, or the server-side path as given")
    created: float = Field(description="Unix time")
    started: float | None
    finished: float | None
    progress: Progress
    error: str | None = Field(description="why the job failed")
    cancel_requested: bool
    shape: list[int] | None = Field(description="[height, width] of the result, once the job has succeeded")
    results: dict[str, str] = Field(
        description="links to the results, once the job has succeeded: 'zarr' (the label store, file by file), "
        "'png' / 'tiff' (one label image, for results within the image limits)"
    )

    @classmethod
    def of(cls, job: JobRecord) -> Job:
        computed, seconds = job.blocks_computed, job.run_seconds
        pace = computed / seconds if computed and seconds > 0 else None
        remaining = job.blocks_total - job.blocks_done
        base = f"/v1/jobs/{job.id}/result"
        results = {}
        if job.state == State.succeeded.value:
            kinds = job.result.split("+")
            results = {"zarr": f"{base}.zarr/"} if "zarr" in kinds else {}
            if "png" in kinds:
                results.update(png=f"{base}.png", tiff=f"{base}.tif")
            if "tiff" in kinds:
                results["tiff"] = f"{base}.tif"
        return cls(
            id=job.id, state=State(job.state), model=job.model, model_version=job.model_version or None,
            input=job.input_name, created=job.created,
            started=job.started, finished=job.finished, error=job.error, cancel_requested=job.cancel_requested,
            shape=[job.height, job.width] if job.height is not None else None, results=results,
            progress=Progress(
                blocks_done=job.blocks_done, blocks_total=job.blocks_total,
                fraction=job.blocks_done / job.blocks_total if job.blocks_total else 0.0,
                pixels_per_second=job.pixels / seconds if computed and seconds > 0 else None,
                eta_seconds=remaining / pace if pace and job.state == State.running.value else None,
            ),
        )  # fmt: skip


class JobList(BaseModel):
    jobs: list[Job]
