"""The jobs' disk quota as reservations in the database: bytes are reserved *before* they are written (an upload's
declared length, a streamed job upload's declared or maximal length, a job's estimated results), each reservation
granted atomically only while the sum stays within ``disk_quota_bytes``, and trued up to the disk blocks the files
really take once they are written. Admission never walks the jobs' directory.

Bytes whose length is not known up front (a resumable upload's PATCHes, a chunked job upload) are reserved as they
arrive (:class:`GrowingReservation`), so an upload that sends nothing holds no quota.

>>> quota = Quota(engine, 8_000_000)
>>> quota.reserve("upload-ab12", 6_000_000)      # granted
>>> quota.reserve("upload-cd34", 6_000_000)      # QuotaExceeded: 2,000,000 bytes left
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

from sqlalchemy import delete, func, insert, literal, select, update
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from ..errors import ApiError
from .db import Reservation


class QuotaExceeded(ApiError):
    """A new job or upload would take the jobs' files past the disk quota."""

    def __init__(self, room: int):
        super().__init__(
            507,
            "quota_exceeded",
            f"the jobs' disk quota leaves room for {max(room, 0):,} bytes, less than this job needs; delete "
            "finished jobs (DELETE /v1/jobs/ID) or wait until they expire, then submit it again",
        )


def upload_reservation(upload_id: str) -> str:
    """The reservation id of a resumable upload (jobs' reservations are their ids)."""
    return f"upload-{upload_id}"


class Quota:
    def __init__(self, engine: Engine, limit: int):
        self.engine, self.limit = engine, limit

    def used(self) -> int:
        """Bytes reserved in all."""
        with Session(self.engine) as session:
            return int(session.scalar(select(func.coalesce(func.sum(Reservation.bytes), 0))))

    def room(self) -> int:
        return self.limit - self.used()

    def reserve(self, name: str, nbytes: int) -> None:
        """Reserve ``nbytes`` under ``name`` (new), in one statement that grants it only within the quota.

        Raises QuotaExceeded with the room left otherwise."""
        total = select(func.coalesce(func.sum(Reservation.bytes), 0)).scalar_subquery()
        granted = select(literal(name), literal(nbytes), literal(time.time())).where(
            total + nbytes <= self.limit
        )
        with Session(self.engine) as session:
            done = session.execute(
                insert(Reservation).from_select(["id", "bytes", "updated"], granted)
            ).rowcount
            session.commit()
        if not done:
            raise QuotaExceeded(self.room())

    def grow(self, name: str, nbytes: int) -> None:
        """Add ``nbytes`` to the reservation ``name``, within the quota (QuotaExceeded otherwise)."""
        total = select(func.coalesce(func.sum(Reservation.bytes), 0)).scalar_subquery()
        with Session(self.engine) as session:
            done = session.execute(
                update(Reservation)
                .where(Reservation.id == name, total + nbytes <= self.limit)
                .values(bytes=Reservation.bytes + nbytes, updated=time.time())
            ).rowcount
            session.commit()
        if not done:
            raise QuotaExceeded(self.room())

    def reserved(self, name: str) -> int:
        """Bytes reserved under ``name`` (0 for none)."""
        with Session(self.engine) as session:
            return int(session.scalar(select(Reservation.bytes).where(Reservation.id == name)) or 0)

    def set(self, name: str, nbytes: int) -> None:
        """The reservation ``name`` becomes ``nbytes`` (what its files were measured to take)."""
        with Session(self.engine) as session:
            session.execute(
                update(Reservation).where(Reservation.id == name).values(bytes=nbytes, updated=time.time())
            )
            session.commit()

    def rename(self, old: str, new: str) -> None:
        """Hand the reservation ``old`` over to ``new`` (an upload that becomes a job's input)."""
        with Session(self.engine) as session:
            session.execute(update(Reservation).where(Reservation.id == old).values(id=new))
            session.commit()

    def release(self, name: str) -> None:
        with Session(self.engine) as session:
            session.execute(delete(Reservation).where(Reservation.id == name))
            session.commit()

    def names(self) -> set[str]:
        with Session(self.engine) as session:
            return set(session.scalars(select(Reservation.id)))


BLOCK = 4096  # bytes of a file system block: the least a file takes
GROWTH_STEP = 64 << 20  # a growing reservation takes this many bytes more at a time (fewer database writes)


def disk_blocks(nbytes: int) -> int:
    """The disk ``nbytes`` take at most: whole blocks of :data:`BLOCK` bytes."""
    return -(-nbytes // BLOCK) * BLOCK


class GrowingReservation:
    """The reservation ``name``, grown ahead of the bytes written under it, at most to ``limit`` bytes.

    >>> reservation = GrowingReservation(quota, "job-ab12", limit=4 << 30)   # reserved (0 bytes) already
    >>> reservation.cover(disk_blocks(received))   # before writing: QuotaExceeded when the quota has no room
    """

    def __init__(self, quota: Quota, name: str, limit: int):
        self.quota, self.name, self.limit = quota, name, limit
        self.held = quota.reserved(name)

    def cover(self, nbytes: int) -> None:
        """Hold at least ``nbytes`` (the disk they take), growing by :data:`GROWTH_STEP` at a time where the quota
        and ``limit`` leave room for it, else by just what is needed."""
        needed = nbytes - self.held
        if needed <= 0:
            return
        step = min(max(needed, GROWTH_STEP), max(self.limit - self.held, needed))
        try:
            self.quota.grow(self.name, step)
        except QuotaExceeded:
            if step == needed:
                raise
            self.quota.grow(self.name, step := needed)
        self.held += step


def disk_usage(path: Path) -> int:
    """Bytes of disk the file ``path``, or the files under the directory ``path``, take, in allocated blocks (``st_blocks`` × 512: a sparse file counts
    what it holds, a 1-byte file a whole block); symlinks not followed, files vanishing meanwhile skipped."""
    if path.is_file():
        return path.lstat().st_blocks * 512
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(FileNotFoundError):
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
    return total
