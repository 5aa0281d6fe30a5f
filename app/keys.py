"""API keys: a random secret given once to its holder; the database keeps only its SHA-256 and the key's name.

A key's name owns the jobs made with it. Create keys with ``densecnn keys add NAME`` (docs/service.md, "Security").
"""

from __future__ import annotations

import hashlib
import re
import secrets

from sqlalchemy import func, select
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from densecnn.errors import InvalidInputError

from .jobs.db import KeyRecord

PREFIX = "dcnn_"
_NAME = re.compile(r"[A-Za-z0-9._@-]{1,200}")


def digest(secret: str) -> str:
    """What is stored of a key: SHA-256 suffices for 256 random bits (no dictionary to guess from)."""
    return hashlib.sha256(secret.encode()).hexdigest()


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

    def owner(self, secret: str) -> str | None:
        """The name of the key ``secret``, or None when no key has it."""
        with Session(self.engine) as session:
            return session.scalar(select(KeyRecord.name).where(KeyRecord.digest == digest(secret)))
