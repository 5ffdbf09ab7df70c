"""Speculative decoding in the engine (prompt-lookup drafts verified inside the batched step):
lossless on the real model, greedy token for token, batched, across prefill chunks, with the
prefix cache and sessions, with logprobs, stop tokens, max_tokens, penalties and a grammar
mask; and the sampled acceptance rule exact on synthetic distributions."""

from __future__ import annotations

import random

import numpy as np
import pytest

from .conftest import TEST_BACKEND, run_all

SNIPPET = '''def parse_config(path):
    """Read key = value lines, skipping comments and blank lines."""
    settings = {}
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            if "=" not in line:
                raise ValueError(f"line {number}: expected key = value")
            key, value = line.split("=", 1)
            settings[key.strip()] = value.strip()
    return settings


def merge(defaults, overrides):
    merged = dict(defaults)
    for key, value in overrides.items():
        if value is not None:
            merged[key] = value
    return merged
'''


@pytest.fixture(scope="module")
def engine(model_path):  # type: ignore[no-untyped-def]
    """Drafting priced as free (`draft_row_cost=0`: the cost model never cuts a draft), so the
    counts of drafts verified and kept below do not depend on how loaded the machine is; the
    cost model itself is tested in test_draft_cost.py."""
    native = pytest.importorskip("llmd._engine")
    return native.Engine(
        str(model_path),
        context_length=4096,
        max_sequences=8,
        backend=TEST_BACKEND,
        draft_row_cost=0.0,
    )


def chat(text_model, user: str) -> list[int]:  # type: ignore[no-untyped-def]
    rendered = f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"
    return text_model.encode_rendered_chat(rendered)


def copy_request(text_model) -> list[int]:  # type: ignore[no-untyped-def]
    """A file the model is asked to write out again: the 135M model copies it nearly whole on
    every CPU path (scalar, AVX2 and AVX-512 each keep 87 of the drafts over 120 tokens), where
    an edit such as a rename makes it paraphrase by an amount that turns on the kernels'
    rounding."""
    return chat(
        text_model,
        "Here is a Python file:\n```python\n"
        + SNIPPET
        + "```\nRepeat the file exactly as it is. Output only the code.",
    )


@pytest.fixture(scope="module")
def copy_prompt(text_model) -> list[int]:  # type: ignore[no-untyped-def]
    return copy_request(text_model)


def generate(engine, prompt: list[int], max_draft: int, **kw) -> dict:  # type: ignore[no-untyped-def]
    return run_all(engine, {"r": {"prompt": prompt, "max_draft": max_draft, **kw}})["r"]


def test_greedy_copy_is_token_for_token_the_same_and_most_drafts_are_kept(
    engine, copy_prompt: list[int]
) -> None:  # type: ignore[no-untyped-def]
    plain = generate(engine, copy_prompt, 0, max_tokens=160)
    before = engine.stats()
    spec = generate(engine, copy_prompt, 8, max_tokens=160)
    after = engine.stats()
    assert spec["tokens"] == plain["tokens"]
    assert spec["done"]["finish_reason"] == plain["done"]["finish_reason"]
    assert plain["done"]["drafted_tokens"] == 0
    done = spec["done"]
    # Free rows: every draft prompt lookup offers is verified, and exactly the drafts that equal
    # the greedy tokens are kept, as replaying the drafter over the plain run's tokens counts.
    native = pytest.importorskip("llmd._engine")
    replay = native.ngram_replay(copy_prompt, plain["tokens"], 8, 160)
    assert (done["drafted_tokens"], done["accepted_tokens"]) == tuple(replay), done
    # The model copies most of the file: a good share of the tokens come from accepted drafts,
    # so the sequence took far fewer steps than tokens.
    assert done["accepted_tokens"] >= len(spec["tokens"]) // 2, done
    assert (
        after["draft_accepted_tokens"] - before["draft_accepted_tokens"] == done["accepted_tokens"]
    )
    assert after["steps"] - before["steps"] <= len(spec["tokens"]) - done["accepted_tokens"] + 1


def test_drafts_of_several_sequences_are_verified_in_one_forward(
    engine, copy_prompt: list[int], reference: dict
) -> None:  # type: ignore[no-untyped-def]
    others = {c["name"]: c["prompt_ids"] for c in reference["cases"][:3]}
    requests = {"copy0": {"prompt": copy_prompt, "max_tokens": 120}}
    requests["copy1"] = {"prompt": copy_prompt, "max_tokens": 90, "frequency_penalty": 0.3}
    for name, ids in others.items():
        requests[name] = {"prompt": ids, "max_tokens": 40}
    plain = run_all(engine, {k: {**r, "max_draft": 0} for k, r in requests.items()})
    before = engine.stats()
    spec = run_all(engine, {k: {**r, "max_draft": 6} for k, r in requests.items()})
    after = engine.stats()
    for name in requests:
        assert spec[name]["tokens"] == plain[name]["tokens"], name
    hist = after["drafting_rows_histogram"]
    multi = sum(v for k, v in hist.items() if int(k) >= 2) - sum(
        v for k, v in before["drafting_rows_histogram"].items() if int(k) >= 2
    )
    assert multi > 0, hist  # steps in which two or more sequences verified drafts together
    assert after["speculative_steps"] > before["speculative_steps"]


def test_logprobs_stop_tokens_max_tokens_and_penalties_are_unchanged(
    engine, copy_prompt: list[int]
) -> None:  # type: ignore[no-untyped-def]
    base = {"max_tokens": 50, "top_logprobs": 3}
    plain = generate(engine, copy_prompt, 0, **base)
    spec = generate(engine, copy_prompt, 8, **base)
    assert spec["tokens"] == plain["tokens"]
    # A stop token the model produces part way: both end at the same place.
    stop = plain["tokens"][30]
    first = plain["tokens"].index(stop)
    for kw in ({"stop_tokens": [stop]}, {"max_tokens": 23}, {"repetition_penalty": 1.3}):
        a = generate(engine, copy_prompt, 0, **{"max_tokens": 50, **kw})
        b = generate(engine, copy_prompt, 8, **{"max_tokens": 50, **kw})
        assert b["tokens"] == a["tokens"], kw
        assert b["done"]["finish_reason"] == a["done"]["finish_reason"], kw
        assert b["done"]["completion_tokens"] == a["done"]["completion_tokens"], kw
        if "stop_tokens" in kw:
            assert len(a["tokens"]) == first and a["done"]["finish_reason"] == "stop"
        if "max_tokens" in kw:
            assert len(b["tokens"]) == 23 and b["done"]["finish_reason"] == "length"


def test_logprobs_are_the_same_numbers(engine, copy_prompt: list[int]) -> None:  # type: ignore[no-untyped-def]
    plain_events, spec_events = [], []
    for max_draft, out in ((0, plain_events), (8, spec_events)):
        engine.submit("lp", copy_prompt, 40, top_logprobs=2, max_draft=max_draft)
        done = False
        while not done:
            for ev in engine.poll(1000):
                if ev["type"] == "tokens":
                    out.extend(ev["logprobs"])
                done = done or ev["type"] == "done"
    assert len(plain_events) == len(spec_events) == 40
    for a, b in zip(plain_events, spec_events, strict=True):
        assert [t for t, _ in a["top"]] == [t for t, _ in b["top"]]
        assert b["logprob"] == pytest.approx(a["logprob"], abs=1e-4)


class Forbid:
    """A grammar-like constraint that forbids some tokens (the engine masks them at every
    position, drafted ones included)."""

    def __init__(self, vocab: int, banned: set[int]) -> None:
        words = [0xFFFFFFFF] * ((vocab + 31) // 32)
        for t in banned:
            words[t >> 5] &= ~(1 << (t & 31))
        self.mask = np.array(words, dtype="<u4").tobytes()
        self.accepted: list[int] = []

    def allowed_tokens(self) -> bytes:
        return self.mask

    def accept(self, token: int) -> None:
        self.accepted.append(token)


def test_a_grammar_mask_applies_at_drafted_positions(engine, copy_prompt: list[int]) -> None:  # type: ignore[no-untyped-def]
    plain = generate(engine, copy_prompt, 0, max_tokens=60)
    # Forbid a token the copy needs: the drafts (copied from the prompt) then hold it, and
    # the mask must reject them exactly as plain decoding never picks it.
    banned = {plain["tokens"][20]}
    vocab = engine.info()["vocab_size"]
    runs = []
    for max_draft in (0, 8):
        constraint = Forbid(vocab, banned)
        out = generate(engine, copy_prompt, max_draft, max_tokens=60, constraint=constraint)
        assert constraint.accepted == out["tokens"]  # the constraint saw exactly the kept tokens
        runs.append(out["tokens"])
    assert runs[1] == runs[0]
    assert not banned & set(runs[0])


def test_prefix_cache_and_sessions_never_share_rejected_drafts(
    engine, copy_prompt: list[int], model_path, text_model
) -> None:  # type: ignore[no-untyped-def]
    """A speculative run's blocks (written with drafts, some rejected) are indexed and pinned
    for its session; the next turn reuses them and must equal a fresh engine's output."""
    native = pytest.importorskip("llmd._engine")
    first = run_all(
        engine,
        {"t1": {"prompt": copy_prompt, "max_tokens": 150, "max_draft": 8, "session": "spec-s"}},
    )["t1"]
    assert first["done"]["accepted_tokens"] > 0
    follow = chat(text_model, "Now rename `parse_config` to `load_config` too.")
    turn2 = copy_prompt + first["tokens"] + follow
    second = run_all(
        engine, {"t2": {"prompt": turn2, "max_tokens": 80, "max_draft": 8, "session": "spec-s"}}
    )["t2"]
    assert (
        second["done"]["cached_tokens"]
        >= 64 * ((len(copy_prompt) + len(first["tokens"])) // 64) - 64
    )
    fresh = native.Engine(
        str(model_path), context_length=4096, max_sequences=2, backend=TEST_BACKEND
    )
    try:
        alone = run_all(fresh, {"t2": {"prompt": turn2, "max_tokens": 80}})["t2"]
    finally:
        fresh.shutdown()
    assert second["tokens"] == alone["tokens"]
    engine.unpin("spec-s")


def test_speculation_across_prefill_chunks_and_a_small_step_budget(
    model_path, copy_prompt: list[int], reference: dict
) -> None:  # type: ignore[no-untyped-def]
    """A step budget of 24 tokens: prompts prefill over many chunks beside sequences that
    draft, and drafts are cut to what the budget leaves."""
    native = pytest.importorskip("llmd._engine")
    small = native.Engine(
        str(model_path),
        context_length=4096,
        max_sequences=4,
        step_token_budget=24,
        backend=TEST_BACKEND,
        draft_row_cost=0.0,
    )
    try:
        long_prompt = next(c["prompt_ids"] for c in reference["cases"] if c["name"] == "long_1000")
        reqs = {
            "edit": {"prompt": copy_prompt, "max_tokens": 100},
            "long": {"prompt": long_prompt, "max_tokens": 30},
            "edit2": {"prompt": copy_prompt[:-3] + copy_prompt[-3:], "max_tokens": 70},
        }
        plain = run_all(small, {k: {**r, "max_draft": 0} for k, r in reqs.items()})
        spec = run_all(small, {k: {**r, "max_draft": 16} for k, r in reqs.items()})
        for k in reqs:
            assert spec[k]["tokens"] == plain[k]["tokens"], k
        assert spec["edit"]["done"]["accepted_tokens"] > 0
    finally:
        small.shutdown()


def test_seeded_sampling_with_drafts_repeats_and_accepts(engine, copy_prompt: list[int]) -> None:  # type: ignore[no-untyped-def]
    kw = {"max_tokens": 60, "temperature": 0.7, "top_p": 0.95, "seed": 11}
    a = generate(engine, copy_prompt, 8, **kw)
    b = generate(engine, copy_prompt, 8, **kw)
    assert a["tokens"] == b["tokens"]
    assert a["done"]["accepted_tokens"] > 0


# ------------------------------------------------------------------ the acceptance rule


def _exact(
    logits: np.ndarray, temperature: float, top_k: int, top_p: float, min_p: float
) -> np.ndarray:
    """The distribution Sampler::sample draws from, computed independently."""
    order = sorted(range(len(logits)), key=lambda i: (-logits[i], i))
    if top_k:
        order = order[:top_k]
    z = np.array([logits[i] / temperature for i in order], dtype=np.float64)
    p = np.exp(z - z.max())
    p /= p.sum()
    n = len(p)
    if min_p > 0:
        n = int(np.sum(p >= min_p * p[0]))
    if top_p < 1:
        n = min(n, int(np.searchsorted(np.cumsum(p[:n]), top_p) + 1))
    out = np.zeros(len(logits))
    out[order[:n]] = p[:n] / p[:n].sum()
    return out


@pytest.mark.parametrize(
    "params",
    [
        {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0},
        {"temperature": 0.6, "top_k": 5, "top_p": 1.0, "min_p": 0.0},
        {"temperature": 1.3, "top_k": 0, "top_p": 0.8, "min_p": 0.0},
        {"temperature": 0.9, "top_k": 0, "top_p": 1.0, "min_p": 0.1},
    ],
)
def test_speculative_sampling_draws_from_the_same_distribution(params: dict) -> None:
    """Rejection sampling against a deterministic draft (keep it with probability p(draft),
    else draw from p without it) gives exactly p: checked over 200k seeded draws for a draft
    that is likely, one that is unlikely and one outside the kept set."""
    native = pytest.importorskip("llmd._engine")
    rng = np.random.default_rng(3)
    logits = rng.normal(0, 2, size=12).astype(np.float32)
    p = _exact(logits.astype(np.float64), **params)
    draws = 200_000
    ranked = np.argsort(-p, kind="stable")
    outside = int(ranked[-1]) if p[ranked[-1]] == 0 else -1
    for draft in {int(ranked[0]), int(ranked[2]), outside}:
        if draft < 0:
            continue
        counts = np.array(native.sample_counts(logits.tolist(), draft, draws, seed=5, **params))
        freq = counts / draws
        # Each frequency within 5 standard errors of its probability; nothing outside the set.
        se = np.sqrt(p * (1 - p) / draws) + 1e-9
        assert np.all(np.abs(freq - p) <= 5 * se + 1e-4), (draft, freq, p)
        assert counts[p == 0].sum() == 0


def test_the_drafter_proposes_the_continuation_of_the_latest_match() -> None:
    native = pytest.importorskip("llmd._engine")
    assert native.ngram_draft([1, 2, 3, 4, 5, 9, 1, 2, 3], 4) == [4, 5, 9, 1]
    # The latest occurrence of the longest tail that matches wins.
    assert native.ngram_draft([7, 8, 1, 7, 8, 2, 7, 8], 2) == [2, 7]
    assert native.ngram_draft([5, 6, 7], 3) == []  # no earlier occurrence
    assert native.ngram_draft([4, 4], 3) == [4]


def test_replayed_drafts_of_copied_text_are_mostly_kept() -> None:
    """The drafting policy alone (lookup plus DraftLength), replayed over given tokens: text
    that repeats the prompt is drafted in growing runs and kept; text that never occurred
    before offers no draft; a run of rejected drafts stops drafting for a while."""
    native = pytest.importorskip("llmd._engine")
    source = list(range(100, 160))
    drafted, kept = native.ngram_replay(source + [1], source, 8, 1000)
    assert kept == drafted and kept >= len(source) - 8, (drafted, kept)
    assert native.ngram_replay([1, 2, 3], list(range(10, 50)), 8, 1000) == (0, 0)
    # Each token occurred in the prompt, always followed by another one than now: every draft
    # is rejected at once, and after two misses in a row drafting pauses, so few are verified.
    shuffled = list(range(60))
    random.Random(3).shuffle(shuffled)
    assert all(b != a + 1 for a, b in zip(shuffled, shuffled[1:], strict=False))
    drafted, kept = native.ngram_replay(list(range(60)), shuffled, 8, 1000)
    assert kept == 0 and 0 < drafted < len(shuffled) // 3, (drafted, kept)
