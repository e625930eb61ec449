"""The tenants file, live: ``TenantStore`` holds the current ``Tenants`` and reloads them.

Like the policy store (gateway/policy/store.py): the file is read and validated at start-up
(an invalid file stops it), then reloaded when its modification time, size or inode changes
(polled every ``quotas.poll_interval_s``), on ``SIGHUP`` and on ``POST /admin/tenants/reload``.
A reload reads the file off the event loop; an invalid file is refused whole, the last good
tenants stay, ``gateway_tenants_reloads_total{result="failure"}`` counts it and one log line
lists the problems (never a key: the file holds only digests). Every lookup reads the current
``Tenants``, so a new key, quota, weight or priority applies to the next request.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from pathlib import Path

from gateway.tasks import stop_task
from gateway.tenants.directory import Tenants, TenantsError
from gateway.tenants.quota.spec import TenantSpec
from gateway.upstream.admission.fairqueue import Priority

log = logging.getLogger("gateway.tenants.directory")

_Stamp = tuple[int, int, int] | None


class TenantStore:
    """The current tenants, kept in step with their file (see the module docstring)."""

    def __init__(self, path: Path | None, *, tenants: Tenants | None = None,
                 poll_interval_s: float = 1.0,
                 on_reload: Callable[[str], None] | None = None) -> None:
        """``tenants`` given: used as they are and never reloaded (tests, set-ups); else read
        from ``path``, or every request is tenant ``public`` without one. ``on_reload(result)``
        hears ``success`` or ``failure`` after each reload."""
        self._path = path if tenants is None else None
        self._poll_interval_s = poll_interval_s
        self._on_reload = on_reload
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._stamp = self._stat()
        if tenants is not None:
            self._tenants = tenants
        else:
            self._tenants = Tenants.load(path) if path is not None else Tenants.public()

    @property
    def current(self) -> Tenants:
        """The tenants every request is identified by now."""
        return self._tenants

    @property
    def path(self) -> Path | None:
        """The file reloads read (None: nothing to reload)."""
        return self._path

    def identify(self, authorization: str | None) -> str:
        """``Tenants.identify`` on the current tenants (401 for a missing or unknown key)."""
        return self._tenants.identify(authorization)

    @property
    def names(self) -> frozenset[str]:
        return self._tenants.names

    def spec(self, tenant: str) -> TenantSpec:
        """The tenant's quota, weight and priority now."""
        return self._tenants.spec(tenant)

    def share(self, tenant: str) -> tuple[float, Priority]:
        """(weight, priority class): what admission's fair queue asks on every call."""
        spec = self._tenants.spec(tenant)
        return spec.weight, spec.priority

    def backend_priority(self, tenant: str) -> tuple[Priority, int | None, Mapping[str, int]]:
        """(class, backend priority, per-route priorities) the tenants file sets for
        ``tenant``: what each backend call's scheduling priority is made of."""
        spec = self._tenants.spec(tenant)
        return spec.priority, spec.backend_priority, spec.route_priority

    def _stat(self) -> _Stamp:
        if self._path is None:
            return None
        try:
            st = self._path.stat()
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size, st.st_ino

    async def reload(self) -> Tenants:
        """Re-read the file: the new tenants, or ``TenantsError`` with the old ones kept."""
        path = self._path
        if path is None:
            return self._tenants
        async with self._lock:
            loop = asyncio.get_running_loop()
            stamp = await loop.run_in_executor(None, self._stat)
            try:
                tenants = await loop.run_in_executor(None, Tenants.load, path)
            except TenantsError as exc:
                self._stamp = stamp  # not retried until the file changes again
                self._report("failure")
                log.error("tenants reload refused, keeping the last good file: %s",
                          str(exc).replace("\n", "; "))
                raise
            self._stamp, self._tenants = stamp, tenants
            self._report("success")
            log.info("tenants reloaded: %d tenant(s)", len(tenants.names))
            return tenants

    def _report(self, result: str) -> None:
        if self._on_reload is not None:
            self._on_reload(result)

    async def start(self) -> None:
        """Start watching the file (a no-op without one or with a zero interval)."""
        if self._task is None and self._path is not None and self._poll_interval_s > 0:
            self._task = asyncio.create_task(self._watch(), name="tenants-watch")

    async def stop(self) -> None:
        task, self._task = self._task, None
        await stop_task(task)

    async def _watch(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self._poll_interval_s)
            if await loop.run_in_executor(None, self._stat) == self._stamp:
                continue
            try:
                await self.reload()
            except TenantsError:
                pass  # counted and logged; tried again when the file changes again
            except Exception:  # a bug must not stop the watcher for good
                log.exception("tenants reload failed")
