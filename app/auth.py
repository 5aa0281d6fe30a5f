"""Who is calling: ``Authorization: Bearer KEY`` names the key, whose id owns the jobs it makes; each key's requests
are rate-limited (per worker process), and so are each client address's failed authentications.

With ``require_keys`` off (the default, for ``make serve`` on localhost) a request without a key is the anonymous
caller (owner ""), whose jobs every anonymous caller sees; a request with a key is that key's, as when keys are
required. A wrong key is refused either way.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Request

from .errors import ApiError
from .keys import KeyStore
from .settings import Settings

ANONYMOUS = ""
MAX_TRACKED = 10_000  # keys whose buckets are remembered; the fullest (longest idle) are forgotten first


@dataclass(frozen=True)
class Caller:
    owner: str  # the key's owner id (keys.owner_id), or ANONYMOUS
    name: str = "anonymous"  # as messages name the caller


class RateLimiter:
    """A token bucket per key: ``per_minute`` requests a minute, bursts up to as many."""

    def __init__(self, per_minute: int):
        self.rate, self.capacity = per_minute / 60.0, float(per_minute)
        self._buckets: dict[str, tuple[float, float]] = {}  # key -> (tokens, when)
        self._lock = threading.Lock()

    def wait(self, key: str, *, count: bool = True) -> float:
        """0 if ``key`` may make a request now (it is counted, unless ``count`` is False), else the seconds until it
        may."""
        now = time.monotonic()
        with self._lock:
            tokens, then = self._buckets.get(key, (self.capacity, now))
            tokens = min(self.capacity, tokens + (now - then) * self.rate)
            if tokens < 1:
                self._buckets[key] = (tokens, now)
                return (1 - tokens) / self.rate
            self._buckets[key] = (tokens - count, now)
            if len(self._buckets) > MAX_TRACKED:
                del self._buckets[min(self._buckets, key=lambda k: self._buckets[k][1])]
        return 0.0


def _unauthorized(code: str, message: str) -> ApiError:
    return ApiError(401, code, message, {"WWW-Authenticate": 'Bearer realm="densecnn"'})


def _refused_too_often(request: Request) -> None:
    """429 for a client address out of failed-authentication tokens (``failed_auth_per_minute``): keys cannot be
    guessed at speed."""
    limiter: RateLimiter = request.app.state.auth_failures
    wait = limiter.wait(client_address(request), count=False)
    if wait > 0:
        raise ApiError(429, "too_many_failed_keys",
                       "too many requests with a wrong or missing key from your address; retry after the time in "
                       "the Retry-After header, with a valid key", {"Retry-After": str(math.ceil(wait))})  # fmt: skip


def client_address(request: Request) -> str:
    """The client's address, the key of the per-address limits (failed keys, bodies being received)."""
    return request.client.host if request.client else "?"


def _failed(request: Request, error: ApiError) -> ApiError:
    request.app.state.auth_failures.wait(client_address(request))  # counts the failure
    return error


def get_caller(request: Request) -> Caller:
    """The caller of a /v1 request; 401 without a valid key where one is needed, 429 past the key's rate (or past
    the address's failed authentications).

    A plain ``def``: the key lookup reads the database, so FastAPI runs it on its thread pool.
    """
    settings: Settings = request.app.state.settings
    keys: KeyStore | None = getattr(request.app.state, "keys", None)
    header = request.headers.get("authorization")
    if header is None:
        if settings.require_keys:
            _refused_too_often(request)
            raise _failed(request, _unauthorized(
                "missing_key", "this server needs an API key: send Authorization: Bearer KEY (an administrator "
                "creates keys with `densecnn keys add NAME`)"))  # fmt: skip
        return Caller(ANONYMOUS)
    _refused_too_often(request)
    scheme, _, secret = header.partition(" ")
    if scheme.lower() != "bearer" or not secret.strip():
        raise _failed(
            request, _unauthorized("invalid_authorization", "the Authorization header must be 'Bearer KEY'")
        )
    holder = keys.holder(secret.strip()) if keys is not None else None
    if holder is None:
        raise _failed(request, _unauthorized(
            "invalid_key", "the API key is not known to this server; check it, or ask for a new one"))  # fmt: skip
    wait = request.app.state.rate_limiter.wait(holder.owner)
    if wait > 0:
        raise ApiError(429, "rate_limited",
                       f"key {holder.name!r} is over its {settings.requests_per_minute} requests a minute; retry "
                       "after the time in the Retry-After header", {"Retry-After": str(math.ceil(wait))})  # fmt: skip
    return Caller(holder.owner, holder.name)


CallerDep = Annotated[Caller, Depends(get_caller)]
