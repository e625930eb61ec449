"""API fuzzing driven by the OpenAPI documents: ``python -m bench fuzz --engine own [--cases N]``.

Starts a real backend (the real model) and a real gateway in front of it, both on loopback ports
and stopped by PID, and sends each schemathesis-generated requests built from its own
``/openapi.json``: positive cases (fit the schema) and negative ones (break it), operation by
operation, round after round with fresh seeds, until N cases per service ran or the time is up.

Checks on every answer (``check_response``):
- no 5xx: a 504 is excused only when the case itself asked for a deadline under a second;
- the status, content type, headers and body are the ones the document gives for it;
- a negative case is refused with a 4xx (the document says what the server accepts);
- every error is JSON in the service's one error shape (``error_shape``).
Afterwards each service must still answer its readiness probe and one valid request
(``still_serving``). The test suite runs the same engine with a small bounded count
(``tests/gateway/http/test_fuzz.py``, ``tests/backend/test_openapi_fuzz.py``).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.core.failures import Failure, FailureGroup
from schemathesis.core.result import Err
from schemathesis.generation.case import Case as _Case
from schemathesis.openapi import from_dict
from schemathesis.schemas import APIOperation as _APIOperation

from gateway.http.routes import openapi as gateway_openapi

ADMIN_TOKEN = "fuzz-admin-token"
MODES = (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
APIOperation = _APIOperation[Any, Any, Any, Any]
Case = _Case[Any]
ErrorShape = Callable[[str, int, Mapping[str, str], bytes], str | None]


@dataclass(frozen=True, slots=True)
class Finding:
    """One distinct failure: which operation, which check, the status, and how to repeat it."""

    operation: str
    check: str
    status: int
    detail: str
    reproduce: str

    def describe(self) -> str:
        """A short block for a report: operation, check, status, detail, curl."""
        return (f"{self.operation}: {self.check} (status {self.status})\n  {self.detail}\n"
                f"  {self.reproduce}")


@dataclass
class FuzzReport:
    """What one service's run did: cases, statuses, distinct failures, time."""

    service: str
    cases: int = 0
    failed_cases: int = 0
    statuses: Counter[int] = field(default_factory=Counter)
    findings: dict[tuple[str, str, int], Finding] = field(default_factory=dict)
    duration_s: float = 0.0
    rounds: int = 0
    generation_errors: list[str] = field(default_factory=list)

    def add(self, finding: Finding) -> None:
        """Keep the first example of each (operation, check, status)."""
        self.findings.setdefault((finding.operation, finding.check, finding.status), finding)

    def summary(self) -> str:
        """One Markdown table row: service, cases, failed cases, distinct failures, duration,
        statuses seen."""
        statuses = ", ".join(f"{s}: {n}" for s, n in sorted(self.statuses.items()))
        return (f"| {self.service} | {self.cases} | {self.failed_cases} | {len(self.findings)} | "
                f"{self.duration_s:.0f} s | {statuses} |")


def load_document(path: Path) -> dict[str, Any]:
    """An OpenAPI document (JSON) from a file."""
    data: dict[str, Any] = orjson.loads(path.read_bytes())
    return data


def operations(document: dict[str, Any]) -> list[APIOperation]:
    """Every operation of the document, as schemathesis sees it."""
    schema = from_dict(document)
    found: list[APIOperation] = []
    for result in schema.get_all_operations():
        if isinstance(result, Err):
            raise result.err()
        found.append(result.ok())
    return found


def gateway_error_shape(path: str, status: int, headers: Mapping[str, str],
                        body: bytes) -> str | None:
    """None when an error answer is the gateway's ``{"error": {"type", "message",
    "request_id"}}`` in JSON with the request id of its ``X-Request-Id`` header; else why not."""
    problem = _json_error(headers, body)
    if isinstance(problem, str):
        return problem
    error = problem.get("error")
    if not isinstance(error, dict):
        return f"'error' is {type(error).__name__}, not an object"
    for name in ("type", "message", "request_id"):
        if not isinstance(error.get(name), str) or not error[name]:
            return f"error.{name} is missing or not a non-empty string"
    rid = _header(headers, "x-request-id")
    if error["request_id"] != rid:
        return f"error.request_id {error['request_id']!r} is not the X-Request-Id {rid!r}"
    return None


def backend_error_shape(path: str, status: int, headers: Mapping[str, str],
                        body: bytes) -> str | None:
    """None when an error answer is the backend's shape: OIP's ``{"error": "<message>"}``, or
    on ``/v1/`` OpenAI's ``{"error": {"message", "type", "param", "code"}}``; else why not."""
    problem = _json_error(headers, body)
    if isinstance(problem, str):
        return problem
    error = problem.get("error")
    if path.startswith("/v1/"):
        if not isinstance(error, dict) or not isinstance(error.get("message"), str) \
                or not isinstance(error.get("type"), str):
            return "not OpenAI's error object {error: {message, type, param, code}}"
        return None
    if not isinstance(error, str) or not error:
        return 'not the OIP error {"error": "<message>"}'
    return None


def _json_error(headers: Mapping[str, str], body: bytes) -> dict[str, Any] | str:
    ctype = _header(headers, "content-type").split(";", 1)[0].strip()
    if ctype != "application/json":
        return f"error answered as {ctype or 'no content type'}, not application/json: " \
               f"{body[:120]!r}"
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return f"error body is not JSON: {body[:120]!r}"
    if not isinstance(data, dict):
        return "error body is not a JSON object"
    return data


def _header(headers: Mapping[str, str], name: str) -> str:
    for key, value in headers.items():
        if key.lower() == name:
            return value
    return ""


def _asked_deadline_ms(case: Case) -> float | None:
    """The shortest deadline the case asks for: the header, or the OIP ``timeout`` parameter
    (microseconds, Triton's name; 0 is none)."""
    headers: Mapping[str, Any] = case.headers or {}
    raw = headers.get("X-Request-Timeout-Ms")
    asked: list[float] = []
    try:
        if raw is not None:
            asked.append(float(raw))
    except (TypeError, ValueError):
        pass
    body = case.body if isinstance(case.body, dict) else {}
    parameters = body.get("parameters")
    timeout_us = parameters.get("timeout") if isinstance(parameters, dict) else None
    if isinstance(timeout_us, int) and not isinstance(timeout_us, bool) and timeout_us > 0:
        asked.append(timeout_us / 1000.0)
    return min(asked, default=None)


def check_response(case: Case, status: int, headers: Mapping[str, str], body: bytes,
                   error_shape: ErrorShape) -> list[tuple[str, str]]:
    """The project's own checks: ``(check, detail)`` for each that failed."""
    failed: list[tuple[str, str]] = []
    path = case.formatted_path
    if status >= 500:
        asked = _asked_deadline_ms(case)
        # A short deadline may rightly end in 504 (it passed) or 503 (the scheduler saw at
        # once that the work ahead outlasts it).
        excused = status in (503, 504) and asked is not None and asked < 1000.0
        if not excused:
            failed.append(("no_server_error", f"{status}: {body[:300]!r}"))
    if status >= 400:
        shape = error_shape(path, status, headers, body)
        if shape is not None:
            failed.append(("error_shape", shape))
    return failed


def _schema_checks(mode: GenerationMode) -> list[Any]:
    from schemathesis.specs.openapi import checks

    found = [checks.status_code_conformance, checks.content_type_conformance,
             checks.response_headers_conformance, checks.response_schema_conformance]
    if mode == GenerationMode.NEGATIVE:
        found.append(checks.negative_data_rejection)
    return found


def fuzz_operation(
    operation: APIOperation,
    *,
    base_url: str,
    mode: GenerationMode,
    examples: int,
    run_seed: int,
    report: FuzzReport,
    error_shape: ErrorShape,
    headers: Mapping[str, str] | None = None,
    deadline: float = math.inf,
) -> None:
    """Send up to ``examples`` generated cases for one operation and record what failed.

    Failures are recorded, not raised, so one defect does not stop the run (and Hypothesis
    does not spend the run shrinking it); the caller decides.
    """
    extra = dict(headers or {})
    schema_checks = _schema_checks(mode)
    label = f"{operation.method.upper()} {operation.path}"

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(max_examples=examples, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck), print_blob=False)
    @seed(run_seed)
    def run(case: Case) -> None:
        if time.monotonic() > deadline:
            return
        try:
            response = case.call(base_url=base_url, headers=extra, timeout=30)
        except Exception as exc:  # the connection broke: the server may have died
            report.cases += 1
            report.failed_cases += 1
            report.add(Finding(label, "connection", 0, f"{type(exc).__name__}: {exc}"[:300],
                               _curl(case, base_url, extra)))
            return
        report.cases += 1
        report.statuses[response.status_code] += 1
        flat = {k: v[0] if isinstance(v, list) and v else str(v)
                for k, v in response.headers.items()}
        failed = check_response(case, response.status_code, flat, response.content, error_shape)
        try:
            case.validate_response(response, checks=schema_checks)
        except FailureGroup as group:
            failed += [(_check_name(f), _one_line(f.title + ": " + f.message))
                       for f in group.exceptions]
        except Failure as one:
            failed.append((_check_name(one), _one_line(one.title + ": " + one.message)))
        if failed:
            report.failed_cases += 1
        for check, detail in failed:
            report.add(Finding(label, check, response.status_code, detail,
                               _curl(case, base_url, extra)))

    try:
        run()
    except Unsatisfiable:  # nothing to negate (no parameters, or only free strings)
        return
    except Exception as exc:  # generation itself failed
        note = f"{label} {mode.value}: {type(exc).__name__}: {_one_line(str(exc))[:200]}"
        if note not in report.generation_errors:
            report.generation_errors.append(note)


def _check_name(failure: Failure) -> str:
    return failure.checks[0] if failure.checks else type(failure).__name__


def _one_line(text: str) -> str:
    return " ".join(text.split())[:400]


def _curl(case: Case, base_url: str, headers: Mapping[str, str]) -> str:
    try:
        return case.as_curl_command(headers=dict(headers), base_url=base_url)[:1500]
    except Exception as exc:
        return f"(no curl: {exc})"


def fuzz_service(
    document: dict[str, Any],
    *,
    service: str,
    base_url: str,
    cases: int,
    seconds: float,
    error_shape: ErrorShape,
    headers_for: Callable[[APIOperation], Mapping[str, str]] | None = None,
    only: Callable[[APIOperation], bool] | None = None,
    first_seed: int = 0,
) -> FuzzReport:
    """Fuzz every operation, both modes, in rounds until ``cases`` ran or ``seconds`` passed.

    Round r gives each (operation, mode) ``ceil(cases / pairs)`` examples with seed
    ``first_seed + r``; operations with few distinct cases finish early, so later rounds fill
    up the count with new seeds (at most 50 rounds).
    """
    report = FuzzReport(service)
    ops = [op for op in operations(document) if only is None or only(op)]
    pairs = max(1, len(ops) * len(MODES))
    per_pair = max(1, math.ceil(cases / pairs))
    started = time.monotonic()
    deadline = started + seconds
    for round_no in range(50):
        if report.cases >= cases or time.monotonic() > deadline:
            break
        report.rounds += 1
        before = report.cases
        for op in ops:
            for mode in MODES:
                if report.cases >= cases or time.monotonic() > deadline:
                    break
                fuzz_operation(op, base_url=base_url, mode=mode, examples=per_pair,
                               run_seed=first_seed + round_no, report=report,
                               error_shape=error_shape,
                               headers=headers_for(op) if headers_for else None,
                               deadline=deadline)
        if report.cases == before:
            break  # nothing new can be generated
    report.duration_s = time.monotonic() - started
    return report


def still_serving(base_url: str, ready_path: str,
                  request: tuple[str, dict[str, Any]]) -> str | None:
    """None when the service answers its readiness probe and one valid POST with 200."""
    path, body = request
    with httpx.Client(base_url=base_url, timeout=30) as client:
        ready = client.get(ready_path)
        if ready.status_code != 200:
            return f"GET {ready_path} answered {ready.status_code}: {ready.text[:200]}"
        answer = client.post(path, json=body)
        if answer.status_code != 200:
            return f"POST {path} answered {answer.status_code}: {answer.text[:200]}"
    return None


def gateway_headers(operation: APIOperation) -> dict[str, str]:
    """The admin token for the admin and dashboard routes (the fuzz gateway has one)."""
    if operation.path.startswith(("/admin", "/dashboard")):
        return {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    return {}


VALID_GATEWAY = ("/v1/embeddings", {"model": "minilm", "input": ["still serving?"]})
VALID_BACKEND = ("/v2/models/minilm/infer",
                 {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1],
                              "data": ["still serving?"]}]})
REPO = Path(__file__).resolve().parent.parent


@contextlib.contextmanager
def services(models: Path) -> Iterator[tuple[str, str]]:
    """A real backend and a real gateway (admin token set) in front of it: their URLs."""
    from bench import services as svc

    with svc.backend(models, cores=None) as backend, svc.gateway(
        backend.url, cores=None,
        settings={"admin_token": ADMIN_TOKEN, "logging": {"level": "WARNING"}},
        name="fuzz-gateway",
    ) as gateway:
        yield backend.url, gateway.url


def _report(reports: Sequence[FuzzReport], alive: Mapping[str, str | None]) -> int:
    print("| service | cases | failed cases | distinct failures | duration | statuses |")
    print("| --- | --- | --- | --- | --- | --- |")
    for report in reports:
        print(report.summary())
    code = 0
    for report in reports:
        verdict = alive[report.service]
        print(f"\n{report.service}: still serving afterwards: "
              f"{'yes' if verdict is None else 'NO: ' + verdict}")
        if verdict is not None:
            code = 1
        for finding in report.findings.values():
            code = 1
            print(finding.describe())
        for note in report.generation_errors:
            print(f"  (generation: {note})")
    return code


def main(argv: Sequence[str]) -> int:
    """``python -m bench fuzz``: schemathesis' runner (``bench/fuzz_cli.py``); with
    ``--engine own`` first, this module's engine (10,000 cases per service by default)."""
    args_in = list(argv)
    if args_in[:2] != ["--engine", "own"]:
        from bench import fuzz_cli

        return fuzz_cli.main(args_in)
    argv = args_in[2:]
    parser = argparse.ArgumentParser(prog="python -m bench fuzz --engine own")
    parser.add_argument("--cases", type=int, default=10_000, help="cases per service")
    parser.add_argument("--minutes", type=float, default=30.0, help="time cap per service")
    parser.add_argument("--models", type=Path, default=REPO / "models")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    reports: list[FuzzReport] = []
    alive: dict[str, str | None] = {}
    with services(args.models) as (backend_url, gateway_url):
        for service, url, doc, shape, headers, ready, valid in (
            # The gateway's document as served: its cached routes are generated.
            ("gateway", gateway_url, gateway_openapi.document(), gateway_error_shape,
             gateway_headers, "/readyz", VALID_GATEWAY),
            ("backend", backend_url, load_document(REPO / "backend" / "openapi.json"),
             backend_error_shape, None, "/v2/health/ready", VALID_BACKEND),
        ):
            print(f"fuzzing {service} at {url}: {args.cases} cases", file=sys.stderr, flush=True)
            report = fuzz_service(doc, service=service, base_url=url,
                                  cases=args.cases, seconds=args.minutes * 60.0,
                                  error_shape=shape, headers_for=headers, first_seed=args.seed)
            reports.append(report)
            alive[service] = still_serving(url, ready, valid)
    return _report(reports, alive)
