"""The backend's OpenAPI document (``backend/openapi.json``) is true to the backend, and a
property-based fuzzer driven by it finds no fault in a real backend process (real model).

The document: every registered route is documented with its methods and nothing else is; the
request examples fit their schemas and are answered 200 in the documented shape; the served
document is the file. The fuzzer (schemathesis, through ``bench.fuzz``): per operation a bounded
number of positive and negative cases (fixed seed); no 5xx, answers as documented, negative
cases refused with a 4xx, errors in the OIP or OpenAI error shape, and the backend still ready
and answering afterwards.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from backend import openapi
from backend.app import create_app
from backend.settings import ServeSettings
from bench import services
from bench.fuzz import VALID_BACKEND, backend_error_shape, fuzz_service, still_serving
from tests.openapi_support import (
    METHODS,
    documented,
    errors_of,
    fill_path,
    load,
    metaschema_errors,
    request_examples,
    response_pointer,
    route_table,
)

pytestmark = pytest.mark.model

DOC = load(openapi.DOCUMENT)
CASES_PER_OPERATION = 30  # positive and negative together
PATH_VALUES = {"model": "minilm", "version": "1"}


@pytest.fixture(scope="module")
def backend_url(models_dir: Path) -> Iterator[str]:
    """``python -m backend serve`` with the real model, ready."""
    with services.backend(models_dir, cores=None) as server:
        yield server.url


def test_document_is_openapi_31() -> None:
    assert DOC["openapi"].startswith("3.1")
    assert metaschema_errors(DOC) == []


def test_every_route_is_documented_and_nothing_else(tmp_path: Path) -> None:
    app = create_app(ServeSettings(models_dir=tmp_path, device="cpu"), models=[])
    assert route_table(app) == documented(DOC)


def test_the_document_is_served(backend_url: str) -> None:
    resp = httpx.get(f"{backend_url}/openapi.json", timeout=10)
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("application/json")
    assert resp.json() == DOC


@pytest.mark.parametrize("example", request_examples(DOC),
                         ids=lambda e: f"{e.method} {e.path} {e.name}")
def test_request_examples_fit_and_are_answered(backend_url: str, example: Any) -> None:
    assert errors_of(DOC, example.schema_pointer, example.value) == []
    resp = httpx.request(example.method, backend_url + fill_path(example.path, PATH_VALUES),
                         json=example.value, timeout=30)
    assert resp.status_code == 200, resp.text
    if resp.headers["content-type"].startswith("application/json"):
        body = resp.json()
        assert errors_of(DOC, response_pointer(example.path, example.method, 200), body) == []
    else:  # binary outputs asked for: the JSON part comes first, its size in the header
        head = resp.content[: int(resp.headers["Inference-Header-Content-Length"])]
        assert errors_of(DOC, response_pointer(example.path, example.method, 200),
                         httpx.Response(200, content=head).json()) == []


def _operations() -> list[Any]:
    return [pytest.param(method.upper(), path, id=f"{method.upper()} {path}")
            for path, item in DOC["paths"].items() for method in item if method in METHODS]


@pytest.mark.parametrize(("method", "path"), _operations())
def test_fuzz_operation(backend_url: str, method: str, path: str) -> None:
    report = fuzz_service(
        DOC, service="backend", base_url=backend_url, cases=CASES_PER_OPERATION, seconds=30.0,
        error_shape=backend_error_shape,
        only=lambda op: op.method.upper() == method and op.path == path,
    )
    assert report.cases > 0, report.generation_errors
    assert not report.generation_errors, report.generation_errors
    findings = "\n".join(f.describe() for f in report.findings.values())
    assert not report.findings, f"{report.summary()}\n{findings}"
    assert still_serving(backend_url, "/v2/health/ready", VALID_BACKEND) is None
