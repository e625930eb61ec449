"""Property-based fuzzing of a real gateway process in front of the real backend, driven by the
gateway's OpenAPI document (schemathesis, through ``bench.fuzz``).

Each operation gets a bounded number of positive and negative cases (fixed seed). Checks: no
5xx, the answer is one the document gives for the operation (status, content type, headers,
body), negative cases are refused with a 4xx, every error is ``{"error": {"type", "message",
"request_id"}}``, and the gateway still answers ``/readyz`` and a valid request afterwards.
``make fuzz`` runs the same engine for 10,000 cases per service.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from bench import services
from bench.fuzz import (
    ADMIN_TOKEN,
    VALID_GATEWAY,
    fuzz_service,
    gateway_error_shape,
    gateway_headers,
    still_serving,
)
from gateway.http.routes import openapi
from tests.conftest import RedisServer
from tests.gateway.conftest import BackendProc
from tests.openapi_support import METHODS

DOC = openapi.document()
CASES_PER_OPERATION = 30  # positive and negative together

KNOWN: dict[tuple[str, str], str] = {}  # (method, path) -> the defect that fails it (strict xfail)


def _operations() -> list[Any]:
    params = []
    for path, item in DOC["paths"].items():
        for method in item:
            if method not in METHODS:
                continue
            marks = []
            reason = KNOWN.get((method.upper(), path))
            if reason is not None:
                marks.append(pytest.mark.xfail(strict=True, reason=reason))
            params.append(pytest.param(method.upper(), path, marks=marks,
                                       id=f"{method.upper()} {path}"))
    return params


@pytest.fixture(scope="module")
def gateway_url(backend: BackendProc, redis_server: RedisServer) -> Iterator[str]:
    """``python -m gateway serve`` (one worker, an admin token) in front of the real backend,
    with Redis (the batch routes need it: without, they answer 503 by design)."""
    with services.gateway(backend.url, cores=None, name="fuzz-gateway",
                          redis_url=redis_server.url,
                          settings={"admin_token": ADMIN_TOKEN,
                                    "logging": {"level": "WARNING"}}) as gw:
        yield gw.url


@pytest.mark.parametrize(("method", "path"), _operations())
def test_fuzz_operation(gateway_url: str, method: str, path: str) -> None:
    report = fuzz_service(
        DOC, service="gateway", base_url=gateway_url, cases=CASES_PER_OPERATION, seconds=30.0,
        error_shape=gateway_error_shape, headers_for=gateway_headers,
        only=lambda op: op.method.upper() == method and op.path == path,
    )
    assert report.cases > 0, report.generation_errors
    assert not report.generation_errors, report.generation_errors
    findings = "\n".join(f.describe() for f in report.findings.values())
    assert not report.findings, f"{report.summary()}\n{findings}"
    assert still_serving(gateway_url, "/readyz", VALID_GATEWAY) is None
