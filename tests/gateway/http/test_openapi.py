"""The gateway's OpenAPI document (``gateway/http/openapi.json``) is true to the running gateway.

Every route the app registers is documented with its methods and nothing else is; the request
examples fit their schemas and a real gateway in front of the real backend answers each without
a 4xx, in the documented 200 shape; errors come in the documented shape. The fuzzer
(``test_fuzz.py``) then drives the gateway from the same document.
"""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from gateway.app import create_app
from gateway.http.routes import openapi
from gateway.settings import load_settings
from tests.gateway.conftest import GatewayFactory
from tests.openapi_support import (
    documented,
    errors_of,
    fill_path,
    metaschema_errors,
    request_examples,
    response_pointer,
    route_table,
)

DOC = openapi.document()
TOKEN = "openapi-test-admin-token"
PATH_VALUES = {"name": "minilm", "version": "1"}
ERROR = "/components/schemas/Error"


def _app(**values: Any) -> Any:
    settings = load_settings(None, {"backends": ["http://127.0.0.1:9"], **values}, environ={})
    return create_app(settings, registry=CollectorRegistry())


def test_document_is_openapi_31() -> None:
    assert DOC["openapi"].startswith("3.1")
    assert metaschema_errors(DOC) == []


def test_every_route_is_documented_and_nothing_else() -> None:
    routes = route_table(_app(admin_token=TOKEN))
    assert routes == documented(DOC)


def test_without_an_admin_token_only_the_admin_routes_are_missing() -> None:
    missing = documented(DOC) - route_table(_app())
    assert missing and all(path.startswith("/admin/") for _, path in missing)


async def test_the_document_is_served(gateway: GatewayFactory) -> None:
    client = await gateway(admin_token=TOKEN)
    resp = await client.get("/openapi.json")
    assert resp.status == 200
    assert resp.content_type == "application/json"
    assert await resp.json() == DOC
    # Without an admin token the /admin routes do not exist: neither does their documentation.
    without = await (await (await gateway()).get("/openapi.json")).json()
    assert without["paths"] == {p: v for p, v in DOC["paths"].items()
                                if not p.startswith("/admin/")}


@pytest.mark.parametrize("example", request_examples(DOC),
                         ids=lambda e: f"{e.method} {e.path} {e.name}")
async def test_request_examples_fit_and_are_answered(gateway: GatewayFactory,
                                                     example: Any) -> None:
    assert errors_of(DOC, example.schema_pointer, example.value) == []
    client = await gateway(admin_token=TOKEN)
    resp = await client.request(example.method, fill_path(example.path, PATH_VALUES),
                                json=example.value,
                                headers={"Authorization": f"Bearer {TOKEN}"})
    body = await resp.json()
    assert resp.status == 200, body
    assert errors_of(DOC, response_pointer(example.path, example.method, 200), body) == []


async def test_errors_come_in_the_documented_shape(gateway: GatewayFactory) -> None:
    client = await gateway(max_body_bytes=1024)
    cases = [
        ("POST", "/v1/embeddings", {"data": b"{not json", "headers": {
            "Content-Type": "application/json"}}, 400),
        ("POST", "/v1/embeddings", {"data": b"{}", "headers": {"Content-Type": "text/plain"}},
         415),
        ("POST", "/v1/embeddings", {"json": {"model": "minilm", "input": "x" * 2048}}, 413),
        ("POST", "/v1/embeddings", {"json": {"model": "minilm"}}, 422),
        ("POST", "/v1/embeddings", {"json": {"model": "nope", "input": "x"}}, 404),
        ("GET", "/no/such/route", {}, 404),
        ("GET", "/v1/embeddings", {}, 405),
    ]
    for method, path, kwargs, status in cases:
        resp = await client.request(method, path, **kwargs)
        body = await resp.json()
        assert resp.status == status, (path, body)
        assert errors_of(DOC, ERROR, body) == [], (path, body)
        assert body["error"]["request_id"] == resp.headers["X-Request-Id"]
