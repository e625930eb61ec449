"""The route registry (gateway/adapters/registry.py) is the one list of cached routes: every entry
has what a cached route needs, and every other list of routes derives from it."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from gateway.adapters.registry import (
    BATCH_PATHS,
    BY_PATH,
    CACHED_PATHS,
    ROUTES,
    Parsing,
    Route,
)
from gateway.app import create_app
from gateway.cli.policy import gateway_models, texts_of
from gateway.http import app_state as state
from gateway.http.routes import openapi
from gateway.settings import load_settings
from tests.openapi_support import errors_of, route_table

DOC = openapi.document()


def problems(route: Route, document: dict[str, Any]) -> list[str]:
    """What ``route`` lacks to be a cached route (empty: nothing)."""
    found = []
    schemas = document["components"]["schemas"]
    if not route.path.startswith("/"):
        found.append(f"{route.path}: not a path")
    for name in (route.doc.request_schema, route.doc.response_schema):
        if name not in schemas:
            found.append(f"{route.path}: no schema {name!r} in the OpenAPI components")
    if not route.doc.examples:
        found.append(f"{route.path}: no request example")
    pointer = f"/components/schemas/{route.doc.request_schema}"
    for name, example in route.doc.examples.items():
        if route.doc.request_schema in schemas and errors_of(document, pointer, example["value"]):
            found.append(f"{route.path}: example {name!r} does not fit its schema")
        model = "minilm" if route.path.startswith("/v2/models/") else None
        try:
            call = route.parse(dict(example["value"]), Parsing(resolve=lambda n: "minilm",
                                                               path_model=model))
        except Exception as exc:  # any failure is the finding
            found.append(f"{route.path}: example {name!r} is refused by its parser ({exc})")
            continue
        if not any(texts for _field, texts in call.groups):
            found.append(f"{route.path}: example {name!r} has no texts for the policy")
    return found


@pytest.mark.parametrize("route", ROUTES, ids=lambda r: r.path)
def test_each_entry_has_what_a_cached_route_needs(route: Route) -> None:
    assert problems(route, DOC) == []


def test_the_check_catches_an_incomplete_entry() -> None:
    entry = BY_PATH["/v1/classify"]
    no_schema = replace(entry, doc=replace(entry.doc, request_schema="SimilarityRequest"))
    assert problems(no_schema, DOC) == [
        "/v1/classify: no schema 'SimilarityRequest' in the OpenAPI components"]
    no_example = replace(entry, doc=replace(entry.doc, examples={}))
    assert problems(no_example, DOC) == ["/v1/classify: no request example"]
    wrong_parser = replace(entry, parse=BY_PATH["/v1/rank"].parse)
    assert "refused by its parser" in problems(wrong_parser, DOC)[0]


def test_every_list_of_routes_derives_from_the_registry() -> None:
    settings = load_settings(None, {"backends": ["http://127.0.0.1:9"]}, environ={})
    app = create_app(settings, registry=CollectorRegistry())
    posts = {path for method, path in route_table(app) if method == "POST"}
    for route in ROUTES:
        assert route.path in posts
        assert {alias for alias, _ in route.aliases} <= posts
    # Policies may name exactly the registry's routes, in the gateway and in `policy check`.
    known = app[state.POLICIES].known_models
    assert known is not None and known.routes == CACHED_PATHS
    assert gateway_models().routes == CACHED_PATHS
    # The OpenAPI document's cached operations are the registry's, and only those.
    cached = {path for path, item in DOC["paths"].items()
              if "post" in item and "X-Cache" in item["post"]["responses"]["200"].get("headers",
                                                                                     {})}
    assert cached == set(CACHED_PATHS) | {a for r in ROUTES for a, _ in r.aliases}
    # Batch lines: the entries marked for it.
    assert BATCH_PATHS == ("/v1/embeddings", "/v1/classify", "/v1/rank")


@pytest.mark.parametrize("route", ROUTES, ids=lambda r: r.path)
def test_policy_explain_reads_the_texts_the_adapter_reads(route: Route) -> None:
    example = next(iter(route.doc.examples.values()))["value"]
    path = route.path.replace("{name}", "minilm")
    model = "minilm" if route.path.startswith("/v2/models/") else None
    call = route.parse(dict(example), Parsing(resolve=lambda n: "minilm", path_model=model))
    assert texts_of(path, example) == [(f, list(t)) for f, t in call.groups]
