"""The mutation score per module, from ``mutmut results``: killed / (all - equivalent).

Run by ``make mutate`` after ``mutmut run`` (docs/MUTATION.md). A mutant counts as killed when
the tests failed or hung on it (killed, timeout, caught by type check, segfault); one that no
test runs ("no tests") counts as a survivor. ``tests/mutation/survivors.txt`` lists the
survivors accepted as equivalent, one ``NAME  REASON`` a line; this script prints every survivor
the file does not explain and every entry that no longer survives, and exits 1 if there is
either (or if some mutants were not checked), so a new gap is seen.

    python tests/mutation/score.py [--results FILE]   # FILE: saved `mutmut results --all true`
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path

SURVIVORS = Path(__file__).with_name("survivors.txt")
KILLED = {"killed", "timeout", "caught by type check", "segfault"}
SURVIVED = {"survived", "no tests"}
# gateway.pkg.mod.x_func__mutmut_3 or gateway.pkg.mod.xǁClassǁmethod__mutmut_3
_NAME = re.compile(
    r"^\s*(?P<name>(?P<module>[\w.]+?)\.x[_ǁ]\S*__mutmut_\d+):\s*(?P<status>.+?)\s*$")


def parse_results(text: str) -> dict[str, str]:
    """``mutmut results --all true`` lines -> {mutant name: status}."""
    found = {}
    for line in text.splitlines():
        m = _NAME.match(line)
        if m:
            found[m["name"]] = m["status"]
    return found


def parse_survivors(text: str) -> dict[str, str]:
    """The survivors file -> {mutant name: reason}; blank lines and ``#`` comments ignored."""
    accepted = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, _, reason = line.partition(" ")
        if not reason.strip():
            raise SystemExit(f"{SURVIVORS.name}:{number}: {name} has no reason")
        accepted[name] = reason.strip()
    return accepted


def module_of(name: str) -> str:
    m = _NAME.match(f"{name}: x")
    return m["module"] if m else name


def report(results: dict[str, str], accepted: dict[str, str]) -> tuple[list[str], int]:
    """The score table's lines, and how many problems (unexplained, stale, unchecked)."""
    by_module: dict[str, Counter[str]] = defaultdict(Counter)
    unexplained, stale, unchecked = [], [], []
    for name, status in sorted(results.items()):
        counts = by_module[module_of(name)]
        counts["all"] += 1
        if status in KILLED:
            counts["killed"] += 1
        elif status in SURVIVED:
            if name in accepted:
                counts["equivalent"] += 1
            else:
                counts["survived"] += 1
                unexplained.append(f"{name}: {status}")
        else:
            counts["other"] += 1
            unchecked.append(f"{name}: {status}")
    for name in sorted(accepted):
        if results.get(name) not in SURVIVED and (name in results or module_of(name) in by_module):
            stale.append(f"{name}: {results.get(name, 'no longer exists')}")
    lines = [f"{'module':34} {'all':>5} {'killed':>7} {'equiv':>6} {'surv':>5} {'other':>6} "
             f"{'score':>7}"]
    total: Counter[str] = Counter()
    for module in sorted(by_module):
        c = by_module[module]
        total.update(c)
        lines.append(_row(module, c))
    lines.append(_row("all", total))
    if unexplained:
        lines += ["", f"survivors not explained in {SURVIVORS.name} ({len(unexplained)}):"]
        lines += [f"  {u}" for u in unexplained]
    if stale:
        lines += ["", f"entries of {SURVIVORS.name} that no longer survive ({len(stale)}):"]
        lines += [f"  {s}" for s in stale]
    if unchecked:
        lines += ["", f"not checked, skipped or suspicious ({len(unchecked)}): rerun make mutate"]
        lines += [f"  {u}" for u in unchecked[:20]]
    return lines, len(unexplained) + len(stale) + len(unchecked)


def _row(module: str, c: Counter[str]) -> str:
    judged = c["all"] - c["equivalent"] - c["other"]
    score = f"{100.0 * c['killed'] / judged:6.1f}%" if judged else "      -"
    return (f"{module:34} {c['all']:5} {c['killed']:7} {c['equivalent']:6} {c['survived']:5} "
            f"{c['other']:6} {score}")


def main(argv: list[str] | None = None) -> int:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--results", type=Path, help="saved `mutmut results --all true` output")
    opts = args.parse_args(argv)
    if opts.results is not None:
        text = opts.results.read_text(encoding="utf-8")
    else:
        mutmut = Path(sys.executable).with_name("mutmut")
        text = subprocess.run([str(mutmut), "results", "--all", "true"], check=True,
                              capture_output=True, text=True).stdout
    accepted = parse_survivors(SURVIVORS.read_text(encoding="utf-8"))
    lines, problems = report(parse_results(text), accepted)
    print("\n".join(lines))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
