"""One batch line through the one pipeline, exactly as an interactive call of its route.

The line's body is parsed by the route's own adapter (``parse_embeddings``, ``parse_classify``,
``parse_rank``: same validation), run by ``Pipeline.run`` under a ``RequestContext`` for the
batch's tenant (same policy, PII actions, tenant scope, per-text cache and routing), and
rendered by the same ``Call.render``. What comes back is the line's output or error line.

A backend that sheds, times out or fails (503, 504, 502) says nothing about the line: the
runner raises ``Retry`` and the worker tries the line again later. A line the tenant's quota
refuses raises ``OverQuota`` (gateway/batch/quota.py: charged like an interactive call, never
computed free). Any other error is the line's answer and goes to the error file. A line
answered counts in the tenant's accounting like an interactive request.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import orjson

from gateway.adapters.registry import BY_PATH, Parsing
from gateway.adapters.render import FragmentCache
from gateway.batch.jsonl import BadLine, error_line, parse_request, response_line
from gateway.batch.quota import QUOTA_EXCEEDED, LineCharge, OverQuota, reason
from gateway.errors import (
    BadGateway,
    DeadlineExceeded,
    GatewayError,
    ModelNotFound,
    Overloaded,
    RateLimited,
)
from gateway.pipeline import Pipeline
from gateway.pipeline.accounting import usage_of
from gateway.pipeline.context import RequestContext
from gateway.settings import Settings
from gateway.telemetry.observer import NullObserver, Observer
from gateway.tenants.quota.limiter import QuotaGate
from gateway.upstream.admission.fairqueue import BATCH

_TRANSIENT = (Overloaded, DeadlineExceeded, BadGateway)


class Retry(Exception):
    """The backends could not answer the line now (shed, timed out, failed): try it later."""

    def __init__(self, error: GatewayError) -> None:
        super().__init__(error.type)
        self.error = error


@dataclass(frozen=True, slots=True)
class LineResult:
    """A line's answer: the JSONL line and whether it belongs in the output file."""

    ok: bool
    line: bytes


def line_id(batch_id: str, index: int) -> str:
    """The output line's id (also the request id the pipeline and the backends see)."""
    return f"batch_req_{batch_id.removeprefix('batch_')}_{index}"


class LineRunner:
    """Runs batch lines through the pipeline with the route adapters of the interactive path."""

    def __init__(self, pipeline: Pipeline, settings: Settings, *,
                 model_width: Callable[[str], int | None], fragments: FragmentCache,
                 quotas: QuotaGate | None = None, observer: Observer | None = None) -> None:
        self._pipeline = pipeline
        self._settings = settings
        self._quotas = quotas
        self._observer: Observer = observer or NullObserver()
        self._parsing = Parsing(resolve=self._resolve, width=model_width, fragments=fragments)

    def _resolve(self, name: str) -> str:
        model = self._settings.resolve_model(name)
        if model is None:
            known = ", ".join(self._settings.models)
            raise ModelNotFound(f"model {name!r} is not served here (known: {known})")
        return model

    async def run(self, *, batch_id: str, tenant: str, endpoint: str, index: int, number: int,
                  raw: bytes) -> LineResult:
        """The line's answer; ``Retry`` when only a later try can give one, ``OverQuota`` when
        the tenant's quota refuses it now."""
        rid = line_id(batch_id, index)
        try:
            custom_id, body = parse_request(raw, number, endpoint)
        except BadLine as bad:
            return LineResult(False, error_line(rid, bad.custom_id, "invalid_request_line",
                                                bad.message, number))
        gate = self._quotas
        quota = gate.state(tenant) if gate is not None else None
        charge: LineCharge | None = None
        try:
            call = BY_PATH[endpoint].parse(body, self._parsing)
            # Batch lines go at the lowest priority, in the gateway's queue and the backend's.
            ctx = RequestContext(
                request_id=rid, route=endpoint, tenant=tenant, priority=BATCH,
                deadline=time.monotonic() + self._settings.max_timeout_ms / 1000.0)
            if gate is not None and quota is not None:  # as the HTTP handlers do
                await quota.admit()
                charge = LineCharge(quota, gate.settings.hit_cost)
                ctx.charge = charge
            result = await self._pipeline.run(ctx, call)
            rendered = call.render(result)
        except RateLimited as exc:
            never = charge is not None and charge.never
            raise OverQuota(exc, never=never, line=error_line(
                rid, custom_id, QUOTA_EXCEEDED, reason(exc, never), number)) from None
        except _TRANSIENT as exc:
            raise Retry(exc) from None
        except GatewayError as exc:
            error = {"error": {"type": exc.type, "message": exc.public_message,
                               "request_id": rid}}
            return LineResult(False, response_line(rid, custom_id, exc.status, rid,
                                                   orjson.dumps(error)))
        self._observer.tenant_request(tenant, "ok")
        self._observer.tenant_usage(tenant, usage_of(result.outcomes,
                                                     ctx.timings.get("compute", 0.0)))
        return LineResult(True, response_line(rid, custom_id, 200, rid, rendered))
