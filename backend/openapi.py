"""``GET /openapi.json``: the backend's OpenAPI 3.1 document (``backend/openapi.json``).

The document is package data, read once when the app is built, and kept true by
``tests/backend/test_openapi_fuzz.py`` (every registered route is documented with its methods and
nothing else is; the request examples validate and are answered without a 4xx) and by the fuzzer
that is driven by it.
"""

from __future__ import annotations

import functools
from pathlib import Path

DOCUMENT = Path(__file__).resolve().parent / "openapi.json"


@functools.cache
def load() -> bytes:
    """The document's bytes (read once per process)."""
    return DOCUMENT.read_bytes()
