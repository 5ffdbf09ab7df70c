"""Qwen3.5-MoE beyond the per-architecture tests of test_architectures.py: logits against
transformers while batched with other sequences (prefill chunks and decode rows of other lengths
in the same steps), the engine's rule for reusing a cached prefix of a model with recurrent
state, sessions evicted and resumed, and the multimodal checkpoint layouts (GGUF files:
test_qwen3_5_gguf.py).

The prefix rule (engine.cpp, prefix_cache.h): KV of the full-attention layers is reused only up
to a block boundary where a snapshot of the recurrent state at exactly that position exists.
Snapshots are kept at the last block boundary inside each prompt and at the latest boundary past
it (what the next chat turn or a session resumes from); a shared prefix that ends elsewhere is
prefilled again.

Tolerance as in test_architectures.py: 1e-4 of the largest |logit| (float32 on both sides).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from .conftest import run_all
from .tiny_models import (
    CONFIGS,
    TOKENS,
    qwen3_5_moe_mtp_weights,
    weights,
    write_checkpoint,
    write_multimodal_checkpoint,
)

native = pytest.importorskip("llmd._engine")

ARCH = "qwen3_5_moe_text"
FIXTURE = Path(__file__).parents[1] / "fixtures" / f"{ARCH}_transformers.json"
BACKENDS = ["cpu", "mlx-cpu"]
TIGHT = 1e-4
BLOCK = 64


def _engine(path: Path, backend: str, **kw):  # type: ignore[no-untyped-def]
    from llmd.worker.host import hf_config

    # float32 KV: these tests hold the model to float32 transformers logits (test_kv_f16 runs
    # it on float16 KV).
    opts = {
        "context_length": 512,
        "max_sequences": 8,
        "kv_budget_bytes": 16 << 20,
        "kv_type": "f32",
        **kw,
    }
    return native.Engine(str(path), backend=backend, hf_config=hf_config(str(path)), **opts)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("qwen3_5_moe")
    write_checkpoint(path, ARCH)
    return path


@pytest.fixture(scope="module")
def fixture() -> dict:
    return json.loads(FIXTURE.read_text())


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def _top_diff(event_logprobs: dict, ref_logits: np.ndarray) -> float:
    """Largest |logprob difference| over the tokens llmd reported as the top ones."""
    ref = _log_softmax(ref_logits)
    return max(abs(lp - ref[t]) for t, lp in event_logprobs["top"])


def _collect(engine, requests: dict[str, dict]) -> dict[str, dict]:  # type: ignore[no-untyped-def]
    for rid, r in requests.items():
        engine.submit(rid, **r)
    out = {rid: {"tokens": [], "logprobs": [], "done": None} for rid in requests}
    while any(r["done"] is None for r in out.values()):
        for ev in engine.poll(1000):
            r = out[ev["id"]]
            if ev["type"] == "tokens":
                r["tokens"] += ev["tokens"]
                r["logprobs"] += ev.get("logprobs", [])
            else:
                assert ev["type"] == "done", ev
                r["done"] = ev
    return out


@pytest.mark.parametrize("backend", BACKENDS)
def test_batched_prefill_and_decode_logits_match_transformers(
    checkpoint: Path, fixture: dict, backend: str
) -> None:
    """Prompts that are prefixes of the scored tokens (their first sampled token's logprobs are
    transformers' logits at that position) and the greedy run (each step's logprobs are
    transformers' cached-decode logits) run together with sequences of other lengths, in steps
    of 16 tokens mixing prefill chunks and decode rows."""
    ref = np.array(fixture["logits"], dtype=np.float32)
    greedy_ref = np.array(fixture["greedy_logits"], dtype=np.float32)
    scale = float(max(np.abs(ref).max(), np.abs(greedy_ref).max()))
    engine = _engine(checkpoint, backend, step_token_budget=16)
    rng = np.random.default_rng(7)
    vocab = CONFIGS[ARCH]["vocab_size"]
    reqs: dict[str, dict] = {
        "greedy": {"prompt": fixture["greedy_prompt"], "max_tokens": 16, "top_logprobs": 20}
    }
    for k in (1, 5, 12, 20):
        reqs[f"prefix{k}"] = {"prompt": TOKENS[:k], "max_tokens": 1, "top_logprobs": 20}
    for n in (3, 40, 90):
        reqs[f"other{n}"] = {
            "prompt": [int(t) for t in rng.integers(3, vocab, n)],
            "max_tokens": 12,
        }
    out = _collect(engine, reqs)
    assert engine.stats()["max_rows_sampled_in_a_step"] >= 3
    prefill = max(_top_diff(out[f"prefix{k}"]["logprobs"][0], ref[k - 1]) for k in (1, 5, 12, 20))
    assert prefill < TIGHT * scale, prefill
    # Decode: the same tokens as transformers up to its first near-tie, and the same logits.
    top2 = np.sort(greedy_ref, 1)[:, -2:]
    ties = np.nonzero(top2[:, 1] - top2[:, 0] < 1e-3 * scale)[0]
    upto = int(ties[0]) + 1 if len(ties) else len(fixture["greedy"])
    assert out["greedy"]["tokens"][:upto] == fixture["greedy"][:upto]
    decode = max(_top_diff(out["greedy"]["logprobs"][i], greedy_ref[i]) for i in range(upto))
    assert decode < TIGHT * scale, decode
    print(
        f"\n{backend}: batched prefill {prefill:.2e}, batched decode {decode:.2e} (scale {scale:.2f})"
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_prefix_reuse_follows_the_recurrent_state_snapshots(checkpoint: Path, backend: str) -> None:
    """A prefix is reused exactly where a state snapshot exists, and reuse changes no token
    and no logprob against an engine that prefilled everything."""
    rng = np.random.default_rng(3)
    vocab = CONFIGS[ARCH]["vocab_size"]

    def toks(n: int) -> list[int]:
        return [int(t) for t in rng.integers(3, vocab, n)]

    a = toks(150)  # snapshots: 128 (last boundary in the prompt), then 192 (while decoding)
    reqs = {
        "b": {"prompt": a[:140] + toks(20), "max_tokens": 6},  # shares 128: reused
        "c": {"prompt": a[:100] + toks(20), "max_tokens": 6},  # shares 64, no snapshot: none
    }
    warm = _engine(checkpoint, backend)
    first = _collect(warm, {"a": {"prompt": a, "max_tokens": 50, "top_logprobs": 5}})["a"]
    assert first["done"]["cached_tokens"] == 0
    reqs["d"] = {"prompt": a + first["tokens"] + [5, 6], "max_tokens": 6}  # next turn: 192
    reqs["e"] = {"prompt": a, "max_tokens": 6}  # the same prompt again: 128
    expected = {"b": 128, "c": 0, "d": 192, "e": 128}
    diffs = []
    for rid, r in reqs.items():
        r = {**r, "top_logprobs": 5}
        reused = _collect(warm, {rid: r})[rid]
        assert reused["done"]["cached_tokens"] == expected[rid], rid
        plain = _collect(_engine(checkpoint, backend), {rid: r})[rid]
        assert plain["done"]["cached_tokens"] == 0
        assert reused["tokens"] == plain["tokens"], rid
        for x, y in zip(reused["logprobs"], plain["logprobs"], strict=True):
            assert [t for t, _ in x["top"]] == [t for t, _ in y["top"]]
            diffs.append(max(abs(p - q) for (_, p), (_, q) in zip(x["top"], y["top"], strict=True)))
    assert max(diffs) < 1e-4, max(diffs)
    print(f"\n{backend}: reused vs recomputed prefix, max logprob difference {max(diffs):.2e}")


@pytest.mark.parametrize("backend", BACKENDS)
def test_session_evicted_and_resumed_gives_fresh_tokens(checkpoint: Path, backend: str) -> None:
    """A pinned session resumes from its snapshot; an unpinned one whose KV and snapshots were
    evicted prefills again. Either way the next turn, decoded beside a neighbour, gives the
    tokens of an engine that never saw the session, and so does the neighbour."""
    rng = np.random.default_rng(5)
    vocab = CONFIGS[ARCH]["vocab_size"]
    ours = [int(t) for t in rng.integers(3, vocab, 130)]
    others = [[int(t) for t in rng.integers(3, vocab, 250)] for _ in range(2)]
    neighbour = {"prompt": [int(t) for t in rng.integers(3, vocab, 37)], "max_tokens": 20}
    # One block of the full-attention layer's KV, in whatever element type the backend stores.
    block_bytes = BLOCK * _engine(checkpoint, backend).kv_cache()["bytes_per_token"]
    for pinned in (True, False):
        e = _engine(checkpoint, backend, kv_budget_bytes=7 * block_bytes, step_token_budget=32)
        first = run_all(e, {"s1": {"prompt": ours, "max_tokens": 10, "session": "chat"}})["s1"]
        assert e.stats()["pinned_blocks"] == 2
        if not pinned:
            e.unpin("chat")
        for i, p in enumerate(others):
            run_all(e, {f"o{i}": {"prompt": p, "max_tokens": 2}})
        turn2 = ours + first["tokens"] + [5, 6]
        both = run_all(
            e, {"s2": {"prompt": turn2, "max_tokens": 12, "session": "chat"}, "n": neighbour}
        )
        if pinned:
            assert both["s2"]["done"]["cached_tokens"] == 128
        else:
            assert both["s2"]["done"]["cached_tokens"] == 0
        fresh = _engine(checkpoint, backend)
        assert (
            both["s2"]["tokens"]
            == run_all(fresh, {"t": {"prompt": turn2, "max_tokens": 12}})["t"]["tokens"]
        )
        assert both["n"]["tokens"] == run_all(fresh, {"n": neighbour})["n"]["tokens"]


@pytest.mark.parametrize("layout", ["multimodal", "multimodal-per-expert"])
def test_multimodal_checkpoint_serves_its_text_model(
    tmp_path: Path, fixture: dict, layout: str
) -> None:
    """A Qwen3_5MoeForConditionalGeneration directory (config with a text_config, the language
    model under model.language_model., a vision tower and MTP weights beside it) serves its
    text model; experts stored one module each load as well."""
    tensors: dict[str, np.ndarray] = {}
    for k, v in weights(ARCH).items():
        name = "model.language_model." + k.removeprefix("model.") if k.startswith("model.") else k
        if layout.endswith("per-expert") and name.endswith("experts.gate_up_proj"):
            f = v.shape[1] // 2
            for e in range(v.shape[0]):
                base = name.removesuffix("gate_up_proj") + f"{e}."
                tensors[base + "gate_proj.weight"] = v[e, :f]
                tensors[base + "up_proj.weight"] = v[e, f:]
            continue
        if layout.endswith("per-expert") and name.endswith("experts.down_proj"):
            for e in range(v.shape[0]):
                tensors[name.removesuffix("down_proj") + f"{e}.down_proj.weight"] = v[e]
            continue
        tensors[name] = v
    tensors["model.visual.blocks.0.norm1.weight"] = np.ones(8, dtype=np.float32)
    tensors.update(qwen3_5_moe_mtp_weights())
    config = write_multimodal_checkpoint(
        tmp_path,
        ARCH,
        tensors,
        model_type="qwen3_5_moe",
        architecture="Qwen3_5MoeForConditionalGeneration",
        vision_type="qwen3_5_moe_vision",
        drop=("tie_word_embeddings", "architectures"),
    )
    ref = np.array(fixture["logits"], dtype=np.float32)
    engine = _engine(tmp_path, "cpu")
    assert engine.info()["architecture"] == "qwen3_5_moe"
    assert engine.has_mtp  # the MTP head beside the text model loads with it
    ours = np.asarray(engine.score(TOKENS, 1))[: len(TOKENS)]
    assert np.abs(ours - ref).max() < TIGHT * np.abs(ref).max()
    from llmd.store.install import check_hf_config

    assert check_hf_config(config, "test") == "qwen3_5_moe"


def test_experts_run_batched_gather_mm(checkpoint: Path) -> None:
    paths = _engine(checkpoint, "cpu").matmul_paths()
    assert paths["blk.0.ffn_gate_up_exps"].startswith("mlx:gather_mm")
    assert "blk.0.ssm_in" in paths and "blk.3.attn_qkv" in paths and "blk.3.ssm_in" not in paths
