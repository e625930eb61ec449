"""The cached routes, one entry each: every list of routes in the gateway derives from here.

An entry names the route's path (as policies and cache keys see it), the adapter that parses a
body into a ``Call``, whether the Batch API accepts it as a line's ``url``, and what the OpenAPI
document says of it (summary, schemas by component name, request examples). From this table:
the HTTP routes (``create_app``), the routes policy rules may name (``KnownModels.routes``), the
texts ``policy explain`` shows (the adapter's own parse, then ``Call.groups``), the Batch API's
endpoints and line parsers, and the OpenAPI paths of the cached routes
(``gateway/http/routes/openapi.py``). ``tests/gateway/adapters/test_registry.py`` fails for an
entry that lacks what a cached route needs.

Adding a cached route: its adapter module, one ``Route`` here, its request/response schemas in
the OpenAPI document's components, and its tests.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.adapters.oip import parse_oip
from gateway.adapters.render import FragmentCache
from gateway.adapters.texts import Resolve, parse_classify, parse_embeddings, parse_rank
from gateway.pipeline import Call


@dataclass(frozen=True, slots=True, kw_only=True)
class Parsing:
    """What a route's parser may use besides the body."""

    resolve: Resolve
    """Client model name -> served model name (raises ModelNotFound)."""
    width: Callable[[str], int | None] = lambda _model: None
    """A model's embedding size when known (bounds ``dimensions``)."""
    fragments: FragmentCache | None = None
    """Rendered-number fragments shared by the renderers of one process."""
    path_model: str | None = None
    """The served model the URL names (OIP routes), already resolved and version-checked."""


Parser = Callable[[dict[str, Any], Parsing], Call]


@dataclass(frozen=True, slots=True, kw_only=True)
class Doc:
    """The route's operation in the OpenAPI document (the parts that differ per route)."""

    operation_id: str
    summary: str
    tag: str
    request_schema: str
    response_schema: str
    response_description: str
    description: str | None = None
    examples: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """name -> {"summary", "value"}, each a valid request that is answered 200."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Route:
    """One cached route."""

    path: str
    """The pattern policies match and keys hash (``/v2/models/{name}/infer`` for every model)."""
    parse: Parser
    doc: Doc
    batch: bool = False
    """The Batch API accepts it as a line's ``url``."""
    aliases: tuple[tuple[str, str], ...] = ()
    """Other paths answered the same way (path, its OpenAPI operation id)."""


def _embeddings(data: dict[str, Any], p: Parsing) -> Call:
    return parse_embeddings(data, p.resolve, width=p.width, fragments=p.fragments)


def _classify(data: dict[str, Any], p: Parsing) -> Call:
    return parse_classify(data, p.resolve)


def _rank(data: dict[str, Any], p: Parsing) -> Call:
    return parse_rank(data, p.resolve)


def _oip(data: dict[str, Any], p: Parsing) -> Call:
    if p.path_model is None:
        raise ValueError("the OIP route's parser needs the model its path names")
    return parse_oip(data, p.path_model)


ROUTES: tuple[Route, ...] = (
    Route(path="/v1/embeddings", parse=_embeddings, batch=True, doc=Doc(
        operation_id="createEmbeddings", summary="Embeddings (OpenAI-compatible)",
        description="Each text is cached on its own; only misses reach a backend.",
        tag="inference", request_schema="EmbeddingsRequest",
        response_schema="EmbeddingsResponse",
        response_description="One embedding per input, in order.",
        examples={
            "single": {"summary": "One text",
                       "value": {"model": "minilm", "input": "How do I reset my password?"}},
            "list": {"summary": "A list, base64",
                     "value": {"model": "minilm", "input": ["first text", "second text"],
                               "encoding_format": "base64"}},
            "dimensions": {"summary": "Shortened vectors",
                           "value": {"model": "all-MiniLM-L6-v2", "input": "shorter vector",
                                     "dimensions": 64}},
        })),
    Route(path="/v1/classify", parse=_classify, batch=True, doc=Doc(
        operation_id="classify", summary="Zero-shot classification",
        description=("Cosine similarity between each input and each label, over the same "
                     "per-text cache."),
        tag="inference", request_schema="ClassifyRequest", response_schema="ClassifyResponse",
        response_description="Per input: labels best first.",
        examples={"basic": {"summary": "Zero-shot labels",
                            "value": {"model": "minilm", "input": "I cannot log in",
                                      "labels": ["billing", "account access"]}}})),
    Route(path="/v1/rank", parse=_rank, batch=True, doc=Doc(
        operation_id="rank", summary="Rank documents against a query",
        tag="inference", request_schema="RankRequest", response_schema="RankResponse",
        response_description="Documents best first.",
        examples={"basic": {"summary": "Rank documents",
                            "value": {"model": "minilm", "query": "reset password",
                                      "documents": ["bake bread", "forgot password? click here"],
                                      "top_n": 1, "return_documents": True}}})),
    Route(path="/v2/models/{name}/infer", parse=_oip,
          aliases=(("/v2/models/{name}/versions/{version}/infer", "oipInferVersion"),),
          doc=Doc(
              operation_id="oipInfer", summary="OIP v2 inference (cached)",
              description=("The request's BYTES texts go through the same policy and "
                           "per-request cache as the OpenAI-style routes."),
              tag="oip", request_schema="InferRequest", response_schema="InferResponse",
              response_description="The OIP v2 answer in JSON.",
              examples={
                  "basic": {"summary": "One BYTES input",
                            "value": {"id": "req-1", "inputs": [
                                {"name": "text", "datatype": "BYTES", "shape": [2],
                                 "data": ["hello", "world"]}]}},
                  "outputs": {"summary": "Only the embedding output",
                              "value": {"inputs": [
                                  {"name": "text", "datatype": "BYTES", "shape": [1, 1],
                                   "data": [["hello"]]}],
                                  "outputs": [{"name": "embedding"}]}},
              })),
)

BY_PATH: dict[str, Route] = {route.path: route for route in ROUTES}
CACHED_PATHS: tuple[str, ...] = tuple(route.path for route in ROUTES)
"""The routes whose requests a policy decides, spelt as rules (and the cache key) see them."""
BATCH_PATHS: tuple[str, ...] = tuple(route.path for route in ROUTES if route.batch)
"""The Batch API's endpoints."""
