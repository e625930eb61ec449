"""Live policy state: the active policy (and a shadow candidate), reloaded without a restart.

``PolicyStore`` loads the policy files at construction (start-up fails on an invalid set), then
reloads them on demand (SIGHUP, the admin route) and when their modification times change
(``start()`` polls). A reload reads and validates the files off the event loop; an invalid set is
refused whole: the last good policy stays active, ``gateway_policy_reloads_total{result="failure"}``
counts it, one log line lists the errors, and ``PolicyError`` reaches the caller (the admin route
returns it). A shadow policy is evaluated beside the active one by the pipeline; where they would
decide differently ``compare_shadow`` counts it by rule, so a team sees the effect of a change
before making it active.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from pathlib import Path

from gateway.policy.evaluate import Decision
from gateway.policy.loader import PolicyError, default_policy, load_policy, policy_files
from gateway.policy.model import Policy
from gateway.policy.targets import KnownModels
from gateway.tasks import stop_task
from gateway.telemetry.observer import NullObserver, Observer

log = logging.getLogger("gateway.policy")

_Snapshot = tuple[tuple[str, int, int, int] | tuple[str], ...]


def differences(active: Decision | None, shadow: Decision | None) -> tuple[str, ...]:
    """What two decisions for one request disagree on; ``None`` stands for a rejected request.

    Names: ``outcome`` (one rejects), ``cache``, ``scope``, ``ttl``, ``stale_while_revalidate``,
    ``stale_if_error``, ``normalization``, ``store`` (which items may be cached) and ``text``
    (what the backend and the key see, e.g. after redaction).
    """
    if active is None or shadow is None:
        return () if active is shadow else ("outcome",)
    a, s = active.rule, shadow.rule
    pairs = (
        ("cache", active.cache, shadow.cache),
        ("scope", active.scope, shadow.scope),
        ("ttl", a.ttl_s, s.ttl_s),
        ("stale_while_revalidate", a.stale_while_revalidate_s, s.stale_while_revalidate_s),
        ("stale_if_error", a.stale_if_error_s, s.stale_if_error_s),
        ("normalization", a.normalization.fingerprint, s.normalization.fingerprint),
        ("store", [i.store for i in active.items], [i.store for i in shadow.items]),
        ("text", [i.text for i in active.items], [i.text for i in shadow.items]),
    )
    return tuple(name for name, x, y in pairs if x != y)


class PolicyStore:
    """The active policy and an optional shadow one, kept in step with their files."""

    def __init__(
        self,
        paths: Sequence[Path],
        *,
        observer: Observer | None = None,
        shadow_paths: Sequence[Path] | None = None,
        poll_interval_s: float = 1.0,
        models: KnownModels | None = None,
    ) -> None:
        self.known_models = models
        """What rules may name (routes, served models): others are refused (None: unchecked)."""
        self._paths = tuple(Path(p) for p in paths)
        self._shadow_paths = tuple(Path(p) for p in shadow_paths or ())
        self._observer: Observer = observer or NullObserver()
        self._poll_interval_s = poll_interval_s
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._snapshot = self._stat()  # before reading: a change during the read is seen later
        self._active, self._shadow = self._load()
        self._publish(None, self._active)

    @property
    def active(self) -> Policy:
        """The policy every request is decided by."""
        return self._active

    @property
    def shadow(self) -> Policy | None:
        """The candidate evaluated beside the active policy, if one is configured."""
        return self._shadow

    def _load(self) -> tuple[Policy, Policy | None]:
        models = self.known_models
        active = load_policy(self._paths, models=models) if self._paths else default_policy()
        shadow = load_policy(self._shadow_paths, models=models) if self._shadow_paths else None
        return active, shadow

    def _stat(self) -> _Snapshot:
        # A folder's own mtime changes when files are added or removed (or renamed over, as
        # editors save); each file's mtime, size and inode when it is rewritten.
        entries: list[tuple[str, int, int, int] | tuple[str]] = []
        for path in (*self._paths, *self._shadow_paths):
            for p in [path, *(policy_files([path]) if path.is_dir() else [])]:
                try:
                    st = p.stat()
                except OSError:
                    entries.append((str(p),))
                    continue
                entries.append((str(p), st.st_mtime_ns, st.st_size, st.st_ino))
        return tuple(entries)

    def _publish(self, old: Policy | None, new: Policy) -> None:
        self._observer.policy_active(old.version if old is not None else None, new.version,
                                     ",".join(new.sources))

    async def reload(self) -> Policy:
        """Re-read the files; the new active policy, or ``PolicyError`` with the old one kept."""
        async with self._lock:
            loop = asyncio.get_running_loop()
            snapshot = await loop.run_in_executor(None, self._stat)
            try:
                active, shadow = await loop.run_in_executor(None, self._load)
            except PolicyError as exc:
                self._snapshot = snapshot  # do not retry the same bad files on every poll
                self._observer.policy_reloaded("failure")
                log.error("policy reload refused, keeping %s: %s", self._active.version,
                          "; ".join(str(e) for e in exc.errors))
                raise
            old = self._active
            self._snapshot, self._active, self._shadow = snapshot, active, shadow
            self._publish(old, active)
            self._observer.policy_reloaded("success")
            log.info("policy %s active (was %s), shadow %s", active.version, old.version,
                     shadow.version if shadow is not None else "none")
            return active

    async def start(self) -> None:
        """Start watching the files (a no-op for the built-in policy or a zero interval)."""
        if self._task is None and self._poll_interval_s > 0 and (
            self._paths or self._shadow_paths
        ):
            self._task = asyncio.create_task(self._watch(), name="policy-watch")

    async def stop(self) -> None:
        """Stop watching; waits for the watcher to finish."""
        task, self._task = self._task, None
        await stop_task(task)

    async def _watch(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self._poll_interval_s)
            snapshot = await loop.run_in_executor(None, self._stat)
            if snapshot == self._snapshot:
                continue
            try:
                await self.reload()
            except PolicyError:
                pass  # counted and logged by reload; tried again when the files change again
            except Exception:  # a bug must not stop the watcher for good
                log.exception("policy reload failed")

    def compare_shadow(self, active: Decision | None, shadow: Decision | None) -> tuple[str, ...]:
        """Count where the shadow policy decides differently (``None``: that policy rejected)."""
        found = differences(active, shadow)
        if found:
            self._observer.shadow_differences(
                active.rule.name if active is not None else "rejected",
                shadow.rule.name if shadow is not None else "rejected", found)
        return found
