"""``create_app``'s lifecycle: one cleanup context per long-lived resource, so a start that fails
stops everything started before it, and a normal stop stops everything."""

from __future__ import annotations

from pathlib import Path

import pytest
from aiohttp.test_utils import TestServer
from prometheus_client import CollectorRegistry

from gateway.app import create_app
from gateway.http import app_state as state
from gateway.policy.loader import PolicyError
from gateway.settings import load_settings
from gateway.upstream.transport import AiohttpTransport, SchemeTransport


def _session_closed(app: object) -> bool:
    transport = app[state.TRANSPORT]  # type: ignore[index]
    assert isinstance(transport, SchemeTransport)
    rest = transport.by_scheme["https"]  # http:// is the lean client; https:// keeps the session
    assert isinstance(rest, AiohttpTransport)
    return bool(rest.session.closed)


DEFAULT_POLICY = (Path(__file__).resolve().parents[2] / "policies" / "default.yaml").read_text()


@pytest.fixture
def policy(tmp_path: Path) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(DEFAULT_POLICY)
    return path


def _break(path: Path) -> None:
    path.write_text("version: [this is not a policy\n")


def _app(tmp_path: Path, policies: Path) -> object:
    values = {"backends": ["http://127.0.0.1:9"], "policies.path": str(policies),
              "cache.node.path": str(tmp_path / "node")}
    return create_app(load_settings(None, values, environ={}), registry=CollectorRegistry())


async def test_a_failed_start_stops_what_started_before_it(tmp_path: Path, policy: Path) -> None:
    app = _app(tmp_path, policy)
    _break(policy)  # between build and start: the start-up reload refuses it
    server = TestServer(app)  # type: ignore[arg-type]
    with pytest.raises(PolicyError):
        await server.start_server()
    # The policy store failed after the telemetry, the stores and the transport had started;
    # the runner's cleanup (gateway/server.py runs it whether or not setup finished) stops them.
    assert state.PIPELINE not in app  # type: ignore[operator]
    assert not _session_closed(app)
    await server.close()
    assert _session_closed(app)
    assert app[state.ACCESS_LOG]._task is None  # type: ignore[index]
    assert app[state.METRICS].tally._task is None  # type: ignore[index]


async def test_a_normal_stop_stops_every_resource(tmp_path: Path, policy: Path) -> None:
    app = _app(tmp_path, policy)
    server = TestServer(app)  # type: ignore[arg-type]
    await server.start_server()
    assert not _session_closed(app)
    assert app[state.ACCESS_LOG]._task is not None  # type: ignore[index]
    await server.close()
    assert _session_closed(app)
    assert app[state.ACCESS_LOG]._task is None  # type: ignore[index]
    assert app[state.METRICS].tally._task is None  # type: ignore[index]
