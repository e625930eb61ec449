"""Checks the gateway bench makes around its timed runs: is that a hit, and from which tier.

wrk cannot say which answers were cache hits, so before a timed run a ``Probe`` sends the same
requests with a plain HTTP client and checks the cache header (the gateway's ``X-Cache``,
nginx's ``X-Nginx-Cache``), and ``cache_lookups`` reads the gateway's lookup counters from
``/metrics`` so a report can show which tier answered during the run.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import orjson
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample as MetricSample

from bench.loadgen import Reply

PATH = "/v1/embeddings"


@dataclass(frozen=True)
class Probe:
    """What a check saw: how many answers had the expected cache header value."""

    matched: int
    total: int
    header: str
    want: str
    seen: str  # the first answer's header value (or the error)

    @property
    def ok(self) -> bool:
        """Every answer matched."""
        return self.total > 0 and self.matched == self.total

    def describe(self) -> str:
        """``2/2 answers with X-Cache: HIT`` and what was seen otherwise."""
        text = f"{self.matched}/{self.total} answers with {self.header}: {self.want}"
        return text if self.ok else f"{text} (saw {self.seen!r}) - NOT AS EXPECTED"

    @classmethod
    def check(cls, base_url: str, body: bytes, header: str, want: str) -> Probe:
        """Sends ``body`` twice; the second answer must carry ``header: want``."""
        fetch(base_url, body)
        status, headers = fetch(base_url, body)
        value = headers.get(header, f"status {status}")
        return cls(int(value == want and status == 200), 1, header, want, value)

    @classmethod
    def warm(cls, base_url: str, bodies: Sequence[bytes]) -> Probe:
        """Sends every body once (filling the caches), then again expecting ``X-Cache: HIT``."""
        for body in bodies:
            fetch(base_url, body)
        matched, first = 0, ""
        for body in bodies:
            status, headers = fetch(base_url, body)
            value = headers.get("X-Cache", f"status {status}")
            first = first or value
            matched += int(value == "HIT" and status == 200)
        return cls(matched, len(bodies), "X-Cache", "HIT", first)


def fetch(base_url: str, body: bytes, path: str = PATH) -> tuple[int, Mapping[str, str]]:
    """POSTs ``body`` as JSON; the status and headers (status 0 when nothing answered)."""
    request = urllib.request.Request(base_url + path, data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            response.read()
            return int(response.status), dict(response.headers)
    except urllib.error.HTTPError as exc:
        return int(exc.code), dict(exc.headers)
    except (urllib.error.URLError, OSError, TimeoutError) as exc:
        return 0, {"error": type(exc).__name__}


def capture(base_url: str, body: bytes, out: Path, path: str = PATH) -> None:
    """POSTs ``body`` and writes the answer's body and headers to ``out`` (for ``bench.floor``)."""
    request = urllib.request.Request(base_url + path, data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        answer = response.read()
        headers = dict(response.headers)
    out.write_bytes(orjson.dumps({"body": answer.decode(), "headers": headers}))


def metric_samples(base_url: str, names: Collection[str]) -> list[MetricSample]:
    """The samples named ``names`` (e.g. ``gateway_shed_total``) on ``base_url``'s ``/metrics``."""
    with urllib.request.urlopen(base_url + "/metrics", timeout=10) as response:
        text = response.read().decode()
    return [sample for family in text_string_to_metric_families(text)
            for sample in family.samples if sample.name in names]


def cache_lookups(base_url: str) -> dict[str, float]:
    """``gateway_cache_lookups_total`` from ``/metrics`` as ``{"l1 hit": n, ...}``."""
    out: dict[str, float] = {}
    for sample in metric_samples(base_url, {"gateway_cache_lookups_total"}):
        key = f"{sample.labels.get('tier', '?')} {sample.labels.get('result', '?')}"
        out[key] = out.get(key, 0.0) + sample.value
    return out


def server_timing(reply: Reply) -> dict[str, float]:
    """The ``Server-Timing`` durations of an answer, in ms (``{"total": 1.2, ...}``)."""
    found: dict[str, float] = {}
    for metric in reply.headers.get("Server-Timing", "").split(","):
        name, _, rest = metric.strip().partition(";")
        for param in rest.split(";"):
            key, _, value = param.strip().partition("=")
            if key.strip() == "dur":
                try:
                    found[name.strip()] = float(value)
                except ValueError:
                    continue
    return found
