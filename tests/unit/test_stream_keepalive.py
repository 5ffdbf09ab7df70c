"""http_common.with_keepalive: the frames a stream relays, with a keep-alive frame whenever
the next one is slow to come (a long prefill), and nothing lost or reordered."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from llmd.api.http_common import with_keepalive

BEAT = b": beat\n\n"


async def _slow(delays: list[float]) -> AsyncIterator[bytes]:
    for i, delay in enumerate(delays):
        await asyncio.sleep(delay)
        yield f"frame {i}".encode()


async def test_beats_fill_silences_and_frames_keep_their_order() -> None:
    # 0.5 s silences hold 10 beat periods: 3 beats arrive even on a loaded 2-core machine.
    out = [f async for f in with_keepalive(_slow([0.5, 0.0, 0.5]), 0.05, BEAT)]
    frames = [f for f in out if f != BEAT]
    assert frames == [b"frame 0", b"frame 1", b"frame 2"]
    assert out.index(b"frame 0") >= 3  # beats while the first frame was slow
    between = out[out.index(b"frame 1") + 1 : out.index(b"frame 2")]
    assert len(between) >= 3 and set(between) == {BEAT}


async def test_after_first_sends_nothing_before_the_first_frame() -> None:
    out = [f async for f in with_keepalive(_slow([0.2, 0.2]), 0.05, BEAT, after_first=True)]
    assert out[0] == b"frame 0" and BEAT in out[1:]


async def test_closing_early_cancels_the_pending_frame() -> None:
    closed = asyncio.Event()

    async def endless() -> AsyncIterator[bytes]:
        try:
            yield b"first"
            await asyncio.sleep(60)
            yield b"never"
        finally:
            closed.set()

    stream = with_keepalive(endless(), 0.02, BEAT)
    assert await anext(stream) == b"first"
    assert await anext(stream) == BEAT
    await stream.aclose()  # type: ignore[attr-defined]
    await asyncio.wait_for(closed.wait(), 1)
