"""Run benchmarks by name: ``python -m bench all|backend|latency|gateway|cache|policy|overload``.

``cpu`` (instructions per request under callgrind, several minutes), ``fuzz`` (schemathesis on
both services: every check and phase, pinned seeds), ``batch`` (a 10,000-line batch job beside
interactive load, a few minutes) and ``soak`` (10 minutes of mixed traffic under faults) run only
by name: they are long and not part of ``all``.

``providers`` times ONNX Runtime's CPU EP against the OpenVINO EP (in ``.venv-openvino``,
which ``openvino_env`` builds) in one run; ``--quick`` for a short run.

``hitrps`` compares hit throughput (wrk) of this checkout's gateway with other checkouts'
(``--gateway-src``) and the floor, by name only.

``hitratio`` replays key traces through the cache tiers against Belady's optimum (issue 27;
``--quick`` for a short check), by name only; ``hitrecord`` records a trace from a real gateway
under a Zipf load for it to replay (``--trace``).

``resilience`` kills a near-zone model server under steady load, with and without the retry
policy (issue 15).

Each benchmark is a module ``bench.<name>`` with a ``main(argv) -> int``. Results are printed as
Markdown tables; copy them into ``bench/RESULTS.md`` with the command that made them.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

ORDER = ("policy", "cache", "backend", "latency", "gateway", "overload", "tenants",
         "resilience")
BY_NAME = ("fuzz", "soak", "batch", "cpu", "providers", "openvino_env", "sched", "hitratio",
           "hitrecord", "hitrps")


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    name = args.pop(0) if args else "all"
    names = ORDER if name == "all" else (name,)
    code = 0
    for bench in names:
        try:
            module = importlib.import_module(f"bench.{bench}")
        except ModuleNotFoundError as exc:
            if exc.name != f"bench.{bench}":
                raise
            print(f"bench: no benchmark named {bench!r} (have: {', '.join(ORDER + BY_NAME)})",
                  file=sys.stderr)
            return 2
        print(f"\n## bench {bench}\n", flush=True)
        code |= int(module.main(args))
    return code


if __name__ == "__main__":
    sys.exit(main())
