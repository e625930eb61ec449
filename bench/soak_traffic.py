"""The soak's traffic and the checks on every answer (``bench.soak`` runs the phases and faults).

Mixed requests from several tenants through the gateway: cache hits (a small shared pool of
texts), misses (unique texts), lists mixing both, PII texts, ``/v1/classify``, ``/v1/rank`` and
OIP ``infer``. Each answer is checked:
- **values**: every 200 is compared with a fresh computation by the backend itself (its own
  ``/v1/embeddings``, no cache): cosine > 0.9999 per embedding, classify and rank scores within
  1e-3 of the cosines of the reference vectors;
- **isolation**: tenant ``globex`` has a policy rule that truncates texts to 24 characters, the
  others do not, and all of them send the same pool texts; a HIT, STALE or COALESCED answer is
  allowed only for items that tenant itself sent before (on that route), and a leaked entry
  would also show as a wrong value;
- **PII**: tenant ``vault`` sends only texts with personal data (no_store) and must never get a
  HIT or STALE; ``pii_markers`` are searched for in Redis by ``bench.soak``;
- **errors**: every error is the gateway's JSON shape; a 500 or no answer at all is always a
  violation, other statuses are judged by the phase (``bench.soak``).
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import numpy as np
import numpy.typing as npt
import orjson

Vector = npt.NDArray[np.float32]
TENANTS = ("acme", "globex", "initech")
PII_TENANT = "vault"
TRUNCATING_TENANT = "globex"
TRUNCATE_AT = 24
LABELS = ("billing question", "account access", "shipping delay", "refund request")
POOL = tuple(f"customer question number {i}: how do I change my plan and billing date?"
             for i in range(60))
PII_MARKERS = (b"soak.person", b"@example.com", b"+44 20 7946", b"4111 1111 1111 1111")
COSINE_MIN = 0.9999
SCORE_TOLERANCE = 1e-3
MAX_PENDING = 50_000
KINDS = (("hit", 30), ("miss", 12), ("list", 14), ("pii", 10), ("classify", 12), ("rank", 10),
         ("oip", 12))


@dataclass(slots=True)
class Sample:
    """One request: when, which phase it started in, what it was, what came back."""

    t: float
    phase: str
    kind: str
    tenant: str
    status: int
    latency_s: float
    cache: str
    detail: str = ""  # for errors: the error type and message


@dataclass(slots=True)
class Pending:
    """A 200 waiting to be compared with reference vectors."""

    kind: str
    tenant: str
    texts: list[str]  # as the backend saw them (after the tenant's normalisation)
    answer: Any


@dataclass
class Checks:
    """Violations found so far, by kind (each list holds short descriptions)."""

    wrong_values: list[str] = field(default_factory=list)
    leaks: list[str] = field(default_factory=list)
    pii_cached: list[str] = field(default_factory=list)
    bad_errors: list[str] = field(default_factory=list)
    unanswered: list[str] = field(default_factory=list)
    verified: int = 0

    def all(self) -> dict[str, list[str]]:
        """Every violation list by name."""
        return {"wrong values": self.wrong_values, "cross-tenant entries": self.leaks,
                "PII cached": self.pii_cached, "bad error shape": self.bad_errors,
                "no answer": self.unanswered}


def normalised(tenant: str, text: str) -> str:
    """What the backend embeds for ``tenant``'s ``text`` (the soak's texts are plain ASCII with
    single spaces, so only globex's truncation changes them)."""
    return text[:TRUNCATE_AT] if tenant == TRUNCATING_TENANT else text


class Traffic:
    """Builds, sends and checks the soak's requests."""

    def __init__(self, gateway_url: str, backend_url: str, keys: dict[str, str], *,
                 seed: int = 0, deadline_ms: int = 2000) -> None:
        self.gateway_url = gateway_url
        self.backend_url = backend_url
        self.keys = keys
        self.deadline_ms = deadline_ms
        self.rng = random.Random(seed)
        self.counter = itertools.count()
        self.sent: set[tuple[str, str, str]] = set()  # (tenant, route, item) sent before
        self.pending: list[Pending] = []
        self.refs: OrderedDict[str, Vector] = OrderedDict()  # bounded LRU
        self.checks = Checks()
        self.policy_versions: set[str] = set()
        self._kinds = [k for k, _ in KINDS]
        self._weights = [w for _, w in KINDS]

    # --- building requests -----------------------------------------------------------------

    def _unique(self, tenant: str) -> str:
        return f"unique soak text {next(self.counter)} from {tenant} about an order"

    def _pii(self) -> str:
        n = next(self.counter)
        return self.rng.choice((
            f"please write to soak.person{n}@example.com about the invoice",
            f"call me back on +44 20 7946 {n % 10000:04d} tomorrow",
            f"my card is 4111 1111 1111 1111 and order {n} failed",
        ))

    def build(self) -> tuple[str, str, str, dict[str, Any], list[str], list[bool]]:
        """``(kind, tenant, path, body, items, is_pii)``: a random request of the mix."""
        kind = self.rng.choices(self._kinds, self._weights)[0]
        tenant = self.rng.choice(TENANTS)
        pool = self.rng.choice
        if kind == "hit":
            items = [pool(POOL)]
            return kind, tenant, "/v1/embeddings", {"model": "minilm", "input": items[0]}, \
                items, [False]
        if kind == "miss":
            items = [self._unique(tenant)]
            return kind, tenant, "/v1/embeddings", {"model": "minilm", "input": items}, \
                items, [False]
        if kind == "list":
            items = [pool(POOL) if self.rng.random() < 0.6 else self._unique(tenant)
                     for _ in range(self.rng.randint(2, 6))]
            return kind, tenant, "/v1/embeddings", {"model": "minilm", "input": items}, \
                items, [False] * len(items)
        if kind == "pii":
            if self.rng.random() < 0.5:
                items = [self._pii()]
                return kind, PII_TENANT, "/v1/embeddings", \
                    {"model": "minilm", "input": items[0]}, items, [True]
            items = [pool(POOL), self._pii()]
            return kind, tenant, "/v1/embeddings", {"model": "minilm", "input": items}, \
                items, [False, True]
        if kind == "classify":
            text = pool(POOL) if self.rng.random() < 0.7 else self._unique(tenant)
            labels = self.rng.sample(LABELS, self.rng.randint(2, 4))
            return kind, tenant, "/v1/classify", \
                {"model": "minilm", "input": text, "labels": labels}, [text, *labels], \
                [False] * (1 + len(labels))
        if kind == "rank":
            query = pool(POOL)
            docs = self.rng.sample(POOL, 3)
            return kind, tenant, "/v1/rank", \
                {"model": "minilm", "query": query, "documents": docs}, [query, *docs], \
                [False] * 4
        texts = self.rng.sample(POOL, self.rng.randint(1, 2))
        body = {"id": f"soak-{next(self.counter)}",
                "inputs": [{"name": "text", "datatype": "BYTES", "shape": [len(texts)],
                            "data": texts}]}
        return "oip", tenant, "/v2/models/minilm/infer", body, texts, [False] * len(texts)

    # --- one request -----------------------------------------------------------------------

    async def one(self, session: aiohttp.ClientSession, phase: str) -> Sample:
        """Send one request of the mix and check the answer."""
        kind, tenant, path, body, items, pii = self.build()
        seen = [normalised(tenant, t) for t in items]
        # The OIP route caches whole requests; the others cache each text.
        keys = [("oip", "|".join(seen))] if kind == "oip" else \
            [(path, text) for text, p in zip(seen, pii, strict=True) if not p]
        known_before = all((tenant, route, item) in self.sent for route, item in keys)
        self.sent.update((tenant, route, item) for route, item in keys)
        headers = {"Authorization": f"Bearer {self.keys[tenant]}",
                   "X-Request-Timeout-Ms": str(self.deadline_ms)}
        started = time.perf_counter()
        try:
            async with session.post(self.gateway_url + path, json=body, headers=headers) as resp:
                raw = await resp.read()
                status, cache = resp.status, resp.headers.get("X-Cache", "")
                rid = resp.headers.get("X-Request-Id", "")
                ctype = resp.content_type
                policy = resp.headers.get("X-Cache-Policy", "")
        except (aiohttp.ClientError, TimeoutError) as exc:
            latency = time.perf_counter() - started
            self.checks.unanswered.append(f"{phase} {kind}: {type(exc).__name__} {exc}"[:200])
            return Sample(time.monotonic(), phase, kind, tenant, 0, latency, "")
        latency = time.perf_counter() - started
        if policy:
            self.policy_versions.add(policy.split("@", 1)[-1])
        if status == 200:
            self._check_cache(phase, kind, tenant, cache, known_before, any(pii))
            if len(self.pending) < MAX_PENDING:
                self.pending.append(Pending(kind, tenant, seen, orjson.loads(raw)))
        else:
            detail = self._check_error(phase, kind, status, ctype, raw, rid)
            return Sample(time.monotonic(), phase, kind, tenant, status, latency, cache, detail)
        return Sample(time.monotonic(), phase, kind, tenant, status, latency, cache)

    def _check_cache(self, phase: str, kind: str, tenant: str, cache: str, known_before: bool,
                     has_pii: bool) -> None:
        if cache in ("HIT", "STALE") and (tenant == PII_TENANT or has_pii):
            self.checks.pii_cached.append(f"{phase} {kind}: a request with PII answered {cache}")
        elif cache in ("HIT", "STALE", "COALESCED") and not known_before:
            self.checks.leaks.append(f"{phase} {kind}: {tenant} got {cache} for items it never "
                                     "sent")

    def _check_error(self, phase: str, kind: str, status: int, ctype: str, raw: bytes,
                     rid: str) -> str:
        """Check the error's shape; its ``type: message`` for the report."""
        problem = None
        error: Any = None
        if ctype != "application/json":
            problem = f"content type {ctype}"
        else:
            try:
                error = orjson.loads(raw).get("error")
            except (orjson.JSONDecodeError, AttributeError):
                error = None
            if not isinstance(error, dict) or not all(
                    isinstance(error.get(k), str) for k in ("type", "message", "request_id")):
                problem = "not {error: {type, message, request_id}}"
            elif error["request_id"] != rid:
                problem = "request_id differs from X-Request-Id"
        if problem is not None:
            self.checks.bad_errors.append(f"{phase} {kind} {status}: {problem}: {raw[:120]!r}")
            return problem
        return f"{error['type']}: {error['message']}"[:200]

    # --- verification ----------------------------------------------------------------------

    async def verify(self, session: aiohttp.ClientSession, *, limit: int = 200) -> bool:
        """Compare up to ``limit`` pending answers with reference vectors computed by the
        backend directly. False when the backend could not answer (they stay pending)."""
        batch = self.pending[:limit]
        if not batch:
            return True
        needed = sorted({t for p in batch for t in p.texts if t not in self.refs})
        try:
            for i in range(0, len(needed), 64):
                await self._fetch_refs(session, needed[i:i + 64])
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return False
        del self.pending[:len(batch)]
        for item in batch:
            self._compare(item)
            self.checks.verified += 1
        while len(self.refs) > 4096:
            self.refs.popitem(last=False)
        return True

    async def _fetch_refs(self, session: aiohttp.ClientSession, texts: list[str]) -> None:
        async with session.post(f"{self.backend_url}/v1/embeddings",
                                json={"model": "minilm", "input": texts},
                                timeout=aiohttp.ClientTimeout(total=10)) as resp:
            if resp.status != 200:
                raise ValueError(f"backend answered {resp.status}")
            data = orjson.loads(await resp.read())["data"]
        for text, row in zip(texts, data, strict=True):
            self.refs[text] = np.asarray(row["embedding"], dtype=np.float32)

    def _ref(self, text: str) -> Vector:
        self.refs.move_to_end(text)
        return self.refs[text]

    def _compare(self, item: Pending) -> None:
        answer, texts = item.answer, item.texts
        where = f"{item.kind} ({item.tenant})"
        if item.kind in ("hit", "miss", "list", "pii"):
            got = [np.asarray(row["embedding"], dtype=np.float32) for row in answer["data"]]
            self._cosines(where, texts, got)
        elif item.kind == "oip":
            out = next(o for o in answer["outputs"] if o["name"] == "embedding")
            rows = np.asarray(out["data"], dtype=np.float32).reshape(len(texts), -1)
            self._cosines(where, texts, list(rows))
        elif item.kind == "classify":
            text = texts[0]
            for row in answer["data"][0]["labels"]:
                # Labels are shorter than the truncation: they come back as the backend saw them.
                want = float(self._ref(text) @ self._ref(row["label"]))
                self._score(where, row["score"], want)
        else:  # rank
            query, docs = texts[0], texts[1:]
            for row in answer["results"]:
                self._score(where, row["relevance_score"],
                            float(self._ref(query) @ self._ref(docs[row["index"]])))

    def _cosines(self, where: str, texts: list[str], got: list[Vector]) -> None:
        if len(got) != len(texts):
            self.checks.wrong_values.append(f"{where}: {len(got)} vectors for {len(texts)}")
            return
        for text, vec in zip(texts, got, strict=True):
            ref = self._ref(text)
            cos = float(vec @ ref / (np.linalg.norm(vec) * np.linalg.norm(ref)))
            if not cos > COSINE_MIN:
                self.checks.wrong_values.append(f"{where}: cosine {cos:.6f} for {text[:40]!r}")

    def _score(self, where: str, got: float, want: float) -> None:
        if abs(got - want) > SCORE_TOLERANCE:
            self.checks.wrong_values.append(f"{where}: score {got:.6f}, reference {want:.6f}")


async def sleep_until(deadline: float) -> None:
    """Sleep until ``time.monotonic()`` reaches ``deadline`` (at once when it has)."""
    await asyncio.sleep(max(0.0, deadline - time.monotonic()))
