"""The per-text routes: ``/v1/embeddings`` (OpenAI-compatible), ``/v1/classify``, ``/v1/rank``.

All three are answered from per-text embeddings: each text is one cache item, and only the
missing ones reach a backend, in one call. Classification is zero-shot by cosine similarity
between each input and each label; ranking by cosine similarity between the query and each
document (the embeddings are L2-normalised, so the dot product is the cosine).

``parse_*`` validate a JSON body completely (everything that can be checked without a backend),
so a bad request never reaches a cache or a backend; ``render`` builds the response body. What
happens between the two (the items, their keys, the backend calls) is the pipeline's.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from gateway.adapters.fields import check_keys, positive_int, require_str, text_list
from gateway.adapters.render import FragmentCache
from gateway.errors import ValidationFailed
from gateway.pipeline import PER_TEXT, PerText, Result
from gateway.pipeline.vectors import tokens, vector

_NUMPY = orjson.OPT_SERIALIZE_NUMPY
# Softmax temperature turning label cosines into probabilities (CLIP-style zero-shot scale).
CLASSIFY_TEMPERATURE = 0.05

Resolve = Callable[[str], str]
"""Client model name -> backend model name (raises ModelNotFound)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TextCall:
    """What the three routes share: one item per text (``PER_TEXT``)."""

    model: str
    name: str
    """The model name as the client sent it (echoed in the answer)."""
    groups: tuple[tuple[str, tuple[str, ...]], ...]
    """The texts by field, for the policy (and the renderers: labels, documents)."""
    unit: PerText = PER_TEXT

    def _usage(self, result: Result) -> dict[str, int]:
        n = sum(tokens(o) for o in result.outcomes)
        return {"prompt_tokens": n, "total_tokens": n}


@dataclass(frozen=True, slots=True, kw_only=True)
class EmbeddingsCall(TextCall):
    encoding_format: str = "float"
    dimensions: int | None = None
    fragments: FragmentCache | None = None

    def render(self, result: Result) -> bytes:
        if (self.dimensions is None and self.encoding_format == "float"
                and self.fragments is not None):
            n = sum(tokens(o) for o in result.outcomes)
            return self.fragments.embeddings_body(result.outcomes, self.name, n)
        rows = []
        for index, item in enumerate(result.outcomes):
            vec = vector(item)
            if self.dimensions is not None:
                vec = _renormalise(vec[: self.dimensions])
            emb: Any = (base64.b64encode(vec.astype("<f4").tobytes()).decode("ascii")
                        if self.encoding_format == "base64" else vec)
            rows.append({"object": "embedding", "index": index, "embedding": emb})
        return orjson.dumps({"object": "list", "data": rows, "model": self.name,
                             "usage": self._usage(result)}, option=_NUMPY)


def parse_embeddings(data: dict[str, Any], resolve: Resolve, *,
                     width: Callable[[str], int | None] = lambda _model: None,
                     fragments: FragmentCache | None = None) -> EmbeddingsCall:
    """``width``: a model's embedding size when known (it bounds ``dimensions``)."""
    check_keys(data, {"model", "input", "encoding_format", "user", "dimensions"})
    name = require_str(data, "model")
    texts = text_list(data.get("input"), "input")
    if "user" in data and not isinstance(data["user"], str):
        raise ValidationFailed("user", "must be a string")
    fmt = data.get("encoding_format", "float")
    if fmt not in ("float", "base64"):
        raise ValidationFailed("encoding_format", "must be 'float' or 'base64'")
    model = resolve(name)
    dims = (positive_int(data, "dimensions", 1, upper=width(model)) if "dimensions" in data
            else None)
    return EmbeddingsCall(model=model, name=name, groups=(("input", tuple(texts)),),
                          encoding_format=fmt, dimensions=dims, fragments=fragments)


def _renormalise(vec: np.ndarray) -> np.ndarray:
    norm = float(np.linalg.norm(vec))
    return vec / norm if norm > 0 else vec


@dataclass(frozen=True, slots=True, kw_only=True)
class ClassifyCall(TextCall):
    n_inputs: int

    def render(self, result: Result) -> bytes:
        vectors = np.stack([vector(o) for o in result.outcomes])
        inputs, label_vecs = vectors[: self.n_inputs], vectors[self.n_inputs:]
        labels = self.groups[1][1]
        sims = inputs @ label_vecs.T
        logits = sims / CLASSIFY_TEMPERATURE
        probs = np.exp(logits - logits.max(axis=1, keepdims=True))
        probs /= probs.sum(axis=1, keepdims=True)
        out = []
        for i in range(self.n_inputs):
            order = np.argsort(-sims[i], kind="stable")
            out.append({"index": i, "labels": [
                {"label": labels[j], "score": round(float(sims[i, j]), 6),
                 "probability": round(float(probs[i, j]), 6)} for j in order]})
        return orjson.dumps({"object": "list", "data": out, "model": self.name,
                             "usage": self._usage(result)})


def parse_classify(data: dict[str, Any], resolve: Resolve) -> ClassifyCall:
    check_keys(data, {"model", "input", "labels", "multi_label"})
    name = require_str(data, "model")
    texts = text_list(data.get("input"), "input")
    labels = text_list(data.get("labels"), "labels", allow_single=False)
    if len(set(labels)) != len(labels):
        raise ValidationFailed("labels", "must not repeat a label")
    if "multi_label" in data and not isinstance(data["multi_label"], bool):
        raise ValidationFailed("multi_label", "must be true or false")
    return ClassifyCall(model=resolve(name), name=name, n_inputs=len(texts),
                        groups=(("input", tuple(texts)), ("labels", tuple(labels))))


@dataclass(frozen=True, slots=True, kw_only=True)
class RankCall(TextCall):
    top_n: int
    return_documents: bool

    def render(self, result: Result) -> bytes:
        vectors = np.stack([vector(o) for o in result.outcomes])
        docs = self.groups[1][1]
        scores = vectors[1:] @ vectors[0]
        order = np.argsort(-scores, kind="stable")[: self.top_n]
        results = []
        for j in order:
            row: dict[str, Any] = {"index": int(j), "relevance_score": round(float(scores[j]), 6)}
            if self.return_documents:
                row["document"] = {"text": docs[j]}
            results.append(row)
        return orjson.dumps({"object": "list", "results": results, "model": self.name,
                             "usage": self._usage(result)})


def parse_rank(data: dict[str, Any], resolve: Resolve) -> RankCall:
    check_keys(data, {"model", "query", "documents", "top_n", "return_documents"})
    name = require_str(data, "model")
    query = require_str(data, "query")
    docs = text_list(data.get("documents"), "documents", allow_single=False)
    top_n = positive_int(data, "top_n", len(docs))
    return_docs = data.get("return_documents", False)
    if not isinstance(return_docs, bool):
        raise ValidationFailed("return_documents", "must be true or false")
    return RankCall(model=resolve(name), name=name, top_n=top_n, return_documents=return_docs,
                    groups=(("query", (query,)), ("documents", tuple(docs))))
