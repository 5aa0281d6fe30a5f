"""Every error of the service, and the one place where errors become HTTP answers.

Every 4xx/5xx the app answers has the body ``{"error": {"code": ..., "message": ..., "request_id": ...}}`` (the id
is also the answer's ``X-Request-ID``). Protocol errors that uvicorn
answers itself, before the app sees a request (malformed HTTP, headers over the size limit), are plain text.
"""

from __future__ import annotations

import logging
import re

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel
from sqlalchemy.exc import OperationalError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from densecnn.errors import (
    DenseCNNError,
    ImageDimensionsError,
    ImageReadError,
    ImageStackError,
    ImageTooLargeError,
    IntensityError,
    NonFiniteInputError,
    query_option,
    render,
)

from .requestid import request_id

logger = logging.getLogger("densecnn.app")

OBJECT_REPR = re.compile(
    r"<[^<>]* at 0x[0-9a-fA-F]+>"
)  # e.g. <_io.BytesIO object at 0x7f...>, in a library's message
CLIENT_CLOSED = 499  # nginx's "client closed request": counted in /metrics, never sent to anyone


class ErrorDetail(BaseModel):
    code: str
    message: str
    request_id: str | None = None


class ErrorBody(BaseModel):
    """The body of every error response."""

    error: ErrorDetail


class ApiError(Exception):
    """An HTTP error with a stable ``code`` and a message saying what to do."""

    def __init__(self, status: int, code: str, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.code, self.message, self.headers = status, code, message, headers or {}


class BodyTooLarge(ApiError):
    def __init__(self, limit: int):
        super().__init__(
            413,
            "payload_too_large",
            f"the request body is larger than the limit of {limit:,} bytes; send a smaller image",
        )


class Overloaded(ApiError):
    """Every inference slot and queue place is taken (or the server is shutting down)."""

    def __init__(self, message: str):
        super().__init__(503, "overloaded", message)


class InferenceTimeout(ApiError):
    """A job did not finish within the request deadline; it is abandoned at its next layer or tile."""

    def __init__(self, timeout: float):
        super().__init__(
            503,
            "timeout",
            f"the inference did not finish within {timeout:g} s; send a smaller image or retry later",
        )


class ClientGone(Exception):
    """The client closed the connection before its answer was ready; its job is dropped or abandoned."""


def error_response(
    status: int, code: str, message: str, headers: dict[str, str] | None = None, request_id: str | None = None
) -> JSONResponse:
    body = ErrorBody(error=ErrorDetail(code=code, message=message, request_id=request_id))
    return JSONResponse(body.model_dump(), status_code=status, headers=headers)


_HTTP_CODES = {
    400: "bad_request",
    401: "unauthorized",
    404: "not_found",
    405: "method_not_allowed",
    406: "not_acceptable",
    413: "payload_too_large",
    415: "unsupported_media_type",
}
_RETRY = {429, 503}  # statuses that carry Retry-After


# the options a fix may name that the service takes, as query parameters: POST /segment's, and the jobs' (also
# fields of a JSON job request); a fix naming any other option (channel_axis, a command line's) is not offered
SEGMENT_OPTIONS = frozenset({"intensity", "nonfinite"})
JOB_OPTIONS = SEGMENT_OPTIONS | {"chunk", "level"}


def service_message(error: BaseException, options: frozenset[str]) -> str:
    """``error``'s message for a caller of the service: its fix, if it has one, spelled as query parameters and
    kept to the settings among ``options`` (those the endpoint takes); a fix with none of them is left out, the
    problem's own advice standing."""
    if not isinstance(error, DenseCNNError) or error.fix is None:
        return render(error, query_option)
    fix = error.fix.within(options)
    return error.problem if fix is None else f"{error.problem}; {fix.render(query_option)}"


# densecnn's errors about an input, as the status and code they are answered with
INPUT_ERRORS = {
    ImageTooLargeError: (413, "image_too_large"),
    ImageStackError: (422, "image_is_a_stack"),
    ImageDimensionsError: (422, "wrong_dimensions"),
    IntensityError: (400, "intensity_out_of_range"),
    NonFiniteInputError: (400, "non_finite_input"),
    ImageReadError: (400, "invalid_image"),
}


def install_error_handlers(app: FastAPI, *, retry_after: int) -> None:
    """Map every exception the service raises (and FastAPI's own 404/405/422) to the one error shape."""

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError):
        headers = dict(exc.headers)
        if exc.status in _RETRY:
            headers.setdefault("Retry-After", str(retry_after))
        return error_response(exc.status, exc.code, exc.message, headers, _id(request))

    for error_type, (status, code) in INPUT_ERRORS.items():

        async def input_error(request: Request, exc: Exception, status=status, code=code):
            options = JOB_OPTIONS if request.url.path.startswith("/v1/jobs") else SEGMENT_OPTIONS
            # a decoder may quote its buffer
            message = OBJECT_REPR.sub("the image", service_message(exc, options))
            return error_response(status, code, message, request_id=_id(request))

        app.add_exception_handler(error_type, input_error)  # the most specific type's handler answers

    @app.exception_handler(ClientDisconnect)
    @app.exception_handler(ClientGone)
    async def client_gone(request: Request, exc: Exception):
        logger.info("client %s closed the connection before the answer to %s %s", _peer(request), request.method,
                    request.url.path)  # fmt: skip
        return Response(status_code=CLIENT_CLOSED)  # nobody reads it; /metrics counts it apart

    @app.exception_handler(OperationalError)
    async def database_unavailable(request: Request, exc: OperationalError):
        logger.error("database unavailable on %s %s: %s", request.method, request.url.path, exc.orig)
        return error_response(503, "storage_unavailable",
                              "the server cannot write its records now (its disk may be full); retry later",
                              {"Retry-After": str(retry_after)}, _id(request))  # fmt: skip

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException):
        code = _HTTP_CODES.get(exc.status_code, f"http_{exc.status_code}")
        message = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        if exc.status_code == 404 and message == "Not Found":
            message = f"no endpoint at {request.url.path}; see /docs for the API"
        return error_response(exc.status_code, code, message, getattr(exc, "headers", None), _id(request))

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError):
        problems = "; ".join(_validation_problem(error) for error in exc.errors())
        return error_response(422, "invalid_request", problems or "invalid request", request_id=_id(request))

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception):
        logger.exception(
            "unhandled error on %s %s (request %s)", request.method, request.url.path, _id(request)
        )
        return error_response(
            500, "internal_error", "the server failed on this request; it was logged under its request id",
            request_id=_id(request),
        )  # fmt: skip


def _validation_problem(error: dict) -> str:
    """One validation error as "where: what" (just "what" where it concerns the whole body), without pydantic's
    "Value error, " prefix."""
    where = ".".join(str(part) for part in error.get("loc", ()))
    what = str(error.get("msg", "")).removeprefix("Value error, ")
    return f"{where}: {what}" if where else what


def _id(request: Request) -> str | None:
    return request_id(request.scope)


def _peer(request: Request) -> str:
    return f"{request.client.host}:{request.client.port}" if request.client else "?"
