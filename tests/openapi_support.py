"""Helpers the OpenAPI tests of both services share: the route table of an aiohttp app, the
operations a document names, its request examples, and validators for any schema in it
(``$ref``s resolve inside the document)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web
from jsonschema import Draft202012Validator
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

METHODS = ("get", "put", "post", "delete", "patch", "options", "head")
_BASE = "urn:openapi-under-test"


def load(path: Path) -> dict[str, Any]:
    document: dict[str, Any] = orjson.loads(path.read_bytes())
    return document


def route_table(app: web.Application) -> set[tuple[str, str]]:
    """``(METHOD, path pattern)`` of every route the app registered (aiohttp's automatic HEAD
    twin of each GET left out)."""
    return {(route.method, route.resource.canonical) for route in app.router.routes()
            if route.method != "HEAD" and route.resource is not None}


def documented(document: dict[str, Any]) -> set[tuple[str, str]]:
    """``(METHOD, path)`` of every operation in the document."""
    return {(method.upper(), path) for path, item in document["paths"].items()
            for method in item if method in METHODS}


def _escape(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


@dataclass(frozen=True)
class Example:
    """A request example: where it is and what it holds."""

    method: str
    path: str
    name: str
    schema_pointer: str
    value: Any


def request_examples(document: dict[str, Any]) -> list[Example]:
    """Every JSON request-body example of every operation."""
    found = []
    for path, item in document["paths"].items():
        for method, op in item.items():
            content = op.get("requestBody", {}).get("content", {}).get("application/json")
            if content is None:
                continue
            pointer = (f"/paths/{_escape(path)}/{method}/requestBody/content/"
                       f"application~1json/schema")
            for name, example in content.get("examples", {}).items():
                found.append(Example(method.upper(), path, name, pointer, example["value"]))
    return found


def response_pointer(path: str, method: str, status: int) -> str:
    """The JSON pointer of an operation's inline JSON response schema for ``status``."""
    return (f"/paths/{_escape(path)}/{method.lower()}/responses/{status}/content/"
            f"application~1json/schema")


def validator(document: dict[str, Any], pointer: str) -> Draft202012Validator:
    """A JSON Schema 2020-12 validator for the schema at ``pointer`` in the document."""
    registry: Registry[Any] = Registry().with_resource(
        _BASE, Resource(contents=document, specification=DRAFT202012))
    return Draft202012Validator({"$ref": f"{_BASE}#{pointer}"}, registry=registry)


def errors_of(document: dict[str, Any], pointer: str, value: Any) -> list[str]:
    """Why ``value`` breaks the schema at ``pointer`` (empty when it fits)."""
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
            for e in validator(document, pointer).iter_errors(value)]


def fill_path(path: str, values: dict[str, str]) -> str:
    """``/v2/models/{name}`` with its parameters filled in."""
    for name, value in values.items():
        path = path.replace("{" + name + "}", value)
    return path


def metaschema_errors(document: dict[str, Any]) -> list[str]:
    """Why the document is not OpenAPI 3.1 (the specification's own JSON Schema), plus any
    component schema that is not valid JSON Schema 2020-12."""
    from schemathesis.specs.openapi.definitions import OPENAPI_31

    problems = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
                for e in Draft202012Validator(OPENAPI_31).iter_errors(document)]
    for name, schema in document.get("components", {}).get("schemas", {}).items():
        problems += [f"components/schemas/{name}: {e.message}"
                     for e in Draft202012Validator(Draft202012Validator.META_SCHEMA)
                     .iter_errors(schema)]
    return problems
