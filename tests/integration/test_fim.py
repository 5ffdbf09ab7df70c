"""Fill-in-the-middle through `llmd serve`, the real worker and the real model, on all three
routes: `/v1/completions` with `suffix`, Ollama's `/api/generate` with `suffix`, and
llama-server's `/infill`.

SmolLM2-135M has no FIM tokens, so it is what a model without them answers (a 400). The FIM
model is a copy of the same GGUF whose metadata names three of its control tokens as FIM
prefix/suffix/middle (`tokenizer.ggml.fim_*_token_id`, read as llama.cpp reads them); its
vocabulary's StarCoder-style `<repo_name>` and `<file_sep>` give the repo-level form. The
model was not trained on those tokens, so the tests check what the user notices (the prompt
holds the FIM tokens in order, an answer comes back, streaming equals the whole answer, a
prompt too long for the context is cut, not refused), not what the middle says.
"""

from __future__ import annotations

import json
import shutil
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import LiveServer, run_llmd, short_home, start_server, stop_server
from tests.unit.test_fim import with_fim_metadata

pytest.importorskip("llmd._engine", reason="the native engine (llmd._engine) is not built")

PLAIN = "smollm2-135m"
FIM = "smollm2-fim"
CONTEXT = 1024
# SmolLM2's <jupyter_start>, <jupyter_text>, <jupyter_code> stand in for FIM tokens
# (tests/unit/test_fim.py: with_fim_metadata).
PRE, SUF, MID = "<jupyter_start>", "<jupyter_text>", "<jupyter_code>"


@pytest.fixture(scope="module")
def served(model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """A daemon with a small context (so cutting a long prompt is quick to check) serving the
    test model and its FIM copy."""
    home = short_home()
    live = start_server(home, "--context-length", str(CONTEXT))
    try:
        fim_file = tmp_path_factory.mktemp("fim") / "smollm2-fim.gguf"
        with_fim_metadata(model_path, fim_file)
        pulled = run_llmd(live.env, "pull", str(fim_file), "--name", FIM, timeout=300)
        assert pulled.returncode == 0, pulled.stderr
        yield live
    finally:
        stop_server(live)
        shutil.rmtree(home, ignore_errors=True)


def post(server: LiveServer, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    req = urllib.request.Request(
        server.base_url + path,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def post_lines(server: LiveServer, path: str, body: dict[str, Any]) -> list[str]:
    req = urllib.request.Request(
        server.base_url + path,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=300) as r:
        assert r.status == 200
        return [line.decode() for line in r.read().splitlines() if line.strip()]


def sse_events(lines: list[str]) -> list[Any]:
    assert all(line.startswith("data: ") for line in lines), lines
    return [json.loads(line[len("data: ") :]) for line in lines]


def n_tokens(text_model, s: str) -> int:  # type: ignore[no-untyped-def]
    return len(text_model.tokenizer.encode(s, add_special_tokens=False).ids)


PREFIX = "def fibonacci(n):\n    "
SUFFIX = "\n    return fibonacci(n - 1) + fibonacci(n - 2)\n"


# ---------------------------------------------------------------------- /v1/completions


def test_completions_suffix_fills_the_middle(served: LiveServer, text_model) -> None:  # type: ignore[no-untyped-def]
    body = {"model": FIM, "prompt": PREFIX, "suffix": SUFFIX, "max_tokens": 12, "temperature": 0}
    status, out = post(served, "/v1/completions", body)
    assert status == 200, out
    # <PRE> prefix <SUF> suffix <MID>: three FIM tokens around the two texts, nothing else.
    expected = 3 + n_tokens(text_model, PREFIX) + n_tokens(text_model, SUFFIX)
    assert out["usage"]["prompt_tokens"] == expected
    choice = out["choices"][0]
    assert isinstance(choice["text"], str) and choice["finish_reason"] in ("stop", "length")
    assert 0 < out["usage"]["completion_tokens"] <= 12

    chunks = post_lines(served, "/v1/completions", {**body, "stream": True})
    assert chunks[-1] == "data: [DONE]"
    events = sse_events(chunks[:-1])
    streamed = "".join(e["choices"][0]["text"] for e in events if e["choices"])
    assert streamed == choice["text"]  # greedy: the same middle, streamed or whole


def test_completions_suffix_on_a_model_without_fim_tokens_is_a_400(served: LiveServer) -> None:
    status, out = post(
        served, "/v1/completions", {"model": PLAIN, "prompt": PREFIX, "suffix": SUFFIX}
    )
    assert status == 400
    assert out["error"]["param"] == "suffix"
    assert "no fill-in-the-middle tokens" in out["error"]["message"]
    assert PLAIN in out["error"]["message"]


def test_completions_suffix_with_echo_is_a_400(served: LiveServer) -> None:
    body = {"model": FIM, "prompt": PREFIX, "suffix": SUFFIX, "echo": True}
    status, out = post(served, "/v1/completions", body)
    assert status == 400 and out["error"]["param"] == "echo"


# ---------------------------------------------------------------------- Ollama


def test_ollama_generate_suffix_fills_the_middle(served: LiveServer, text_model) -> None:  # type: ignore[no-untyped-def]
    body = {
        "model": FIM,
        "prompt": PREFIX,
        "suffix": SUFFIX,
        "stream": False,
        "options": {"num_predict": 8, "temperature": 0},
    }
    status, out = post(served, "/api/generate", body)
    assert status == 200, out
    assert out["done"] is True and isinstance(out["response"], str)
    expected = 3 + n_tokens(text_model, PREFIX) + n_tokens(text_model, SUFFIX)
    assert out["prompt_eval_count"] == expected
    lines = [
        json.loads(line) for line in post_lines(served, "/api/generate", {**body, "stream": True})
    ]
    assert lines[-1]["done"] is True
    assert "".join(line["response"] for line in lines) == out["response"]

    status, out = post(served, "/api/generate", {**body, "model": PLAIN})
    assert status == 400 and "does not support insert" in out["error"]


# ---------------------------------------------------------------------- /infill


def infill_body(**extra: Any) -> dict[str, Any]:
    return {
        "model": FIM,
        "input_prefix": PREFIX,
        "input_suffix": SUFFIX,
        "input_extra": [{"filename": "util.py", "text": "def helper():\n    pass\n"}],
        "prompt": "if",
        "n_predict": 8,
        "temperature": 0,
        "samplers": ["top_k", "top_p", "infill"],
        "cache_prompt": True,
        **extra,
    }


def test_infill_answers_with_the_repo_level_fim_prompt(served: LiveServer) -> None:
    status, out = post(served, "/infill", infill_body())
    assert status == 200, out
    assert out["prompt"] == (
        "<repo_name>myproject\n<file_sep>util.py\ndef helper():\n    pass\n"
        f"<file_sep>filename\n{PRE}{PREFIX}if{SUF}{SUFFIX}{MID}"
    )
    assert isinstance(out["content"], str) and out["stop"] is True
    assert out["stop_type"] in ("eos", "limit", "word")
    assert 0 < out["tokens_predicted"] <= 8 and out["truncated"] is False
    assert out["tokens_evaluated"] > 0
    assert out["tokens_cached"] == out["tokens_evaluated"] + out["tokens_predicted"]
    timings = out["timings"]
    assert timings["predicted_n"] == out["tokens_predicted"]
    assert timings["prompt_n"] + timings["cache_n"] == out["tokens_evaluated"]
    assert timings["prompt_ms"] >= 0 and timings["predicted_ms"] >= 0

    picked = post(served, "/infill", infill_body(response_fields=["content", "timings/prompt_n"]))[
        1
    ]
    assert set(picked) == {"content", "timings/prompt_n"} and picked["content"] == out["content"]

    events = sse_events(post_lines(served, "/infill", infill_body(stream=True)))
    assert all(e["stop"] is False for e in events[:-1]) and events[-1]["stop"] is True
    assert "".join(e["content"] for e in events) == out["content"]
    assert events[-1]["tokens_predicted"] == out["tokens_predicted"]


def test_infill_cuts_a_prompt_too_long_for_the_context(served: LiveServer, text_model) -> None:  # type: ignore[no-untyped-def]
    prefix = "".join(f"value_{i} = {i}\n" for i in range(400))  # ~3000 tokens
    suffix = "".join(f"print(value_{i})\n" for i in range(200))
    body = infill_body(input_prefix=prefix, input_suffix=suffix, n_predict=4, input_extra=[])
    status, out = post(served, "/infill", body)
    assert status == 200, out
    assert out["truncated"] is True
    assert out["tokens_evaluated"] + 4 <= CONTEXT
    # The prefix keeps its end (next to the cursor), the suffix its start.
    assert f"value_399 = 399\nif{SUF}print(value_0)\n" in out["prompt"]
    assert "value_0 = 0\n" not in out["prompt"]


def test_infill_n_predict_0_only_warms_the_cache(served: LiveServer) -> None:
    # An editor sends its ring of other files this way before the user types.
    ring = [{"filename": "ring.py", "text": "".join(f"def f{i}(): pass\n" for i in range(40))}]
    status, out = post(served, "/infill", infill_body(n_predict=0, input_extra=ring))
    assert status == 200, out
    assert out["content"] == "" and out["tokens_predicted"] == 0
    # The completion that follows reuses those files' KV from the prefix cache.
    status, again = post(served, "/infill", infill_body(n_predict=1, input_extra=ring))
    assert status == 200 and again["timings"]["cache_n"] > 0


def test_infill_refuses_a_model_without_fim_tokens_and_unknown_parameters(
    served: LiveServer,
) -> None:
    status, out = post(served, "/infill", infill_body(model=PLAIN))
    assert status == 400 and "no fill-in-the-middle tokens" in out["error"]["message"]
    status, out = post(served, "/infill", infill_body(mirostat=2))
    assert status == 400 and out["error"]["param"] == "mirostat"
    status, out = post(served, "/infill", {"input_suffix": ""})
    assert status == 400 and out["error"]["param"] == "input_prefix"
