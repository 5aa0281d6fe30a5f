"""Reading and changing job records. Every read a caller makes is scoped to its owner; a job another owner holds is
as absent as one that never existed.

Several worker processes can share the database: a worker *claims* a job (compare-and-set on its ``runner`` and
``heartbeat``) before running it, renews the heartbeats of the jobs it holds, and releases them when it stops; a
job whose worker stopped without releasing it is claimed by another once its heartbeat is stale.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from sqlalchemy import func, insert, literal, select, update
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

from .db import UNFINISHED, JobRecord, State


class JobStore:
    def __init__(self, engine: Engine):
        self.engine = engine

    def add(self, job: JobRecord, max_unfinished: int) -> bool:
        """Record ``job`` unless its owner has ``max_unfinished`` jobs queued or running: one statement, so that
        simultaneous requests of one owner cannot all pass the count (False: refused)."""
        columns = [column for column in JobRecord.__table__.columns if getattr(job, column.key) is not None]
        unfinished = (
            select(func.count())
            .select_from(JobRecord)
            .where(JobRecord.owner == job.owner, JobRecord.state.in_(UNFINISHED))
            .scalar_subquery()
        )
        row = select(*(literal(getattr(job, c.key), c.type) for c in columns)).where(
            unfinished < max_unfinished
        )
        with Session(self.engine) as session:
            added = session.execute(insert(JobRecord).from_select([c.key for c in columns], row)).rowcount
            session.commit()
        return bool(added)

    def get(self, job_id: str, owner: str | None = None) -> JobRecord | None:
        """The job ``job_id``; None if it does not exist or (with ``owner``) belongs to someone else."""
        with Session(self.engine, expire_on_commit=False) as session:
            job = session.get(JobRecord, job_id)
        return job if job is not None and (owner is None or job.owner == owner) else None

    def list(self, owner: str, limit: int = 100) -> list[JobRecord]:
        """The owner's jobs, newest first."""
        with Session(self.engine, expire_on_commit=False) as session:
            query = select(JobRecord).where(JobRecord.owner == owner).order_by(JobRecord.created.desc())
            return list(session.scalars(query.limit(limit)))

    def unfinished(self, owner: str) -> int:
        """How many of the owner's jobs are queued or running."""
        with Session(self.engine) as session:
            query = select(func.count()).where(JobRecord.owner == owner, JobRecord.state.in_(UNFINISHED))
            return session.scalar(query) or 0

    def count_by_state(self) -> dict[str, int]:
        with Session(self.engine) as session:
            rows = session.execute(select(JobRecord.state, func.count()).group_by(JobRecord.state))
            return {state: count for state, count in rows}

    def set(self, job_id: str, **values) -> None:
        with Session(self.engine) as session:
            session.execute(update(JobRecord).where(JobRecord.id == job_id).values(**values))
            session.commit()

    def finish(self, job_id: str, state: State, **values) -> None:
        """End the job ``job_id`` in ``state``; its worker lets go of it."""
        self.set(job_id, state=state.value, finished=time.time(), runner=None, **values)

    def request_cancel(self, job_id: str) -> bool:
        """Cancel a queued job at once (True), or ask the worker running it to stop (False)."""
        with Session(self.engine) as session:
            queued = session.execute(
                update(JobRecord)
                .where(JobRecord.id == job_id, JobRecord.state == State.queued.value)
                .values(state=State.cancelled.value, finished=time.time(), cancel_requested=True, runner=None)
            ).rowcount
            if not queued:
                session.execute(
                    update(JobRecord)
                    .where(JobRecord.id == job_id, JobRecord.state == State.running.value)
                    .values(cancel_requested=True)
                )
            session.commit()
        return bool(queued)

    def delete(self, job_id: str) -> None:
        with Session(self.engine) as session:
            job = session.get(JobRecord, job_id)
            if job is not None:
                session.delete(job)
                session.commit()

    def claimable(self, stale_before: float) -> list[JobRecord]:
        """Unfinished jobs that no worker holds, or whose worker's heartbeat is older than ``stale_before``."""
        with Session(self.engine, expire_on_commit=False) as session:
            query = select(JobRecord).where(
                JobRecord.state.in_(UNFINISHED),
                (JobRecord.runner.is_(None)) | (JobRecord.heartbeat < stale_before),
            )
            return list(session.scalars(query.order_by(JobRecord.created)))

    def claim(self, job: JobRecord, runner: str) -> bool:
        """Take ``job`` for ``runner``, unless another worker took it since it was read."""
        with Session(self.engine) as session:
            taken = session.execute(
                update(JobRecord)
                .where(
                    JobRecord.id == job.id,
                    JobRecord.state.in_(UNFINISHED),
                    JobRecord.heartbeat == job.heartbeat,
                    JobRecord.runner.is_(None) if job.runner is None else JobRecord.runner == job.runner,
                )
                .values(runner=runner, heartbeat=time.time(), state=State.queued.value)
            ).rowcount
            session.commit()
        return bool(taken)

    def renew(self, job_ids: Iterable[str], runner: str) -> None:
        """Say that ``runner`` still holds ``job_ids``."""
        job_ids = list(job_ids)
        if job_ids:
            self._held(job_ids, runner, {"heartbeat": time.time()})

    def release(self, job_ids: Iterable[str], runner: str) -> None:
        """Let go of unfinished jobs (the server stops): they go back to the queue, for the next worker to resume."""
        job_ids = list(job_ids)
        if job_ids:
            self._held(job_ids, runner, {"runner": None, "state": State.queued.value, "heartbeat": 0.0})

    def _held(self, job_ids: list[str], runner: str, values: dict) -> None:
        with Session(self.engine) as session:
            session.execute(
                update(JobRecord)
                .where(JobRecord.id.in_(job_ids), JobRecord.runner == runner, JobRecord.state.in_(UNFINISHED))
                .values(**values)
            )
            session.commit()

    def expired(self, finished_before: float) -> list[JobRecord]:
        with Session(self.engine, expire_on_commit=False) as session:
            query = select(JobRecord).where(
                JobRecord.state.not_in(UNFINISHED), JobRecord.finished < finished_before
            )
            return list(session.scalars(query))
