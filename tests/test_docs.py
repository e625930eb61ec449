"""The docs name only what exists: every ``make`` target, ``python -m`` command, setting, settings
environment variable and repository path that README.md and docs/*.md name in code spans.

Docs go stale one rename at a time (a moved module, a setting renamed in a refactor, a command
never written); each finding here is a line to fix in the docs, or a thing to build.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.settings.fields import settings_fields

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "bench" / "RESULTS.md"]
SPAN = re.compile(r"`([^`\n]+)`")
SETTINGS = {s.path for s in settings_fields()}
SECTIONS = {path.split(".")[0] for path in SETTINGS if "." in path}
ENVS = {s.env for s in settings_fields()}
# Variables the gateway reads that are not settings (documented beside them).
OTHER_ENVS = {"GATEWAY_ARGS", "GATEWAY_PORT"}


def spans() -> list[tuple[str, str]]:
    """(doc name, code span) for every inline code span of every doc."""
    found = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        text = re.sub(r"```.*?```", "", text, flags=re.S)  # fenced blocks: examples, not names
        found += [(doc.name, m.group(1).strip()) for m in SPAN.finditer(text)]
    return found


def _importable(name: str) -> bool:
    """A library module (``redis.asyncio``) rather than a setting."""
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def make_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    return set(re.findall(r"(?m)^([a-z][a-z0-9_-]*):", text))


def test_make_targets_named_exist() -> None:
    targets = make_targets()
    missing = sorted({(doc, s) for doc, s in spans()
                      if (m := re.match(r"make ([a-z][a-z0-9_-]*)", s))
                      and m.group(1) not in targets})
    assert missing == []


def test_bench_commands_named_exist() -> None:
    missing = sorted({(doc, s) for doc, s in spans()
                      if (m := re.match(r"python -m bench ([a-z_]+)", s))
                      and m.group(1) != "all"
                      and not (ROOT / "bench" / f"{m.group(1)}.py").exists()})
    assert missing == []


@pytest.mark.parametrize("service", ["gateway", "backend"])
def test_service_subcommands_named_exist(service: str) -> None:
    named = {m.group(1) for _doc, s in spans()
             if (m := re.match(rf"python -m {service} ([a-z][a-z-]*)", s))}
    for sub in sorted(named):
        done = subprocess.run([sys.executable, "-m", service, sub, "--help"], cwd=ROOT,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, (service, sub, done.stderr[-500:])


def test_settings_named_exist() -> None:
    # A dotted name whose first part is a settings section is a setting (or a section).
    sections_and_settings = SETTINGS | {p.rsplit(".", i)[0] for p in SETTINGS
                                        for i in range(1, p.count(".") + 1)}
    missing = sorted({(doc, s) for doc, s in spans()
                      if (m := re.fullmatch(r"([a-z_]+(?:\.[a-z_0-9]+)+)(?::.*)?", s))
                      and m.group(1).split(".")[0] in SECTIONS
                      and m.group(1) not in sections_and_settings
                      and not _importable(m.group(1))})
    assert missing == []


def test_settings_shown_as_yaml_exist() -> None:
    # ``log_level: WARNING`` reads like a setting a user would paste into the config file.
    # POLICIES.md shows policy YAML, RESULTS.md request bodies: neither is the settings file.
    missing = sorted({(doc, s) for doc, s in spans() if doc not in ("POLICIES.md", "RESULTS.md")
                      and (m := re.fullmatch(r"([a-z]+_[a-z_]+|[a-z_]+(?:\.[a-z_0-9]+)+): .+", s))
                      and m.group(1) not in SETTINGS})
    assert missing == []


def test_settings_variables_named_exist() -> None:
    def known(v: str) -> bool:
        # ``GATEWAY_CACHE_*`` names a family: some setting must start with it.
        if v.endswith("_"):
            return any(e.startswith(v) for e in ENVS)
        return v in ENVS or v in OTHER_ENVS

    missing = sorted({(doc, v) for doc, s in spans()
                      for v in re.findall(r"\bGATEWAY_[A-Z0-9_]+", s) if not known(v)})
    assert missing == []


def test_repository_paths_named_exist() -> None:
    roots = ("gateway/", "backend/", "oip/", "bench/", "tests/", "docs/", "deploy/",
             "policies/")
    missing = []
    for doc, s in spans():
        path = s.split()[0].split(":")[0].rstrip(",.;")
        if (path.startswith(roots) and not any(c in path for c in "*{}<>$")
                and not (ROOT / path).exists()):
            missing.append((doc, path))
    assert sorted(set(missing)) == []


def test_the_readme_is_a_newcomers_page() -> None:
    # It starts with the two commands that work on a fresh machine and stays short: long
    # material belongs in docs/.
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    first = text.split("```", 2)[1]
    assert first.strip().splitlines() == ["sh", "make run", "make test"]
    assert len(text.splitlines()) <= 250
