"""EmbeddingGemma in the engine (native/mlx/gemma3.cpp with use_bidirectional_attention): a tiny
random one (tests/native/tiny_embedding_models.py) loaded from its sentence-transformers
directory, on the host kernels and on the device graph (MLX's CPU device here), pooled by the
engine and projected by the worker's Dense head (store/dense_modules.py), gives the vectors
sentence-transformers computes on the same files (tests/fixtures/embeddinggemma_transformers.json,
recorded by tests/fixtures/record_embeddinggemma.py). Prompts run whole whatever the step
budget, the same alone or batched, and the model refuses to generate."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.native.tiny_embedding_models import EMBEDDINGGEMMA_CONFIG, write_embeddinggemma_dir

native = pytest.importorskip("llmd._engine")

FIXTURE = json.loads(
    (Path(__file__).parents[1] / "fixtures" / "embeddinggemma_transformers.json").read_text()
)


def _engine(directory: Path, backend: str, **kw: Any) -> Any:
    from llmd.worker.host import hf_config

    write_embeddinggemma_dir(directory)
    return native.Engine(str(directory), hf_config=hf_config(str(directory)), backend=backend, **kw)


def _drain(engine: Any, ids: set[str], timeout: float = 60) -> dict[str, dict]:
    out: dict[str, dict] = {}
    deadline = time.monotonic() + timeout
    while ids - set(out) and time.monotonic() < deadline:
        for ev in engine.poll(50):
            if ev["type"] in ("done", "error"):
                out[ev["id"]] = ev
    return out


def _cosine(a: list[float], b: list[float]) -> float:
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(x @ y / (np.linalg.norm(x) * np.linalg.norm(y)))


def _pooled(engine: Any, prompts: list[list[int]], prefix: str = "e") -> list[dict]:
    """Mean-pooled, unnormalised rows: the worker normalises after the Dense head."""
    ids = [f"{prefix}{i}" for i in range(len(prompts))]
    engine.submit_pooled(ids, prompts, output="embedding", pooling="mean", normalize=False)
    got = _drain(engine, set(ids))
    return [got[i] for i in ids]


def test_the_fixture_tells_the_attention_pattern_apart() -> None:
    """The reference would catch a model that ignored the sliding window or attended
    causally: on the inputs longer than the window, those land far from it."""
    assert FIXTURE["sliding_window_seen"] == EMBEDDINGGEMMA_CONFIG["sliding_window"] // 2 + 1
    long = [i for i in FIXTURE["items"] if len(i["ids"]) > FIXTURE["sliding_window_seen"]]
    assert len(long) >= 3
    assert max(i["cosine_if_whole_prompt_windows"] for i in long) < 0.95
    assert max(i["cosine_if_causal"] for i in FIXTURE["items"]) < 0.95


@pytest.mark.parametrize("backend", ["cpu", "mlx-cpu"])
def test_embeddinggemma_matches_sentence_transformers(tmp_path: Path, backend: str) -> None:
    from llmd.store.dense_modules import DenseHead

    engine = _engine(tmp_path, backend, kv_type="f32")
    info = engine.info()
    assert info["architecture"] == "gemma3" and info["hidden_size"] == 64
    head = DenseHead.load(tmp_path, info["hidden_size"])
    assert head is not None and len(head.layers) == 2
    got = _pooled(engine, [item["ids"] for item in FIXTURE["items"]])
    for ev, item in zip(got, FIXTURE["items"], strict=True):
        assert ev["type"] == "done", ev
        assert ev["prompt_tokens"] == len(item["ids"]) and ev["cached_tokens"] == 0
        vector = head.apply(ev["values"], normalize=True)
        assert len(vector) == len(item["embedding"]) == 64
        assert _cosine(vector, item["embedding"]) >= 0.9999, (item["text"], backend)
        assert abs(np.linalg.norm(vector) - 1) < 1e-5
    engine.shutdown()


def test_whole_prompts_past_the_step_budget_alone_or_batched(tmp_path: Path) -> None:
    """A 47-token prompt under a 16-token step budget still runs whole (a bidirectional
    model's early chunk would miss the later tokens); the same prompt sent twice is never
    served from the prefix cache (its positions depend on what follows them); and each
    input's vector is the same in a batch of many as alone."""
    engine = _engine(tmp_path, "cpu", kv_type="f32", step_token_budget=16, max_sequences=8)
    prompts = [item["ids"] for item in FIXTURE["items"]] * 3
    batched = _pooled(engine, prompts, "b")
    for i, (ev, prompt) in enumerate(zip(batched, prompts, strict=True)):
        assert ev["type"] == "done" and ev["prompt_tokens"] == len(prompt), ev
        assert ev["cached_tokens"] == 0
        alone = _pooled(engine, [prompt], f"alone{i}-")[0]
        assert np.allclose(alone["values"], ev["values"], atol=1e-5)
    assert max(int(k) for k in engine.stats()["pooled_rows_histogram"]) > 1  # inputs shared steps
    engine.shutdown()


def test_embeddinggemma_refuses_to_generate(tmp_path: Path) -> None:
    engine = _engine(tmp_path, "cpu")
    engine.submit("g", FIXTURE["items"][0]["ids"], max_tokens=4)
    ev = _drain(engine, {"g"})["g"]
    assert ev["type"] == "error" and ev["code"] == "unsupported", ev
    assert "embeddings" in ev["message"]
    engine.shutdown()
