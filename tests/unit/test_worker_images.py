"""The worker's image queue (llmd/worker/vision.py): requests with images wait for the image
thread, which encodes every waiting request's images in the same passes, and a cancel of a
waiting request still ends it through the engine. A fake encoder stands in for the vision
tower (the real one is tested in tests/native/test_gemma3_vision.py)."""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import pytest

from llmd.worker.vision import (
    EmbeddingCache,
    ImageLayout,
    ImageRequests,
    layout_images,
    surrogate_ids,
)


class FakeEncoder:
    """Rows of 2 values per image; the first pass waits until the test lets it go."""

    def __init__(self) -> None:
        self.passes: list[int] = []
        self.release = threading.Event()
        self.encoded = 0
        self.cache_hits = 0
        self.encode_seconds = 0.0

    def pixels(self, images: list[Any]) -> list[np.ndarray]:
        if any(i == "bad" for i in images):
            raise ValueError("image 0 is unreadable")
        return [np.full((1, 2, 2), float(i), dtype=np.float32) for i in images]

    def encode(self, pixels: list[np.ndarray]) -> list[np.ndarray]:
        self.passes.append(len(pixels))
        self.encoded += len(pixels)
        self.encode_seconds += 0.5  # what each pass reports spending in the tower
        if len(self.passes) == 1:
            assert self.release.wait(10)
        return [np.full((2, 4), p.flat[0], dtype=np.float32) for p in pixels]

    def layout(self, prompt: list[int], embeddings: list, pixels: list) -> tuple[list[int], list]:
        return layout_images(prompt, embeddings, pixels, ImageLayout(9, 2, True))


class FakeEngine:
    def __init__(self) -> None:
        self.cancelled: list[str] = []

    def cancel(self, rid: str) -> None:
        self.cancelled.append(rid)


def _wait(cond: Any) -> None:
    deadline = time.monotonic() + 10
    while not cond():
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_waiting_requests_are_encoded_together_and_cancels_reach_the_engine() -> None:
    encoder, engine = FakeEncoder(), FakeEngine()
    failures: list[tuple[str, str, str]] = []
    queue = ImageRequests(encoder, engine, lambda *f: failures.append(f))  # type: ignore[arg-type]
    submitted: dict[str, tuple[list[int], list]] = {}

    def submit(rid: str) -> Any:
        return lambda ids, runs: submitted.__setitem__(rid, (ids, runs))

    queue.put("a", [1, 9, 9, 3], [1], submit("a"))
    _wait(lambda: encoder.passes == [1])  # the thread is busy with a
    queue.put("b", [1, 9, 9, 5, 9, 9], [2, 3], submit("b"))
    queue.put("c", [9, 9], [4], submit("c"))
    queue.put("d", [9, 9], ["bad"], submit("d"))
    assert queue.cancel("c")  # still waiting: it will end through the engine
    assert not queue.cancel("zz")
    encoder.release.set()
    _wait(lambda: len(submitted) == 3 and failures)
    assert encoder.passes == [1, 3]  # b's two images and c's in one pass
    assert queue.stats() == {
        "images_encoded": 4,
        "image_encode_seconds": 1.0,
        "image_cache_hits": 0,
        "image_batches": 2,
        "image_requests_largest_batch": 2,
    }
    ids, runs = submitted["b"]
    assert [first for first, _, _ in runs] == [1, 4]
    assert runs[0][1][0, 0] == 2 and runs[1][1][0, 0] == 3  # each run its own image's rows
    assert ids[0] == 1 and ids[3] == 5 and all(t < 0 for t in ids[1:3] + ids[4:])
    assert engine.cancelled == ["c"]
    assert failures == [("d", "invalid_request", "image 0 is unreadable")]
    assert not queue.cancel("b")  # submitted: a cancel now goes to the engine directly


def test_surrogate_ids_tell_images_apart() -> None:
    a, b = b"\x01" * 32, b"\x02" * 32
    assert surrogate_ids(a, 4) == surrogate_ids(a, 4)
    assert all(t < 0 for t in surrogate_ids(a, 64))
    assert len(set(surrogate_ids(a, 64))) == 64  # rows of one image differ too
    assert not set(surrogate_ids(a, 64)) & set(surrogate_ids(b, 64))


def test_embedding_cache_drops_the_least_recently_used_past_its_budget() -> None:
    cache = EmbeddingCache(budget=3 * 64)
    rows = {k: np.full((4, 4), i, dtype=np.float32) for i, k in enumerate([b"a", b"b", b"c", b"d"])}
    for k in (b"a", b"b", b"c"):
        cache.put(k, rows[k])
    assert cache.get(b"a") is rows[b"a"]  # a is now the most recent
    cache.put(b"d", rows[b"d"])  # over budget: b goes
    assert cache.get(b"b") is None
    assert all(cache.get(k) is rows[k] for k in (b"a", b"c", b"d"))
    cache.put(b"huge", np.zeros((100, 100), dtype=np.float32))  # larger than the budget: not kept
    assert cache.get(b"huge") is None and cache.get(b"a") is not None


def test_qwen_layout_takes_each_images_own_row_count_and_grid() -> None:
    """Qwen3.5's images differ in size: each run of `<|image_pad|>` is as long as its image's
    embeddings, causal, and carries the merged grid (patch grid / 2) for M-RoPE."""
    from llmd.worker.vision import qwen_layout

    layout = qwen_layout({"image_token_id": 9}, merge=2)
    pixels = [np.zeros((4, 6, 3), np.float32), np.ones((2, 4, 3), np.float32)]  # grids 4x6, 2x4
    embeddings = [np.zeros((6, 8), np.float32), np.zeros((2, 8), np.float32)]
    prompt = [1, 5, *[9] * 6, 7, *[9] * 2, 3]
    ids, runs = layout_images(prompt, embeddings, pixels, layout)
    assert [(first, len(e), bi, grid) for first, e, bi, grid in runs] == [
        (2, 6, False, (2, 3)),
        (9, 2, False, (1, 2)),
    ]
    assert all(t < 0 for t in ids[2:8] + ids[9:11]) and ids[8] == 7
    with pytest.raises(
        ValueError, match="an image takes 6 image tokens; the prompt has a run of 5"
    ):
        layout_images([1, *[9] * 5, 3, *[9] * 2], embeddings, pixels, layout)


def test_gemma4_layout_follows_the_text_configs_bidirectional_setting() -> None:
    """Gemma 4's images differ in size: each run of `<|image|>` is as long as its image's
    embeddings, with no grid (its rotary is 1-D); the rows see their whole image only where
    the text config asks for it ("vision"), else they are causal like text."""
    from llmd.worker.vision import gemma4_layout

    pixels = [np.zeros((3, 6, 4), np.float32), np.ones((6, 3, 4), np.float32)]
    embeddings = [np.zeros((2, 8), np.float32), np.zeros((2, 8), np.float32)]
    prompt = [1, 5, 125, 9, 9, 126, 7, 125, 9, 9, 126]
    for setting, bidirectional in (("vision", True), (None, False)):
        config = {"image_token_id": 9, "text_config.use_bidirectional_attention": setting}
        ids, runs = layout_images(prompt, embeddings, pixels, gemma4_layout(config))
        assert [(first, len(e), bi) for first, e, bi in runs] == [
            (3, 2, bidirectional),
            (8, 2, bidirectional),
        ]
        assert ids[3:5] != ids[8:10]  # different pixels, different surrogate ids
    with pytest.raises(ValueError, match="names no image_token_id"):
        gemma4_layout({})
