"""GET routes that answer HEAD too, with one operation in the OpenAPI schema.

A route of methods GET and HEAD gives both operations its one operationId, which OpenAPI forbids (client generators
refuse the schema); so HEAD is its own route of the same function, left out of the schema.

>>> @get_and_head(router, "/healthz", response_model=Health)
... async def healthz() -> Health: ...
"""

from __future__ import annotations

from collections.abc import Callable

from fastapi import APIRouter


def get_and_head(router: APIRouter, path: str, **options) -> Callable:
    def register(endpoint: Callable) -> Callable:
        router.add_api_route(path, endpoint, methods=["HEAD"], include_in_schema=False, **options)
        return router.get(path, **options)(endpoint)

    return register
