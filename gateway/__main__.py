"""Command line: ``python -m gateway serve``, ``python -m gateway policy check|explain`` and
``python -m gateway node-path``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def _serve_args(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("serve", help="run the gateway")
    p.add_argument("--config", help="YAML settings file (flags and GATEWAY_* env override it)")
    # Each flag's dest is the dotted path of the setting it sets (gateway/settings).
    p.add_argument("--host", dest="host")
    p.add_argument("--port", dest="port", type=int)
    p.add_argument("--backend", action="append", dest="backends", metavar="URL[@REGION/ZONE]",
                   help="a backend base URL; repeat for several")
    p.add_argument("--redis", dest="redis.url", metavar="URL",
                   help="L2 cache (redis:// or rediss://); none = in-process cache only")
    p.add_argument("--policies", dest="policies.path", metavar="PATH",
                   help="policy file or folder")
    p.add_argument("--shadow-policies", dest="policies.shadow_path", metavar="PATH",
                   help="candidate policy to compare")
    p.add_argument("--tenants", dest="tenants_file", metavar="FILE", help="API key -> tenant file")
    p.add_argument("--workers", dest="workers", type=int,
                   help="worker processes (default: one per core)")
    p.add_argument("--region", dest="routing.region", metavar="REGION")
    p.add_argument("--zone", dest="routing.zone", metavar="ZONE")
    p.add_argument("--log-level", dest="logging.level", metavar="LEVEL")


def build_parser() -> argparse.ArgumentParser:
    """The whole command line (also used by tests that check deploy files' commands)."""
    parser = argparse.ArgumentParser(prog="python -m gateway", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    _serve_args(sub)
    from gateway.cli.node_path import register as register_node_path
    from gateway.cli.policy import register as register_policy

    register_policy(sub)
    register_node_path(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "serve":
        from gateway.server import serve

        return serve(args)
    handler = getattr(args, "func", None)
    if handler is None:
        parser.print_help()
        return 2
    code: int = handler(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
