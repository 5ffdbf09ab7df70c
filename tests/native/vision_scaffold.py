"""What the vision tests share (test_gemma3_vision.py, test_qwen3_5_vision.py,
test_gemma4_vision.py): a checkpoint's tower and engine as the worker loads them, the engine's
log-probabilities of the whole (tiny, 128-token) vocabulary to compare with transformers'
logits, and the worker's JSONL turn with images."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import numpy as np

from .conftest import read_event, send

VOCAB = 128  # the tiny models' vocabulary: top_logprobs of all of it is the whole distribution


def tower(path: Path, backend: str):  # type: ignore[no-untyped-def]
    """The checkpoint's vision tower, from its flattened config as the worker reads it."""
    from llmd import _engine
    from llmd.worker.host import multimodal_config

    config = multimodal_config(str(path))
    assert config is not None
    return _engine.VisionTower(str(path), config, backend=backend)


def engine(path: Path, backend: str = "cpu", **kw: Any):  # type: ignore[no-untyped-def]
    """The checkpoint's engine, KV in float32 by default: references at 1e-4 (see
    test_architectures)."""
    from llmd import _engine
    from llmd.worker.host import hf_config

    kw.setdefault("kv_type", "f32")
    return _engine.Engine(
        str(path),
        context_length=256,
        max_sequences=8,
        backend=backend,
        hf_config=hf_config(str(path)),
        **kw,
    )


def rel(ours: np.ndarray, ref: np.ndarray) -> float:
    """Largest difference relative to the reference's largest value."""
    return float(np.abs(ours - ref).max() / np.abs(ref).max())


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max()
    return x - m - np.log(np.exp(x - m).sum())


def _dense(top: list) -> np.ndarray:
    out = np.full(VOCAB, -np.inf, dtype=np.float64)
    for t, v in top:
        out[t] = v
    return out


def generate(engine, rid: str, prompt: list[int], embedded: list, n: int = 1):  # type: ignore[no-untyped-def]
    """Greedy tokens of a request with image rows, the whole vocabulary's log-probabilities
    at each generated token, and the done event."""
    engine.submit(rid, prompt, n, top_logprobs=VOCAB, embedded=embedded)
    events: list = []
    while not any(e["type"] == "done" for e in events):
        events += engine.poll(1000)
    assert not [e for e in events if e["type"] == "error"], events
    tokens = [t for e in events if e["type"] == "tokens" for t in e["tokens"]]
    logprobs = [_dense(lp["top"]) for e in events if e["type"] == "tokens" for lp in e["logprobs"]]
    done = next(e for e in events if e["type"] == "done")
    return tokens, logprobs, done


def first_logprobs(engine, rid: str, prompt: list[int], embedded: list) -> tuple[np.ndarray, dict]:  # type: ignore[no-untyped-def]
    """Log-probabilities of the whole vocabulary for the first generated token, and the done
    event."""
    _, logprobs, done = generate(engine, rid, prompt, embedded)
    return logprobs[0], done


def image_input(pixels: np.ndarray) -> dict:
    """One image as the worker's generate request carries it (protocol.ImageInput)."""
    data = np.ascontiguousarray(pixels, dtype="<f4").tobytes()
    return {"pixels": base64.b64encode(data).decode(), "shape": list(pixels.shape)}


def worker_turn(proc, rid: str, prompt: list[int], images: list[dict]) -> tuple[list, dict]:  # type: ignore[no-untyped-def]
    """One generate request with images to a worker process: its tokens events and its done
    (or error) event."""
    send(
        proc,
        {
            "type": "generate",
            "id": rid,
            "prompt": prompt,
            "max_tokens": 1,
            "sampling": {"top_logprobs": VOCAB - 1},
            "images": images,
        },
    )
    tokens: list = []
    while (event := read_event(proc))["type"] not in ("done", "error"):
        if event["type"] == "tokens":
            tokens.append(event)
    return tokens, event
