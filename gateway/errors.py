"""The gateway's one error hierarchy.

Every error a client can see is a ``GatewayError`` subclass carrying its HTTP status and a stable
``type`` string; one middleware renders them all as
``{"error": {"type", "message", "request_id"}}``. Third-party exceptions (aiohttp, redis,
onnxruntime) are converted into these where they are called, never leaked.

``message`` is what the raising code knows (it may name a backend's address); clients see
``public_message``. The errors a backend causes keep their detail for the logs and show a fixed
message that names no internal address.

    GatewayError (500 internal_error)
    ├── BadRequest (400 invalid_json)
    ├── MalformedRequest (400 bad_request)          the HTTP message itself did not parse
    ├── Unauthorized (401 unauthorized)
    ├── NotFound (404 not_found)
    │   └── ModelNotFound (404 model_not_found)
    ├── MethodNotAllowed (405 method_not_allowed)
    ├── PayloadTooLarge (413 payload_too_large)
    ├── UriTooLong (414 uri_too_long)
    ├── UnsupportedMediaType (415 unsupported_media_type)
    ├── ValidationFailed (422 invalid_request)        field + reason
    │   └── PolicyRejected (422 policy_rejected)      names the detector, never the text
    ├── BackendRejected (422 backend_rejected)        a backend refused a request we passed
    │   ├── BackendBadRequest (400)
    │   ├── BackendNotFound (404)
    │   └── BackendPayloadTooLarge (413)
    ├── RateLimited (429 rate_limited)                Retry-After
    ├── HeadersTooLarge (431 headers_too_large)
    ├── BadGateway (502 bad_gateway)                  shown as "backend unavailable"
    ├── Overloaded (503 overloaded)                   Retry-After, reason for shed metrics
    └── DeadlineExceeded (504 deadline_exceeded)      shown without the backend's name
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable


class GatewayError(Exception):
    """Base class: an error with an HTTP status that is safe to show to the client."""

    status: int = 500
    type: str = "internal_error"

    def __init__(self, message: str = "internal error") -> None:
        super().__init__(message)
        self.message = message

    @property
    def public_message(self) -> str:
        """The message a client sees; ``message`` itself unless the class keeps it internal."""
        return self.message

    def headers(self) -> dict[str, str]:
        """Extra response headers this error needs (e.g. ``Retry-After``)."""
        return {}


class BadRequest(GatewayError):
    status = 400
    type = "invalid_json"


class MalformedRequest(GatewayError):
    """The request line or headers broke HTTP/1.1 (answered before any route runs)."""

    status = 400
    type = "bad_request"


class InvalidHeader(GatewayError):
    """A request header the gateway reads holds a value it cannot use: names the header."""

    status = 400
    type = "invalid_header"


class Unauthorized(GatewayError):
    status = 401
    type = "unauthorized"

    def headers(self) -> dict[str, str]:
        return {"WWW-Authenticate": 'Bearer realm="gateway"'}


class NotFound(GatewayError):
    status = 404
    type = "not_found"


class ModelNotFound(NotFound):
    type = "model_not_found"


class MethodNotAllowed(GatewayError):
    """The route exists but not for this method; ``Allow`` names the ones it takes."""

    status = 405
    type = "method_not_allowed"

    def __init__(self, message: str, *, allowed: Iterable[str] = ()) -> None:
        super().__init__(message)
        self.allowed = tuple(sorted(set(allowed)))

    def headers(self) -> dict[str, str]:
        return {"Allow": ", ".join(self.allowed)} if self.allowed else {}


class PayloadTooLarge(GatewayError):
    status = 413
    type = "payload_too_large"


class UriTooLong(GatewayError):
    status = 414
    type = "uri_too_long"


class UnsupportedMediaType(GatewayError):
    status = 415
    type = "unsupported_media_type"


class ValidationFailed(GatewayError):
    """The body parsed but breaks the schema: names the field and why."""

    status = 422
    type = "invalid_request"

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


class PolicyRejected(ValidationFailed):
    """A privacy detector with action ``reject`` fired. Names the detector, never the text."""

    type = "policy_rejected"

    def __init__(self, field: str, detector: str, rule: str) -> None:
        super().__init__(field, f"rejected by policy rule {rule!r}: detector {detector!r} matched")
        self.detector = detector
        self.rule = rule


class BackendRejected(GatewayError):
    """A backend answered 4xx to a request the gateway found valid; its message is passed on.

    ``for_status`` picks the subclass whose status matches the backend's (422 for the rest)."""

    status = 422
    type = "backend_rejected"

    def __init__(self, message: str) -> None:
        super().__init__(f"backend refused the request: {message}")

    @staticmethod
    def for_status(status: int, message: str) -> BackendRejected:
        cls = _BACKEND_REJECTIONS.get(status, BackendRejected)
        return cls(message)


class BackendBadRequest(BackendRejected):
    status = 400


class BackendNotFound(BackendRejected):
    status = 404


class BackendPayloadTooLarge(BackendRejected):
    status = 413


_BACKEND_REJECTIONS: dict[int, type[BackendRejected]] = {
    400: BackendBadRequest, 404: BackendNotFound, 413: BackendPayloadTooLarge,
}


class _RetryAfter(GatewayError):
    def __init__(self, message: str, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(max(1, math.ceil(self.retry_after_s)))}


class RateLimited(_RetryAfter):
    status = 429
    type = "rate_limited"


class RequestTimeout(GatewayError):
    """The client did not send its request head or body within the read deadline."""

    status = 408
    type = "request_timeout"


class HeadersTooLarge(GatewayError):
    status = 431
    type = "headers_too_large"


class BadGateway(GatewayError):
    """A backend failed or answered badly. ``message`` (with its address) is for the logs."""

    status = 502
    type = "bad_gateway"

    @property
    def public_message(self) -> str:
        return "backend unavailable"


class Overloaded(_RetryAfter):
    """Shed before queueing: ``reason`` feeds the shed-count metric (queue_full, deadline, ...)."""

    status = 503
    type = "overloaded"

    def __init__(self, message: str, *, reason: str, retry_after_s: float = 1.0) -> None:
        super().__init__(message, retry_after_s)
        self.reason = reason

    @property
    def public_message(self) -> str:
        # Shed by this gateway: its own words. A backend that said 503: no name, no address.
        if self.reason == "backend_overloaded":
            return "backend overloaded"
        return self.message


class DeadlineExceeded(GatewayError):
    """The request's deadline (or a backend's read timeout) passed before an answer came.

    Raised by admission as well as by the upstream client, whose messages name the backend:
    clients get one message for all of them, the logs get ``message``.
    """

    status = 504
    type = "deadline_exceeded"

    @property
    def public_message(self) -> str:
        return "deadline passed before a backend answered"


class HttpError(GatewayError):
    """An HTTP-level refusal raised by aiohttp itself (not one of ours): ``http_error_class``
    gives one subclass per status, so the status is still on the class."""

    status = 400
    type = "http_error"


@functools.cache
def http_error_class(status: int) -> type[HttpError]:
    """The ``HttpError`` subclass for one status (made once, then reused)."""
    return type(f"HttpError{status}", (HttpError,), {"status": status})
