"""Prefix cache: KV of earlier requests is reused by later ones that share a prefix, without
changing a single output token."""

from __future__ import annotations

from .conftest import run_all

BLOCK = 64
# One block of SmolLM2-135M's float16 KV: 30 layers x 3 KV heads x 64 dims, keys and values
# (test_kv_f16 checks the engine reports this size).
BLOCK_BYTES = 30 * 2 * 3 * 64 * BLOCK * 2


def _long_prompt(reference: dict) -> list[int]:
    return next(c["prompt_ids"] for c in reference["cases"] if c["name"] == "long_1000")


def test_repeated_prompt_reuses_kv_and_gives_the_same_tokens(engine, reference: dict) -> None:  # type: ignore[no-untyped-def]
    prompt = _long_prompt(reference)[:1000]  # its last block holds 40 tokens (>= 8 reused)
    first = run_all(engine, {"p1": {"prompt": prompt, "max_tokens": 12}})["p1"]
    again = run_all(engine, {"p2": {"prompt": prompt, "max_tokens": 12}})["p2"]
    assert again["tokens"] == first["tokens"]
    cached = again["done"]["cached_tokens"]
    # Whole prompt cached but the last token (the whole blocks, then the head of the first
    # run's partly filled last block): the first sampled token still gets fresh logits.
    assert cached == len(prompt) - 1
    assert again["done"]["timings"]["prefill_ms"] < first["done"]["timings"]["prefill_ms"] / 3


def test_next_chat_turn_prefills_only_the_new_tokens(engine, reference: dict) -> None:  # type: ignore[no-untyped-def]
    turn1 = _long_prompt(reference)[:-5]
    r1 = run_all(engine, {"t1": {"prompt": turn1, "max_tokens": 70}})["t1"]
    turn2 = turn1 + r1["tokens"] + [2, 198, 1, 4093, 198, 1780, 314, 2, 198, 1, 520, 9531, 198]
    r2 = run_all(engine, {"t2": {"prompt": turn2, "max_tokens": 8}})["t2"]
    # Blocks filled by turn 1's generated tokens are reused too.
    assert r2["done"]["cached_tokens"] >= (len(turn1) + 64) // BLOCK * BLOCK - BLOCK
    assert r2["done"]["cached_tokens"] > len(turn1) // BLOCK * BLOCK - 1
    cold = run_all(engine, {"cold": {"prompt": [1, 2, *turn2[2:]], "max_tokens": 8}})["cold"]
    assert cold["done"]["cached_tokens"] == 0  # a different second token shares nothing


def test_shared_system_prompt_is_prefilled_once_for_many_requests(engine, reference: dict) -> None:  # type: ignore[no-untyped-def]
    system = _long_prompt(reference)[:600]
    reqs = {
        f"q{i}": {"prompt": system + [198, 100 + i, 200 + i, 198], "max_tokens": 4}
        for i in range(4)
    }
    # The warm request runs past the system prompt's last partial block, so that block is
    # cached too: each request reuses the whole system prompt, not only its whole blocks.
    run_all(engine, {"warm": {"prompt": system + [198], "max_tokens": 40}})
    before = engine.stats()
    results = run_all(engine, reqs)
    for r in results.values():
        assert 600 <= r["done"]["cached_tokens"] < r["done"]["prompt_tokens"]
    stats = engine.stats()
    assert stats["prefix_cache_hits"] - before["prefix_cache_hits"] == 4
    assert stats["prefix_partial_tokens"] - before["prefix_partial_tokens"] >= 4 * (600 % BLOCK)


def test_cached_prefix_output_equals_uncached_engine(model_path, reference: dict) -> None:  # type: ignore[no-untyped-def]
    """Reused KV is bit-identical to recomputed KV: a fresh engine gives the same tokens."""
    import llmd._engine as native

    prompt = _long_prompt(reference)
    warm = native.Engine(str(model_path), context_length=2048)
    run_all(warm, {"a": {"prompt": prompt[:700], "max_tokens": 1}})
    reused = run_all(warm, {"b": {"prompt": prompt, "max_tokens": 16}})["b"]
    assert reused["done"]["cached_tokens"] > 0
    fresh = native.Engine(str(model_path), context_length=2048)
    plain = run_all(fresh, {"c": {"prompt": prompt, "max_tokens": 16}})["c"]
    assert plain["done"]["cached_tokens"] == 0
    assert reused["tokens"] == plain["tokens"]


def test_partly_shared_block_is_reused_token_by_token_with_the_same_output(
    model_path, reference: dict
) -> None:  # type: ignore[no-untyped-def]
    """Two prompts sharing 40 tokens (less than a block) then differing: the second reuses
    exactly those 40 positions from the first's cached block (a copy of it, so the first's
    block is untouched) and generates what a fresh engine generates; a head shorter than the
    minimum is not reused."""
    import llmd._engine as native

    long = _long_prompt(reference)
    first = long[:100]
    second = long[:40] + long[300:360]
    warm = native.Engine(str(model_path), context_length=2048)
    a = run_all(warm, {"a": {"prompt": first, "max_tokens": 8}})["a"]
    b = run_all(warm, {"b": {"prompt": second, "max_tokens": 16}})["b"]
    assert b["done"]["cached_tokens"] == 40
    assert warm.stats()["prefix_partial_tokens"] == 40
    fresh = native.Engine(str(model_path), context_length=2048)
    plain = run_all(fresh, {"c": {"prompt": second, "max_tokens": 16}})["c"]
    assert plain["done"]["cached_tokens"] == 0
    assert b["tokens"] == plain["tokens"]
    # The source block still serves its own prefix unchanged.
    again = run_all(warm, {"a2": {"prompt": first, "max_tokens": 8}})["a2"]
    assert again["done"]["cached_tokens"] >= BLOCK and again["tokens"] == a["tokens"]
    short = long[:5] + long[500:560]
    assert (
        run_all(warm, {"s": {"prompt": short, "max_tokens": 2}})["s"]["done"]["cached_tokens"] == 0
    )


def test_preamble_shorter_than_a_block_is_reused_from_a_finished_request(
    engine, model_path, reference: dict
) -> None:  # type: ignore[no-untyped-def]
    """Requests that share only a preamble shorter than a block (a chat template and system
    prompt, as an app's requests do) reuse it from a finished request's partly filled last
    block, as mlx-lm's and llama-server's prompt caches do, and give a fresh engine's tokens."""
    import llmd._engine as native

    long = _long_prompt(reference)
    preamble = long[:30]
    run_all(engine, {"a": {"prompt": preamble + long[100:115], "max_tokens": 4}})
    second = preamble + long[200:218]
    b = run_all(engine, {"b": {"prompt": second, "max_tokens": 8}})["b"]
    assert b["done"]["cached_tokens"] == 30
    fresh = native.Engine(str(model_path), context_length=2048)
    plain = run_all(fresh, {"c": {"prompt": second, "max_tokens": 8}})["c"]
    assert plain["done"]["cached_tokens"] == 0
    assert b["tokens"] == plain["tokens"]


def test_tight_kv_budget_evicts_old_prefixes_and_keeps_serving(model_path, reference: dict) -> None:  # type: ignore[no-untyped-def]
    import llmd._engine as native

    block_bytes = BLOCK_BYTES
    small = native.Engine(str(model_path), context_length=2048, kv_budget_bytes=24 * block_bytes)
    prompt = _long_prompt(reference)  # ~17 blocks: two different prompts cannot both stay cached
    a = run_all(small, {"a": {"prompt": prompt, "max_tokens": 4}})["a"]
    b = run_all(small, {"b": {"prompt": [1, 5, *prompt[2:]], "max_tokens": 4}})["b"]
    assert a["done"]["finish_reason"] == b["done"]["finish_reason"] == "length"
    again = run_all(small, {"a2": {"prompt": prompt, "max_tokens": 4}})["a2"]
    assert again["tokens"] == a["tokens"]
    assert again["done"]["cached_tokens"] < (len(prompt) - 1) // BLOCK * BLOCK  # partly evicted
    assert small.stats()["kv_bytes"] <= 24 * block_bytes


def test_named_session_keeps_its_kv_through_cache_pressure_until_unpinned(
    model_path, reference: dict
) -> None:  # type: ignore[no-untyped-def]
    """A session's blocks survive other requests that evict every idle block; once unpinned
    they are ordinary cache again and the same pressure evicts them."""
    import llmd._engine as native

    block_bytes = BLOCK_BYTES
    long = _long_prompt(reference)
    ours = long[:700]
    others = [[1, 7 + i, *long[300:998]] for i in range(2)]  # same length, different prefixes

    def pressure(engine) -> None:  # type: ignore[no-untyped-def]
        for i, p in enumerate(others):
            run_all(engine, {f"o{i}": {"prompt": p, "max_tokens": 2}})

    for pinned in (True, False):
        e = native.Engine(str(model_path), context_length=2048, kv_budget_bytes=24 * block_bytes)
        first = run_all(e, {"s1": {"prompt": ours, "max_tokens": 4, "session": "chat-1"}})["s1"]
        stats = e.stats()
        assert stats["pinned_sessions"] == 1 and stats["pinned_blocks"] == len(ours) // BLOCK
        if not pinned:
            e.unpin("chat-1")
        pressure(e)
        turn2 = ours + first["tokens"] + [198, 504]
        again = run_all(e, {"s2": {"prompt": turn2, "max_tokens": 2, "session": "chat-1"}})["s2"]
        if pinned:
            assert again["done"]["cached_tokens"] >= len(ours) // BLOCK * BLOCK
        else:
            assert again["done"]["cached_tokens"] < len(ours) // BLOCK * BLOCK
            assert e.stats()["pinned_sessions"] == 1  # turn 2 pinned it again
