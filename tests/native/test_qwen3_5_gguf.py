"""Qwen3.5-MoE from llama.cpp's GGUF (`qwen35moe`, native/mlx/qwen3_5_moe.cpp) against
transformers and against the same checkpoint's safetensors.

The file is what llama.cpp's converter writes for the tiny checkpoint of
test_qwen3_5_moe.py (with its MTP head): tiny_qwen35_gguf.write_qwen35moe_gguf, whose every
key and tensor equals the converter's own output (recorded in
tests/fixtures/qwen3_5_gguf_llamacpp.json by tests/fixtures/record_qwen3_5_gguf.py; the first
test here). So the loader must undo or adopt what the converter changed (value heads tiled,
-exp(A_log), 1 + w norms, split experts, the MTP head as block 4) to give transformers' logits.

Tolerance as test_qwen3_5_moe.py: 1e-4 of the largest |logit| (float32 on both sides; the
weights are bf16-representable, so the F32 file holds them exactly).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from .conftest import run_all
from .test_qwen3_5_moe import _collect  # run_all with each request's logprobs as well
from .tiny_models import TOKENS, write_checkpoint
from .tiny_qwen35_gguf import (
    digest,
    write_exact_twin,
    write_qwen3_5_mmproj,
    write_qwen35moe_gguf,
)

native = pytest.importorskip("llmd._engine")

FIXTURES = Path(__file__).parents[1] / "fixtures"
TEXT_FIXTURE = FIXTURES / "qwen3_5_moe_text_transformers.json"
MTP_FIXTURE = FIXTURES / "qwen3_5_moe_mtp_transformers.json"
CONVERTER = FIXTURES / "qwen3_5_gguf_llamacpp.json"
BACKENDS = ["cpu", "mlx-cpu"]
TIGHT = 1e-4


def _engine(path: Path, backend: str, **kw):  # type: ignore[no-untyped-def]
    from llmd.worker.host import hf_config

    config = hf_config(str(path)) if path.is_dir() else {}
    # draft_row_cost 0: drafting priced as free, so the MTP check always drafts.
    opts = {
        "context_length": 256,
        "max_sequences": 4,
        "kv_type": "f32",
        "draft_row_cost": 0.0,
        **kw,
    }
    return native.Engine(str(path), backend=backend, hf_config=config, **opts)


def assert_matches_transformers(engine, fixture: Path) -> tuple[float, float, float]:  # type: ignore[no-untyped-def]
    """The engine's logits at every position of the 20-token prompt, and its greedy tokens with
    their logprobs (one decode step each), within TIGHT of the largest |logit| of transformers'
    in `fixture` (a record_transformers.py recording). Returns (prefill error, greedy logprob
    error, scale) for the test to print."""
    ref = json.loads(fixture.read_text())
    want = np.array(ref["logits"], dtype=np.float32)
    greedy_want = np.array(ref["greedy_logits"], dtype=np.float32)
    ours = np.asarray(engine.score(TOKENS, 1))[: len(TOKENS)]
    scale = float(np.abs(want).max())
    prefill = float(np.abs(ours - want).max())
    assert prefill < TIGHT * scale, (prefill, scale)
    out = _collect(
        engine,
        {
            "g": {
                "prompt": ref["greedy_prompt"],
                "max_tokens": len(ref["greedy"]),
                "top_logprobs": 20,
            }
        },
    )["g"]
    assert out["tokens"] == ref["greedy"]
    worst = 0.0
    for step, row in zip(out["logprobs"], greedy_want, strict=True):
        x = row.astype(np.float64)
        lp = x - x.max() - np.log(np.exp(x - x.max()).sum())
        worst = max(worst, max(abs(p - lp[t]) for t, p in step["top"]))
    assert worst < TIGHT * scale, worst
    return prefill, worst, scale


@pytest.fixture(scope="module")
def gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_qwen35moe_gguf(tmp_path_factory.mktemp("qwen35moe") / "tiny-qwen3.5-F32.gguf")


def _compare(ours: dict, theirs: dict) -> None:
    assert ours["fields"] == theirs["fields"]
    assert sorted(ours["tensors"]) == sorted(theirs["tensors"])
    for name, (kind, shape, value) in theirs["tensors"].items():
        mine = ours["tensors"][name]
        assert mine[:2] == [kind, shape], name
        if isinstance(value, list):  # ssm_a: -exp(A_log), torch's exp against numpy's
            np.testing.assert_allclose(mine[2], value, rtol=1e-6, err_msg=name)
        else:
            assert mine[2] == value, name


def test_writers_write_what_llamacpps_converter_writes(tmp_path: Path) -> None:
    recorded = json.loads(CONVERTER.read_text())
    _compare(digest(write_qwen35moe_gguf(tmp_path / "model.gguf")), recorded["text"])
    _compare(digest(write_qwen3_5_mmproj(tmp_path / "mmproj.gguf")), recorded["mmproj"])


@pytest.mark.parametrize("backend", BACKENDS)
def test_gguf_logits_and_greedy_tokens_match_transformers(gguf: Path, backend: str) -> None:
    """Every position of the 20-token prompt and the 16 greedy tokens with their logits (one
    decode step each), as transformers computed them on the safetensors checkpoint."""
    engine = _engine(gguf, backend)
    info = engine.info()
    assert (info["architecture"], info["weight_format"]) == ("qwen3_5_moe", "gguf:F32")
    prefill, worst, scale = assert_matches_transformers(engine, TEXT_FIXTURE)
    print(f"\n{backend}: prefill {prefill:.2e}, greedy logprobs {worst:.2e} (scale {scale:.2f})")


@pytest.mark.parametrize("backend", BACKENDS)
def test_gguf_and_safetensors_of_one_checkpoint_agree(
    gguf: Path, tmp_path: Path, backend: str
) -> None:
    """The GGUF against the checkpoint it was converted from, loaded by llmd's safetensors
    path, prompt positions batched with a second sequence of another length."""
    write_checkpoint(tmp_path / "hf", "qwen3_5_moe_text")
    rng = np.random.default_rng(4)
    prompts = {"a": [int(t) for t in rng.integers(3, 124, 70)], "b": TOKENS}
    got = {}
    for name, path in (("gguf", gguf), ("hf", tmp_path / "hf")):
        engine = _engine(path, backend, step_token_budget=32)
        reqs = {k: {"prompt": p, "max_tokens": 12, "top_logprobs": 5} for k, p in prompts.items()}
        got[name] = _collect(engine, reqs)
    for k in prompts:
        assert got["gguf"][k]["tokens"] == got["hf"][k]["tokens"], k
        for x, y in zip(got["gguf"][k]["logprobs"], got["hf"][k]["logprobs"], strict=True):
            assert [t for t, _ in x["top"]] == [t for t, _ in y["top"]]
            assert max(abs(p - q) for (_, p), (_, q) in zip(x["top"], y["top"], strict=True)) < 1e-4


@pytest.mark.parametrize("backend", BACKENDS)
def test_mtp_head_from_the_gguf_matches_the_reference(gguf: Path, backend: str) -> None:
    """llama.cpp's converter keeps Qwen3.5's MTP head (block 4, `nextn.*`): its logits at
    every prompt position and three chained guesses equal the reference of
    test_speculative_mtp.py (the same head, from transformers' modules)."""
    ref = json.loads(MTP_FIXTURE.read_text())
    assert ref["tokens"] == TOKENS
    want = np.array(ref["mtp_logits"] + ref["chain_logits"], dtype=np.float32)
    engine = _engine(gguf, backend)
    assert engine.has_mtp
    logits, chained = engine.mtp_probe(TOKENS, 3)
    scale = float(np.abs(want).max())
    assert float(np.abs(logits - want).max()) < TIGHT * scale
    assert chained == ref["chain_tokens"]
    # Drafting with it changes no greedy token.
    prompt = {"prompt": TOKENS, "max_tokens": 24}
    plain = run_all(_engine(gguf, backend), {"p": prompt})["p"]
    drafted = run_all(engine, {"d": {**prompt, "max_draft": 4, "mtp": True}})["d"]
    assert drafted["tokens"] == plain["tokens"]
    assert drafted["done"]["drafted_tokens"] > 0


def test_gguf_without_the_mtp_block_has_no_head(tmp_path: Path) -> None:
    """`convert_hf_to_gguf.py --no-mtp` files (and older conversions) load without a head:
    requests for MTP drafts are then refused upstream (runtime/speculative.py)."""
    path = write_qwen35moe_gguf(tmp_path / "no-mtp.gguf", mtp=False)
    engine = _engine(path, "cpu")
    assert not engine.has_mtp
    ref = json.loads(TEXT_FIXTURE.read_text())
    want = np.array(ref["logits"], dtype=np.float32)
    ours = np.asarray(engine.score(TOKENS, 1))[: len(TOKENS)]
    assert np.abs(ours - want).max() < TIGHT * np.abs(want).max()


@pytest.mark.parametrize("backend", BACKENDS)
def test_q8_0_gguf_answers_as_its_exact_twin(tmp_path: Path, backend: str) -> None:
    """A Q8_0 file (the tensors and types `llama-quantize F32.gguf Q8_0` writes for this model,
    byte for byte but ssm_a's last bits: checked by hand) against an F32 file holding exactly
    its blocks' values.

    mlx-cpu dequantizes the blocks for MLX's matmul: the same numbers, the same logits. The
    cpu backend runs llmd's Q8_0 kernels, which quantize the activations to int8 blocks as
    llama.cpp's CPU path does: measured 1.8% of the largest logit at the first position and up
    to 54% later, because a tiny random MoE is not a smooth function of its inputs (8-bit
    rounding flips top-2 expert choices, and the recurrent state carries the change on; Q8_0
    token embeddings alone, as exact F32, move it as much). So there: the first position
    within 3%, and the same top token at most positions."""
    q8, twin = tmp_path / "q8.gguf", tmp_path / "twin.gguf"
    write_exact_twin(q8, twin)
    a = _engine(q8, backend)
    assert a.info()["weight_format"] == "gguf:Q8_0"
    ours = np.asarray(a.score(TOKENS, 1))[: len(TOKENS)]
    want = np.asarray(_engine(twin, backend).score(TOKENS, 1))[: len(TOKENS)]
    per_position = np.abs(ours - want).max(1) / np.abs(want).max()
    agree = float((ours.argmax(1) == want.argmax(1)).mean())
    if backend == "mlx-cpu":
        assert per_position.max() < 1e-5, per_position.max()
    else:
        assert per_position[0] < 3e-2, per_position[0]
        assert agree >= 0.75, agree
    print(
        f"\n{backend}: Q8_0 vs its exact twin: first position {per_position[0]:.2e}, "
        f"worst {per_position.max():.2e}, same top token at {agree:.0%} of positions"
    )


def test_pull_time_check_accepts_the_gguf(gguf: Path) -> None:
    """The pull's checks: the architecture is one llmd runs from GGUF, and the engine's
    validation load (no weight bytes kept, no experts expanded) accepts the file."""
    from llmd.store.engine_check import engine_refusal
    from llmd.store.model_support import gguf_architecture_supported

    assert gguf_architecture_supported("qwen35moe")
    assert engine_refusal(gguf) is None
