"""The engine serves a context beyond the model's trained one when asked (as llama-server's
-c and Ollama's num_ctx): a tiny Qwen2 GGUF trained on 512 positions takes a 700-token prompt
at context_length=1024, while `info()` still reports the trained 512 (the daemon warns from
the two). The served context still bounds a request."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import run_all
from .tiny_models import CONFIGS, write_gguf

native = pytest.importorskip("llmd._engine")


def test_a_context_past_the_trained_one_is_served(tmp_path: Path) -> None:
    path = tmp_path / "tiny.gguf"
    write_gguf(path, "qwen2")
    trained = CONFIGS["qwen2"]["max_position_embeddings"]
    engine = native.Engine(
        str(path), context_length=2 * trained, max_sequences=2, kv_budget_bytes=16 << 20
    )
    try:
        assert engine.context_length == 2 * trained
        assert engine.info()["context_length"] == trained
        prompt = [3 + i % 100 for i in range(trained + 188)]
        out = run_all(
            engine,
            {
                "long": {"prompt": prompt, "max_tokens": 4},
                "too_long": {"prompt": [3] * (2 * trained), "max_tokens": 1},
            },
        )
        assert out["long"]["done"]["type"] == "done", out["long"]["done"]
        assert out["long"]["done"]["prompt_tokens"] == trained + 188
        assert len(out["long"]["tokens"]) == 4
        assert out["too_long"]["done"]["code"] == "context_length_exceeded"
    finally:
        engine.shutdown()
