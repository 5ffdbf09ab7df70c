"""Speculative decoding with Qwen3.5's MTP head (`mtp.*`, native/core/mtp_drafter.h) on the tiny
Qwen3.5-MoE checkpoint, and speculation on a model with recurrent layers at all (its state set
back to the snapshot at the last kept position when a draft is rejected).

- The head's logits against tests/fixtures/qwen3_5_moe_mtp_transformers.json (transformers'
  own modules wired as vLLM's Qwen3.5 MTP: record_transformers.py mtp), for every position of a
  prompt and three chained guesses. Tolerance 1e-4 of the largest |logit|, float32 both sides,
  as test_qwen3_5_moe.py.
- Lossless: greedy output with the head drafting is token for token the output without, for
  sequences batched together in steps of 16 tokens (prefill chunks beside decode rows), with
  the random head (it drafts, nearly every draft is rejected: the state rollback runs at almost
  every step) and with a head built to agree with the model (most drafts kept); seeded sampled
  output follows the same distribution (chi-square: speculative_sampling.py, shared with the
  draft-model tests).
- A cached prefix, a session's next turn and a sibling of n > 1 draft with the head too (it
  starts where the model starts computing hidden states), lossless.
- Reported: drafted and accepted tokens in the done event and the engine's stats.
- Refused: an MTP request on a model without a head.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from .conftest import run_all
from .speculative_sampling import assert_same_distribution, sampled_positions
from .tiny_models import (
    CONFIGS,
    TOKENS,
    qwen3_5_moe_mtp_weights,
    weights,
    write_checkpoint,
    write_qwen3_5_moe_with_mtp,
)

native = pytest.importorskip("llmd._engine")

ARCH = "qwen3_5_moe_text"
FIXTURE = Path(__file__).parents[1] / "fixtures" / "qwen3_5_moe_mtp_transformers.json"
BACKENDS = ["cpu", "mlx-cpu"]
TIGHT = 1e-4
VOCAB = CONFIGS[ARCH]["vocab_size"]


def _engine(path: Path, backend: str = "cpu", **kw):  # type: ignore[no-untyped-def]
    from llmd.worker.host import hf_config

    opts = {
        "context_length": 512,
        "max_sequences": 8,
        "kv_budget_bytes": 16 << 20,
        "kv_type": "f32",
        "step_token_budget": 16,
        "draft_row_cost": 0.0,  # drafting priced as free: these tests count the drafts verified
        **kw,
    }
    return native.Engine(str(path), backend=backend, hf_config=hf_config(str(path)), **opts)


@pytest.fixture(scope="module")
def random_head(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("qwen3_5_mtp")
    write_qwen3_5_moe_with_mtp(path)
    return path


def _agreeing_weights(
    config: dict | None = None,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """A model whose layers only nudge its residual stream (their output projections scaled
    down), so its next token depends mostly on the current one, and an MTP head that computes
    exactly that guess from the token it reads: fc passes the normalised embedding through
    (fc = [I | 0]), its layer adds nothing (zero output projections), its final norm is the
    model's. Most of its drafts are kept; not all (the layers' nudges), so rejections and the
    state rollback still run."""
    c = config or CONFIGS[ARCH]
    model = weights(ARCH, config=c)
    for name in list(model):
        if name.endswith(
            ("o_proj.weight", "out_proj.weight", "down_proj.weight", "experts.down_proj")
        ):
            model[name] = model[name] * np.float32(1 / 64)  # a power of two: still bf16-exact
    head = qwen3_5_moe_mtp_weights(config=c)
    h = c["hidden_size"]
    head["mtp.fc.weight"] = np.concatenate([np.eye(h), np.zeros((h, h))], 1).astype(np.float32)
    head["mtp.pre_fc_norm_embedding.weight"] = np.zeros(h, np.float32)
    head["mtp.norm.weight"] = model["model.norm.weight"]
    for name in list(head):
        if name.endswith(("o_proj.weight", "down_proj.weight", "experts.down_proj")):
            head[name] = np.zeros_like(head[name])
    return model, head


@pytest.fixture(scope="module")
def agreeing_head(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("qwen3_5_mtp_agree")
    model, head = _agreeing_weights()
    write_qwen3_5_moe_with_mtp(path, mtp=head, model=model)
    return path


def _prompts(seed: int, lengths: tuple[int, ...]) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [[int(t) for t in rng.integers(3, VOCAB, n)] for n in lengths]


def _greedy(engine, prompts: list[list[int]], spec: dict, max_tokens: int = 24) -> list[dict]:  # type: ignore[no-untyped-def]
    reqs = {f"r{i}": {"prompt": p, "max_tokens": max_tokens, **spec} for i, p in enumerate(prompts)}
    out = run_all(engine, reqs)
    return [out[f"r{i}"] for i in range(len(prompts))]


MTP = {"max_draft": 4, "mtp": True}


@pytest.mark.parametrize("backend", BACKENDS)
def test_mtp_logits_match_the_reference(random_head: Path, backend: str) -> None:
    """Every position of a 20-token prompt (the head reads the model's hidden state at i and
    token i + 1) and three greedy guesses chained on the head's own output."""
    ref = json.loads(FIXTURE.read_text())
    assert ref["tokens"] == TOKENS
    want = np.array(ref["mtp_logits"] + ref["chain_logits"], dtype=np.float32)
    engine = _engine(random_head, backend)
    try:
        assert engine.has_mtp
        logits, chained = engine.mtp_probe(TOKENS, 3)
    finally:
        engine.shutdown()
    assert logits.shape == want.shape == (len(TOKENS) - 1 + 3, VOCAB)
    scale = float(np.abs(want).max())
    diff = float(np.abs(logits - want).max())
    assert diff < TIGHT * scale, (diff, scale)
    assert chained == ref["chain_tokens"]
    print(f"\n{backend}: MTP logits max |diff| {diff:.2e} (scale {scale:.2f})")


@pytest.mark.parametrize("backend", BACKENDS)
def test_greedy_with_the_random_head_is_the_same_batched_across_prefill_chunks(
    random_head: Path, backend: str
) -> None:
    """Four sequences (prompts of 5 to 90 tokens: several prefill chunks of 16 beside the
    others' decode rows) with the head drafting up to 4 tokens, against the same without.
    The random head's guesses are nearly all wrong: the state rollback runs at almost every
    step, and the adaptive draft length stays low."""
    prompts = _prompts(11, (5, 23, 47, 90))
    plain = _engine(random_head, backend)
    spec = _engine(random_head, backend)
    try:
        want = _greedy(plain, prompts, {})
        got = _greedy(spec, prompts, MTP)
        stats = spec.stats()
    finally:
        plain.shutdown()
        spec.shutdown()
    assert [r["tokens"] for r in got] == [r["tokens"] for r in want]
    assert stats["draft_tokens"] > 0
    assert all(r["done"]["drafted_tokens"] > 0 for r in got)
    assert stats["max_rows_sampled_in_a_step"] >= 2


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_head_that_agrees_with_the_model_gets_its_drafts_kept(
    agreeing_head: Path, backend: str
) -> None:
    """The head built to reproduce the model's guess: most drafts are kept, several tokens a
    step, and the output is still token for token the output without speculation."""
    prompts = _prompts(5, (9, 30, 70))
    plain = _engine(agreeing_head, backend)
    spec = _engine(agreeing_head, backend)
    try:
        want = _greedy(plain, prompts, {}, max_tokens=40)
        got = _greedy(spec, prompts, MTP, max_tokens=40)
        stats = spec.stats()
        plain_steps = plain.stats()["steps"]
    finally:
        plain.shutdown()
        spec.shutdown()
    assert [r["tokens"] for r in got] == [r["tokens"] for r in want]
    drafted = sum(r["done"]["drafted_tokens"] for r in got)
    accepted = sum(r["done"]["accepted_tokens"] for r in got)
    assert stats["draft_tokens"] == drafted and stats["draft_accepted_tokens"] == accepted
    assert drafted > 0 and accepted / drafted > 0.6, (accepted, drafted)
    assert accepted < drafted  # some rejected: the rollback ran
    assert stats["steps"] < plain_steps
    print(f"\n{backend}: accepted {accepted}/{drafted}, steps {stats['steps']} vs {plain_steps}")


def test_cached_prefixes_sessions_and_siblings_draft_with_the_head(agreeing_head: Path) -> None:
    """A sequence that reuses KV the model did not compute for it (a prefix from the cache, a
    session's earlier turn, a sibling of n > 1 starting from its first choice's KV) has no
    hidden states there: its head starts at the first position the model computes
    (mtp_drafter.h). Each of them drafts, gets drafts kept, and gives the tokens of a plain
    run of the same prompt."""
    prompt = _prompts(23, (100,))[0]  # a recurrent-state snapshot at 64: reusable
    fresh = _prompts(29, (40,))[0]
    engine = _engine(agreeing_head)
    plain = _engine(agreeing_head)
    try:
        first = run_all(engine, {"a": {"prompt": prompt, "max_tokens": 20, **MTP}})["a"]
        again = run_all(engine, {"b": {"prompt": prompt, "max_tokens": 20, **MTP}})["b"]
        siblings = run_all(
            engine,
            {
                "p": {"prompt": fresh, "max_tokens": 20, **MTP},
                "c": {"prompt": fresh, "max_tokens": 20, "prefill_of": "p", **MTP},
            },
        )
        turn1 = _prompts(31, (90,))[0]
        t1 = run_all(engine, {"t1": {"prompt": turn1, "max_tokens": 20, "session": "s", **MTP}})
        turn2 = turn1 + t1["t1"]["tokens"] + _prompts(37, (30,))[0]
        t2 = run_all(engine, {"t2": {"prompt": turn2, "max_tokens": 24, "session": "s", **MTP}})
        engine.unpin("s")
        want = _greedy(plain, [prompt, fresh, turn1], {}, max_tokens=20)
        want_turn2 = _greedy(plain, [turn2], {}, max_tokens=24)[0]["tokens"]
    finally:
        engine.shutdown()
        plain.shutdown()
    assert first["tokens"] == again["tokens"] == want[0]["tokens"]
    assert first["done"]["cached_tokens"] == 0 and again["done"]["cached_tokens"] == 64
    assert siblings["p"]["tokens"] == siblings["c"]["tokens"] == want[1]["tokens"]
    assert siblings["c"]["done"]["cached_tokens"] == len(fresh)  # it prefilled nothing
    assert t1["t1"]["tokens"] == want[2]["tokens"]
    assert t2["t2"]["tokens"] == want_turn2
    assert t2["t2"]["done"]["cached_tokens"] >= 64
    for done in (again["done"], siblings["c"]["done"], t2["t2"]["done"]):
        assert done["accepted_tokens"] > 0, done
        assert done["drafted_tokens"] > done["accepted_tokens"] // 2, done


def test_sampled_output_follows_the_same_distribution_with_the_head(agreeing_head: Path) -> None:
    """500 seeded draws each way at temperature 1 (different seeds each way: distributions are
    compared, not draws), positions 1-3 of each continuation (speculative_sampling.py)."""
    prompt = _prompts(3, (12,))[0]
    engine = _engine(agreeing_head)
    draws = 500
    try:
        with_head = sampled_positions(engine, prompt, MTP, draws)
        assert engine.stats()["draft_accepted_tokens"] > 0
        plain = sampled_positions(engine, prompt, {}, draws, seed_base=10**6)
    finally:
        engine.shutdown()
    assert_same_distribution(with_head, plain, "mtp")


def test_ngram_drafts_on_the_recurrent_model_are_lossless(random_head: Path) -> None:
    """Prompt lookup on the model with recurrent layers: a prompt that repeats itself gets
    drafts kept and rejected, and the greedy output is the output without."""
    base = _prompts(17, (12,))[0]
    prompts = [base * 4, _prompts(18, (40,))[0] * 2]
    plain = _engine(random_head)
    spec = _engine(random_head)
    try:
        want = _greedy(plain, prompts, {}, max_tokens=32)
        got = _greedy(spec, prompts, {"max_draft": 6}, max_tokens=32)
        stats = spec.stats()
    finally:
        plain.shutdown()
        spec.shutdown()
    assert [r["tokens"] for r in got] == [r["tokens"] for r in want]
    assert stats["draft_tokens"] > 0


def test_an_mtp_request_on_a_model_without_a_head_is_an_error(tmp_path: Path) -> None:
    write_checkpoint(tmp_path, ARCH)
    engine = _engine(tmp_path)
    try:
        assert not engine.has_mtp
        engine.submit("nohead", TOKENS, 8, **MTP)
        events = []
        while not any(e["type"] in ("done", "error") for e in events):
            events += engine.poll(1000)
    finally:
        engine.shutdown()
    error = events[-1]
    assert error["type"] == "error" and error["code"] == "unsupported"
    assert "no MTP head" in error["message"]


def test_the_worker_drafts_with_the_head_and_says_it_has_one(
    agreeing_head: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker process: `speculative_mtp` in its ready features only where the model ships a
    head, and a generate message with `mtp` drafts with it (drafted and accepted tokens in its
    done message) and gives the tokens the same request gives without. Drafting is priced free
    (LLMD_DRAFT_ROW_COST=0): with measured step times a loaded box declined the head's later
    drafts and kept 3 of 6, which says nothing about the head."""
    from .conftest import read_event, send, worker_process

    monkeypatch.setenv("LLMD_DRAFT_ROW_COST", "0")

    def turn(proc, rid: str, **extra) -> tuple[list[int], dict]:  # type: ignore[no-untyped-def]
        send(proc, {"type": "generate", "id": rid, "prompt": TOKENS, "max_tokens": 24, **extra})
        tokens: list[int] = []
        while (event := read_event(proc))["type"] != "done":
            assert event["type"] in ("started", "tokens"), event
            tokens += event.get("tokens", [])
        return tokens, event

    with worker_process(agreeing_head, "cpu") as (proc, ready):
        assert {"speculative_ngram", "speculative_mtp"} <= set(ready["features"])
        plain, _ = turn(proc, "plain")
        drafted, done = turn(proc, "mtp", max_draft=4, mtp=True)
    assert drafted == plain
    assert done["drafted_tokens"] > 0 and done["accepted_tokens"] > done["drafted_tokens"] // 2
    write_checkpoint(tmp_path, ARCH)
    with worker_process(tmp_path, "cpu") as (proc, ready):
        assert (
            "speculative_ngram" in ready["features"] and "speculative_mtp" not in ready["features"]
        )
