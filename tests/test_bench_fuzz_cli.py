"""``make fuzz`` is schemathesis' own runner with every check and every phase (stateful too),
pinned seeds, and a configuration schemathesis itself accepts (issue 20, item 12). The run
itself is long (bench/RESULTS.md, Fuzz); here its command and configuration are checked."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from schemathesis.config import SchemathesisConfig

from bench import fuzz_cli, fuzz_hooks


def test_the_command_runs_every_check_and_phase_with_a_seed() -> None:
    argv = fuzz_cli.st_command("http://127.0.0.1:1/", seed=7, examples=5, max_time_s=None)
    assert argv[argv.index("--checks") + 1] == "all"
    assert set(argv[argv.index("--phases") + 1].split(",")) == {
        "examples", "coverage", "fuzzing", "stateful"}
    assert argv[argv.index("--seed") + 1] == "7"
    assert argv[argv.index("--config-file") + 1] == str(fuzz_cli.CONFIG)
    assert "http://127.0.0.1:1/openapi.json" in argv
    assert len(set(fuzz_cli.SEEDS.values())) == 2


def test_schemathesis_accepts_the_configuration() -> None:
    config = SchemathesisConfig.from_path(str(fuzz_cli.CONFIG))
    checks = config.projects.default.checks
    assert checks.not_a_server_error.expected_statuses == ["2xx", "3xx", "4xx", "504"]


def case(deadline: str | None) -> SimpleNamespace:
    return SimpleNamespace(headers={} if deadline is None else {"X-Request-Timeout-Ms": deadline})


def test_a_504_is_excused_only_for_a_deadline_under_a_second() -> None:
    answer = SimpleNamespace(status_code=504)
    assert fuzz_hooks.deadline_504(None, answer, case("5")) is None
    for deadline in (None, "1000", "60000"):
        with pytest.raises(AssertionError, match="504"):
            fuzz_hooks.deadline_504(None, answer, case(deadline))
    assert fuzz_hooks.deadline_504(None, SimpleNamespace(status_code=200), case(None)) is None
