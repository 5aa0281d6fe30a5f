"""One error body for every 4xx/5xx, ``{"error": {"code": ..., "message": ...}}``; domain errors -> statuses here."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException

from densecnn.imageio import ImageReadError, ImageTooLargeError

from .executor import InferenceTimeout, Overloaded

logger = logging.getLogger("densecnn.app")


class ErrorDetail(BaseModel):
    code: str
    message: str


class ErrorBody(BaseModel):
    """The body of every error response."""

    error: ErrorDetail


class ApiError(Exception):
    """An HTTP error with a stable ``code`` and a message saying what to do."""

    def __init__(self, status: int, code: str, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.code, self.message, self.headers = status, code, message, headers or {}


def error_response(
    status: int, code: str, message: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    body = ErrorBody(error=ErrorDetail(code=code, message=message))
    return JSONResponse(body.model_dump(), status_code=status, headers=headers)


_HTTP_CODES = {
    400: "bad_request",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    413: "payload_too_large",
    415: "unsupported_media_type",
}


def install_error_handlers(app: FastAPI, *, retry_after: int) -> None:
    """Map every exception the service raises (and FastAPI's own 404/405/422) to the one error shape."""
    busy = {"Retry-After": str(retry_after)}

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError):
        return error_response(exc.status, exc.code, exc.message, exc.headers)

    @app.exception_handler(ImageTooLargeError)
    async def image_too_large(request: Request, exc: ImageTooLargeError):
        return error_response(413, "image_too_large", str(exc))

    @app.exception_handler(ImageReadError)
    async def unreadable_image(request: Request, exc: ImageReadError):
        return error_response(400, "invalid_image", str(exc))

    @app.exception_handler(Overloaded)
    async def overloaded(request: Request, exc: Overloaded):
        return error_response(503, "overloaded", str(exc), busy)

    @app.exception_handler(InferenceTimeout)
    async def timed_out(request: Request, exc: InferenceTimeout):
        return error_response(503, "timeout", str(exc), busy)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        code = _HTTP_CODES.get(exc.status_code, f"http_{exc.status_code}")
        message = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        if exc.status_code == 404 and message == "Not Found":
            message = f"no endpoint at {request.url.path}; see /docs for the API"
        return error_response(exc.status_code, code, message, getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError):
        problems = "; ".join(
            f"{'.'.join(str(p) for p in error.get('loc', ()))}: {error.get('msg', '')}"
            for error in exc.errors()
        )
        return error_response(422, "invalid_request", problems or "invalid request")

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception):
        logger.exception("unhandled error on %s %s", request.method, request.url.path)
        return error_response(500, "internal_error", "the server failed on this request; it was logged")
