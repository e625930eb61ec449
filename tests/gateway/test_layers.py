"""Arrows run one way: the gateway's packages form layers, and no module imports a higher one.

The picture (docs/ARCHITECTURE.md draws it with what each package owns):

    __main__ -> cli, server -> app -> http -> batch -> settings -> tenants -> adapters
      -> pipeline -> (policy | cache | upstream) -> upstream.admission, routing
      -> telemetry -> (errors, validation)

Every ``import`` counts, those under ``if TYPE_CHECKING:`` and inside functions included: a cycle
hidden from the interpreter is still a cycle for the reader. Packages on one line of ``LAYERS``
are siblings and must not import each other either. The test of the test below plants an
up-import and a sibling import and checks that both are caught.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Top first. A module belongs to the longest prefix listed; each entry is a module or package.
LAYERS: list[list[str]] = [
    ["gateway.__main__"],
    ["gateway.cli", "gateway.server"],
    ["gateway.app"],
    ["gateway.http"],
    ["gateway.batch"],
    ["gateway.settings"],
    ["gateway.tenants"],
    ["gateway.adapters"],
    ["gateway.pipeline"],
    ["gateway.policy", "gateway.cache", "gateway.upstream"],
    ["gateway.upstream.admission", "gateway.routing"],
    ["gateway.telemetry"],
    ["gateway.errors", "gateway.validation", "gateway.tasks"],
]
ORDER = {unit: rank for rank, units in enumerate(LAYERS) for unit in units}


def unit_of(module: str) -> str | None:
    """The longest ``LAYERS`` entry that ``module`` is or lies under (None: not layered)."""
    best = None
    for unit in ORDER:
        if (module == unit or module.startswith(unit + ".")) and (
                best is None or len(unit) > len(best)):
            best = unit
    return best


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def exists(module: str, root: Path) -> bool:
    base = root.joinpath(*module.split("."))
    return base.with_suffix(".py").exists() or (base / "__init__.py").exists()


def imports_of(path: Path, root: Path) -> Iterator[tuple[int, str]]:
    """(line, module) for every gateway import in ``path``, wherever it stands in the file."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("gateway."):
                    yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and (
                node.module == "gateway" or node.module.startswith("gateway.")):
            # ``from gateway.x import y``: y may be a module (count it) or a name in x.
            subs = [f"{node.module}.{a.name}" for a in node.names]
            found = [s for s in subs if exists(s, root)]
            for target in found or [node.module]:
                yield node.lineno, target


def violations(root: Path) -> list[str]:
    """Every import that runs up a layer or sideways between siblings."""
    found = []
    for path in sorted((root / "gateway").rglob("*.py")):
        if path.name.endswith("_pb2.py"):
            continue
        source = module_name(path, root)
        src = unit_of(source)
        if src is None:
            continue
        for line, target in imports_of(path, root):
            dst = unit_of(target)
            if dst is None or dst == src:
                continue
            if ORDER[dst] <= ORDER[src]:
                where = f"{path.relative_to(root)}:{line}"
                kind = "sideways" if ORDER[dst] == ORDER[src] else "up"
                found.append(f"{where}: {source} imports {target} ({kind}: {src} -> {dst})")
    return found


def test_every_gateway_module_is_in_a_layer() -> None:
    missing = [module_name(p, ROOT) for p in sorted((ROOT / "gateway").rglob("*.py"))
               if unit_of(module_name(p, ROOT)) is None
               and module_name(p, ROOT) not in ("gateway",)]
    assert missing == []


def test_arrows_run_one_way() -> None:
    assert violations(ROOT) == []


def test_the_check_catches_an_up_import_and_a_sibling_import(tmp_path: Path) -> None:
    # A copy of two packages with planted imports: the cache importing the pipeline (up), the
    # policy importing the cache (sideways), one under TYPE_CHECKING to show those count too.
    for pkg, body in {
        "gateway/__init__.py": "",
        "gateway/pipeline/__init__.py": "",
        "gateway/pipeline/core.py": "from gateway.cache import tiers\n",
        "gateway/cache/__init__.py": "",
        "gateway/cache/tiers.py": "from gateway.pipeline import core\n",
        "gateway/policy/__init__.py": "",
        "gateway/policy/store.py": (
            "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n    from gateway.cache.tiers import X\n"),
    }.items():
        (tmp_path / pkg).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / pkg).write_text(body)
    found = violations(tmp_path)
    assert len(found) == 2, found
    assert any("gateway.cache.tiers imports gateway.pipeline.core (up" in f for f in found)
    assert any("gateway.policy.store imports gateway.cache.tiers (sideways" in f for f in found)


def _top_imports(package: str) -> set[str]:
    found = set()
    for path in (ROOT / package).rglob("*.py"):
        if path.name.endswith("_pb2.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add(node.module.split(".")[0])
    return found


def test_the_services_share_only_the_wire_package() -> None:
    # Two services that share only the wire protocol (oip/): neither imports the other, and the
    # shared package imports neither.
    assert "backend" not in _top_imports("gateway")
    assert "gateway" not in _top_imports("backend")
    assert not {"gateway", "backend"} & _top_imports("oip")
    assert "oip" in _top_imports("gateway") and "oip" in _top_imports("backend")
