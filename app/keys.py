"""API keys: a random secret given once to its holder; the database keeps only its SHA-256 and the key's name.

The jobs made with a key are owned by the key's id (:func:`owner_id`, from its digest), never by its name: a key
removed and added again under the same name is a new key, which sees none of the old one's jobs. Create keys with ``densecnn keys add NAME`` (docs/service.md, "Security").
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass

from sqlalchemy import func, select, update
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from densecnn.errors import InvalidInputError

from .jobs.db import JobRecord, KeyRecord

PREFIX = "dcnn_"
_NAME = re.compile(r"[A-Za-z0-9._@-]{1,200}")


def digest(secret: str) -> str:
    """What is stored of a key: SHA-256 suffices for 256 random bits (no dictionary to guess from)."""
    return hashlib.sha256(secret.encode()).hexdigest()


def owner_id(key_digest: str) -> str:
    """The owner of a key's jobs and uploads: unique to the key (its digest's first 128 bits), not to its name.

    >>> owner_id(digest("dcnn_secret"))
    'key-5d0c...'
    """
    return f"key-{key_digest[:32]}"


@dataclass(frozen=True)
class KeyHolder:
    name: str  # as messages name the key
    owner: str  # owner_id: what owns its jobs


class KeyStore:
    def __init__(self, engine: Engine):
        self.engine = engine

    def add(self, name: str) -> str:
        """A new key called ``name``; returns its secret, which is not stored and cannot be shown again."""
        if not _NAME.fullmatch(name):
            raise InvalidInputError(f"key name {name!r}: use 1-200 letters, digits and . _ @ -")
        secret = PREFIX + secrets.token_urlsafe(32)
        try:
            with Session(self.engine) as session:
                session.add(KeyRecord(name=name, digest=digest(secret)))
                session.commit()
        except IntegrityError:
            raise InvalidInputError(
                f"a key named {name!r} exists; remove it first (densecnn keys remove {name}) or choose another name"
            ) from None
        return secret

    def remove(self, name: str) -> bool:
        with Session(self.engine) as session:
            key = session.get(KeyRecord, name)
            if key is None:
                return False
            session.delete(key)
            session.commit()
        return True

    def names(self) -> list[str]:
        with Session(self.engine) as session:
            return list(session.scalars(select(KeyRecord.name).order_by(KeyRecord.name)))

    def count(self) -> int:
        with Session(self.engine) as session:
            return session.scalar(select(func.count()).select_from(KeyRecord)) or 0

    def holder(self, secret: str) -> KeyHolder | None:
        """The key ``secret`` (its name and owner id), or None when no key has it."""
        key_digest = digest(secret)
        with Session(self.engine) as session:
            name = session.scalar(select(KeyRecord.name).where(KeyRecord.digest == key_digest))
        return None if name is None else KeyHolder(name, owner_id(key_digest))

    def adopt_named_jobs(self) -> None:
        """Jobs recorded when keys' names owned them pass to the key of that name that existed when they were made
        (a job older than the key of its name stays with nobody, and expires). Run at start; idempotent."""
        with Session(self.engine) as session:
            for name, key_digest, created in session.execute(
                select(KeyRecord.name, KeyRecord.digest, KeyRecord.created)
            ):
                session.execute(
                    update(JobRecord)
                    .where(JobRecord.owner == name, JobRecord.created >= created)
                    .values(owner=owner_id(key_digest))
                )
            session.commit()
