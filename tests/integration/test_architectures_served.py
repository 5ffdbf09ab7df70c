"""Every architecture through `llmd serve` as a user reaches it: a tiny random checkpoint
(tests/native/tiny_models.py) pulled from a local Hugging Face directory into the running
daemon, then chatted with through the OpenAI client. Greedy answers equal transformers'
`generate()` (fixtures recorded by tests/fixtures/record_transformers.py); the tiny tokenizer
maps word `wN` to id N, so the answer's words are its token ids."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from openai import OpenAI

from tests.conftest import run_llmd
from tests.native.test_architectures import ARCHS, _tiny_tokenizer
from tests.native.tiny_models import CONFIGS, write_checkpoint

pytest.importorskip("llmd._engine", reason="the native engine (llmd._engine) is not built")

FIXTURES = Path(__file__).parents[1] / "fixtures"


def _words(ids: list[int]) -> str:
    return " ".join({1: "<bos>", 2: "<eos>"}.get(i, f"w{i}") for i in ids)


@pytest.mark.parametrize("arch", ARCHS)
def test_pulled_directory_answers_like_transformers(server, tmp_path: Path, arch: str) -> None:  # type: ignore[no-untyped-def]
    fx = json.loads((FIXTURES / f"{arch}_transformers.json").read_text())
    write_checkpoint(tmp_path, arch)
    _tiny_tokenizer(tmp_path, CONFIGS[arch]["vocab_size"])
    name = f"tiny-{arch.replace('_', '-')}"
    pulled = run_llmd(server.env, "pull", str(tmp_path), "--name", name, timeout=300)
    assert pulled.returncode == 0, pulled.stderr
    client = OpenAI(base_url=server.base_url + "/v1", api_key="unused")
    assert name in {m.id for m in client.models.list()}
    prompt = fx["greedy_prompt"]
    assert prompt[0] == 1  # the template writes <bos> itself
    out = client.chat.completions.create(
        model=name,
        messages=[{"role": "user", "content": _words(prompt[1:])}],
        max_tokens=len(fx["greedy"]),
        temperature=0,
    )
    answer = [int(w[1:]) for w in (out.choices[0].message.content or "").split()]
    assert answer == fx["greedy"]
    assert out.usage and out.usage.prompt_tokens == len(prompt)  # one BOS, no more
