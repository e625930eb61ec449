"""policy check / policy explain, called as functions and through their argparse wiring."""

from __future__ import annotations

import argparse
import io
import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.cli.policy import RequestError, check, explain, register, texts_of
from gateway.errors import PolicyRejected, ValidationFailed
from gateway.policy import PolicyError

REPO = Path(__file__).resolve().parents[3]
STRICT = REPO / "policies" / "examples" / "strict.yaml"


def run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="gateway")
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    status: int = args.func(args)
    return status


def test_check_ok_prints_one_line_per_file() -> None:
    out = io.StringIO()
    assert check([REPO / "policies" / "default.yaml", STRICT], out=out) == 0
    lines = out.getvalue().splitlines()
    assert len(lines) == 2
    assert lines[0].startswith(f"{REPO / 'policies' / 'default.yaml'}: OK (1 rule, version ")
    assert lines[1].startswith(f"{STRICT}: OK (5 rules, version strict-2026-12-01.1+")


def test_check_reports_file_line_field_and_fails(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("rules:\n  - name: a\n    scope: world\n")
    good = tmp_path / "good.yaml"
    good.write_text("rules:\n  - name: a\n")
    out = io.StringIO()
    assert check([good, bad], out=out) == 1
    text = out.getvalue()
    assert f"{good}: OK" in text
    assert f"{bad}:3: rules[0].scope: must be one of tenant, shared, not 'world'" in text


def test_check_prints_warnings_but_passes(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("rules:\n  - name: all\n  - name: never\n")
    out = io.StringIO()
    assert check([path], out=out) == 0
    assert "never: warning: unreachable" in out.getvalue()


def test_check_a_folder_checks_it_as_one_set(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # default.yaml and strict.yaml both name a rule "default": as a set they are refused.
    for source in (REPO / "policies" / "default.yaml", STRICT):
        (tmp_path / source.name).write_text(source.read_text())
    assert run(["policy", "check", str(tmp_path)]) == 1
    assert "duplicate rule name 'default'" in capsys.readouterr().out


def test_check_the_shipped_policies_folder_passes(capsys: pytest.CaptureFixture[str]) -> None:
    # `--policies policies/` is the shipped default alone: examples/ is a subfolder, not read.
    assert run(["policy", "check", str(REPO / "policies")]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{REPO / 'policies'}: OK (1 rule, version default-1+")
    assert "warning" not in out


def test_explain_embeddings_list_with_pii() -> None:
    body = json.dumps({"model": "minilm", "input": ["hello", "mail me: a@b.example.com"]})
    result = explain([], route="/v1/embeddings", body=body.encode(), tenant="acme")
    assert result["rule"] == "default"
    assert result["cacheable"] is True
    assert result["scope"] == "tenant" and result["scope_key"] == "acme"
    assert result["detectors"] == ["email"]
    assert result["not_stored"] == [1]
    assert result["fields"] == {"input": {"items": 2, "not_stored": [1], "detectors": ["email"]}}
    assert result["model"] == "minilm"
    assert "a@b" not in json.dumps(result)


def test_explain_matches_headers_tenants_and_routes() -> None:
    body = b'{"model": "minilm", "query": "q", "documents": ["a", "b"]}'
    debug = explain([STRICT], route="/v1/rank", body=body, headers={"X-Debug": "1"})
    assert debug["rule"] == "no-cache-debug" and debug["cacheable"] is False
    bank = explain([STRICT], route="/v1/rank", body=body, tenant="bank-eu")
    assert bank["rule"] == "no-cache-for-bank"
    shared = explain([STRICT], route="/v1/embeddings", body=b'{"model":"minilm","input":"x"}')
    assert shared["scope"] == "shared" and shared["ttl_s"] == 86400
    assert shared["stale_while_revalidate_s"] == 300 and shared["stale_if_error_s"] == 3600
    assert set(bank["fields"]) == {"query", "documents"}


def test_explain_v2_infer_reads_bytes_inputs_and_model_from_the_route() -> None:
    body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [2],
                        "data": ["hi", "ssn 123-45-6789"]}]}
    result = explain([], route="/v2/models/minilm/infer", body=json.dumps(body).encode())
    assert result["model"] == "minilm"
    # The field as the gateway's OIP adapter names it (explain parses with the route's adapter).
    assert result["fields"]["inputs"]["not_stored"] == [1]


def test_explain_raises_for_a_rejected_request() -> None:
    body = b'{"model": "minilm", "input": "card 4111 1111 1111 1111"}'
    with pytest.raises(PolicyRejected) as info:
        explain([STRICT], route="/v1/rank", body=b'{"model":"m","query":"4111 1111 1111 1111",'
                 b'"documents":["a document"]}')
    assert info.value.detector == "card"
    with pytest.raises(PolicyRejected):
        explain([STRICT], route="/v1/embeddings", body=body)


def test_explain_bad_requests() -> None:
    with pytest.raises(RequestError, match="JSON"):
        explain([], route="/v1/embeddings", body=b"{nope")
    with pytest.raises(RequestError, match="model"):
        explain([], route="/v1/embeddings", body=b'{"input": "x"}')
    with pytest.raises(RequestError, match="route"):
        texts_of("/v1/unknown", {})
    with pytest.raises(RequestError, match="documents"):
        texts_of("/v1/rank", {"model": "minilm", "query": "q", "documents": "not a list"})
    with pytest.raises(RequestError, match="labels"):  # what the gateway would answer 422 to
        texts_of("/v1/classify", {"model": "minilm", "input": "x"})


def test_explain_command_prints_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    body = tmp_path / "req.json"
    body.write_text('{"model": "minilm", "input": "hello", "labels": ["a", "b"]}')
    status = run(["policy", "explain", "--policy", str(STRICT), "--tenant", "acme",
                  "--route", "/v1/classify", "--body", str(body), "--header", "X-Env: prod"])
    assert status == 0
    result = json.loads(capsys.readouterr().out)
    assert result["rule"] == "classify" and result["tenant"] == "acme"


def test_explain_command_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    body = tmp_path / "req.json"
    body.write_text('{"model": "minilm", "input": "key AKIAIOSFODNN7EXAMPLE"}')
    assert run(["policy", "explain", "--policy", str(STRICT), "--route", "/v1/embeddings",
                "--body", str(body)]) == 1
    err = capsys.readouterr().err
    assert "policy_rejected" in err and "'secret'" in err and "AKIA" not in err
    bad_policy = tmp_path / "bad.yaml"
    bad_policy.write_text("rules: nope\n")
    assert run(["policy", "explain", "--policy", str(bad_policy), "--route", "/v1/embeddings",
                "--body", str(body)]) == 1
    assert f"{bad_policy}:1: rules: must be a list" in capsys.readouterr().err
    assert run(["policy", "explain", "--route", "/v1/embeddings", "--body",
                str(tmp_path / "missing.json")]) == 2


def test_errors_are_the_gateway_error_types() -> None:
    assert issubclass(PolicyRejected, ValidationFailed)
    assert issubclass(PolicyError, Exception)


def test_check_refuses_a_misspelt_route(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("rules:\n  - name: e\n    match:\n      routes: [/v1/embedings]\n")
    out = io.StringIO()
    assert check([path], out=out) == 1
    assert out.getvalue().startswith(
        f"{path}:4: rules[0].match.routes[0]: unknown route '/v1/embedings' (did you mean "
        "'/v1/embeddings'?)")


def test_check_knows_the_gateway_models_and_takes_models_from_a_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("rules:\n  - name: m\n    match: {models: [minilm, bge-small]}\n")
    assert run(["policy", "check", str(path)]) == 1
    assert (f"{path}:3: rules[0].match.models[1]: unknown model 'bge-small'; known models: "
            "minilm") in capsys.readouterr().out
    assert run(["policy", "check", "--models", "minilm,bge-small", str(path)]) == 0
    assert f"{path}: OK (1 rule" in capsys.readouterr().out
    assert run(["policy", "check", "--models", "bge-small", str(path)]) == 1
    assert "unknown model 'minilm'" in capsys.readouterr().out
    alias = tmp_path / "alias.yaml"
    alias.write_text("rules:\n  - name: m\n    match: {models: all-MiniLM-L6-v2}\n")
    assert run(["policy", "check", str(alias)]) == 1
    assert "is an alias of 'minilm'" in capsys.readouterr().out


def test_explain_resolves_aliases_and_matches_oip_paths_by_their_pattern(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("rules:\n  - name: oip\n    match: {routes: '/v2/models/{name}/infer', "
                    "models: minilm}\n  - name: alias\n    match: {models: minilm}\n")
    body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["hi"]}]}
    oip = explain([path], route="/v2/models/minilm/versions/1/infer",
                  body=json.dumps(body).encode())
    assert oip["rule"] == "oip" and oip["route"] == "/v2/models/{name}/infer"
    aliased = explain([path], route="/v1/embeddings",
                      body=b'{"model": "all-MiniLM-L6-v2", "input": "hi"}')
    assert aliased["rule"] == "alias" and aliased["model"] == "minilm"


def test_the_documented_explain_command_runs_on_the_shipped_example() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    [command] = [line.strip() for line in readme.splitlines()
                 if line.strip().startswith("python -m gateway policy explain")
                 and "policies/examples/request.json" in line]
    argv = shlex.split(command)
    done = subprocess.run([sys.executable, *argv[1:]], cwd=REPO, capture_output=True,
                          text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["rule"] == "default" and result["cacheable"] is True
    assert result["fields"]["input"] == {"items": 2, "not_stored": [1], "detectors": ["email"]}
    assert "jane@" not in done.stdout + done.stderr
