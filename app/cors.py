"""Cross-origin requests from browsers (where ``cors_origins`` allows some): Starlette's CORS middleware, a refused
preflight answered in the service's error shape instead of its plain-text 400."""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from .errors import error_response
from .requestid import request_id

REFUSED_PREFIX = "Disallowed CORS "  # Starlette's refusal: "Disallowed CORS origin, method, headers"


class JsonCORSMiddleware(CORSMiddleware):
    """CORS as Starlette answers it, except a preflight it refuses: 400 with the JSON error body, code
    ``cors_origin_not_allowed`` (the page's origin is not among ``cors_origins``) or ``cors_request_not_allowed``
    (a method or header the service does not take), the message naming what was refused."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = Headers(scope=scope) if scope["type"] == "http" else None
        if headers is None or not _is_preflight(scope, headers):
            await super().__call__(scope, receive, send)
            return
        response = self.preflight_response(request_headers=headers)
        if response.status_code == 400:
            response = self._refusal(response, headers, request_id(scope))
        await response(scope, receive, send)

    def _refusal(self, refused: Response, headers: Headers, identifier: str | None) -> Response:
        """The refused preflight ``refused`` as a JSON error, with its CORS headers."""
        failures = bytes(refused.body).decode().removeprefix(REFUSED_PREFIX).split(", ")
        reasons = {
            "origin": f"the origin {headers['origin'][:200]!r} may not call this service from a browser; ask its "
            "operator to add it to cors_origins",
            "method": f"the method {headers['access-control-request-method'][:20]!r} is not one of "
            f"{', '.join(self.allow_methods)}",
            "headers": f"a requested header is not one of {', '.join(self.allow_headers)}",
            "private-network": "requests from public pages to this private network are not allowed",
        }
        code = "cors_origin_not_allowed" if "origin" in failures else "cors_request_not_allowed"
        message = "CORS preflight refused: " + "; ".join(reasons.get(f, f) for f in failures)
        kept = {
            k: v for k, v in refused.headers.items() if k.lower().startswith("access-control") or k == "vary"
        }
        return error_response(400, code, message, kept, identifier)


def _is_preflight(scope: Scope, headers: Headers) -> bool:
    """An OPTIONS request from a browser asking whether a cross-origin request may be sent."""
    return scope["method"] == "OPTIONS" and "origin" in headers and "access-control-request-method" in headers
