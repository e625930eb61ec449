"""Active health checks on the OIP readiness route, and model versions from OIP metadata.

Every ``health_interval_s`` each backend gets ``GET /v2/health/ready`` (through the upstream
transport: over gRPC, ``ServerReady``). A refused connection or a
non-200 answer marks it unhealthy at once (nothing listens, or it says it is not ready); timeouts
and other errors must repeat ``unhealthy_threshold`` times, so one slow answer under load does
not move traffic, except for a backend that has not been ready once since the gateway started
(nothing vouches for it yet). One success marks it healthy again, but does not cut a passive
ejection short: ejection is about failed calls, which a cheap readiness probe cannot vouch for.

The checker logs each change of health. A backend that has not been ready once since the gateway
started (refused or not ready: it is starting or warming up) is logged at INFO, once; a backend
that was ready and stops being so is a failure, logged at WARNING with the reason.

A healthy backend is also asked ``GET /v2/models/{name}`` for every configured model; the router
turns the reported versions into the version the cache keys use, and ``on_version_change`` hears
of a change the moment a check sees it. The graph's identity, where the metadata reports one
(``parameters.model_sha256``), is kept beside the version: the node cache scopes entries by it.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Callable, Sequence

import aiohttp
import orjson

from gateway.routing.backends import BackendState
from gateway.routing.balancer import Router, version_sort_key
from gateway.routing.config import RoutingSettings
from gateway.tasks import stop_task
from gateway.upstream.transport import (
    AiohttpTransport,
    ConnectFailed,
    ConnectTimeout,
    ReadTimeout,
    Request,
    Transport,
    TransportError,
)

log = logging.getLogger(__name__)

VersionCallback = Callable[[str, str | None, str], None]


class _Probe(enum.Enum):
    OK = "ok"
    DOWN = "down"  # definitive: refused or not ready
    FLAKY = "flaky"  # timeout or transport error: counts toward the threshold


_Verdict = tuple[_Probe, str]
"""A probe's outcome and, when it failed, why (for the log: no URL, no body)."""


class _Unknown(enum.Enum):
    """Metadata could not be read this time: keep what we knew."""

    TOKEN = 0


_UNKNOWN = _Unknown.TOKEN


class HealthChecker:
    """Polls every backend's readiness and model metadata; started and stopped explicitly."""

    def __init__(
        self,
        router: Router,
        transport: Transport | aiohttp.ClientSession,
        settings: RoutingSettings,
        *,
        models: Sequence[str],
        on_version_change: VersionCallback | None = None,
    ) -> None:
        self._router = router
        # Probes go through the transport seam, so a grpc:// backend gets ServerReady and
        # ModelMetadata calls on its channel; a bare session (as tests pass) is wrapped.
        self._transport = transport if isinstance(transport, Transport) else AiohttpTransport(
            transport, connect_timeout_s=settings.connect_timeout_s)
        self._settings = settings
        self._models = tuple(models)  # whose versions to read from each backend
        self._on_version_change = on_version_change
        self._task: asyncio.Task[None] | None = None
        self._seen_ready: set[BackendState] = set()  # ready at least once since start

    async def start(self) -> None:
        """Check every backend once (so versions are known before traffic), then keep polling."""
        if self._task is not None:
            return
        await self.check_once()
        self._task = asyncio.create_task(self._run(), name="gateway-health-checker")

    async def stop(self) -> None:
        """Stop polling and wait for the loop to end."""
        task, self._task = self._task, None
        await stop_task(task)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._settings.health_interval_s)
            try:
                await self.check_once()
            except Exception:  # the loop must outlive any one bad round
                log.exception("health check round failed")

    async def check_once(self) -> None:
        """Probe every backend concurrently and apply the verdicts."""
        models = self._models
        before = {m: self._router.model_version(m) for m in models}
        await asyncio.gather(*(self._check(state) for state in self._router.states))
        self._router.refresh_gauges()
        for model in models:
            after = self._router.model_version(model)
            if after is not None and after != before[model]:
                log.info("model version changed",
                         extra={"model": model, "old": before[model], "new": after})
                if self._on_version_change is not None:
                    try:
                        self._on_version_change(model, before[model], after)
                    except Exception:
                        log.exception("on_version_change callback failed")

    async def _check(self, state: BackendState) -> None:
        probe, reason = await self._probe(state)
        if probe is _Probe.OK:
            state.health_failures = 0
            versions = dict(state.model_versions)
            identities = dict(state.model_identities)
            for model in self._models:
                found = await self._version(state, model)
                if found is None:
                    versions.pop(model, None)
                    identities.pop(model, None)
                elif isinstance(found, tuple):
                    versions[model] = found[0]
                    if found[1]:
                        identities[model] = found[1]
                    else:
                        identities.pop(model, None)
            # Versions first, so the flip to healthy already carries them.
            self._router.set_model_versions(state, versions, identities)
            if self._router.set_health(state, True):
                log.info("backend healthy", extra=self._fields(state))
            self._seen_ready.add(state)
            return
        state.health_failures += 1
        # The threshold spares a backend that has worked from one slow answer; one that has not
        # been ready since start (health is optimistic until then) gets no benefit of the doubt.
        if (probe is _Probe.DOWN or state not in self._seen_ready
                or state.health_failures >= self._settings.unhealthy_threshold):
            if not self._router.set_health(state, False):
                return
            fields = {**self._fields(state), "reason": reason}
            if state in self._seen_ready:
                log.warning("backend unhealthy", extra=fields)
            else:
                # Starting or warming up (a backend answers ready only after its warm-up):
                # expected at start-up, so not a warning. Logged once: it stays unhealthy.
                log.info("backend not ready yet", extra=fields)

    @staticmethod
    def _fields(state: BackendState) -> dict[str, str]:
        return {"backend": state.name, "zone": state.spec.zone}

    async def _get(self, url: str) -> tuple[int, bytes]:
        timeout_s = self._settings.health_timeout_s
        async with asyncio.timeout(timeout_s):
            reply = await self._transport.send(Request("GET", url), timeout_s=timeout_s)
        return reply.status, reply.body

    async def _probe(self, state: BackendState) -> _Verdict:
        try:
            status, _ = await self._get(f"{state.url}/v2/health/ready")
            if status == 200:
                return _Probe.OK, ""
            return _Probe.DOWN, f"readiness answered HTTP {status}"
        except (ConnectTimeout, ReadTimeout, TimeoutError):
            return _Probe.FLAKY, "readiness check timed out"
        except ConnectFailed:
            return _Probe.DOWN, "connection refused or unreachable"
        except (TransportError, OSError) as exc:
            return _Probe.FLAKY, f"readiness check failed ({type(exc).__name__})"

    async def _version(self, state: BackendState, model: str
                       ) -> tuple[str, str] | _Unknown | None:
        """The highest version the backend lists for ``model`` and the graph's identity
        (``parameters.model_sha256``, "" when not reported); None if it does not serve it."""
        try:
            status, body = await self._get(f"{state.url}/v2/models/{model}")
            if status == 404:
                return None
            if status != 200:
                return _UNKNOWN
            meta = orjson.loads(body)
        except (TransportError, TimeoutError, OSError, orjson.JSONDecodeError):
            return _UNKNOWN
        versions = meta.get("versions") if isinstance(meta, dict) else None
        if not isinstance(versions, list):
            return _UNKNOWN
        names = [str(v) for v in versions if isinstance(v, str | int) and not isinstance(v, bool)]
        # A backend that lists no versions still serves the model: "" is its one version.
        version = max(names, key=version_sort_key) if names else ""
        params = meta.get("parameters")
        identity = params.get("model_sha256") if isinstance(params, dict) else None
        if not isinstance(identity, str) or len(identity) > 128:
            identity = ""
        return version, identity
