"""Key traces for ``bench hitratio``: synthetic ones with fixed seeds, and recorded ones.

A trace is three arrays of one length: ``keys`` (an integer per distinct text), ``sizes`` (the
bytes the answer to that key weighs, the same every time it is asked) and ``tenants`` (which
tenant asked). Synthetic traces draw ``REQUESTS`` requests over ``UNIVERSE`` distinct texts:

- ``zipf-A``: popularity rank r asked with probability proportional to 1 / r^A;
- ``zipf-A+scanF``: the same with one-off keys (never seen again: a backfill, a crawler)
  making up fraction F of the requests, in bursts of ``SCAN_BURST``;
- ``zipf-0.8+scan50-mid``: a 50% scan in the middle third only (the case LRU handles worst);
- ``shift-0.8``: Zipf 0.8 with the popularity ranking reshuffled every 20,000 requests;
- ``tenants-4``: four tenants with their own keys (per-tenant scope), tenant 0 running a scan
  of half the requests through the middle third (the other tenants' hit ratio is what counts).

Answer sizes come from real answers of the 384-d model: the float32 vector a per-text entry
holds (1,536 bytes), the same answer as an OIP JSON body with the floats in text, in base64, and
OIP requests of several texts cached as one entry (``answer_sizes``).
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson

REQUESTS = 100_000
UNIVERSE = 20_000
SCAN_BURST = 100
SEED = 27


@dataclass(frozen=True)
class Trace:
    """One replayable trace (see the module docstring)."""

    name: str
    keys: np.ndarray  # int64 per request
    sizes: np.ndarray  # int64 per request: the answer's bytes
    tenants: np.ndarray  # int8 per request
    universe: int  # the distinct texts capacities are a fraction of


def answer_sizes(seed: int = SEED) -> tuple[int, int, int, int]:
    """Bytes of one real-shaped answer: (float32 vector, OIP JSON with floats, base64 form,
    OIP JSON per text of a list request). Drawn from a unit vector like the model's."""
    rng = np.random.default_rng(seed)
    vec = rng.standard_normal(384).astype(np.float32)
    vec /= np.linalg.norm(vec)
    raw = vec.tobytes()
    floats = orjson.dumps({"model_name": "minilm", "model_version": "1", "outputs": [
        {"name": "embedding", "datatype": "FP32", "shape": [1, 384], "data": vec.tolist()}]})
    b64 = orjson.dumps({"object": "embedding", "index": 0,
                        "embedding": base64.b64encode(raw).decode()})
    per_text_in_list = len(orjson.dumps(vec.tolist())) + 2
    return len(raw), len(floats), len(b64), per_text_in_list


def key_sizes(n: int, seed: int = SEED) -> np.ndarray:
    """A size per key: 60% per-text vectors, 20% OIP float JSON, 15% base64, 5% list requests
    of 2-16 texts (the mix of routes is an assumption; the sizes are real)."""
    raw, floats, b64, per_text = answer_sizes(seed)
    rng = np.random.default_rng(seed + 1)
    kind = rng.choice(4, size=n, p=[0.60, 0.20, 0.15, 0.05])
    texts = rng.integers(2, 17, size=n)
    sizes = np.select([kind == 0, kind == 1, kind == 2],
                      [raw, floats, b64], default=texts * per_text + 120)
    return sizes.astype(np.int64)


def _zipf_ranks(rng: np.random.Generator, n: int, universe: int, alpha: float) -> np.ndarray:
    weights = 1.0 / np.arange(1, universe + 1, dtype=np.float64) ** alpha
    return rng.choice(universe, size=n, p=weights / weights.sum())


def zipf(alpha: float, *, n: int = REQUESTS, universe: int = UNIVERSE, seed: int = SEED,
         shift_every: int = 0) -> np.ndarray:
    """Keys 0..universe-1 by Zipf popularity (a random key for each rank, reshuffled every
    ``shift_every`` requests when set)."""
    rng = np.random.default_rng(seed)
    ranks = _zipf_ranks(rng, n, universe, alpha)
    out = np.empty(n, dtype=np.int64)
    step = shift_every or n
    for start in range(0, n, step):
        perm = rng.permutation(universe)
        out[start:start + step] = perm[ranks[start:start + step]]
    return out


def with_scans(keys: np.ndarray, fraction: float, *, first_key: int, seed: int = SEED,
               lo: float = 0.0, hi: float = 1.0) -> np.ndarray:
    """``keys`` with one-off keys (from ``first_key`` up) replacing ``fraction`` of the requests
    between fractions ``lo`` and ``hi`` of the trace, in bursts of ``SCAN_BURST``."""
    rng = np.random.default_rng(seed + 7)
    out = keys.copy()
    a, b = int(len(keys) * lo), int(len(keys) * hi)
    bursts = np.arange(a, b, SCAN_BURST)
    chosen = rng.choice(len(bursts), size=round(len(bursts) * fraction), replace=False)
    mask = np.zeros(len(keys), dtype=bool)
    for start in bursts[np.sort(chosen)]:
        mask[start:min(start + SCAN_BURST, b)] = True
    out[mask] = first_key + np.arange(int(mask.sum()))
    return out


def _trace(name: str, keys: np.ndarray, tenants: np.ndarray | None = None,
           universe: int = UNIVERSE) -> Trace:
    sizes = key_sizes(int(keys.max()) + 1)[keys]
    if tenants is None:
        tenants = np.zeros(len(keys), dtype=np.int8)
    return Trace(name, keys, sizes, tenants, universe)


def tenants_trace(*, scan: bool, n: int = REQUESTS, seed: int = SEED) -> Trace:
    """Four tenants of equal traffic, Zipf 0.8 each over their own quarter of the texts;
    with ``scan``, tenant 0 sends as many one-off keys as all others together in the middle
    third."""
    rng = np.random.default_rng(seed + 3)
    per = UNIVERSE // 4
    tenants = rng.integers(0, 4, size=n).astype(np.int8)
    keys = zipf(0.8, n=n, universe=per, seed=seed) + tenants.astype(np.int64) * per
    if scan:
        a, b = n // 3, 2 * n // 3
        mid_keys = keys[a:b]
        mid_t = tenants[a:b]
        # Interleave: one scan request of tenant 0 after every request of the middle third.
        scan_keys = UNIVERSE + np.arange(b - a)
        keys = np.concatenate([keys[:a], np.column_stack([mid_keys, scan_keys]).ravel(),
                               keys[b:]])
        tenants = np.concatenate([tenants[:a], np.column_stack(
            [mid_t, np.zeros(b - a, dtype=np.int8)]).ravel(), tenants[b:]])
    return _trace("tenants-4" + ("+scan" if scan else ""), keys, tenants)


def synthetic(quick: bool = False) -> list[Trace]:
    """Every synthetic trace of the module docstring (``quick``: a fifth as long)."""
    n = REQUESTS // 5 if quick else REQUESTS
    u = UNIVERSE // 5 if quick else UNIVERSE
    out: list[Trace] = []
    for alpha in (0.6, 0.8, 1.0):
        base = zipf(alpha, n=n, universe=u)
        out.append(_trace(f"zipf-{alpha}", base, universe=u))
        for frac in (0.1, 0.5):
            out.append(_trace(f"zipf-{alpha}+scan{int(frac * 100)}",
                              with_scans(base, frac, first_key=u), universe=u))
    mid = with_scans(zipf(0.8, n=n, universe=u), 0.5, first_key=u, lo=1 / 3, hi=2 / 3)
    out.append(_trace("zipf-0.8+scan50-mid", mid, universe=u))
    out.append(_trace("shift-0.8", zipf(0.8, n=n, universe=u, shift_every=n // 5),
                      universe=u))
    return out


def recorded(path: str) -> Trace:
    """A trace written by the gateway's trace recorder (``gateway/cache/tracefile.py``)."""
    from gateway.cache.tracefile import read_trace

    records = read_trace(path)
    ids: dict[int, int] = {}
    keys = np.array([ids.setdefault(r.key, len(ids)) for r in records], dtype=np.int64)
    tenant_ids: dict[int, int] = {}
    tenants = np.array([tenant_ids.setdefault(r.tenant, len(tenant_ids)) % 128
                        for r in records], dtype=np.int8)
    sizes = np.array([r.size for r in records], dtype=np.int64)
    # A key's size is its first answer's (misses and hits of one key weigh the same).
    first = dict(zip(keys[::-1].tolist(), sizes[::-1].tolist(), strict=True))
    sizes = np.array([first[k] for k in keys.tolist()], dtype=np.int64)
    return Trace(f"recorded:{Path(path).name}", keys, sizes, tenants, max(1, len(ids)))
