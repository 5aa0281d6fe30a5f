"""The job and key tables, through SQLAlchemy: a SQLite file by default, any database by URL (PostgreSQL)."""

from __future__ import annotations

import time
from enum import Enum

from sqlalchemy import BigInteger, Float, Integer, String, Text, create_engine, event, inspect, text
from sqlalchemy.engine import Engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class State(str, Enum):
    queued = "queued"
    running = "running"
    succeeded = "succeeded"
    failed = "failed"
    cancelled = "cancelled"


UNFINISHED = (State.queued.value, State.running.value)


class Base(DeclarativeBase):
    pass


class JobRecord(Base):
    """One job: what it labels with which model, where it stands, and who owns it."""

    __tablename__ = "jobs"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    owner: Mapped[str] = mapped_column(
        String(200), index=True
    )  # the key's id (keys.owner_id), or "" without keys
    model: Mapped[str] = mapped_column(String(200))
    # the version of the model it runs with (the served model's identity when it first started; "" until then)
    model_version: Mapped[str] = mapped_column(String(64), default="", server_default="")
    input: Mapped[str] = mapped_column(Text)  # the input's path on the server
    input_name: Mapped[str] = mapped_column(
        Text
    )  # as the caller named it: a file name or a path under a root
    intensity: Mapped[str | None] = mapped_column(String(100), default=None)
    nonfinite: Mapped[str] = mapped_column(String(16), default="refuse", server_default="refuse")
    level: Mapped[int | None] = mapped_column(Integer, default=None)
    chunk: Mapped[int | None] = mapped_column(Integer, default=None)
    state: Mapped[str] = mapped_column(String(16), index=True, default=State.queued.value)
    error: Mapped[str | None] = mapped_column(Text, default=None)
    cancel_requested: Mapped[bool] = mapped_column(default=False)
    blocks_done: Mapped[int] = mapped_column(Integer, default=0)  # chunks (or the one image) written
    blocks_total: Mapped[int] = mapped_column(Integer, default=0)
    blocks_computed: Mapped[int] = mapped_column(Integer, default=0)  # of the done, in the current run
    pixels: Mapped[int] = mapped_column(Integer, default=0)  # computed in the current run
    run_seconds: Mapped[float] = mapped_column(Float, default=0.0)  # of the current run
    result: Mapped[str] = mapped_column(String(16), default="zarr")  # "zarr", "png", "zarr+png", "zarr+tiff"
    height: Mapped[int | None] = mapped_column(Integer, default=None)
    width: Mapped[int | None] = mapped_column(Integer, default=None)
    created: Mapped[float] = mapped_column(Float, default=time.time)
    started: Mapped[float | None] = mapped_column(Float, default=None)
    finished: Mapped[float | None] = mapped_column(Float, default=None)
    runner: Mapped[str | None] = mapped_column(String(100), default=None)  # the worker process holding it
    heartbeat: Mapped[float] = mapped_column(Float, default=0.0)  # when that worker last said it holds it


class Reservation(Base):
    """Disk the jobs' files may take, reserved before they are written: an upload's declared length, a job's input
    and estimated results (measured in disk blocks once it has finished). The quota is their sum."""

    __tablename__ = "reservations"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)  # a job's id, or "upload-" + an upload's id
    bytes: Mapped[int] = mapped_column(BigInteger)
    updated: Mapped[float] = mapped_column(Float, default=time.time)


class KeyRecord(Base):
    """An API key: its name and the SHA-256 of its secret (never the secret); its jobs are owned by an id derived from
    the digest, so a new key under a reused name owns none of the old key's jobs."""

    __tablename__ = "api_keys"

    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    digest: Mapped[str] = mapped_column(String(64), unique=True, index=True)
    created: Mapped[float] = mapped_column(Float, default=time.time)


def make_engine(url: str) -> Engine:
    """The database at ``url``, its tables created if missing. SQLite waits for a writer instead of failing."""
    sqlite = url.startswith("sqlite")
    engine = create_engine(url, connect_args={"timeout": 30, "check_same_thread": False} if sqlite else {})
    if sqlite:

        @event.listens_for(engine, "connect")
        def _wal(connection, _record):  # readers do not wait for the writer; several workers share the file
            connection.execute("PRAGMA journal_mode=WAL")

    Base.metadata.create_all(engine)
    _add_missing_columns(engine)
    return engine


def _add_missing_columns(engine: Engine) -> None:
    """Columns added to ``jobs`` since a database was created (``create_all`` adds tables, never columns), with
    their defaults: a database from an older version keeps working."""
    present = {column["name"] for column in inspect(engine).get_columns(JobRecord.__tablename__)}
    with engine.begin() as connection:
        for column in JobRecord.__table__.columns:
            if column.name not in present and column.server_default is not None:
                connection.execute(text(f"ALTER TABLE {JobRecord.__tablename__} ADD COLUMN {column.name} "
                                        f"{column.type.compile(engine.dialect)} DEFAULT '{column.server_default.arg}'"))  # fmt: skip
