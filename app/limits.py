"""The request-body limit, as pure ASGI middleware: counts the bytes actually received, chunked bodies included."""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .errors import BodyTooLarge, error_response
from .requestid import request_id


class BodySizeLimitMiddleware:
    """Refuse request bodies over ``max_bytes`` with 413.

    A declared ``Content-Length`` over the limit is refused when the endpoint starts reading, before any byte is
    read; otherwise the bytes are counted as they arrive, so a chunked body without a length is stopped too.
    """

    def __init__(self, app: ASGIApp, max_bytes: int, *, paths: dict[str, int] | None = None):
        """``paths``: other limits for the bodies sent to the paths starting so (uploads of jobs, streamed to disk)."""
        self.app, self.max_bytes, self.paths = app, max_bytes, paths or {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        limit = next((n for prefix, n in self.paths.items() if path.startswith(prefix)), self.max_bytes)
        declared = dict(scope["headers"]).get(b"content-length")
        received = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal received
            if declared is not None and declared.isdigit() and int(declared) > limit:
                raise BodyTooLarge(limit)
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise BodyTooLarge(limit)
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except BodyTooLarge as exc:  # raised where no exception handler saw it (e.g. while streaming)
            if started:
                raise
            await error_response(exc.status, exc.code, exc.message, request_id=request_id(scope))(
                scope, receive, send
            )
