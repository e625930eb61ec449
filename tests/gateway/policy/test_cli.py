"""policy check / policy explain, called as functions and through their argparse wiring."""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path

import pytest

from gateway.errors import PolicyRejected, ValidationFailed
from gateway.policy import PolicyError
from gateway.policy.cli import RequestError, check, explain, register, texts_of

REPO = Path(__file__).resolve().parents[3]
STRICT = REPO / "policies" / "strict.yaml"


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


def test_check_a_folder_checks_it_as_one_set(capsys: pytest.CaptureFixture[str]) -> None:
    # default.yaml and strict.yaml both name a rule "default": as a set they are refused.
    assert run(["policy", "check", str(REPO / "policies")]) == 1
    assert "duplicate rule name 'default'" in capsys.readouterr().out


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
    assert result["fields"]["inputs[0].data"]["not_stored"] == [1]


def test_explain_raises_for_a_rejected_request() -> None:
    body = b'{"model": "minilm", "input": "card 4111 1111 1111 1111"}'
    with pytest.raises(PolicyRejected) as info:
        explain([STRICT], route="/v1/rank", body=b'{"model":"m","query":"4111 1111 1111 1111",'
                 b'"documents":[]}')
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
        texts_of("/v1/rank", {"query": "q", "documents": "not a list"})


def test_explain_command_prints_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    body = tmp_path / "req.json"
    body.write_text('{"model": "minilm", "input": "hello"}')
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
