"""Loads from the disk tier run off the engine thread (native/core/kv_disk_loader.h): while a
request's long prefix is read from disk, the other sequences keep decoding, and the request
joins with the cold run's tokens once its blocks are in. A request cancelled mid-load ends
cleanly and leaves nothing held."""

from __future__ import annotations

from pathlib import Path

from .conftest import run_all
from .test_kv_disk import _engine, _long_prompt

BLOCK = 64


def _written(model_path: Path, disk: Path, prompt: list[int]) -> dict:
    """The prompt run once by an engine that is then gone (a restarted worker's predecessor)."""
    first = _engine(model_path, disk)
    cold = run_all(first, {"cold": {"prompt": prompt, "max_tokens": 12}})["cold"]
    first.flush_kv_disk()
    return cold


def test_a_decode_stream_keeps_going_while_a_prefix_loads_from_disk(
    model_path, reference, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    prompt = _long_prompt(reference)
    blocks = (len(prompt) - 1) // BLOCK
    cold = _written(model_path, tmp_path, prompt)
    # A slow disk: every read waits 100 ms, so the prefix's 15 blocks take 1.5 s or more.
    engine = _engine(model_path, tmp_path, kv_disk_read_delay_ms=100)
    engine.submit("stream", prompt=[1, 504, 3260, 314, 260, 1345, 28], max_tokens=1500)
    tokens: dict[str, list[int]] = {"stream": [], "long": []}
    while len(tokens["stream"]) < 2:  # decoding
        for ev in engine.poll(1000):
            if ev["type"] == "tokens":
                tokens["stream"] += ev["tokens"]
    engine.submit("long", prompt=prompt, max_tokens=12)
    # Events come in the order the engine made them: the stream's tokens before the long
    # request's `started` were decoded while its blocks were being read.
    during = 0
    started = None
    done: dict[str, dict] = {}
    while "long" not in done:
        for ev in engine.poll(1000, True):
            if ev["id"] == "stream" and ev["type"] == "tokens" and started is None:
                during += len(ev["tokens"])
            elif ev["id"] == "long" and ev["type"] == "started":
                started = ev
            elif ev["id"] == "long" and ev["type"] == "tokens":
                tokens["long"] += ev["tokens"]
            elif ev["type"] == "done":
                done[ev["id"]] = ev
    assert started is not None and started["cached_tokens"] == blocks * BLOCK
    assert "stream" not in done  # still decoding: the load did not end it
    assert during >= 1
    engine.cancel("stream")
    assert tokens["long"] == cold["tokens"]
    assert done["long"]["cached_tokens"] == blocks * BLOCK
    disk = engine.stats()["kv_disk"]
    assert disk["loads"] == 1 and disk["hits"] == 1 and disk["read_blocks"] == blocks
    # The stream decoded while the blocks were read: steps ran with the load in flight.
    assert disk["steps_during_loads"] >= 1


def test_a_request_cancelled_while_its_prefix_loads_ends_and_holds_nothing(
    model_path, reference, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    prompt = _long_prompt(reference)
    cold = _written(model_path, tmp_path, prompt)
    engine = _engine(model_path, tmp_path, kv_disk_read_delay_ms=100)
    engine.submit("long", prompt=prompt, max_tokens=12)
    while engine.stats()["kv_disk"]["loads"] == 0:  # admitted, its reads under way
        engine.poll(10)
    engine.cancel("long")
    done = None
    while done is None:
        done = next((ev for ev in engine.poll(1000) if ev["type"] == "done"), None)
    assert done["finish_reason"] == "cancelled" and done["completion_tokens"] == 0
    stats = engine.stats()
    assert stats["kv_blocks_used"] == 0 and stats["active_sequences"] == 0
    # The engine serves on, and the prefix still loads from disk.
    again = run_all(engine, {"again": {"prompt": prompt, "max_tokens": 12}})["again"]
    assert again["tokens"] == cold["tokens"]
    assert again["done"]["cached_tokens"] == (len(prompt) - 1) // BLOCK * BLOCK
