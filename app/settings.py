"""Service settings, from ``DENSECNN_*`` environment variables (or keyword arguments); invalid values fail at start."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from densecnn.ops import BACKENDS

SHIPPED_MODELS = Path(__file__).resolve().parent.parent / "models"
MiB = 1 << 20


class Settings(BaseSettings):
    """What the service serves, how much work and memory one request may take, and how long a client may take.

    Every field can be set as an environment variable with the ``DENSECNN_`` prefix, e.g.
    ``DENSECNN_MAX_UPLOAD_BYTES=5000000``. docs/service.md explains the memory bound these limits give.
    """

    model_config = SettingsConfigDict(env_prefix="DENSECNN_", extra="forbid")

    model_dir: Path = Field(
        SHIPPED_MODELS, description="directory whose subdirectories are model directories"
    )
    default_model: str = Field("nuclei", description="the model the web page selects first")
    backend: Literal[BACKENDS] = Field(  # the library's vocabulary, not a copy of it
        "auto",
        description="dense ops: auto (timed solver choice per image size, cached on disk), native, ext",
    )
    # --- what one request may cost ---
    max_upload_bytes: int = Field(20_000_000, gt=0, description="larger request bodies get 413")
    max_image_pixels: int = Field(
        16_000_000,
        gt=0,
        description="larger images (width x height; voxels of a volume, samples of a signal; from their header) "
        "get 413",
    )
    max_decode_bytes: int = Field(
        64 * MiB,
        gt=0,
        description="images whose decoded array (width x height x samples x planes x bytes per sample, from their "
        "header) is larger get 413 before decoding",
    )
    max_inference_memory: int = Field(
        512 * MiB, gt=0, description="bytes of activations per inference; bigger images run tiled"
    )
    warm_sizes: list[list[int]] = Field(
        [[512, 512]],
        description="image sizes (one entry per spatial axis, e.g. [512, 512] or [64, 256, 256]) each model with "
        "that many axes runs once at start-up, before /readyz says ready, so the first request of that size is as "
        "fast as the next; [] skips it",
    )
    # --- how much work the process accepts ---
    max_concurrent_inferences: int = Field(1, gt=0, description="inferences running at once per worker")
    queue_size: int = Field(4, ge=0, description="requests waiting for an inference slot; beyond: 503")
    max_receiving_uploads: int = Field(
        8,
        gt=0,
        description="segment request bodies being received at once per worker (before they take an inference "
        "place, so that slow senders hold none); beyond: 503",
    )
    max_receiving_per_client: int = Field(
        4, gt=0, description="of those, from one client address; beyond: 503"
    )
    request_timeout: float = Field(
        60.0, gt=0, description="seconds a request may wait and run; beyond: 503, and its job is abandoned"
    )
    retry_after: int = Field(1, ge=0, description="seconds in the Retry-After header of 503 answers")
    torch_threads: int = Field(default_factory=lambda: os.cpu_count() or 1, gt=0, description="per worker")
    # --- what stays in memory between requests ---
    # not output_cache_mb / plan_cache_size: their DENSECNN_ variables are the library's settings (densecnn.ops.config
    # reads them, with the library's defaults), which these per-worker values replace in the service
    worker_output_cache_mb: int = Field(
        256,
        ge=0,
        description="megabytes of free output buffers densecnn's kernels keep for reuse per worker (0: none)",
    )
    worker_plan_cache_size: int = Field(
        16,
        ge=1,
        description="solver plans each model keeps per worker, one per image size seen; least recent dropped",
    )
    # --- slow and idle clients (the last four are uvicorn's, applied by `densecnn serve`) ---
    upload_timeout: float = Field(
        30.0, gt=0, description="seconds the request body may take to arrive; beyond: 408"
    )
    header_timeout: float = Field(
        10.0, gt=0, description="seconds a connection may take to send a request's headers; beyond: closed"
    )
    keep_alive_timeout: int = Field(5, gt=0, description="seconds an idle keep-alive connection stays open")
    max_connections: int = Field(
        100, gt=0, description="open connections per worker; beyond: 503 (JSON, Retry-After) and closed"
    )
    max_connections_per_client: int = Field(
        16,
        gt=0,
        description="open connections per worker from one client address, so that one client cannot take them "
        "all; beyond: 503 (JSON, Retry-After) and closed",
    )
    max_header_bytes: int = Field(
        32 * 1024,
        gt=0,
        description="bytes of a request's line and headers; beyond: 431 (JSON) and closed",
    )

    # --- jobs: images of any size, labelled block by block (docs/service.md, "Jobs") ---
    data_dir: Path = Field(
        default_factory=lambda: (
            Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local/share") / "densecnn"
        ),
        description="where jobs keep their uploads and results, and the job and key database when database_url is "
        "unset (default: ~/.local/share/densecnn)",
    )
    database_url: str | None = Field(
        None,
        description="SQLAlchemy URL of the job and key database (e.g. postgresql://user@host/densecnn); default: "
        "the SQLite file jobs.db in data_dir",
    )
    data_roots: list[Path] = Field(
        [],
        description="directories whose files and zarr stores jobs may read as server-side inputs ([]: uploads only)",
    )
    max_running_jobs: int = Field(
        1, gt=0, description="jobs running at once per worker; the others wait queued"
    )
    job_workers: int = Field(
        1,
        gt=0,
        description="Dask worker processes of a job's local cluster (1: one thread in the server process)",
    )
    job_scheduler: str | None = Field(
        None,
        description="a running Dask scheduler (tcp://host:8786) to run jobs on instead of a local cluster",
    )
    job_block: int = Field(
        1024, gt=0, description="about how many pixels per side one task of a job computes (whole chunks)"
    )
    job_task_memory: int | None = Field(
        None,
        gt=0,
        description="bytes one block task of a job may use, its window and inference together (default and "
        "ceiling: max_job_memory)",
    )
    max_job_memory: int = Field(
        2 << 30,
        gt=0,
        description="bytes one block task of a job may hold: a job whose output chunk's window and buffer would "
        "not fit (estimated before it starts) gets 422; the engine groups chunks and tiles inference within it",
    )
    max_job_upload_bytes: int = Field(
        4 << 30, gt=0, description="larger uploads to POST /v1/jobs get 413 (they are streamed to disk)"
    )
    disk_quota_bytes: int = Field(
        20 << 30,
        gt=0,
        description="bytes the jobs' uploads and results may take under data_dir; a new job that would pass it "
        "gets 507",
    )
    job_retention: float = Field(
        7 * 24 * 3600.0, gt=0, description="seconds a finished job and its files are kept; then deleted"
    )
    upload_idle_seconds: float = Field(
        24 * 3600.0,
        gt=0,
        description="seconds an unfinished resumable upload is kept after the last bytes it received (or its "
        "creation); then deleted, and so are a killed job upload's leftovers",
    )
    job_poll_seconds: float = Field(
        5.0,
        gt=0,
        description="how often each worker renews its jobs' heartbeats, takes over jobs whose worker stopped "
        "(no heartbeat for 3 periods) and deletes expired ones",
    )
    # --- who may call (docs/service.md, "Security") ---
    require_keys: bool = Field(
        False,
        description="every /v1 request needs Authorization: Bearer KEY (densecnn keys add NAME); `densecnn serve` "
        "turns it on when it binds to a non-loopback address",
    )
    max_jobs_per_key: int = Field(4, gt=0, description="queued and running jobs per key; beyond: 429")
    max_uploads_per_key: int = Field(4, gt=0, description="unfinished resumable uploads per key; beyond: 429")
    requests_per_minute: int = Field(
        600, gt=0, description="/v1 requests per key (or client address without keys) per worker; beyond: 429"
    )
    failed_auth_per_minute: int = Field(
        10,
        gt=0,
        description="requests with a wrong (or, where keys are required, missing) key per client address and "
        "worker; beyond: 429 with Retry-After, whatever key is sent",
    )
    public_metrics: bool = Field(
        False,
        description="/metrics answers without a key even where keys are required (a scraper on a trusted "
        "network); otherwise it needs a valid key there",
    )
    cors_origins: list[str] = Field(
        [], description='origins whose pages may call the API from a browser (e.g. ["https://lab.example"])'
    )

    @property
    def database(self) -> str:
        """The database URL in effect."""
        return self.database_url or f"sqlite:///{(self.data_dir / 'jobs.db').resolve()}"

    def request_memory_bound(self, in_channels: int = 3, dims: int = 2, probability_classes: int = 0) -> int:
        """Bytes one request may add to a worker's memory, for a model of ``in_channels`` input channels and
        ``dims`` spatial axes (``max_image_pixels`` counts the voxels of a volume, the samples of a signal).

        The body (held as received, parsed and read: 3 x ``max_upload_bytes``), the decoder's buffer and the decoded
        array (2 x ``max_decode_bytes``), the float32 model input (4 x ``max_image_pixels`` x channels), and the
        inference with its padded copy and result (``max_inference_memory``, which the dense net's tiling respects).
        Volumes and signals add the channel-first copy of the decoded array (``max_decode_bytes``) and their label
        ids (up to 2 bytes per voxel) before encoding. An npy answer of ``probability_classes`` class probabilities
        adds their float32 array and its encoded bytes (8 bytes per class and pixel); label answers pass 0.
        The defaults give 923 MB (0.86 GiB) for an RGB image model (measured peaks in docs/service.md).
        """
        bound = (
            3 * self.max_upload_bytes
            + 2 * self.max_decode_bytes
            + 4 * self.max_image_pixels * in_channels
            + self.max_inference_memory
        )
        if dims != 2:
            bound += self.max_decode_bytes + 2 * self.max_image_pixels
        return bound + 8 * probability_classes * self.max_image_pixels

    @field_validator("data_roots")
    @classmethod
    def _data_roots_exist(cls, value: list[Path]) -> list[Path]:
        missing = [str(root) for root in value if not root.is_dir()]
        if missing:
            raise ValueError(
                f"{', '.join(missing)}: not a directory; DENSECNN_DATA_ROOTS lists directories jobs may read from"
            )
        return value

    @field_validator("database_url")
    @classmethod
    def _database_url_usable(cls, value: str | None) -> str | None:
        """A URL SQLAlchemy reads, of a database whose driver is installed (else the first request would fail)."""
        if value is None:
            return value
        from sqlalchemy.engine import make_url
        from sqlalchemy.exc import ArgumentError, NoSuchModuleError

        try:
            url = make_url(value)
            url.get_dialect().import_dbapi()
        except (ArgumentError, NoSuchModuleError, ValueError):
            raise ValueError(
                f"{value!r} is not a database URL SQLAlchemy reads; give one such as "
                "sqlite:////var/lib/densecnn/jobs.db or postgresql+psycopg://user@host/densecnn"
            ) from None
        except ImportError as exc:
            raise ValueError(
                f"the driver of {url.drivername} is not installed ({exc.name or exc}); install it (e.g. pip install "
                "'psycopg[binary]' for postgresql+psycopg), or name an installed one in the URL"
            ) from None
        return value

    @field_validator("model_dir")
    @classmethod
    def _model_dir_exists(cls, value: Path) -> Path:
        if not value.is_dir():
            raise ValueError(
                f"{value} is not a directory; set DENSECNN_MODEL_DIR (or --model-dir) to a directory of models"
            )
        return value
