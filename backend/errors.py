"""The backend's one error hierarchy: every error a client can see, with its HTTP status and
its gRPC status code (by name, so that this module needs no gRPC import).

Over REST one middleware renders them all: on the Open Inference Protocol routes as the spec's
``{"error": "<message>"}``, on the OpenAI-compatible route as OpenAI's error object. Over gRPC
the service aborts the call with ``grpc_code`` and the same message (``backend/rpc``).
Exceptions from the parts underneath (the batcher, ONNX Runtime, aiohttp, grpcio) are converted
into these where they are called; messages never quote request text.

    BackendError (500, INTERNAL)
    ├── BadRequest (400, INVALID_ARGUMENT)      malformed JSON, wrong datatype or shape, ...
    │   ├── UriTooLong (414)                    request line past the parser's limit
    │   └── HeadersTooLarge (431)               a header, or the header count, past the limit
    ├── NotFound (404, NOT_FOUND)
    │   └── ModelNotFound (404, NOT_FOUND)      unknown model or version
    ├── PayloadTooLarge (413, INVALID_ARGUMENT) body, or the texts in it, past a limit
    ├── UnsupportedMediaType (415)
    ├── Unavailable (503, UNAVAILABLE)          Retry-After: not ready, shutting down
    │   └── Overloaded (503, UNAVAILABLE)       Retry-After: a full queue, or a deadline the
    │                                           work ahead already outlasts
    ├── DeadlineExceeded (504, DEADLINE_EXCEEDED) the deadline passed before compute
    └── ClientDisconnected (499, CANCELLED)     the client left before its body arrived;
                                                counted (499), not logged as an error
"""

from __future__ import annotations

import math


class BackendError(Exception):
    """Base class: an error with an HTTP status and a message that is safe to show."""

    status: int = 500
    grpc_code: str = "INTERNAL"  # a grpc.StatusCode name
    openai_type: str = "server_error"

    def __init__(self, message: str = "internal error") -> None:
        super().__init__(message)
        self.message = message

    def headers(self) -> dict[str, str]:
        """Extra response headers this error needs (e.g. ``Retry-After``)."""
        return {}


class BadRequest(BackendError):
    """The request is malformed or breaks the protocol's rules."""

    status = 400
    grpc_code = "INVALID_ARGUMENT"
    openai_type = "invalid_request_error"


class UriTooLong(BadRequest):
    """The request line (method, URL, version) is longer than the HTTP parser accepts."""

    status = 414


class HeadersTooLarge(BadRequest):
    """A request header, or the number of them, is past the HTTP parser's limits."""

    status = 431


class NotFound(BackendError):
    """No such route or resource."""

    status = 404
    grpc_code = "NOT_FOUND"
    openai_type = "invalid_request_error"


class ModelNotFound(NotFound):
    """The model (or the version of it) is not served here."""


class MethodNotAllowed(BackendError):
    """The route exists but not for this HTTP method."""

    status = 405
    openai_type = "invalid_request_error"


class PayloadTooLarge(BackendError):
    """The body is larger than the server accepts."""

    status = 413
    grpc_code = "INVALID_ARGUMENT"
    openai_type = "invalid_request_error"


class UnsupportedMediaType(BackendError):
    """The body is declared as something other than JSON."""

    status = 415
    openai_type = "invalid_request_error"


class Unavailable(BackendError):
    """The server cannot take this request now; the client may retry after ``Retry-After``."""

    status = 503
    grpc_code = "UNAVAILABLE"
    openai_type = "server_error"

    def __init__(self, message: str, *, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s

    def headers(self) -> dict[str, str]:
        # Retry-After takes whole seconds; never 0, which invites an immediate retry storm.
        return {"Retry-After": str(max(1, math.ceil(self.retry_after_s)))}


class Overloaded(Unavailable):
    """Shed at once rather than queued: the priority's queue is full, or the work ahead would
    outlast the request's deadline. gRPC UNAVAILABLE (the retryable code, as Triton and the
    issue have it; RESOURCE_EXHAUSTED stays for messages past a size limit)."""


class DeadlineExceeded(BackendError):
    """The request's deadline passed before its inference ran."""

    status = 504
    grpc_code = "DEADLINE_EXCEEDED"
    openai_type = "timeout_error"


class ClientDisconnected(BackendError):
    """The client closed the connection before its request body arrived.

    Nobody is left to read an answer: the middleware renders one anyway (aiohttp drops it
    quietly) so that the request is counted and access-logged as 499, nginx's "client closed
    request", and never as a server error.
    """

    status = 499
    grpc_code = "CANCELLED"
    openai_type = "invalid_request_error"
