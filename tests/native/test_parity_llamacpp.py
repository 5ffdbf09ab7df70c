"""llmd against llama.cpp on the test model (fixtures from tests/fixtures/record_llamacpp.py).

Engines legitimately differ where the reference's top-2 logits are within 0.5 of each other
(llama.cpp's own server and llama.cpp in-process disagree there too), so near-ties are the
only allowed divergence: teacher-forced argmax must agree wherever the gap exceeds 0.5, and
free-running greedy output must equal the reference up to the first near-tie.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from llmd.text.chat_template import render_chat
from llmd.text.text_model import load_text_model

from .conftest import on_kernel_path, run_all

NEAR_TIE = 0.5
STOP_IDS = [2]  # <|im_end|> is the GGUF's eos


def _cases(reference: dict) -> list[dict]:
    return reference["cases"]


def test_fixture_covers_the_required_prompts(reference: dict) -> None:
    names = {c["name"] for c in _cases(reference)}
    assert {"capital_france", "chinese", "emoji", "python_code", "long_1000"} <= names
    assert len(names) >= 8
    assert max(len(c["prompt_ids"]) for c in _cases(reference)) >= 1000
    assert reference["llama_cpp_python_version"]


def test_template_and_tokenizer_match_llamacpp_ids(reference: dict, model_path: Path) -> None:
    text = load_text_model(model_path)
    for case in _cases(reference):
        rendered = render_chat(
            text.chat_template, case["messages"], bos_token=text.bos_token, eos_token=text.eos_token
        )
        assert rendered == case["rendered_prompt"], case["name"]
        assert text.encode_rendered_chat(rendered) == case["prompt_ids"], case["name"]


def test_teacher_forced_argmax_agrees_beyond_near_ties(reference: dict, engine) -> None:  # type: ignore[no-untyped-def]
    checked = 0
    for case in _cases(reference):
        prompt, gen, gaps = case["prompt_ids"], case["generated_ids"], case["top2_gaps"]
        logits = engine.score(prompt + gen[:-1], len(prompt))
        assert logits.shape[0] == len(gen)
        ours = np.argmax(logits, axis=1)
        for i, (tok, gap) in enumerate(zip(gen, gaps, strict=True)):
            if gap > NEAR_TIE:
                assert ours[i] == tok, (
                    f"{case['name']} position {i}: llmd {ours[i]} vs llama.cpp {tok} (gap {gap})"
                )
                checked += 1
    assert checked > 300


def test_free_running_greedy_equals_reference_until_first_near_tie(reference: dict, engine) -> None:  # type: ignore[no-untyped-def]
    requests = {
        c["name"]: {
            "prompt": c["prompt_ids"],
            "max_tokens": len(c["generated_ids"]),
            "stop_tokens": STOP_IDS,
        }
        for c in _cases(reference)
    }
    results = run_all(engine, requests)
    compared = 0
    for case in _cases(reference):
        ref = [t for t in case["generated_ids"] if t not in STOP_IDS]
        first_tie = next((i for i, g in enumerate(case["top2_gaps"]) if g <= NEAR_TIE), len(ref))
        ours = results[case["name"]]["tokens"]
        n = min(first_tie, len(ref))
        assert ours[:n] == ref[:n], case["name"]
        compared += n
    assert compared > 50


@pytest.mark.parametrize("path", ["avx2", "scalar"])
def test_lower_kernel_paths_keep_parity(reference: dict, model_path: Path, path: str) -> None:
    """Every dispatch path this CPU runs answers the capital question like llama.cpp."""
    native = pytest.importorskip("llmd._engine")
    if path not in native.runnable_kernel_paths():
        pytest.skip(f"{path} is not runnable here")
    case = next(c for c in _cases(reference) if c["name"] == "capital_france")
    code = (
        "import json,sys; from llmd import _engine as e; "
        f"eng=e.Engine({str(model_path)!r}, context_length=512); "
        f"print(json.dumps([e.active_kernel_path(), eng.score({case['prompt_ids'] + case['generated_ids'][:-1]!r}, {len(case['prompt_ids'])}).argmax(1).tolist()]))"
    )
    active, argmax = on_kernel_path(path, code)
    assert active == path
    assert argmax == case["generated_ids"]
