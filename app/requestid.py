"""A request id on every answer (``X-Request-ID``) and in every error body, to find a request in the logs.

The client's own ``X-Request-ID`` is kept when it is a short token (letters, digits, ``._:-``, up to 128), so ids
can follow a request through proxies; otherwise the service makes one.
"""

from __future__ import annotations

import re
import uuid

from starlette.types import ASGIApp, Message, Receive, Scope, Send

HEADER = "x-request-id"
SCOPE_KEY = "densecnn.request_id"
_TOKEN = re.compile(r"[A-Za-z0-9._:-]{1,128}")


def request_id(scope: Scope) -> str | None:
    """The id of the request whose ASGI scope this is."""
    return scope.get(SCOPE_KEY)


class RequestIdMiddleware:
    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = dict(scope["headers"]).get(HEADER.encode(), b"").decode("latin-1")
        scope[SCOPE_KEY] = identifier = given if _TOKEN.fullmatch(given) else uuid.uuid4().hex

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message.setdefault("headers", [])
                message["headers"] = [*message["headers"], (HEADER.encode(), identifier.encode())]
            await send(message)

        await self.app(scope, receive, send_with_id)
