"""Speculative decoding with Qwen3.5's MTP head through `llmd serve` as a user reaches it: a
tiny Qwen3.5-MoE checkpoint whose head agrees with its model (tests/native/test_speculative_mtp.py
builds it) pulled into the running daemon, then chatted with through the OpenAI client with
`"speculative": {"type": "mtp"}`: the same answer as without, its drafted and accepted tokens
in `usage.speculative`, `mtp` among the drafters /status lists for it."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest
from openai import OpenAI

from tests.conftest import run_llmd
from tests.native.test_architectures import _tiny_tokenizer
from tests.native.test_speculative_mtp import _agreeing_weights
from tests.native.tiny_models import CONFIGS, TOKENS, write_qwen3_5_moe_with_mtp

pytest.importorskip("llmd._engine", reason="the native engine (llmd._engine) is not built")


def test_mtp_requests_draft_with_the_models_head(server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    model, head = _agreeing_weights()
    write_qwen3_5_moe_with_mtp(tmp_path, mtp=head, model=model)
    _tiny_tokenizer(tmp_path, CONFIGS["qwen3_5_moe_text"]["vocab_size"])
    name = "tiny-qwen3-5-mtp"
    pulled = run_llmd(server.env, "pull", str(tmp_path), "--name", name, timeout=300)
    assert pulled.returncode == 0, pulled.stderr
    client = OpenAI(base_url=server.base_url + "/v1", api_key="unused")
    words = " ".join(f"w{i}" for i in TOKENS[1:12])
    ask = {
        "model": name,
        "messages": [{"role": "user", "content": words}],
        "max_tokens": 30,
        "temperature": 0,
    }
    plain = client.chat.completions.create(**ask)
    spec = client.chat.completions.create(
        **ask, extra_body={"speculative": {"type": "mtp", "max_draft": 4}}
    )
    assert spec.choices[0].message.content == plain.choices[0].message.content
    usage = spec.model_dump()["usage"]["speculative"]
    # Drafted and some kept. How many, and at which steps, is the cost model's choice from the
    # served worker's measured step times (draft_cost.h): on a loaded box it verifies the first
    # positions (where the head has seen least) and then declines the head's drafts on this tiny
    # model (loaded runs kept 9 of 18, 6 of 15). The head's acceptance itself, drafting priced
    # free, is test_speculative_mtp.py's (> 0.6).
    assert usage["drafted_tokens"] > 0 and usage["accepted_tokens"] > 0
    with urllib.request.urlopen(server.base_url + "/status", timeout=30) as r:
        status = next(m for m in json.loads(r.read())["models"] if m["name"] == name)
    assert "mtp" in status["speculative"]["available"]
