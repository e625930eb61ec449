"""``/v1/embeddings`` (OpenAI-compatible), ``/v1/classify`` and ``/v1/rank``.

All three are answered from per-text embeddings, so all three share the pipeline: each text is
cached on its own and only misses reach a backend. Classification is zero-shot by cosine
similarity between each input and each label; ranking by cosine similarity between the query and
each document (the embeddings are L2-normalised, so the dot product is the cosine).
"""

from __future__ import annotations

import base64
import time
from typing import Any

import numpy as np
import orjson
from aiohttp import web

from gateway import state
from gateway.errors import ValidationFailed
from gateway.handlers.common import cache_headers, make_context, resolve_model
from gateway.handlers.parsing import check_keys, read_json, require_str, text_list

_JSON_OPTS = orjson.OPT_SERIALIZE_NUMPY
# Softmax temperature turning label cosines into probabilities (CLIP-style zero-shot scale).
CLASSIFY_TEMPERATURE = 0.05


def _json(payload: Any, headers: dict[str, str]) -> web.Response:
    return web.Response(body=orjson.dumps(payload, option=_JSON_OPTS),
                        content_type="application/json", headers=headers)


async def embeddings(request: web.Request) -> web.Response:
    t0 = time.perf_counter()
    settings = request.app[state.SETTINGS]
    data = await read_json(request, settings.max_body_bytes)
    check_keys(data, {"model", "input", "encoding_format", "user", "dimensions"})
    name = require_str(data, "model")
    texts = text_list(data.get("input"), "input")
    fmt = data.get("encoding_format", "float")
    if fmt not in ("float", "base64"):
        raise ValidationFailed("encoding_format", "must be 'float' or 'base64'")
    model = resolve_model(request, name)
    ctx = make_context(request, "/v1/embeddings")
    dims = data.get("dimensions")
    ctx.add_timing("parse", time.perf_counter() - t0)

    result = await request.app[state.PIPELINE].embed(ctx, model, [("input", texts)])
    if dims is not None:
        width = result.items[0].vector.shape[0]
        if not isinstance(dims, int) or isinstance(dims, bool) or not 0 < dims <= width:
            raise ValidationFailed("dimensions", f"must be an integer from 1 to {width}")
    tokens = result.tokens
    if dims is None and fmt == "float":
        body = request.app[state.FRAGMENTS].embeddings_body(result.items, name, tokens)
        return web.Response(body=body, content_type="application/json",
                            headers=cache_headers(ctx, result.age_s))
    rows = []
    for index, item in enumerate(result.items):
        vec = item.vector if dims is None else _renormalise(item.vector[:dims])
        emb: Any = (base64.b64encode(vec.astype("<f4").tobytes()).decode("ascii")
                    if fmt == "base64" else vec)
        rows.append({"object": "embedding", "index": index, "embedding": emb})
    payload = {"object": "list", "data": rows, "model": name,
               "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
    return _json(payload, cache_headers(ctx, result.age_s))


def _renormalise(vec: np.ndarray) -> np.ndarray:
    norm = float(np.linalg.norm(vec))
    return vec / norm if norm > 0 else vec


async def classify(request: web.Request) -> web.Response:
    t0 = time.perf_counter()
    settings = request.app[state.SETTINGS]
    data = await read_json(request, settings.max_body_bytes)
    check_keys(data, {"model", "input", "labels", "multi_label"})
    name = require_str(data, "model")
    texts = text_list(data.get("input"), "input")
    labels = text_list(data.get("labels"), "labels", allow_single=False)
    if len(set(labels)) != len(labels):
        raise ValidationFailed("labels", "must not repeat a label")
    model = resolve_model(request, name)
    ctx = make_context(request, "/v1/classify")
    ctx.add_timing("parse", time.perf_counter() - t0)

    result = await request.app[state.PIPELINE].embed(
        ctx, model, [("input", texts), ("labels", labels)]
    )
    vectors = np.stack([i.vector for i in result.items])
    inputs, label_vecs = vectors[: len(texts)], vectors[len(texts):]
    sims = inputs @ label_vecs.T
    logits = sims / CLASSIFY_TEMPERATURE
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    out = []
    for i in range(len(texts)):
        order = np.argsort(-sims[i], kind="stable")
        out.append({
            "index": i,
            "labels": [
                {"label": labels[j], "score": round(float(sims[i, j]), 6),
                 "probability": round(float(probs[i, j]), 6)}
                for j in order
            ],
        })
    tokens = result.tokens
    payload = {"object": "list", "data": out, "model": name,
               "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
    return _json(payload, cache_headers(ctx, result.age_s))


async def rank(request: web.Request) -> web.Response:
    t0 = time.perf_counter()
    settings = request.app[state.SETTINGS]
    data = await read_json(request, settings.max_body_bytes)
    check_keys(data, {"model", "query", "documents", "top_n", "return_documents"})
    name = require_str(data, "model")
    query = require_str(data, "query")
    docs = text_list(data.get("documents"), "documents", allow_single=False)
    top_n = data.get("top_n", len(docs))
    if not isinstance(top_n, int) or isinstance(top_n, bool) or top_n < 1:
        raise ValidationFailed("top_n", "must be a positive integer")
    return_docs = data.get("return_documents", False)
    if not isinstance(return_docs, bool):
        raise ValidationFailed("return_documents", "must be true or false")
    model = resolve_model(request, name)
    ctx = make_context(request, "/v1/rank")
    ctx.add_timing("parse", time.perf_counter() - t0)

    result = await request.app[state.PIPELINE].embed(
        ctx, model, [("query", [query]), ("documents", docs)]
    )
    vectors = np.stack([i.vector for i in result.items])
    scores = vectors[1:] @ vectors[0]
    order = np.argsort(-scores, kind="stable")[:top_n]
    results = []
    for j in order:
        row: dict[str, Any] = {"index": int(j), "relevance_score": round(float(scores[j]), 6)}
        if return_docs:
            row["document"] = {"text": docs[j]}
        results.append(row)
    tokens = result.tokens
    payload = {"object": "list", "results": results, "model": name,
               "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}
    return _json(payload, cache_headers(ctx, result.age_s))
