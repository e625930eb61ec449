"""Schemathesis hooks for ``python -m bench fuzz`` (named by ``bench/schemathesis.toml``).

``not_a_server_error`` is told that 504 is expected, because a client may ask for a deadline a
miss cannot meet; ``deadline_504`` keeps that excuse to cases that asked for under a second.
"""

from __future__ import annotations

from typing import Any

import schemathesis

EXCUSED_BELOW_MS = 1000.0


def asked_deadline_ms(headers: Any) -> float | None:
    """The case's ``X-Request-Timeout-Ms`` as a number, None when absent or not a number."""
    for key, value in dict(headers or {}).items():
        if key.lower() == "x-request-timeout-ms":
            try:
                return float(value)
            except (TypeError, ValueError):
                return None
    return None


@schemathesis.check
def deadline_504(ctx: Any, response: Any, case: Any) -> bool | None:
    """A 504 only for a case whose own deadline was under ``EXCUSED_BELOW_MS``."""
    if response.status_code != 504:
        return None
    asked = asked_deadline_ms(case.headers)
    if asked is None or asked >= EXCUSED_BELOW_MS:
        raise AssertionError(f"504 although the case allowed {asked or 'the default'} ms")
    return None
