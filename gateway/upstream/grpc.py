"""``GrpcTransport``: the transport seam (transport.py) over OIP gRPC, for ``grpc://host:port``
backends (Triton's and KServe's ``inference.GRPCInferenceService``, as our backend serves it on
``--grpc-port``).

Why a transport and not a second codec in the client: the client, the health checker and the
OIP passthrough all build REST exchanges, and every rule about answers (``wire.status_outcome``,
``wire.parse_embeddings``, the passthrough's JSON) is written once against REST. This transport
carries the same logical exchanges over gRPC, translating on the way (grpc_wire.py, pure): the
infer body into a ``ModelInferRequest`` with ``raw_input_contents``, the ``ModelInferResponse``
into the REST answer (Triton's binary layout when binary outputs were asked for, so the raw
float32 embedding bytes pass through untouched), gRPC status codes into REST statuses. Measured
(``bench/RESULTS.md``, misses against the bare stack, gateway half): the translation costs ~180k
instructions per short miss both ways, ~10% of the gateway's own work per miss, yet a miss over
gRPC costs only ~50k instructions more than over REST in all (grpcio's C client does less than
aiohttp's Python one). A codec per protocol would save most of the 180k but would not make gRPC
the faster hop: what it costs more is grpc.aio's poller thread, woken for every call (~0.1 ms
more CPU per miss on the bench machine). So: one parser, one set of rules.

Per backend: one ``grpc.aio`` channel (one HTTP/2 connection, every call multiplexed on it),
made on first use and kept for the transport's life, with keepalive pings while calls are in
flight (``keepalive_time_ms``; none on an idle connection, which servers' default ping policy
would answer with GOAWAY), a connect timeout (``min_reconnect_backoff_ms``: the shortest connect
attempt) and reconnects within a second of a backend coming back (``max_reconnect_backoff_ms``),
gRPC's own retries off (the client retries, on another backend).

Request headers become the call's terms: ``X-Request-Timeout-Ms`` (the time this try has, within
the request's deadline) is the gRPC deadline, which the backend enforces in its queue;
``X-Request-Id`` and ``X-Attempt-Count`` go as metadata. A channel-side failure is a
``ConnectFailed``/``Reset``/``ReadTimeout`` exactly as an aiohttp one is (the client's retry
policy and the health checker tell them apart the same way); see ``grpc_wire.status_reply``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import grpc
import grpc.aio

from gateway.upstream import grpc_answer as ga
from gateway.upstream import grpc_wire as gw
from gateway.upstream.transport import ReadTimeout, Reply, Request, Transport, TransportError
from oip import inference_pb2 as pb

SCHEME = "grpc://"
_METHODS: Mapping[str, tuple[Any, Any]] = {  # name -> (request class, response class)
    "ServerReady": (pb.ServerReadyRequest, pb.ServerReadyResponse),
    "ModelMetadata": (pb.ModelMetadataRequest, pb.ModelMetadataResponse),
    "ModelInfer": (pb.ModelInferRequest, pb.ModelInferResponse),
}
_METADATA = {"x-request-id", "x-attempt-count"}
_DEADLINE_SLACK_S = 0.001
"""Added to ``X-Request-Timeout-Ms`` (whole milliseconds, rounded down) so the gRPC deadline
never falls before the client's own timer: when the request's time runs out, the client sees
its deadline pass (not the backend's fault), as over REST."""


def channel_options(*, connect_timeout_s: float) -> list[tuple[str, int]]:
    """Options of every backend channel (see the module doc)."""
    connect_ms = max(1, int(connect_timeout_s * 1000))
    return [
        ("grpc.keepalive_time_ms", 30_000),
        ("grpc.keepalive_timeout_ms", 10_000),
        ("grpc.keepalive_permit_without_calls", 0),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.initial_reconnect_backoff_ms", min(connect_ms, 100)),
        ("grpc.min_reconnect_backoff_ms", connect_ms),
        ("grpc.max_reconnect_backoff_ms", max(connect_ms, 1000)),
        ("grpc.enable_retries", 0),
        ("grpc.max_receive_message_length", -1),
        ("grpc.max_send_message_length", -1),
        # Channels to the same backend share nothing: closing one never touches another's.
        ("grpc.use_local_subchannel_pool", 1),
    ]


class _Backend:
    """One backend's channel and a callable per method."""

    def __init__(self, authority: str, options: list[tuple[str, int]]) -> None:
        self.channel = grpc.aio.insecure_channel(authority, options=options)
        self.calls: dict[str, Any] = {
            name: self.channel.unary_unary(
                gw.SERVICE + name, request_serializer=request.SerializeToString,
                response_deserializer=response.FromString)
            for name, (request, response) in _METHODS.items()
        }


class GrpcTransport(Transport):
    """Production transport for ``grpc://`` backends: one kept-alive channel per backend."""

    def __init__(self, *, connect_timeout_s: float) -> None:
        self._options = channel_options(connect_timeout_s=connect_timeout_s)
        self._backends: dict[str, _Backend] = {}
        self._closed = False

    async def send(self, request: Request, *, timeout_s: float, bounded: bool = False) -> Reply:
        # ``bounded`` changes nothing here: the timeout is also the call's gRPC deadline, which
        # the backend reads.
        url = request.url
        if not url.startswith(SCHEME) or self._closed:
            raise TransportError("not a grpc:// URL" if not self._closed else "closed")
        authority, _, path = url[len(SCHEME):].partition("/")
        call = gw.to_call(request.method, "/" + path, request.body)
        if isinstance(call, Reply):
            return call
        timeout = timeout_s
        metadata: list[tuple[str, str]] = []
        for key, value in request.headers.items():
            name = key.lower()
            if name in _METADATA:
                metadata.append((name, value))
            elif name == "x-request-timeout-ms" and value.isascii() and value.isdigit():
                timeout = min(timeout, int(value) / 1000.0 + _DEADLINE_SLACK_S)
        backend = self._backends.get(authority)
        if backend is None:
            backend = self._backends[authority] = _Backend(authority, self._options)
        rpc = backend.calls[call.method](call.message, timeout=timeout, metadata=metadata)
        try:
            response = await rpc
            trailing = await rpc.trailing_metadata()
        except grpc.aio.AioRpcError as exc:
            return _failed(exc)
        except grpc.aio.UsageError as exc:
            raise TransportError(f"gRPC usage error: {exc}") from None
        if call.method == "ModelInfer":
            return ga.infer_reply(response, call.render, trailing or ())
        if call.method == "ServerReady":
            return gw.ready_reply(response, trailing or ())
        return gw.metadata_reply(response, trailing or ())

    async def close(self) -> None:
        self._closed = True
        backends, self._backends = self._backends, {}
        for backend in backends.values():
            await backend.channel.close()


def _failed(exc: grpc.aio.AioRpcError) -> Reply:
    code = exc.code()
    trailing = exc.trailing_metadata() or ()
    if code is grpc.StatusCode.DEADLINE_EXCEEDED and not trailing:
        # The channel's own timer (the server's aborts carry metadata): no answer in time, as
        # aiohttp's read timeout.
        raise ReadTimeout("gRPC deadline exceeded") from None
    return gw.status_reply(code.name, exc.details() or "", trailing)
