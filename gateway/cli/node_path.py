"""``python -m gateway node-path [--config FILE]``: the node tier's directory, as the settings
name it (the file, then ``GATEWAY_*`` variables), printed for scripts such as ``make clean``.

The node tier outlives every gateway process on purpose (it is the host's shared cache), so
removing it is an explicit step: ``rm -rf "$(python -m gateway node-path)"`` with the gateway
stopped.
"""

from __future__ import annotations

import argparse
import sys

from gateway.settings import SettingsError, load_settings


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``node-path``; it sets ``func(args) -> exit status``."""
    cmd = subparsers.add_parser("node-path", help="print the node cache tier's directory")
    cmd.add_argument("--config", help="YAML settings file (GATEWAY_* env overrides it)")
    cmd.set_defaults(func=_node_path)


def _node_path(args: argparse.Namespace) -> int:
    try:
        settings = load_settings(args.config)
    except (SettingsError, OSError) as exc:
        print(f"gateway: invalid settings: {exc}", file=sys.stderr)
        return 2
    print(settings.cache.node.path)
    return 0
