"""``python -m gateway policy check|explain``: lint policy files, and show what they decide.

``check FILE...`` loads each file (a folder is checked as the set it would load as) and prints
``file:line: field: message`` for every problem (exit 1) or one ``OK`` line per file (exit 0),
plus warnings for rules after a catch-all. Routes, models and headers that no request can carry
are errors; models are checked against the gateway's default ``models`` and ``model_aliases``, or
the list given with ``--models a,b``. ``explain`` evaluates one request body the way the gateway
would (aliases resolved, an OIP path matched as its route pattern) and prints the decision as
JSON: matched rule, detectors fired (names only, never the text), cacheable or not, scope, TTL
and stale windows, and which items would not be stored.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import orjson

from gateway.adapters.registry import BY_PATH, CACHED_PATHS, Parsing
from gateway.errors import GatewayError, ValidationFailed
from gateway.policy.evaluate import evaluate_groups
from gateway.policy.loader import PolicyError, default_policy, lint, load_policy
from gateway.policy.targets import OIP_INFER, KnownModels
from gateway.settings import Settings
from gateway.tenants.directory import PUBLIC

Groups = list[tuple[str, list[str]]]


class RequestError(ValueError):
    """The request body given to ``explain`` is not one the route accepts."""


def gateway_models() -> KnownModels:
    """The models (and aliases) a gateway serves with its default settings."""
    defaults = Settings()
    return KnownModels(routes=CACHED_PATHS, names=tuple(defaults.models),
                       aliases=dict(defaults.model_aliases))


def check(
    files: Sequence[Path], *, models: KnownModels | None = None, out: IO[str] | None = None
) -> int:
    """Lint policy files; 0 when all are valid, 1 otherwise. Messages go to ``out`` (stdout).

    ``models``: the models rules may name; default: the gateway's default models and aliases.
    """
    out = out if out is not None else sys.stdout
    models = models if models is not None else gateway_models()
    status = 0
    for path in files:
        try:
            policy = load_policy([path], models=models)
        except PolicyError as exc:
            for issue in exc.errors:
                print(issue, file=out)
            status = 1
            continue
        for warning in lint(policy):
            print(warning, file=out)
        n = len(policy.rules)
        print(f"{path}: OK ({n} rule{'s' * (n != 1)}, version {policy.version})", file=out)
    return status


def texts_of(route: str, body: Mapping[str, Any]) -> Groups:
    """The texts of a request the policy decides on, by field: the route's own adapter parses the
    body (gateway/adapters/registry.py) exactly as the gateway does, then names its texts."""
    pattern = _route_pattern(route)
    entry = BY_PATH.get(pattern)
    if entry is None:
        raise RequestError(f"route {route!r}: expected one of {', '.join(CACHED_PATHS)} "
                           "(an OIP path may name its model: /v2/models/<name>/infer)")
    path_model = route.removeprefix("/v2/models/").split("/", 1)[0] if (
        pattern != route or route == "/v2/models/{name}/infer") else None
    try:
        call = entry.parse(dict(body), Parsing(resolve=lambda name: name, path_model=path_model))
    except GatewayError as exc:
        raise RequestError(exc.public_message) from None
    return [(name, list(texts)) for name, texts in call.groups]


def _model_of(route: str, body: Mapping[str, Any]) -> str:
    if route.startswith("/v2/models/"):
        return route.removeprefix("/v2/models/").split("/", 1)[0]
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise RequestError("model: missing from the body (or pass --model)")
    return model


def _route_pattern(route: str) -> str:
    """The route as rules see it: an OIP inference path becomes its pattern."""
    return "/v2/models/{name}/infer" if OIP_INFER.match(route) else route


def explain(
    policy_paths: Sequence[Path],
    *,
    tenant: str = PUBLIC,
    route: str,
    model: str | None = None,
    body: bytes,
    headers: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The decision for one request as JSON-able data (``Decision.explain`` plus per field).

    Raises ``PolicyError`` (invalid policy), ``RequestError`` (bad body), ``ValidationFailed`` /
    ``PolicyRejected`` (what the gateway would answer with a 422).
    """
    policy = load_policy(policy_paths) if policy_paths else default_policy()
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise RequestError(f"body: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise RequestError("body: expected a JSON object")
    model = gateway_models().resolve(model or _model_of(route, data))
    if not route.startswith("/v2/models/"):
        data.setdefault("model", model)  # --model stands in for a body without one
    groups = texts_of(route, data)
    route = _route_pattern(route)
    lowered = {k.lower(): v for k, v in (headers or {}).items()}
    decision = evaluate_groups(policy, route=route, model=model, tenant=tenant, headers=lowered,
                               groups=groups)
    result = decision.explain()
    fields: dict[str, Any] = {}
    start = 0
    for field, texts in groups:
        items = decision.items[start:start + len(texts)]
        start += len(texts)
        fields[field] = {
            "items": len(items),
            "not_stored": [i for i, item in enumerate(items) if not item.store],
            "detectors": sorted({d for item in items for d in item.detectors}),
        }
    result.update({"route": route, "model": model, "tenant": tenant, "fields": fields})
    return result


def _parse_headers(values: Sequence[str]) -> dict[str, str]:
    headers: dict[str, str] = {}
    for raw in values:
        name, sep, value = raw.partition(":")
        if not sep or not name.strip():
            raise RequestError(f"--header {raw!r}: expected 'Name: value'")
        headers[name.strip().lower()] = value.strip()
    return headers


def _models_arg(value: str) -> KnownModels:
    try:
        return KnownModels(routes=CACHED_PATHS, names=tuple(m.strip() for m in value.split(",")))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _check_command(args: argparse.Namespace) -> int:
    return check(args.files, models=args.models)


def _explain_command(args: argparse.Namespace) -> int:
    try:
        body = sys.stdin.buffer.read() if str(args.body) == "-" else args.body.read_bytes()
        result = explain(args.policy, tenant=args.tenant, route=args.route, model=args.model,
                         body=body, headers=_parse_headers(args.header))
    except PolicyError as exc:
        print(exc, file=sys.stderr)
        return 1
    except ValidationFailed as exc:  # includes PolicyRejected: names the detector, not the text
        print(f"request rejected (HTTP {exc.status} {exc.type}): {exc.message}", file=sys.stderr)
        return 1
    except (RequestError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=2))
    return 0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``policy check`` and ``policy explain``; each sets ``func(args) -> exit status``."""
    policy = subparsers.add_parser("policy", help="lint cache policy files and explain decisions")
    commands = policy.add_subparsers(dest="policy_command", required=True)
    lint_cmd = commands.add_parser("check", help="validate policy files (exit 1 on any error)")
    lint_cmd.add_argument("files", nargs="+", type=Path, metavar="FILE",
                          help="policy file, or a folder checked as one set")
    lint_cmd.add_argument("--models", type=_models_arg, default=None, metavar="A,B",
                          help="the model names the gateway serves (default: its default "
                               "models and aliases)")
    lint_cmd.set_defaults(func=_check_command)
    exp = commands.add_parser("explain", help="print the decision for one request as JSON")
    exp.add_argument("--policy", action="append", type=Path, default=[], metavar="FILE",
                     help="policy file or folder (repeatable); default: the built-in policy")
    exp.add_argument("--tenant", default=PUBLIC, help=f"tenant id (default: {PUBLIC})")
    exp.add_argument("--route", required=True, help="e.g. /v1/embeddings")
    exp.add_argument("--model", help="model name (default: the body's 'model')")
    exp.add_argument("--body", required=True, type=Path, metavar="FILE",
                     help="request body JSON ('-' reads stdin)")
    exp.add_argument("--header", action="append", default=[], metavar="'Name: value'",
                     help="request header (repeatable)")
    exp.set_defaults(func=_explain_command)
