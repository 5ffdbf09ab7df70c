"""Each architecture against Hugging Face transformers: tiny random checkpoints (tiny_models.py)
loaded by llmd's engine from safetensors and from GGUF, on llmd's CPU kernels and on the device
backend's graph (MLX on its CPU device), give transformers' logits (fixtures recorded by
tests/fixtures/record_transformers.py with transformers 5.23 in float32), the GGUFs give
llama.cpp's logits (tests/fixtures/record_llamacpp_architectures.py), and interleaved sequences
on one engine never see each other's state (no bleed).

Tolerances: the reference and llmd both compute in float32 on the same bf16-valued weights, so
logits agree to float32 rounding of a different summation order (~1e-5 of their scale); the
bound used is 1e-4 of the largest |logit|. The device backend stores weights as its compute
dtype (float32 on MLX's CPU device) and the same bound holds. Q8_0 GGUFs run llmd's kernels,
which (like llama.cpp's) quantize activations to 8-bit blocks too; against the F32 load they
differ by 2.9% (Qwen) and 5.5% (Gemma, whose soft-capped logits span only about +-3) of the logit
scale, so the bound is 8e-2: loose for rounding, far below what a wiring mistake (a missing bias,
a swapped gate/up) does.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from .conftest import generate_in_worker, run_all
from .tiny_models import (
    CONFIGS,
    LONG_SCORED,
    LONG_TOKENS,
    TOKENS,
    weights,
    write_checkpoint,
    write_gguf,
    write_multimodal_checkpoint,
    write_stub_gguf,
)

native = pytest.importorskip("llmd._engine")

FIXTURES = Path(__file__).parents[1] / "fixtures"
ARCHS = ["qwen2", "qwen3", "gemma3_text", "qwen3_5_moe_text", "gemma4_text", "gemma4_moe"]
RECURRENT_ARCHS = {"qwen3_5_moe_text"}  # gated delta-rule layers: state snapshots per block
GGUF_ARCHS = ["qwen2", "qwen3", "gemma3_text"]  # Qwen3.5-MoE and Gemma 4: safetensors only
BACKENDS = ["cpu", "mlx-cpu"]
TIGHT = 1e-4
Q8_BOUND = 8e-2


def _fixture(arch: str) -> dict:
    return json.loads((FIXTURES / f"{arch}_transformers.json").read_text())


def _engine(path: Path, backend: str, context_length: int = 256, **kw):  # type: ignore[no-untyped-def]
    """An engine on a tiny checkpoint. The CPU backend keeps float32 KV here (kv_type): these
    tests hold the architectures to float32 references at 1e-4, which float16 KV's rounding
    (2^-11 per key and value) would exceed; test_kv_f16 covers float16 KV on these models."""
    from llmd.worker.host import hf_config

    kw.setdefault("kv_type", "f32")
    return native.Engine(
        str(path),
        context_length=context_length,
        max_sequences=8,
        backend=backend,
        hf_config=hf_config(str(path)),
        **{"kv_budget_bytes": 16 << 20, **kw},
    )


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny")
    for arch in ARCHS:
        write_checkpoint(root / arch, arch)
    return {arch: root / arch for arch in ARCHS}


def _arch_name(arch: str) -> str:
    """What the engine reports: the config's model_type without `_text`."""
    return str(CONFIGS[arch]["model_type"]).removesuffix("_text")


def _max_rel(ours: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(ours - ref).max() / np.abs(ref).max())


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("arch", ARCHS)
def test_safetensors_logits_match_transformers(checkpoints, arch: str, backend: str) -> None:  # type: ignore[no-untyped-def]
    """Every position scored one decode step at a time, and the tail of a prompt prefilled in
    one chunk, give transformers' logits."""
    ref = np.array(_fixture(arch)["logits"], dtype=np.float32)
    engine = _engine(checkpoints[arch], backend)
    assert engine.info()["architecture"] == _arch_name(arch)
    stepped = engine.score(TOKENS, 1)[: len(TOKENS)]
    assert _max_rel(stepped, ref) < TIGHT, np.abs(stepped - ref).max()
    first = 12  # positions 0..10 in one prefill chunk, then one position per step
    chunked = engine.score(TOKENS, first)[: len(TOKENS) - first + 1]
    assert _max_rel(chunked, ref[first - 1 :]) < TIGHT
    assert (stepped.argmax(1) == ref.argmax(1)).all()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("arch", GGUF_ARCHS)
def test_gguf_gives_the_safetensors_logits(
    checkpoints, tmp_path: Path, arch: str, backend: str
) -> None:  # type: ignore[no-untyped-def]
    """The same weights written as llama.cpp's converter writes them (its tensor names and
    metadata keys, rotate-half rope for Qwen and Gemma, Gemma's norms stored as 1 + w) load to
    the same model."""
    ref = np.array(_fixture(arch)["logits"], dtype=np.float32)
    if arch == "gemma3_text":
        # GGUF has no query_pre_attn_scalar: llama.cpp (and llmd) use head_dim (hidden / heads
        # for the 27B model). Compare with the same checkpoint configured that way.
        cfg = {**CONFIGS[arch], "query_pre_attn_scalar": CONFIGS[arch]["head_dim"]}
        variant = tmp_path / "as-gguf"
        write_checkpoint(variant, arch)
        (variant / "config.json").write_text(json.dumps(cfg))
        ref = _engine(variant, backend).score(TOKENS, 1)[: len(TOKENS)]
    f32 = tmp_path / f"{arch}-f32.gguf"
    write_gguf(f32, arch)
    ours = _engine(f32, backend).score(TOKENS, 1)[: len(TOKENS)]
    assert _max_rel(ours, ref) < TIGHT
    if backend == "cpu":  # llmd's Q8_0 kernels with the biases / QK-norm around them
        q8 = tmp_path / f"{arch}-q8_0.gguf"
        write_gguf(q8, arch, quant="Q8_0")
        engine = _engine(q8, backend)
        assert engine.info()["weight_format"] == "gguf:Q8_0"
        assert engine.matmul_paths()["blk.0.attn_qkv"].startswith("llmd:q8_0")
        quant = engine.score(TOKENS, 1)[: len(TOKENS)]
        assert _max_rel(quant, ours) < Q8_BOUND


# ggml's CPU GELU reads a float16 table, which moves Gemma's logits by ~6e-4 of their scale
# (transformers and llmd agree to 3e-6); Qwen's SwiGLU path agrees with llama.cpp to 5e-7.
LLAMACPP_BOUND = {"qwen2": TIGHT, "qwen3": TIGHT, "gemma3_text": 2e-3}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("arch", GGUF_ARCHS)
def test_gguf_logits_match_llamacpp(tmp_path: Path, arch: str, backend: str) -> None:
    """The GGUF loaders read llama.cpp's conventions as llama.cpp itself does (fixtures from
    tests/fixtures/record_llamacpp_architectures.py on the same F32 GGUF)."""
    ref = np.array(
        json.loads((FIXTURES / f"{arch}_llamacpp.json").read_text())["logits"], dtype=np.float32
    )
    path = tmp_path / f"{arch}.gguf"
    write_gguf(path, arch)
    ours = _engine(path, backend).score(TOKENS, 1)[: len(TOKENS)]
    assert _max_rel(ours, ref) < LLAMACPP_BOUND[arch]
    assert (ours.argmax(1) == ref.argmax(1)).all()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_matches_transformers_and_interleaving_does_not_bleed(
    checkpoints, arch: str, backend: str
) -> None:  # type: ignore[no-untyped-def]
    """Solo greedy decoding reproduces transformers' generate(); then sequences of different
    lengths (one spanning several prefill chunks) run together, with a session and a
    cancelled neighbour, and each gives exactly its solo tokens; a session's next turn and a
    forked sibling reuse KV and still give the solo tokens."""
    fx = _fixture(arch)
    engine = _engine(checkpoints[arch], backend, step_token_budget=16)
    solo_ref = run_all(engine, {"g": {"prompt": fx["greedy_prompt"], "max_tokens": 16}})["g"]
    assert solo_ref["tokens"] == fx["greedy"]
    rng = np.random.default_rng(1)
    vocab = CONFIGS[arch]["vocab_size"]
    prompts = {f"p{n}": [int(t) for t in rng.integers(3, vocab, n)] for n in (1, 5, 23, 70)}
    reqs = {k: {"prompt": p, "max_tokens": 10 + i} for i, (k, p) in enumerate(prompts.items())}
    solo = {k: run_all(engine, {k: r})[k]["tokens"] for k, r in reqs.items()}
    for k, r in reqs.items():
        engine.submit(k, **r, session="s" if k == "p70" else "")
    engine.submit("cancelled", prompts["p70"][::-1], 200)
    tokens: dict[str, list[int]] = {k: [] for k in [*reqs, "cancelled"]}
    done: set[str] = set()
    while len(done) < len(tokens):
        for ev in engine.poll(1000):
            if ev["type"] == "tokens":
                tokens[ev["id"]] += ev["tokens"]
                if ev["id"] == "cancelled" and len(tokens["cancelled"]) >= 3:
                    engine.cancel("cancelled")
            else:
                done.add(ev["id"])
    for k in reqs:
        assert tokens[k] == solo[k], k
    assert engine.stats()["max_rows_sampled_in_a_step"] >= 3
    # The session's next turn reuses its KV and still gives the solo continuation.
    turn2 = prompts["p70"] + solo["p70"] + [5, 6]
    fresh = run_all(_engine(checkpoints[arch], backend), {"t": {"prompt": turn2, "max_tokens": 8}})
    again = run_all(engine, {"t": {"prompt": turn2, "max_tokens": 8, "session": "s"}})
    assert again["t"]["done"]["cached_tokens"] >= 64  # whole KV blocks are shared
    assert again["t"]["tokens"] == fresh["t"]["tokens"]
    # A sibling choice forks the prefilled prompt (shared blocks, a copied partial block).
    forked = run_all(
        engine,
        {
            "a": {"prompt": prompts["p70"], "max_tokens": 12},
            "b": {"prompt": prompts["p70"], "max_tokens": 12, "prefill_of": "a"},
        },
    )
    assert forked["a"]["tokens"] == forked["b"]["tokens"] == solo["p70"][:12]
    # A prompt sharing only the head of a cached block reuses exactly that head (a copy of the
    # block; sliding-window layers included) except where recurrent state exists only at block
    # boundaries, and still gives a fresh engine's tokens.
    head = prompts["p70"][:40] + prompts["p23"]
    fresh = run_all(_engine(checkpoints[arch], backend), {"h": {"prompt": head, "max_tokens": 8}})
    partly = run_all(engine, {"h": {"prompt": head, "max_tokens": 8}})
    assert partly["h"]["done"]["cached_tokens"] == (0 if arch in RECURRENT_ARCHS else 40)
    assert partly["h"]["tokens"] == fresh["h"]["tokens"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("arch", ["gemma3_text", "gemma4_text", "gemma4_moe"])
def test_sliding_layers_keep_only_their_window(checkpoints, arch: str, backend: str) -> None:  # type: ignore[no-untyped-def]
    """Sliding layers (window 5) free the KV of blocks behind their window: a 300-token
    sequence still gives transformers' logits at its end; two long sequences run together
    (each reusing window memory the other freed) give their solo tokens while the window parts
    kept stay bounded by the window, not the length; and a session's next turn still reuses
    the KV its window needs."""
    path = checkpoints[arch]
    ref = np.array(_fixture(arch)["long_logits"], dtype=np.float32)
    engine = _engine(path, backend, context_length=1024, step_token_budget=64)
    n = len(LONG_TOKENS)
    stepped = engine.score(LONG_TOKENS, n - LONG_SCORED + 1)[:LONG_SCORED]
    assert _max_rel(stepped, ref) < TIGHT, np.abs(stepped - ref).max()

    prompts = {"a": LONG_TOKENS, "b": LONG_TOKENS[::-1]}
    reqs = {k: {"prompt": p, "max_tokens": 200} for k, p in prompts.items()}
    solo = {k: run_all(_engine(path, backend, 1024), {k: r})[k] for k, r in reqs.items()}
    engine = _engine(path, backend, context_length=1024, step_token_budget=64)
    for k, r in reqs.items():
        engine.submit(k, **r, session="s" if k == "a" else "")
    tokens: dict[str, list[int]] = {k: [] for k in reqs}
    done: set[str] = set()
    most_parts = 0
    while len(done) < len(reqs):
        for ev in engine.poll(1000):
            if ev["type"] == "tokens":
                tokens[ev["id"]] += ev["tokens"]
            else:
                done.add(ev["id"])
        most_parts = max(most_parts, engine.stats()["kv_window_parts"])
    for k in reqs:
        assert tokens[k] == solo[k]["tokens"], k
    # 500 positions are 8 blocks per sequence; each keeps the window (5) + a two-block margin
    # + the block being written: at most 4 parts, however long it grows.
    assert 2 <= most_parts <= 2 * 4, most_parts  # kept for all 16 blocks without windows
    assert engine.stats()["kv_window_parts"] <= 2 * 4

    turn2 = LONG_TOKENS + solo["a"]["tokens"] + [5, 6]
    fresh = run_all(_engine(path, backend, 1024), {"t": {"prompt": turn2, "max_tokens": 8}})
    again = run_all(engine, {"t": {"prompt": turn2, "max_tokens": 8, "session": "s"}})
    assert again["t"]["done"]["cached_tokens"] >= 448  # up to the last whole block
    assert again["t"]["tokens"] == fresh["t"]["tokens"]


@pytest.mark.parametrize("arch", ["gemma3_text", "gemma4_text"])
def test_evicted_window_session_resumes_like_a_fresh_one(checkpoints, arch: str) -> None:  # type: ignore[no-untyped-def]
    """A session on sliding-window layers, unpinned and pushed out of a small KV budget by
    other long sequences, resumes with exactly a fresh engine's tokens: whatever part of its
    KV survived is reused only where its window survived too."""
    path = checkpoints[arch]
    session = {"s": {"prompt": LONG_TOKENS, "max_tokens": 40, "session": "s"}}
    probe = _engine(path, "cpu", context_length=1024)
    run_all(probe, session)
    one_sequence = probe.stats()["kv_bytes"]  # what one such conversation allocates
    engine = _engine(path, "cpu", context_length=1024, kv_budget_bytes=one_sequence * 3 // 2)
    first = run_all(engine, session)
    turn2 = LONG_TOKENS + first["s"]["tokens"] + [5, 6]
    engine.unpin("s")
    for k in range(3):  # evicts the session's idle blocks (LRU)
        others = {f"o{k}": {"prompt": LONG_TOKENS[::-1][k:] + [k + 3], "max_tokens": 60}}
        run_all(engine, others)
    again = run_all(engine, {"t": {"prompt": turn2, "max_tokens": 12, "session": "s"}})
    fresh = run_all(_engine(path, "cpu", 1024), {"t": {"prompt": turn2, "max_tokens": 12}})
    assert again["t"]["tokens"] == fresh["t"]["tokens"]
    assert again["t"]["done"]["cached_tokens"] < len(LONG_TOKENS)  # it was evicted


def _tiny_tokenizer(directory: Path, vocab: int) -> None:
    """A word-level tokenizer.json over the tiny vocabulary, a chat template and special tokens,
    as a Hugging Face repo brings them (the daemon never rebuilds a directory's tokenizer)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = {f"w{i}": i for i in range(vocab)}
    words.update({"<bos>": 1, "<eos>": 2})
    del words["w1"], words["w2"]
    tk = Tokenizer(models.WordLevel(words, unk_token="w0"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    # Matched whole even when text runs on ("<bos>w17"), as a real tokenizer's specials are.
    tk.add_special_tokens(["<bos>", "<eos>"])
    tk.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "chat_template": "{{ bos_token }}{% for m in messages %}{{ m.content }} {% endfor %}",
                "bos_token": "<bos>",
                "eos_token": "<eos>",
                "add_bos_token": False,
            }
        )
    )


@pytest.mark.parametrize("arch", ARCHS)
def test_worker_serves_a_hugging_face_directory(tmp_path: Path, arch: str) -> None:
    """The worker process (as the daemon starts it) loads the directory, reports the
    architecture, and generates transformers' greedy tokens; the daemon's text side (tokenizer,
    template, stop tokens) loads from the same directory."""
    from llmd.text.text_model import load_text_model

    fx = _fixture(arch)
    write_checkpoint(tmp_path, arch)
    _tiny_tokenizer(tmp_path, CONFIGS[arch]["vocab_size"])
    text = load_text_model(tmp_path)
    assert text.encode("w17 w99") == [17, 99] and text.stop_token_ids[0] == 2
    assert text.context_length == CONFIGS[arch]["max_position_embeddings"]
    ready, tokens = generate_in_worker(tmp_path, "cpu", fx["greedy_prompt"], 16)
    assert ready["model"]["architecture"] == _arch_name(arch)
    assert tokens == fx["greedy"]


@pytest.mark.parametrize("layout", ["transformers-4", "transformers-5"])
def test_gemma3_text_inside_a_multimodal_checkpoint(tmp_path: Path, layout: str) -> None:
    """A Gemma3ForConditionalGeneration directory (config with a text_config, the language
    model's tensors under its prefix, a vision tower beside them) serves its text model."""
    prefix = "language_model.model." if layout == "transformers-4" else "model.language_model."
    head = "language_model.lm_head.weight" if layout == "transformers-4" else "lm_head.weight"
    tensors = {
        (prefix + k.removeprefix("model.") if k.startswith("model.") else head): v
        for k, v in weights("gemma3_text").items()
    }
    tensors["vision_tower.vision_model.post_layernorm.weight"] = np.ones(8, dtype=np.float32)
    text = write_multimodal_checkpoint(
        tmp_path,
        "gemma3_text",
        tensors,
        model_type="gemma3",
        architecture="Gemma3ForConditionalGeneration",
        vision_type="siglip_vision_model",
    )["text_config"]
    ref = np.array(_fixture("gemma3_text")["logits"], dtype=np.float32)
    engine = _engine(tmp_path, "cpu")
    assert engine.info()["architecture"] == "gemma3"
    assert _max_rel(engine.score(TOKENS, 1)[: len(TOKENS)], ref) < TIGHT
    from llmd.text.text_model import load_text_model

    _tiny_tokenizer(tmp_path, text["vocab_size"])
    assert load_text_model(tmp_path).context_length == text["max_position_embeddings"]


def test_gemma4_text_inside_a_multimodal_checkpoint(tmp_path: Path) -> None:
    """A Gemma4ForConditionalGeneration directory (transformers 5 names: the language model
    under model.language_model., a vision tower beside it, the head tied by default unless the
    outer config says otherwise) serves its text model on both backends."""
    tensors = {
        ("model.language_model." + k.removeprefix("model.") if k.startswith("model.") else k): v
        for k, v in weights("gemma4_text").items()
    }
    tensors["model.vision_tower.encoder.layers.0.mlp.gate_proj.linear.weight"] = np.ones(
        (8, 8), dtype=np.float32
    )
    write_multimodal_checkpoint(
        tmp_path,
        "gemma4_text",
        tensors,
        model_type="gemma4",
        architecture="Gemma4ForConditionalGeneration",
        vision_type="gemma4_vision",
    )
    ref = np.array(_fixture("gemma4_text")["logits"], dtype=np.float32)
    for backend in BACKENDS:
        engine = _engine(tmp_path, backend)
        assert engine.info()["architecture"] == "gemma4"
        assert _max_rel(engine.score(TOKENS, 1)[: len(TOKENS)], ref) < TIGHT


def test_gemma4_kv_groups_of_different_shapes(checkpoints) -> None:  # type: ignore[no-untyped-def]
    """Gemma 4's KV pool holds each layer's own shape: sliding layers 2 heads x 16, full ones
    1 x 32, and the KV-shared layers nothing, so a block is the sum over the storing layers."""
    engine = _engine(checkpoints["gemma4_text"], "cpu")
    run_all(engine, {"g": {"prompt": TOKENS, "max_tokens": 2}})  # 22 positions: one block
    per_token = 2 * (2 * 16 + 2 * 16 + 1 * 32) * 4  # layers 0, 1 (sliding), 2 (full); f32
    assert engine.stats()["kv_bytes"] == 64 * per_token


def test_gemma4_gguf_is_refused_with_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "gemma4.gguf"
    write_stub_gguf(path, "gemma4")
    with pytest.raises(Exception, match="gemma4 GGUF files are not supported"):
        _engine(path, "cpu")
