"""Embedding and token-logits sequences in the engine (engine.h, GenerateRequest::Output): they
prefill and end without sampling, share steps with each other, give the same values alone or
batched, end early when cancelled, and are refused by models that cannot pool yet."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.native.conftest import TEST_BACKEND
from tests.native.tiny_embedding_models import write_embedding_dir, write_reranker_dir
from tests.native.tiny_models import write_checkpoint

native = pytest.importorskip("llmd._engine")


def _engine(directory: Path, **kw: Any) -> Any:
    from llmd.worker.host import hf_config

    return native.Engine(
        str(directory), hf_config=hf_config(str(directory)), backend=TEST_BACKEND, **kw
    )


def _drain(engine: Any, ids: set[str], timeout: float = 60) -> dict[str, dict]:
    """The final event (done or error) of each id."""
    out: dict[str, dict] = {}
    deadline = time.monotonic() + timeout
    while ids - set(out) and time.monotonic() < deadline:
        for ev in engine.poll(50):
            if ev["type"] in ("done", "error"):
                out[ev["id"]] = ev
    return out


PROMPTS = [[17, 99, 5, 2], [64, 3, 120, 33, 8, 2], [7, 2], [40 + i for i in range(30)] + [2]] * 3


def test_inputs_share_steps_and_match_their_lone_values(tmp_path: Path) -> None:
    write_embedding_dir(tmp_path)
    engine = _engine(tmp_path, max_sequences=16)
    ids = [f"e{i}" for i in range(len(PROMPTS))]
    engine.submit_pooled(ids, PROMPTS, output="embedding", pooling="last", normalize=True)
    batched = _drain(engine, set(ids))
    assert all(batched[i]["type"] == "done" for i in ids)
    histogram = engine.stats()["pooled_rows_histogram"]
    assert max(int(k) for k in histogram) == len(PROMPTS)  # all of them ended in one step
    for i, prompt in zip(ids, PROMPTS, strict=True):
        engine.submit_pooled(
            [f"alone-{i}"], [prompt], output="embedding", pooling="last", normalize=True
        )
        alone = _drain(engine, {f"alone-{i}"})[f"alone-{i}"]
        assert np.allclose(alone["values"], batched[i]["values"], atol=1e-5)
        assert abs(np.linalg.norm(batched[i]["values"]) - 1) < 1e-5
        assert batched[i]["prompt_tokens"] == len(prompt)
    engine.shutdown()


def test_mean_pooling_over_prefill_chunks_and_token_logits(tmp_path: Path) -> None:
    write_reranker_dir(tmp_path)
    engine = _engine(tmp_path, step_token_budget=16)  # a 40-token prompt prefills in 3 chunks
    prompt = [int(t) for t in np.random.default_rng(1).integers(3, 128, 40)]
    engine.submit_pooled(["mean"], [prompt], output="embedding", pooling="mean")
    engine.submit_pooled(["yes-no"], [prompt], output="token_logits", logit_tokens=[50, 51])
    got = _drain(engine, {"mean", "yes-no"})
    assert got["mean"]["type"] == "done" and got["yes-no"]["type"] == "done"
    logits = engine.score(prompt, len(prompt))[-1]  # the logits after the whole prompt
    assert np.allclose(got["yes-no"]["values"], logits[[50, 51]], atol=1e-4)
    assert len(got["mean"]["values"]) == 64
    engine.shutdown()


def test_cancelled_inputs_end_without_values(tmp_path: Path) -> None:
    write_embedding_dir(tmp_path)
    engine = _engine(tmp_path, max_sequences=2, step_token_budget=32)
    prompts = [[int(t) for t in np.random.default_rng(i).integers(3, 128, 400)] for i in range(12)]
    ids = [f"c{i}" for i in range(len(prompts))]
    engine.submit_pooled(ids, prompts, output="embedding")
    for i in ids:
        engine.cancel(i)
    ended = _drain(engine, set(ids))
    assert set(ended) == set(ids)
    cancelled = [e for e in ended.values() if e["finish_reason"] == "cancelled"]
    assert cancelled and all("values" not in e for e in cancelled)
    engine.shutdown()


def test_a_model_that_cannot_pool_refuses_embeddings(tmp_path: Path) -> None:
    write_checkpoint(tmp_path, "gemma3_text")
    engine = _engine(tmp_path)
    engine.submit_pooled(["g"], [[5, 6, 7]], output="embedding")
    error = _drain(engine, {"g"})["g"]
    assert error["type"] == "error" and error["code"] == "unsupported"
    assert "cannot compute embeddings" in error["message"]
    engine.shutdown()


@pytest.mark.parametrize("backend", ["cpu", "mlx-cpu"])
@pytest.mark.parametrize("pooling", ["last", "mean"])
def test_embeddings_match_transformers_on_each_backend(
    tmp_path: Path, backend: str, pooling: str
) -> None:
    """The host kernels and the device graph (MLX's CPU device here, CUDA or Metal elsewhere)
    pool the same vectors as transformers (tests/fixtures/record_embeddings.py)."""
    import json

    fx = json.loads(
        (Path(__file__).parents[1] / "fixtures" / "qwen3_embeddings_transformers.json").read_text()
    )
    fx = fx[f"embed_{pooling}"]
    write_embedding_dir(tmp_path, pooling)
    from llmd.worker.host import hf_config

    engine = native.Engine(
        str(tmp_path), hf_config=hf_config(str(tmp_path)), backend=backend, kv_type="f32"
    )
    ids = [f"b{i}" for i in range(len(fx["ids"]))]
    engine.submit_pooled(
        ids, fx["ids"], output="embedding", pooling=pooling, normalize=pooling == "last"
    )
    got = _drain(engine, set(ids))
    for i, want in zip(ids, fx["embeddings"], strict=True):
        ours = np.asarray(got[i]["values"], dtype=np.float64)
        ref = np.asarray(want, dtype=np.float64)
        assert ours @ ref / (np.linalg.norm(ours) * np.linalg.norm(ref)) >= 0.9999
        assert np.abs(ours - ref).max() < 1e-3 * max(1.0, np.abs(ref).max())
    engine.shutdown()


def test_embeddings_share_steps_with_a_running_generation(tmp_path: Path) -> None:
    """Inputs sent while a generation runs on the same model join its steps: they all end
    long before it does (not queued behind it), and neither changes the other's result (its
    greedy tokens, their vectors)."""
    from tests.native.conftest import run_all

    write_reranker_dir(tmp_path)  # a Qwen3 causal LM: it generates and pools hidden states
    engine = _engine(tmp_path, max_sequences=16)
    generation = {"prompt": [17, 99, 5, 2], "max_tokens": 120}
    solo = run_all(engine, {"solo": generation})["solo"]["tokens"]
    ids = [f"e{i}" for i in range(len(PROMPTS))]
    engine.submit_pooled(ids, PROMPTS, output="embedding", pooling="last", normalize=True)
    alone = _drain(engine, set(ids))
    engine.submit("g", **generation)
    tokens: list[int] = []
    while not tokens:  # the generation is running
        tokens += [t for ev in engine.poll(50) if ev["id"] == "g" for t in ev.get("tokens", [])]
    engine.submit_pooled(ids, PROMPTS, output="embedding", pooling="last", normalize=True)
    ended: dict[str, dict] = {}
    tokens_when_embedded = 0
    while "g" not in ended:
        for ev in engine.poll(50):
            if ev["type"] == "tokens":
                tokens += ev["tokens"]
            elif ev["type"] in ("done", "error"):
                ended[ev["id"]] = ev
                if set(ids) <= set(ended) and not tokens_when_embedded:
                    tokens_when_embedded = len(tokens)
    assert 0 < tokens_when_embedded < len(solo) // 2  # every input ended early in the generation
    assert tokens == solo
    for i in ids:
        assert ended[i]["type"] == "done"
        assert np.allclose(ended[i]["values"], alone[i]["values"], atol=1e-5)
    engine.shutdown()
