"""The gateway's one error hierarchy.

Every error a client can see is a ``GatewayError`` subclass carrying its HTTP status and a stable
``type`` string; one middleware renders them all as
``{"error": {"type", "message", "request_id"}}``. Third-party exceptions (aiohttp, redis,
onnxruntime) are converted into these where they are called, never leaked.

    GatewayError (500 internal_error)
    ├── BadRequest (400 invalid_json)
    ├── Unauthorized (401 unauthorized)
    ├── Forbidden (403 forbidden)
    ├── NotFound (404 not_found)
    │   └── ModelNotFound (404 model_not_found)
    ├── MethodNotAllowed (405 method_not_allowed)
    ├── PayloadTooLarge (413 payload_too_large)
    ├── UnsupportedMediaType (415 unsupported_media_type)
    ├── ValidationFailed (422 invalid_request)        field + reason
    │   └── PolicyRejected (422 policy_rejected)      names the detector, never the text
    ├── RateLimited (429 rate_limited)                Retry-After
    ├── BadGateway (502 bad_gateway)
    ├── Overloaded (503 overloaded)                   Retry-After, reason for shed metrics
    └── DeadlineExceeded (504 deadline_exceeded)
"""

from __future__ import annotations

import math


class GatewayError(Exception):
    """Base class: an error with an HTTP status that is safe to show to the client."""

    status: int = 500
    type: str = "internal_error"

    def __init__(self, message: str = "internal error") -> None:
        super().__init__(message)
        self.message = message

    def headers(self) -> dict[str, str]:
        """Extra response headers this error needs (e.g. ``Retry-After``)."""
        return {}


class BadRequest(GatewayError):
    status = 400
    type = "invalid_json"


class Unauthorized(GatewayError):
    status = 401
    type = "unauthorized"

    def headers(self) -> dict[str, str]:
        return {"WWW-Authenticate": 'Bearer realm="gateway"'}


class Forbidden(GatewayError):
    status = 403
    type = "forbidden"


class NotFound(GatewayError):
    status = 404
    type = "not_found"


class ModelNotFound(NotFound):
    type = "model_not_found"


class MethodNotAllowed(GatewayError):
    status = 405
    type = "method_not_allowed"


class PayloadTooLarge(GatewayError):
    status = 413
    type = "payload_too_large"


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


class _RetryAfter(GatewayError):
    def __init__(self, message: str, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(max(1, math.ceil(self.retry_after_s)))}


class RateLimited(_RetryAfter):
    status = 429
    type = "rate_limited"


class BadGateway(GatewayError):
    status = 502
    type = "bad_gateway"


class Overloaded(_RetryAfter):
    """Shed before queueing: ``reason`` feeds the shed-count metric (queue_full, deadline, ...)."""

    status = 503
    type = "overloaded"

    def __init__(self, message: str, *, reason: str, retry_after_s: float = 1.0) -> None:
        super().__init__(message, retry_after_s)
        self.reason = reason


class DeadlineExceeded(GatewayError):
    status = 504
    type = "deadline_exceeded"
