"""Named sessions outlive the daemon: the table is saved, read back at start (expired ones
left out), and a restored session's next request pins it in the new worker without unpinning
that worker's fresh pin."""

from __future__ import annotations

from pathlib import Path

from llmd.runtime.sessions import SessionTable


class Worker:
    def __init__(self) -> None:
        self.unpinned: list[str] = []

    async def unpin(self, session: str) -> None:
        self.unpinned.append(session)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


async def test_sessions_are_saved_and_read_back_without_the_expired_ones(tmp_path: Path) -> None:
    saved = tmp_path / "sessions.json"
    clock = Clock()
    before = SessionTable(clock=clock, saved=saved)
    worker = Worker()
    long = before.begin("agent-1", "m", worker, ttl=3600)
    short = before.begin("chat-2", "m", worker, ttl=60)
    assert long and short
    await before.end(long)
    await before.end(short)
    before.save()

    clock.now += 120  # the daemon was down for two minutes: chat-2's TTL passed
    after = SessionTable(clock=clock, saved=saved)
    assert after.restore() == 1
    [row] = after.list()
    assert row["id"] == "agent-1" and row["ttl"] == 3600 and row["requests"] == 1
    assert row["created"] == 1_000 and row["active_requests"] == 0

    new_worker = Worker()
    again = after.begin("agent-1", "m", new_worker, ttl=None)
    assert again is not None
    await after.end(again)
    assert new_worker.unpinned == []  # the new pin stays: the restored one held nothing
    assert after.list()[0]["requests"] == 2


def test_a_missing_or_unreadable_file_starts_empty(tmp_path: Path) -> None:
    assert SessionTable(saved=tmp_path / "none.json").restore() == 0
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert SessionTable(saved=bad).restore() == 0
    rows = tmp_path / "rows.json"
    rows.write_text(
        '[{"id": "has space", "model": "m", "ttl": 1e9, "created": 0, '
        '"last_used": 1e12, "requests": 1}, {"id": "ok"}]'
    )
    assert SessionTable(saved=rows).restore() == 0  # an invalid id, a row missing fields
