"""Everything about reaching a backend: the client (routing, admission, retries, hedging) in
``client.py`` (each call's tries in ``tries.py``) and what it returns in ``results.py``, the
retry policy and budget in ``retry.py``, the transport seam in ``transport.py`` and the OIP wire
format in ``wire.py``."""

from gateway.upstream.client import Upstream
from gateway.upstream.results import InferResult, RawResult
from gateway.upstream.transport import (
    AiohttpTransport,
    ConnectError,
    ConnectFailed,
    MemoryTransport,
    ReadTimeout,
    Reply,
    Request,
    Reset,
    Transport,
    TransportError,
)

__all__ = [
    "AiohttpTransport", "ConnectError", "ConnectFailed", "InferResult", "MemoryTransport",
    "RawResult", "ReadTimeout", "Reply", "Request", "Reset", "Transport", "TransportError",
    "Upstream",
]
