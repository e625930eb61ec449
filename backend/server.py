"""Serving the app over HTTP: ``serve`` runs it until SIGINT/SIGTERM through ``BackendRunner``.

``BackendRunner``'s connections answer what fails before any middleware runs (a request line
or header too long, too many headers, a message that is not HTTP/1.1) in the backend's JSON
error shape, ``{"error": "<message>"}``, with 414, 431 or 400 and ``Server: edge-backend``, and
log the status and the kind of error, never the bytes. aiohttp's own answer is plain text that
echoes the first 100 bytes of the offending line (a token in a query string, an API key), names
``Server: Python/... aiohttp/...`` and logs the line at ERROR.
"""

from __future__ import annotations

import asyncio
import logging
import signal

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from backend.dataplane import SERVER_NAME
from backend.envelope import request_id
from backend.errors import BackendError, BadRequest, DeadlineExceeded, HeadersTooLarge, UriTooLong
from backend.handlers import json_response
from backend.logs import access_lines
from backend.middleware import REQUEST_ID_HEADER
from backend.settings import ServeSettings
from oip.parse_errors import parse_failure

# The request line's limit is aiohttp's default; headers get a larger one so that the two
# differ and a LineTooLong says which it was (its message, which quotes the line, is not used).
MAX_LINE_SIZE = 8190
MAX_FIELD_SIZE = 16384

log = logging.getLogger("backend.http")


async def serve(app: web.Application, settings: ServeSettings) -> None:
    """``web.run_app``'s job (which cannot take another runner) with ``BackendRunner``: serves
    ``app`` on the settings' host and port until SIGINT or SIGTERM, then cleans up."""
    # run_app's defaults, kept: keep-alive 75 s, 60 s for running requests at shutdown.
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    runner = BackendRunner(app, access_log=None, keepalive_timeout=75.0, shutdown_timeout=60.0,
                           handle_signals=False)
    try:
        await runner.setup()  # startup: loads the models, starts the gRPC server
        if not stop.is_set():  # a signal during start-up: clean up at once
            site = web.TCPSite(runner, settings.host, settings.port)
            await site.start()
            await stop.wait()
    finally:
        await runner.cleanup()
        access_lines.flush()  # the last requests' lines


_PARSE_ERRORS: dict[int, type[BackendError]] = {
    414: UriTooLong, 431: HeadersTooLarge, 400: BadRequest}


class BackendRequestHandler(web.RequestHandler):
    """aiohttp's per-connection protocol, with its error answers in the backend's shape.

    aiohttp calls ``handle_error`` for what fails before the app sees a request, and for an
    exception escaping the app (the errors middleware leaves none). Overriding this documented
    hook needs a request handler class, which aiohttp takes from no setting: ``BackendServer``
    makes it.
    """

    __slots__ = ()

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        rid = request_id(None)
        error: BackendError
        if isinstance(exc, HttpProcessingError):
            failure = parse_failure(exc, max_line_size=self.max_line_size,
                                    max_field_size=self.max_field_size,
                                    max_headers=self.max_headers,
                                    first_request=self._request_count == 1)
            error = _PARSE_ERRORS[failure.status](failure.message)
            # Scanners send TLS or junk as a first request: aiohttp keeps those at DEBUG too.
            log.log(logging.DEBUG if failure.quiet else logging.INFO, "unparsable request",
                    extra={"fields": {"request_id": rid, "status": error.status,
                                      "error": type(exc).__name__}})
        elif status == 504:  # a TimeoutError escaped the app
            error = DeadlineExceeded("a timeout escaped the request handler")
            log.warning("timeout outside the app", extra={"fields": {"request_id": rid}})
        else:
            error = BackendError("internal error")
            log.error("unhandled error outside the app", exc_info=exc,
                      extra={"fields": {"request_id": rid}})
        if request.writer.output_size > 0:  # the response has started: only closing is left
            raise ConnectionError("response already started; cannot send an error")
        response = json_response({"error": error.message}, status=error.status, headers={
            REQUEST_ID_HEADER: rid, "Server": SERVER_NAME})
        response.force_close()
        return response


class BackendServer(web.Server):
    """aiohttp's low-level server, making each connection's protocol a
    ``BackendRequestHandler`` (``web.Server.__call__`` hard-codes ``RequestHandler``)."""

    def __call__(self) -> web.RequestHandler:
        return BackendRequestHandler(self, loop=self._loop, **self._kwargs)


class BackendRunner(web.AppRunner):
    """``web.AppRunner`` serving through ``BackendServer`` (tests use it through a
    ``TestServer``)."""

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()  # starts the app, applies handler_args
        return BackendServer(server.request_handler, request_factory=server.request_factory,
                             handler_cancellation=server.handler_cancellation,
                             loop=asyncio.get_running_loop(), **server._kwargs)
