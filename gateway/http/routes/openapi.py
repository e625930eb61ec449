"""``GET /openapi.json``: the gateway's OpenAPI 3.1 document.

``gateway/http/openapi.json`` holds everything but the cached routes' operations, which are
generated from the route registry (gateway/adapters/registry.py): what differs per route comes
from its entry, what every cached route shares (cache and deadline headers, the answer's
headers, the error answers) is written once below. The document is assembled once when the app
is built (less the ``/admin`` routes when they are off) and kept true by
``tests/gateway/http/test_openapi.py`` (every registered route is
documented with its methods and nothing else is; the request examples validate and are answered
without a 4xx) and by the fuzzer that is driven by it.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import orjson

from gateway.adapters.registry import ROUTES, Route

DOCUMENT = Path(__file__).resolve().parent.parent / "openapi.json"

_COMMON_PARAMETERS = ("Cache-Control", "X-Request-Timeout-Ms", "X-Request-Id")
_ANSWER_HEADERS = ("X-Cache", "X-Cache-Policy", "Server-Timing", "Age", "X-Request-Id",
                   "RateLimit-Policy", "RateLimit")
_ERRORS = (("400", "BadRequest"), ("401", "Unauthorized"), ("404", "NotFound"),
           ("413", "PayloadTooLarge"), ("415", "UnsupportedMediaType"),
           ("422", "Unprocessable"), ("429", "RateLimited"), ("502", "BadGateway"),
           ("503", "Overloaded"), ("504", "DeadlineExceeded"))


def _ref(kind: str, name: str) -> dict[str, str]:
    return {"$ref": f"#/components/{kind}/{name}"}


def _path_parameters(path: str) -> list[dict[str, str]]:
    known = {"name": "ModelPath", "version": "VersionPath"}
    names = [part[1:-1] for part in path.split("/") if part.startswith("{")]
    return [_ref("parameters", known[n]) for n in names]


def operation(route: Route, path: str, operation_id: str) -> dict[str, Any]:
    """The POST operation of one cached route at ``path`` (the route's own or an alias)."""
    doc = route.doc
    op: dict[str, Any] = {"operationId": operation_id, "summary": doc.summary, "tags": [doc.tag]}
    if doc.description is not None:
        op["description"] = doc.description
    op["parameters"] = [*_path_parameters(path),
                        *(_ref("parameters", name) for name in _COMMON_PARAMETERS)]
    op["security"] = [{}, {"apiKey": []}]
    op["requestBody"] = {"required": True, "content": {"application/json": {
        "schema": _ref("schemas", doc.request_schema),
        "examples": {name: dict(example) for name, example in doc.examples.items()}}}}
    op["responses"] = {
        "200": {"description": doc.response_description,
                "content": {"application/json": {"schema": _ref("schemas", doc.response_schema)}},
                "headers": {name: _ref("headers", name) for name in _ANSWER_HEADERS}},
        **{status: _ref("responses", name) for status, name in _ERRORS},
    }
    return op


def cached_paths() -> dict[str, Any]:
    """The path items of every cached route and its aliases, in registry order."""
    paths: dict[str, Any] = {}
    for route in ROUTES:
        paths[route.path] = {"post": operation(route, route.path, route.doc.operation_id)}
        for alias, operation_id in route.aliases:
            paths[alias] = {"post": operation(route, alias, operation_id)}
    return paths


def document() -> dict[str, Any]:
    """The whole document: the file's paths after the generated ones."""
    base: dict[str, Any] = orjson.loads(DOCUMENT.read_bytes())
    generated = cached_paths()
    clash = sorted(set(generated) & set(base["paths"]))
    if clash:
        raise ValueError(f"{DOCUMENT.name} documents cached routes the registry generates: "
                         f"{', '.join(clash)}")
    base["paths"] = {**generated, **base["paths"]}
    return base


@functools.cache
def load() -> bytes:
    """The document's bytes (built once per process)."""
    return orjson.dumps(document())


def served(document: bytes, *, admin: bool) -> bytes:
    """The document as this gateway serves it: without an admin token the ``/admin`` routes do
    not exist (every ``/admin`` path is a plain 404), so they are left out of it."""
    if admin:
        return document
    data = orjson.loads(document)
    data["paths"] = {path: item for path, item in data["paths"].items()
                     if not path.startswith("/admin/")}
    return orjson.dumps(data)
