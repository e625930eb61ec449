"""Everything about reaching a backend: the client (routing, admission, retries, hedging) in
``client.py``, the transport seam in ``transport.py`` and the OIP wire format in ``wire.py``."""

from gateway.upstream.client import InferResult, RawResult, Upstream
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
