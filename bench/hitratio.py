"""Hit ratio against the optimum: each cache tier replayed on key traces (issue 27).

Run: ``python -m bench hitratio [--quick] [--trace FILE [--only-trace]] [--svg PATH]``. For every
trace (``bench/hittraces.py``; ``--trace`` adds one written by the gateway's trace recorder,
``bench hitrecord`` records one from a real gateway; ``--only-trace``: those alone) and
capacity (a fraction of the trace's distinct texts) it prints, by entries: Belady's MIN, the
frequency oracle, LRU, the real L1 with admission off and on, the real node tier off and on
(its capacity in entries is the most it held, its map sized for that); by bytes (answer sizes
from real answers): LRU, the real L1 off and on, and Belady's furthest-next-use. Then the
targets: each tier / oracle at 1% and 5%, and the other tenants' hit ratio with and without
one tenant's scan. An SVG of hit ratio against capacity goes to ``--svg``.

``--quick``: traces a fifth as long, three capacities, the node tier at one capacity: a
check that it all runs, not figures to quote.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from bench import hitoptimal, hitplot, hitreplay, hittraces
from bench.procs import busy_seconds
from gateway.cache.nodesampled import SampledStore

FULL_CAPS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1)
QUICK_CAPS = (0.01, 0.05, 0.1)
NODE_CAPS = (0.01, 0.05)
UNIFORM = 1536  # node-tier runs by entries: every answer one float32 vector
CALIBRATE_MAP = 4 * 1024 * 1024
#: The node tier is replayed at this many entries or more: a smaller map (a recorded trace of a
#: few thousand keys at 1%) fills up in the middle of a rotation (LMDB's MapFullError).
NODE_MIN_ENTRIES = 200


def node_entries_per_byte() -> float:
    """Most entries the generations' node tier holds per byte of map, for one-vector answers."""
    keys = np.arange(20_000, dtype=np.int64)
    ckeys = hitreplay.cache_keys(keys, np.zeros(len(keys), dtype=np.int8))
    _, peak = hitreplay.replay_node(ckeys, np.full(len(keys), UNIFORM), max_bytes=CALIBRATE_MAP,
                                    admission=False, eviction="generations")
    return peak / CALIBRATE_MAP


def node_map(entries: int, per_byte: float, eviction: str) -> int:
    """The map for ``entries`` one-vector answers: the sampled store's budget holds exactly
    that many (its peak); the generations' peak is ``per_byte`` from a calibration run."""
    if eviction == "sampled":
        return SampledStore.map_for(entries * hitreplay.node_entry_bytes(UNIFORM))
    return int(entries / per_byte)


def run_trace(trace: hittraces.Trace, caps: Sequence[float], node_caps: Sequence[float],
              per_byte: float) -> list[dict[str, float | str]]:
    """One row per capacity: every policy's hit ratio on ``trace``."""
    keys = hitreplay.cache_keys(trace.keys, trace.tenants)
    nxt = hitoptimal.next_use(trace.keys)
    charged = hitreplay.l1_bytes(trace.sizes)
    uniq = np.unique(trace.keys, return_index=True)[1]
    total_bytes = int(charged[uniq[trace.keys[uniq] < trace.universe]].sum())
    uniform = np.full(len(trace.keys), UNIFORM)
    rows: list[dict[str, float | str]] = []
    for frac in caps:
        c = max(1, int(trace.universe * frac))
        b = int(total_bytes * frac)
        row: dict[str, float | str] = {"trace": trace.name, "cap": frac}
        row["belady"] = hitoptimal.belady(trace.keys, c, nxt=nxt).mean()
        row["oracle"] = hitoptimal.oracle(trace.keys, c).mean()
        row["lru"] = hitoptimal.lru(trace.keys, c).mean()
        for adm, tag in ((False, "l1"), (True, "l1+tlfu")):
            hits = hitreplay.replay_l1(keys, trace.sizes, max_entries=c, max_bytes=1 << 50,
                                       admission=adm)
            row[tag] = hits.mean()
            if trace.name.startswith("tenants"):
                row[tag + " others"] = hits[trace.tenants != 0].mean()
        if trace.name.startswith("tenants"):
            row["oracle others"] = hitoptimal.oracle(trace.keys, c)[trace.tenants != 0].mean()
        if frac in node_caps and c >= NODE_MIN_ENTRIES:
            for adm, tag in ((False, "node"), (True, "node+tlfu")):
                for ev, suffix in (("sampled", ""), ("generations", " gens")):
                    hits, _ = hitreplay.replay_node(
                        keys, uniform, max_bytes=node_map(c, per_byte, ev), admission=adm,
                        eviction=ev)
                    row[tag + suffix] = hits.mean()
                    if trace.name.startswith("tenants"):
                        row[tag + suffix + " others"] = hits[trace.tenants != 0].mean()
        row["bytes lru"] = hitoptimal.lru(trace.keys, b, sizes=charged).mean()
        row["bytes belady"] = hitoptimal.belady(trace.keys, b, sizes=charged, nxt=nxt).mean()
        for adm, tag in ((False, "bytes l1"), (True, "bytes l1+tlfu")):
            row[tag] = hitreplay.replay_l1(keys, trace.sizes, max_entries=1 << 40,
                                           max_bytes=b, admission=adm).mean()
        rows.append(row)
    return rows


COLUMNS = ("belady", "oracle", "lru", "l1", "l1+tlfu", "node", "node+tlfu", "node gens",
           "node+tlfu gens", "bytes belady", "bytes lru", "bytes l1", "bytes l1+tlfu")


def _line(row: dict[str, float | str]) -> str:
    cells = [str(row["trace"]), f"{float(row['cap']) * 100:g}%"]
    cells += [f"{float(row[c]):.3f}" if c in row else "-" for c in COLUMNS]
    return "| " + " | ".join(cells) + " |"


def targets(rows: list[dict[str, float | str]]) -> None:
    """The issue's targets: tier / oracle at 1% and 5%; other tenants under one's scan."""
    print("\n| trace | cap | L1 / oracle | L1+tlfu / oracle | node / oracle | node+tlfu / oracle "
          "| node+tlfu gens / oracle | L1+tlfu >= 0.9 | node+tlfu >= 0.9 |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | :---: | :---: |")
    for r in rows:
        if r["cap"] not in (0.01, 0.05) or not str(r["trace"]).startswith(("zipf", "recorded")):
            continue
        o = float(r["oracle"])
        ratios = [float(r[c]) / o if c in r else float("nan")
                  for c in ("l1", "l1+tlfu", "node", "node+tlfu", "node+tlfu gens")]
        met = ["-" if x != x else ("yes" if x >= 0.9 else "no") for x in (ratios[1], ratios[3])]
        print(f"| {r['trace']} | {float(r['cap']) * 100:g}% | "
              + " | ".join("-" if x != x else f"{x:.2f}" for x in ratios)
              + f" | {met[0]} | {met[1]} |")
    base = {r["cap"]: r for r in rows if r["trace"] == "tenants-4"}
    scan = {r["cap"]: r for r in rows if r["trace"] == "tenants-4+scan"}
    if base and scan:
        print("\n| cap | tier | other tenants, no scan (no admission / tlfu) | with tenant 0's "
              "scan | drop (no admission / tlfu) | <= 0.05 (tlfu) |")
        print("| ---: | --- | --- | --- | --- | :---: |")
        for cap, b in base.items():
            s = scan.get(cap)
            if s is None:
                continue
            for tier in ("l1", "node"):
                if f"{tier}+tlfu others" not in b or f"{tier}+tlfu others" not in s:
                    continue
                off, on = (f"{tier} others", f"{tier}+tlfu others")
                d0 = float(b[off]) - float(s[off])
                d1 = float(b[on]) - float(s[on])
                print(f"| {float(cap) * 100:g}% | {'L1' if tier == 'l1' else 'node'} | "
                      f"{float(b[off]):.3f} / {float(b[on]):.3f} | {float(s[off]):.3f} / "
                      f"{float(s[on]):.3f} | {d0:.3f} / {d1:.3f} | "
                      f"{'yes' if d1 <= 0.05 else 'no'} |")


def _show(rows: list[dict[str, float | str]]) -> list[dict[str, float | str]]:
    for row in rows:
        print(_line(row), flush=True)
    return rows


def _children_cpu() -> float:
    """CPU seconds of the worker processes that have exited (``--jobs``)."""
    t = os.times()
    return t.children_user + t.children_system


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench hitratio",
                                     description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="short traces, three capacities")
    parser.add_argument("--trace", action="append", default=[],
                        help="a file of the gateway's trace recorder (repeatable)")
    parser.add_argument("--svg", default="bench/hitratio.svg", help="where the plot goes")
    parser.add_argument("--no-node", action="store_true", help="skip the node tier (LMDB)")
    parser.add_argument("--only-trace", action="store_true",
                        help="replay only the --trace files, not the synthetic traces")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                        help="traces replayed at once, one process each (default: CPUs)")
    args = parser.parse_args(argv)
    t0, busy0 = time.monotonic(), busy_seconds()
    caps = QUICK_CAPS if args.quick else FULL_CAPS
    node_caps = () if args.no_node else ((0.05,) if args.quick else NODE_CAPS)
    per_byte = node_entries_per_byte() if node_caps else 1.0
    if args.only_trace and not args.trace:
        parser.error("--only-trace needs at least one --trace FILE")
    traces = [] if args.only_trace else hittraces.synthetic(args.quick)
    if traces:
        traces += [hittraces.tenants_trace(scan=False, n=len(traces[0].keys)),
                   hittraces.tenants_trace(scan=True, n=len(traces[0].keys))]
    traces += [hittraces.recorded(path) for path in args.trace]
    print("| trace | cap | " + " | ".join(COLUMNS) + " |")
    print("| --- | ---: | " + " | ".join("---:" for _ in COLUMNS) + " |")
    rows: list[dict[str, float | str]] = []
    jobs = max(1, min(args.jobs, len(traces)))
    if jobs == 1:
        for trace in traces:
            rows += _show(run_trace(trace, caps, node_caps, per_byte))
    else:
        # Spawned, not forked: a fork of a process with threads (pytest's, numpy's) can leave the
        # children spinning on a lock the parent held.
        with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            for part in pool.map(run_trace, traces, *zip(*[(caps, node_caps, per_byte)]
                                                          * len(traces), strict=True)):
                rows += _show(part)
    targets(rows)
    hitplot.write_svg(rows, Path(args.svg))
    wall = time.monotonic() - t0
    own = time.process_time() + _children_cpu()
    other = max(0.0, busy_seconds() - busy0 - own)
    print(f"\nplot: {args.svg}; {wall:.0f} s wall, this process {own:.0f} s CPU, other "
          f"processes {other / wall:.2f} cores on average meanwhile")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
