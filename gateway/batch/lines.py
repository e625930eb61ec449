"""One batch line through the one pipeline, exactly as an interactive call of its route.

The line's body is parsed by the route's own adapter (``parse_embeddings``, ``parse_classify``,
``parse_rank``: same validation), run by ``Pipeline.run`` under a ``RequestContext`` for the
batch's tenant (same policy, PII actions, tenant scope, per-text cache and routing), and
rendered by the same ``Call.render``. What comes back is the line's output or error line.

A backend that sheds, times out or fails (503, 504, 502) says nothing about the line: the
runner raises ``Retry`` and the worker tries the line again later. Any other error is the
line's answer and goes to the error file.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.adapters.render import FragmentCache
from gateway.adapters.texts import parse_classify, parse_embeddings, parse_rank
from gateway.batch.jsonl import BadLine, error_line, parse_request, response_line
from gateway.context import RequestContext
from gateway.errors import BadGateway, DeadlineExceeded, GatewayError, ModelNotFound, Overloaded
from gateway.fairqueue import BATCH
from gateway.pipeline import Call, Pipeline
from gateway.settings import Settings

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
                 model_width: Callable[[str], int | None], fragments: FragmentCache) -> None:
        self._pipeline = pipeline
        self._settings = settings
        self._width = model_width
        self._fragments = fragments
        self._parsers: dict[str, Callable[[dict[str, Any]], Call]] = {
            "/v1/embeddings": lambda body: parse_embeddings(
                body, self._resolve, width=self._width, fragments=self._fragments),
            "/v1/classify": lambda body: parse_classify(body, self._resolve),
            "/v1/rank": lambda body: parse_rank(body, self._resolve),
        }

    def _resolve(self, name: str) -> str:
        model = self._settings.resolve_model(name)
        if model is None:
            known = ", ".join(self._settings.models)
            raise ModelNotFound(f"model {name!r} is not served here (known: {known})")
        return model

    async def run(self, *, batch_id: str, tenant: str, endpoint: str, index: int, number: int,
                  raw: bytes) -> LineResult:
        """The line's answer; ``Retry`` when only a later try can give one."""
        rid = line_id(batch_id, index)
        try:
            custom_id, body = parse_request(raw, number, endpoint)
        except BadLine as bad:
            return LineResult(False, error_line(rid, bad.custom_id, "invalid_request_line",
                                                bad.message, number))
        try:
            call = self._parsers[endpoint](body)
            # Batch lines go at the lowest priority, in the gateway's queue and the backend's.
            ctx = RequestContext(
                request_id=rid, route=endpoint, tenant=tenant, priority=BATCH,
                deadline=time.monotonic() + self._settings.max_timeout_ms / 1000.0)
            result = await self._pipeline.run(ctx, call)
            rendered = call.render(result)
        except _TRANSIENT as exc:
            raise Retry(exc) from None
        except GatewayError as exc:
            error = {"error": {"type": exc.type, "message": exc.public_message,
                               "request_id": rid}}
            return LineResult(False, response_line(rid, custom_id, exc.status, rid,
                                                   orjson.dumps(error)))
        return LineResult(True, response_line(rid, custom_id, 200, rid, rendered))
