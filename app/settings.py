"""Service settings, from ``DENSECNN_*`` environment variables (or keyword arguments); invalid values fail at start."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

SHIPPED_MODELS = Path(__file__).resolve().parent.parent / "models"


class Settings(BaseSettings):
    """What the service serves and how much work it accepts.

    Every field can be set as an environment variable with the ``DENSECNN_`` prefix, e.g.
    ``DENSECNN_MAX_UPLOAD_BYTES=5000000``.
    """

    model_config = SettingsConfigDict(env_prefix="DENSECNN_", extra="forbid")

    model_dir: Path = Field(
        SHIPPED_MODELS, description="directory whose subdirectories are model directories"
    )
    default_model: str = Field("nuclei", description="the model the web page selects first")
    max_upload_bytes: int = Field(20_000_000, gt=0, description="larger request bodies get 413")
    max_image_pixels: int = Field(16_000_000, gt=0, description="larger images (by their header) get 413")
    max_inference_memory: int = Field(
        2_000_000_000, gt=0, description="bytes of activations per inference; bigger images run tiled"
    )
    backend: Literal["auto", "native", "ext"] = Field(
        "auto",
        description="dense ops: auto (timed solver choice per image size, cached on disk), native, ext",
    )
    max_concurrent_inferences: int = Field(1, gt=0, description="inferences running at once per worker")
    queue_size: int = Field(4, ge=0, description="requests waiting for an inference slot; beyond: 503")
    request_timeout: float = Field(60.0, gt=0, description="seconds a request may wait and run; beyond: 503")
    retry_after: int = Field(1, ge=0, description="seconds in the Retry-After header of 503 answers")
    torch_threads: int = Field(default_factory=lambda: os.cpu_count() or 1, gt=0, description="per worker")

    @field_validator("model_dir")
    @classmethod
    def _model_dir_exists(cls, value: Path) -> Path:
        if not value.is_dir():
            raise ValueError(
                f"{value} is not a directory; set DENSECNN_MODEL_DIR (or --model-dir) to a directory of models"
            )
        return value
