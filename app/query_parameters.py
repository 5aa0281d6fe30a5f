"""Unknown query parameters are refused, never ignored: ``?levle=1`` would otherwise give labels computed without
the option meant, and no error. So is a parameter given twice that takes one value (``?intensity=dtype&intensity=
range:0,1`` would be read as its last value, silently).

The API routers are included with the dependency :func:`refuse_unknown_query_parameters` (see ``create_app``). It
reads what an endpoint takes from its route: the query parameters the endpoint and its dependencies declare, by
the names a request gives them (their aliases), so new endpoints are checked with no list to keep.

The answer is 422 ``unknown_query_parameter``: each unknown name, the closest known one where there is one ("did
you mean level?"), and the parameters the endpoint takes; or 422 ``repeated_query_parameter``, naming the parameters
given more than once.
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Iterator, Sequence

from fastapi import Request
from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute

from .errors import ApiError

MAX_NAMED = 5  # unknown names a message lists (then "and N more")
MAX_SHOWN = 64  # characters of a name a message quotes


def refuse_unknown_query_parameters(request: Request) -> None:
    """422 ``unknown_query_parameter`` when the request has a query parameter its endpoint does not take, 422
    ``repeated_query_parameter`` when it gives one that takes a single value more than once."""
    route = request.scope.get("route")
    if not isinstance(route, APIRoute) or not request.query_params:
        return
    known = declared_query_parameters(route.dependant)
    unknown = [name for name in request.query_params if name not in known]
    if unknown:
        raise ApiError(
            422, "unknown_query_parameter", unknown_message(unknown, known, request.method, route.path)
        )
    many = set(sequence_query_parameters(route.dependant))
    repeated = [
        name
        for name in request.query_params
        if name not in many and len(request.query_params.getlist(name)) > 1
    ]
    if repeated:
        given = ", ".join(f"{name!r} ({len(request.query_params.getlist(name))} times)" for name in repeated)
        raise ApiError(
            422,
            "repeated_query_parameter",
            f"query parameters given more than once: {given}; {request.method} {route.path} takes one value of "
            "each: give each once",
        )


def unknown_message(unknown: list[str], known: list[str], method: str, path: str) -> str:
    """What is unknown, what each was likely meant to be, and what the endpoint takes."""
    named = [_with_suggestion(name, known) for name in unknown[:MAX_NAMED]]
    if len(unknown) > MAX_NAMED:
        named.append(f"and {len(unknown) - MAX_NAMED} more")
    noun = "parameter" if len(unknown) == 1 else "parameters"
    takes = f"takes the query parameters {', '.join(known)}" if known else "takes no query parameters"
    return f"unknown query {noun} {', '.join(named)}: {method} {path} {takes}"


def _with_suggestion(name: str, known: list[str]) -> str:
    shown = repr(name if len(name) <= MAX_SHOWN else name[:MAX_SHOWN] + "...")
    by_lower = {candidate.lower(): candidate for candidate in known}
    close = difflib.get_close_matches(name[:MAX_SHOWN].lower(), by_lower, n=1)
    return f"{shown} (did you mean {by_lower[close[0]]}?)" if close else shown


def declared_query_parameters(dependant: Dependant) -> list[str]:
    """The names of the query parameters an endpoint takes, in declaration order (its own, then its
    dependencies'), as a request gives them."""
    names = {field.alias: None for current in _dependants(dependant) for field in current.query_params}
    return list(names)


def sequence_query_parameters(dependant: Dependant) -> list[str]:
    """The names of an endpoint's query parameters that take several values (a list: ``?id=1&id=2``)."""
    return [
        field.alias
        for current in _dependants(dependant)
        for field in current.query_params
        if _is_sequence(field.field_info.annotation)
    ]


def _is_sequence(annotation) -> bool:
    """Whether a parameter's annotation is a list, tuple or set (or an optional one)."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(_is_sequence(arg) for arg in typing.get_args(annotation) if arg is not type(None))
    return isinstance(origin, type) and issubclass(origin, Sequence | set | frozenset) and origin is not str


def _dependants(dependant: Dependant) -> Iterator[Dependant]:
    yield dependant
    for sub in dependant.dependencies:
        yield from _dependants(sub)
