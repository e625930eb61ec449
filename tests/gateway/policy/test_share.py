"""Workers sharing their policy reads (gateway/policy/share.py): two PolicyStores on one share
stand for two workers; the race of issue 20 item 10 is played out step by step."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gateway.policy import PolicyError
from gateway.policy.share import PolicyShare
from gateway.policy.store import PolicyStore
from tests.gateway.policy.test_store import BAD, GOOD, GOOD_TWO, rewrite, wait_for


async def test_a_refused_read_falls_back_to_the_last_valid_read_of_any_worker(
        tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(GOOD)
    share = PolicyShare(tmp_path / "share")
    a = PolicyStore([path], share=share, poll_interval_s=0)
    b = PolicyStore([path], share=share, poll_interval_s=0)
    assert a.active.version == b.active.version and a.active.version.startswith("one+")
    rewrite(path, GOOD_TWO)
    assert (await a.reload()).version.startswith("two+")  # the admin reload reached a
    rewrite(path, BAD)
    with pytest.raises(PolicyError):
        await b.reload()  # b never read "two" itself: it keeps what a read, not its own "one"
    assert b.active.version == a.active.version and b.active.version.startswith("two+")
    with pytest.raises(PolicyError):
        await a.reload()
    assert a.active.version.startswith("two+")
    c = PolicyStore([path], share=share, poll_interval_s=0)  # a worker restarted meanwhile
    assert c.active.version == a.active.version, "starts on the gateway's last good policy"


async def test_workers_adopt_a_publication_by_polling(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(GOOD)
    share = PolicyShare(tmp_path / "share")
    a = PolicyStore([path], share=share, poll_interval_s=0)
    b = PolicyStore([path], share=share, poll_interval_s=0.02)
    await b.start()
    try:
        rewrite(path, GOOD_TWO)
        await a.reload()
        rewrite(path, BAD)  # b's own read would be refused now; it adopts a's
        await wait_for(lambda: b.active.version == a.active.version)
        await asyncio.sleep(0.2)  # many polls later: still the same
        assert b.active.version == a.active.version and b.active.version.startswith("two+")
    finally:
        await b.stop()


def test_without_a_publication_an_invalid_file_still_stops_start_up(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(BAD)
    with pytest.raises(PolicyError):
        PolicyStore([path], share=PolicyShare(tmp_path / "share"), poll_interval_s=0)
