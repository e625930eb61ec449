"""A match that no request can meet is refused by the loader, with file, line and field."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from gateway.adapters.registry import CACHED_PATHS
from gateway.policy import PolicyError, load_policy
from gateway.policy.targets import KnownModels

MODELS = KnownModels(routes=CACHED_PATHS, names=("minilm",), aliases={"all-MiniLM-L6-v2": "minilm"})


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "p.yaml"
    path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return path


def errors(path: Path, models: KnownModels | None = MODELS) -> list[str]:
    with pytest.raises(PolicyError) as info:
        load_policy([path], models=models)
    return [str(e) for e in info.value.errors]


def test_a_misspelt_route_is_refused_with_a_suggestion(tmp_path: Path) -> None:
    path = write(tmp_path, """
        rules:
          - name: embeddings
            match:
              routes: [/v1/classify, /v1/embedings]
    """)
    assert errors(path) == [
        f"{path}:4: rules[0].match.routes[1]: unknown route '/v1/embedings' (did you mean "
        "'/v1/embeddings'?); the cached routes: /v1/embeddings, /v1/classify, /v1/rank, "
        "/v2/models/{name}/infer",
    ]


def test_route_globs_must_match_a_cached_route_and_oip_paths_are_patterns(tmp_path: Path) -> None:
    path = write(tmp_path, """
        rules:
          - name: a
            match: {routes: "/v3/*"}
          - name: b
            match:
              routes:
                - /v2/models/minilm/infer
    """)
    assert errors(path) == [
        f"{path}:3: rules[0].match.routes: '/v3/*' matches none of the cached routes "
        "(/v1/embeddings, /v1/classify, /v1/rank, /v2/models/{name}/infer)",
        f"{path}:7: rules[1].match.routes[0]: unknown route '/v2/models/minilm/infer': rules "
        "see every OIP inference call as '/v2/models/{name}/infer'; narrow it to a model with "
        "'models:'",
    ]


def test_every_cached_route_and_useful_globs_load(tmp_path: Path) -> None:
    routes = ", ".join(f'"{r}"' for r in CACHED_PATHS)
    path = write(tmp_path, f"""
        rules:
          - name: exact
            match: {{routes: [{routes}]}}
          - name: globs
            match: {{routes: ["/v1/*", "/v2/models/*", "*"], models: ["mini*"]}}
    """)
    policy = load_policy([path], models=MODELS)
    assert [r.name for r in policy.rules] == ["exact", "globs"]


def test_unknown_models_aliases_and_empty_globs_are_refused(tmp_path: Path) -> None:
    path = write(tmp_path, """
        rules:
          - name: a
            match:
              models: [minlm, all-MiniLM-L6-v2, "bge-*"]
    """)
    assert errors(path) == [
        f"{path}:4: rules[0].match.models[0]: unknown model 'minlm' (did you mean 'minilm'?); "
        "known models: minilm",
        f"{path}:4: rules[0].match.models[1]: 'all-MiniLM-L6-v2' is an alias of 'minilm': the "
        "gateway resolves aliases before rules match, so write 'minilm'",
        f"{path}:4: rules[0].match.models[2]: 'bge-*' matches none of the known models (minilm)",
    ]


def test_models_are_unchecked_when_the_served_set_is_not_given(tmp_path: Path) -> None:
    path = write(tmp_path, "rules:\n  - name: a\n    match: {models: [bge-small]}\n")
    assert load_policy([path]).rules[0].match.models == ("bge-small",)
    assert errors(path, KnownModels(routes=CACHED_PATHS, names=("minilm",))) == [
        f"{path}:3: rules[0].match.models[0]: unknown model 'bge-small'; known models: minilm"]
    both = KnownModels(routes=CACHED_PATHS, names=("minilm", "bge-small"))
    assert load_policy([path], models=both).rules


def test_header_syntax_that_can_never_match(tmp_path: Path) -> None:
    path = write(tmp_path, """
        rules:
          - name: a
            match:
              headers:
                x debug: "1"
                Authorization: "Bearer x"
                x-env: " prod"
                X-Tier: gold
                x-tier: silver
    """)
    assert errors(path) == [
        f"{path}:5: rules[0].match.headers.x debug: 'x debug' is not a valid header name "
        "(letters, digits and !#$%&'*+-.^_`|~ only, no spaces or colons)",
        f"{path}:6: rules[0].match.headers.Authorization: header 'Authorization' is never shown "
        "to policies (the gateway keeps credentials and body framing out of them); match "
        "tenants with 'tenants:'",
        f"{path}:7: rules[0].match.headers.x-env: value ' prod' starts or ends with whitespace, "
        "which HTTP strips from header values",
        f"{path}:9: rules[0].match.headers.x-tier: header 'x-tier' is already matched as "
        "'X-Tier' (header names ignore case)",
    ]


def test_a_header_operator_is_refused_by_the_schema(tmp_path: Path) -> None:
    # A header condition is an exact value or a glob: there are no operators.
    path = write(tmp_path, """
        rules:
          - name: a
            match:
              headers:
                x-debug: {regex: "1.*"}
    """)
    assert errors(path) == [
        f"{path}:5: rules[0].match.headers.x-debug: must be a string or an integer, not a "
        "mapping",
    ]


def test_valid_header_conditions_load(tmp_path: Path) -> None:
    path = write(tmp_path, """
        rules:
          - name: a
            match:
              headers: {X-Debug: 1, x-env: "prod-*", x-empty: ""}
    """)
    match = load_policy([path], models=MODELS).rules[0].match
    assert match.headers == {"x-debug": "1", "x-env": "prod-*", "x-empty": ""}
    assert match.matches(route="/v1/rank", model="minilm", tenant="t",
                         headers={"x-debug": "1", "x-env": "prod-eu", "x-empty": ""})


def test_cached_routes_are_the_routes_the_gateway_decides_policies_for() -> None:
    from prometheus_client import CollectorRegistry

    from gateway.app import create_app
    from gateway.settings import load_settings

    app = create_app(load_settings(None, {"backends": ["http://127.0.0.1:9"]}, environ={}),
                     registry=CollectorRegistry())
    registered = {r.canonical for r in app.router.resources()}
    assert set(CACHED_PATHS) <= registered


def test_the_readme_policy_example_loads_with_the_gateway_models(tmp_path: Path) -> None:
    from gateway.cli.policy import gateway_models

    readme = (Path(__file__).resolve().parents[3] / "README.md").read_text(encoding="utf-8")
    start = readme.index("```yaml\nversion: ") + len("```yaml\n")
    path = tmp_path / "readme.yaml"
    path.write_text(readme[start:readme.index("```", start)], encoding="utf-8")
    policy = load_policy([path], models=gateway_models())
    assert [r.name for r in policy.rules] == ["no-cache-debug", "public-embeddings-shared"]
