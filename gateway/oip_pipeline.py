"""Open Inference Protocol v2 ``infer`` through the cache: whole-request caching.

The canonical form of a request drops ``id`` and orders every object's keys (so ``parameters`` in
any order hash alike); BYTES inputs are normalised and scanned by the policy exactly like the
OpenAI-style routes, and what reaches the backend is the normalised (or redacted) text. The stored
answer never holds the request id; it is put back on the way out.

Answers are JSON: requests for binary outputs (Triton's ``binary_data_output`` and per-output
``binary_data``) are stripped before the key and the backend call, so the gateway caches and
returns JSON, which clients asking for binary data (tritonclient) read too, and such requests
share cache entries with plain ones.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.cache.entry import Entry
from gateway.cache.tiered import TieredCache
from gateway.context import RequestContext
from gateway.errors import BadGateway, GatewayError, ValidationFailed
from gateway.keys import derive_key
from gateway.pipeline import BYPASS, COALESCED, HIT, MISS, STALE, Pipeline
from gateway.singleflight import FlightAbandoned, SingleFlight
from gateway.upstream import Upstream

_TIMING = re.compile(r"(queue|compute);dur=([0-9.]+)")
_TENSOR_KEYS = {"name", "datatype", "shape", "data", "parameters"}


@dataclass(frozen=True, slots=True)
class OipRequest:
    """A validated OIP infer request with its BYTES texts pulled out (row-major order)."""

    body: dict[str, Any]
    texts: list[str]


@dataclass(frozen=True, slots=True)
class OipAnswer:
    body: bytes
    status: str
    age_s: float


def _flatten(data: Any, out: list[Any]) -> None:
    if isinstance(data, list):
        for item in data:
            _flatten(item, out)
    else:
        out.append(data)


def validate(body: dict[str, Any], max_items: int) -> OipRequest:
    """Check the request against the OIP v2 schema for a text (BYTES) model."""
    unknown = set(body) - {"id", "inputs", "outputs", "parameters"}
    if unknown:
        raise ValidationFailed(sorted(unknown)[0], "unknown field in an OIP infer request")
    if "id" in body and not isinstance(body["id"], str):
        raise ValidationFailed("id", "must be a string")
    if "parameters" in body and not isinstance(body["parameters"], dict):
        raise ValidationFailed("parameters", "must be an object")
    outputs = body.get("outputs")
    if outputs is not None and (not isinstance(outputs, list) or not all(
            isinstance(o, dict) and isinstance(o.get("name"), str) for o in outputs)):
        raise ValidationFailed("outputs", "must be a list of objects with a string name")
    inputs = body.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise ValidationFailed("inputs", "must be a non-empty list of tensors")
    texts: list[str] = []
    for i, tensor in enumerate(inputs):
        where = f"inputs[{i}]"
        if not isinstance(tensor, dict):
            raise ValidationFailed(where, "must be an object")
        extra = set(tensor) - _TENSOR_KEYS
        if extra:
            raise ValidationFailed(f"{where}.{sorted(extra)[0]}", "unknown tensor field")
        if not isinstance(tensor.get("name"), str) or not tensor["name"]:
            raise ValidationFailed(f"{where}.name", "is required (a string)")
        if tensor.get("datatype") != "BYTES":
            raise ValidationFailed(f"{where}.datatype",
                                   "must be BYTES: the gateway serves text models")
        shape = tensor.get("shape")
        if not isinstance(shape, list) or not shape or not all(
                isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
            raise ValidationFailed(f"{where}.shape", "must be a list of non-negative integers")
        flat: list[Any] = []
        _flatten(tensor.get("data"), flat)
        if "data" not in tensor:
            raise ValidationFailed(f"{where}.data", "is required")
        if len(flat) != math.prod(shape):
            raise ValidationFailed(f"{where}.data",
                                   f"has {len(flat)} elements but shape {shape} needs "
                                   f"{math.prod(shape)}")
        for j, item in enumerate(flat):
            if not isinstance(item, str):
                raise ValidationFailed(f"{where}.data[{j}]", "BYTES elements must be strings")
        texts.extend(flat)
        if len(texts) > max_items:
            raise ValidationFailed(where, f"more than {max_items} elements in one request")
    return OipRequest(body=body, texts=texts)


def _with_texts(body: dict[str, Any], texts: list[str]) -> dict[str, Any]:
    """The request with its BYTES data replaced by the policy's texts (flat, same shapes)."""
    it = iter(texts)
    inputs = []
    for tensor in body["inputs"]:
        n = math.prod(tensor["shape"])
        inputs.append({**tensor, "data": [next(it) for _ in range(n)]})
    out = {k: v for k, v in body.items() if k != "id"}
    out["inputs"] = inputs
    out = _without_parameter(out, "binary_data_output")  # the gateway answers JSON
    if isinstance(out.get("outputs"), list):
        out["outputs"] = [_without_parameter(o, "binary_data") for o in out["outputs"]]
    return out


def _without_parameter(obj: dict[str, Any], name: str) -> dict[str, Any]:
    """``obj`` without ``parameters[name]`` (and without ``parameters`` if that empties it)."""
    params = obj.get("parameters")
    if not isinstance(params, dict) or name not in params:
        return obj
    rest = {k: v for k, v in params.items() if k != name}
    trimmed = {k: v for k, v in obj.items() if k != "parameters"}
    if rest:
        trimmed["parameters"] = rest
    return trimmed


def _backend_refusal(status: int, answer: Any) -> GatewayError:
    """A backend 4xx on a request the gateway found valid: pass its status and message on."""
    message = answer.get("error") if isinstance(answer, dict) else None
    err = GatewayError(f"backend refused the request: {message or 'no message'}")
    err.status = status if 400 <= status < 500 else 502
    err.type = "backend_rejected" if err.status < 500 else "bad_gateway"
    return err


class OipPipeline:
    """The OIP infer path: policy, key, cache, singleflight, upstream, store."""

    def __init__(self, *, pipeline: Pipeline, cache: TieredCache, upstream: Upstream,
                 model_version: Callable[[str], str | None]) -> None:
        self.pipeline = pipeline
        self.cache = cache
        self.upstream = upstream
        self.model_version = model_version
        self.flights: SingleFlight[Any, bytes] = SingleFlight()

    async def infer(self, ctx: RequestContext, model: str, req: OipRequest) -> OipAnswer:
        decision = self.pipeline.policy(ctx, model, [("inputs", req.texts)])
        texts = [item.text for item in decision.items]
        outgoing = _with_texts(req.body, texts)
        canonical = orjson.dumps(outgoing, option=orjson.OPT_SORT_KEYS)
        key = derive_key(route=ctx.route, model=model,
                         model_version=self.model_version(model) or "unknown",
                         scope=decision.scope,
                         normalization=decision.rule.normalization.fingerprint,
                         canonical=canonical)
        rule = decision.rule
        use_cache = decision.cache and ctx.directives.may_write
        storable = use_cache and all(item.store for item in decision.items)
        stale: Entry | None = None
        now = time.time()
        if use_cache and ctx.directives.may_read:
            t0 = time.perf_counter()
            (entry, _tier), = await self.cache.get_many([key])
            ctx.add_timing("cache", time.perf_counter() - t0)
            if entry is not None:
                age = entry.age(now)
                young = ctx.directives.max_age is None or age <= ctx.directives.max_age
                if young and entry.is_fresh(now):
                    return self._done(ctx, entry.value, HIT, age, req)
                if young and entry.within_swr(now):
                    self.pipeline.spawn(self._refresh(ctx, model, key, outgoing, rule, storable))
                    return self._done(ctx, entry.value, STALE, age, req)
                stale = entry

        fut, leader = self.flights.claim(key)
        if not leader:
            try:
                body = await self.flights.join(fut)
            except FlightAbandoned:
                body, _ = await self._call(ctx, model, outgoing)
            except GatewayError as exc:
                return self._stale_or_raise(ctx, stale, exc, req)
            return self._done(ctx, body, COALESCED if use_cache else BYPASS, 0.0, req)
        try:
            body, compute_ms = await self._call(ctx, model, outgoing)
        except BaseException as exc:
            self.flights.reject(key, exc)
            if isinstance(exc, GatewayError):
                return self._stale_or_raise(ctx, stale, exc, req)
            raise
        self.flights.resolve(key, body)
        if storable:
            self._store(key, body, rule, compute_ms)
        return self._done(ctx, body, MISS if use_cache else BYPASS, 0.0, req)

    async def _call(self, ctx: RequestContext, model: str,
                    outgoing: dict[str, Any]) -> tuple[bytes, float]:
        t0 = time.perf_counter()
        raw = await self.upstream.infer_raw(model, orjson.dumps(outgoing),
                                            request_id=ctx.request_id, deadline=ctx.deadline)
        ctx.add_timing("upstream", time.perf_counter() - t0)
        try:
            answer = orjson.loads(raw.body)
        except orjson.JSONDecodeError:
            raise BadGateway(f"backend {raw.backend} answered with invalid JSON") from None
        if raw.status != 200:
            raise _backend_refusal(raw.status, answer)
        if not isinstance(answer, dict) or not isinstance(answer.get("outputs"), list):
            raise BadGateway(f"backend {raw.backend} answered without outputs")
        answer.pop("id", None)
        timing = dict(_TIMING.findall(raw.headers.get("Server-Timing", "")))
        compute_ms = float(timing.get("compute", 0.0))
        ctx.add_timing("queue", float(timing.get("queue", 0.0)) / 1000.0)
        ctx.add_timing("compute", compute_ms / 1000.0)
        return orjson.dumps(answer), compute_ms

    def _store(self, key: Any, body: bytes, rule: Any, compute_ms: float) -> None:
        entry = Entry(value=body, created_at=time.time(), ttl_s=rule.ttl_s,
                      stale_while_revalidate_s=rule.stale_while_revalidate_s,
                      stale_if_error_s=rule.stale_if_error_s, compute_ms=compute_ms)
        self.pipeline.spawn(self.cache.set_many([(key, entry)], background=True))

    async def _refresh(self, ctx: RequestContext, model: str, key: Any,
                       outgoing: dict[str, Any], rule: Any, storable: bool) -> None:
        _fut, leader = self.flights.claim(key)
        if not leader:
            return
        refresh_ctx = RequestContext(request_id=ctx.request_id, route=ctx.route,
                                     tenant=ctx.tenant, deadline=time.monotonic() + 30.0)
        try:
            body, compute_ms = await self._call(refresh_ctx, model, outgoing)
        except BaseException as exc:
            self.flights.reject(key, exc)
            if not isinstance(exc, GatewayError):
                raise
            return
        self.flights.resolve(key, body)
        if storable:
            self._store(key, body, rule, compute_ms)

    def _stale_or_raise(self, ctx: RequestContext, stale: Entry | None, exc: GatewayError,
                        req: OipRequest) -> OipAnswer:
        now = time.time()
        if stale is not None and exc.status >= 500 and stale.within_sie(now):
            return self._done(ctx, stale.value, STALE, stale.age(now), req)
        raise exc

    @staticmethod
    def _done(ctx: RequestContext, body: bytes, status: str, age: float,
              req: OipRequest) -> OipAnswer:
        ctx.cache_status = status
        rid = req.body.get("id")
        if rid is not None:
            answer = orjson.loads(body)
            answer["id"] = rid
            body = orjson.dumps(answer)
        return OipAnswer(body=body, status=status, age_s=age)
