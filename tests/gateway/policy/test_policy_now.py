"""Issue 20, items 2, 3 and 8, over HTTP against a real backend: every stage reads one reading of
the request's headers (a repeated header cannot bypass a ``cache: false`` rule through the hot
path or the policy), an entry answers only while its age is within the TTL of the policy in force
now (L1, node tier, Redis; full and hot path), and a request the policy keeps wholly out of the
cache says ``X-Cache: BYPASS``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from multidict import CIMultiDict

from gateway.http import app_state as state
from tests.gateway.conftest import BackendProc, GatewayFactory
from tests.gateway.pipeline.rig import WallClock

DEBUG_POLICY = """
version: dbg-1
rules:
  - name: debug
    match: {headers: {x-debug: "1"}}
    cache: false
  - name: default
"""

TTL_POLICY = """
version: ttl-{label}
rules:
  - name: default
    ttl: {ttl}
    stale_if_error: 0s
"""

BODY = {"model": "minilm", "input": "a sentence about repeated headers"}


async def post(client: Any, headers: Any = None, body: Any = None) -> tuple[int, Any]:
    resp = await client.post("/v1/embeddings", json=body or BODY, headers=headers or {})
    await resp.read()
    return resp.status, resp.headers


async def test_a_repeated_header_never_bypasses_a_cache_false_rule(
        gateway: GatewayFactory, backend: BackendProc, tmp_path: Path) -> None:
    policy = tmp_path / "p.yaml"
    policy.write_text(DEBUG_POLICY)
    client = await gateway(policies={"path": str(policy)})
    seen = []
    for _ in range(3):
        _, h = await post(client, {"X-Debug": "0"})
        seen.append(h["X-Cache"])
    assert seen == ["MISS", "HIT", "HIT"] and "hot;dur=" in h["Server-Timing"], "warm and hot"
    for lines in ([("X-Debug", "0"), ("X-Debug", "1")],   # the hot key used to read the first
                  [("X-Debug", "1"), ("X-Debug", "0")],   # the policy used to read the last
                  [("X-Debug", "0, 1")]):                 # as a proxy merges repeated lines
        before = backend.requests_total()
        status, h = await post(client, CIMultiDict(lines))
        assert status == 200
        assert (h["X-Cache"], h["X-Cache-Policy"].split("@")[0]) == ("BYPASS", "debug"), lines
        assert backend.requests_total() == before + 1, "a cache: false request reaches a backend"
    _, h = await post(client, {"X-Debug": "0"})
    assert h["X-Cache"] == "HIT", "the warm entry still answers the plain request"


async def test_cache_control_and_deadline_read_every_line(gateway: GatewayFactory) -> None:
    client = await gateway()
    for _ in range(2):
        await post(client)
    _, h = await post(client, CIMultiDict([("Cache-Control", "max-age=3600"),
                                           ("Cache-Control", "no-store")]))
    assert h["X-Cache"] == "BYPASS", "no-store on a second Cache-Control line counts"
    status, _ = await post(client, CIMultiDict([("X-Request-Timeout-Ms", "5000"),
                                                ("X-Request-Timeout-Ms", "soon")]))
    assert status == 400, "every value of a repeated deadline is checked (400 invalid_header)"


async def test_a_shortened_ttl_reaches_stored_entries_on_every_tier(
        gateway: GatewayFactory, backend: BackendProc, tmp_path: Path, redis_url: str) -> None:
    clock = WallClock()
    policy = tmp_path / "p.yaml"
    policy.write_text(TTL_POLICY.format(label="long", ttl="1h"))
    node = str(tmp_path / "node-shared")
    first = await gateway(policies={"path": str(policy)}, redis={"url": redis_url},
                          clock=clock, **{"cache.node.path": node})
    # One text per tier checked: a MISS stores a fresh entry every other gateway could see.
    bodies = {tier: {"model": "minilm", "input": f"ttl on the {tier} tier"}
              for tier in ("l1", "redis", "node")}
    for body in bodies.values():
        assert [(await post(first, body=body))[1]["X-Cache"] for _ in range(3)] == [
            "MISS", "HIT", "HIT"]
    await first.server.app[state.CACHE].flush()  # node tier and Redis hold the entries
    policy.write_text(TTL_POLICY.format(label="short", ttl="5s"))
    await first.server.app[state.POLICIES].reload()
    clock.advance(8)
    # Each sees its 8 s old entry: in L1 with a hot answer (first), only in Redis (a gateway
    # with a node tier of its own), only in the node tier (one without Redis sharing first's).
    via_redis = await gateway(policies={"path": str(policy)}, redis={"url": redis_url},
                              clock=clock)
    via_node = await gateway(policies={"path": str(policy)}, clock=clock,
                             **{"cache.node.path": node})
    for tier, client in (("l1", first), ("redis", via_redis), ("node", via_node)):
        before = backend.requests_total()
        _, h = await post(client, body=bodies[tier])
        assert h["X-Cache"] == "MISS", f"{tier}: an entry older than the TTL in force answered"
        assert backend.requests_total() == before + 1


async def test_a_hot_answer_ends_at_the_current_ttl(
        gateway: GatewayFactory, backend: BackendProc, tmp_path: Path) -> None:
    """The hot answer is made under the new (5 s) policy from an entry stored under the old
    (1 h) one: it must end when the entry is 5 s old, not 1 h."""
    clock = WallClock()
    policy = tmp_path / "p.yaml"
    policy.write_text(TTL_POLICY.format(label="long", ttl="1h"))
    client = await gateway(policies={"path": str(policy)}, clock=clock)
    _, h = await post(client)
    assert h["X-Cache"] == "MISS"
    policy.write_text(TTL_POLICY.format(label="short", ttl="5s"))
    await client.server.app[state.POLICIES].reload()
    clock.advance(2)
    for _ in range(2):
        _, h = await post(client)
        assert h["X-Cache"] == "HIT"
    assert "hot;dur=" in h["Server-Timing"], "answered hot under the new policy"
    clock.advance(6)
    _, h = await post(client)
    assert h["X-Cache"] == "MISS" and "Age" not in h


async def test_a_request_of_only_no_store_items_says_bypass(
        gateway: GatewayFactory, backend: BackendProc) -> None:
    client = await gateway()  # the built-in policy: every detector no_store
    pii = {"model": "minilm", "input": ["mail jane.doe@example.com"]}
    for _ in range(2):
        _, h = await post(client, body=pii)
        assert h["X-Cache"] == "BYPASS" and "Age" not in h
    mixed = {"model": "minilm", "input": ["mail jane.doe@example.com", "a clean sentence"]}
    await post(client, body=mixed)
    _, h = await post(client, body=mixed)
    assert h["X-Cache"] == "MISS", "beside a cached text the no_store one is the request's MISS"
