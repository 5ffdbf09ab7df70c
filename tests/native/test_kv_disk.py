"""The prefix cache's disk tier (native/core/kv_disk.h): KV blocks written under a directory
are loaded by a later engine (a restarted worker, a reloaded model) or after eviction from
RAM, give the same greedy tokens as a cold prefill, and are never served when corrupt, from
another model file or of another KV type; the directory stays under its bound."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import run_all

BLOCK = 64
DIGEST = "sha256:" + "ab" * 32  # stands for the model file's digest (the store passes it)


def _long_prompt(reference: dict) -> list[int]:
    return next(c["prompt_ids"] for c in reference["cases"] if c["name"] == "long_1000")


def _prompt(reference: dict) -> list[int]:
    """Six full blocks and a few tokens: enough chain for the tests that need no long one."""
    return _long_prompt(reference)[:400]


def _engine(model_path: Path, disk: Path, **options):  # type: ignore[no-untyped-def]
    native = pytest.importorskip("llmd._engine")
    settings = {
        "context_length": 2048,
        "kv_disk_dir": str(disk),
        "kv_disk_bytes": 1 << 30,
        "model_digest": DIGEST,
        "backend": "cpu",
        **options,
    }
    return native.Engine(str(model_path), **settings)


def _generate(engine, prompt: list[int], rid: str = "r", max_tokens: int = 16) -> dict:  # type: ignore[no-untyped-def]
    result = run_all(engine, {rid: {"prompt": prompt, "max_tokens": max_tokens}})[rid]
    engine.flush_kv_disk()  # what it wrote is on disk before the next engine looks
    return result


def _block_files(disk: Path) -> list[Path]:
    return sorted(disk.rglob("*.kvb"))


def test_a_new_engine_loads_the_prefix_from_disk_with_the_cold_tokens(
    model_path, reference, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    prompt = _long_prompt(reference)
    first = _engine(model_path, tmp_path)
    cold = _generate(first, prompt)
    assert cold["done"]["cached_tokens"] == 0
    written = first.stats()["kv_disk"]
    assert written["enabled"] and written["written_blocks"] >= len(prompt) // BLOCK
    del first  # the worker's engine goes away (restart, unload)

    second = _engine(model_path, tmp_path)
    warm = _generate(second, prompt, "again")
    assert warm["tokens"] == cold["tokens"]
    assert warm["done"]["cached_tokens"] == (len(prompt) - 1) // BLOCK * BLOCK
    disk = second.stats()["kv_disk"]
    assert disk["hits"] == 1 and disk["hit_tokens"] == warm["done"]["cached_tokens"]
    assert disk["read_blocks"] == (len(prompt) - 1) // BLOCK and disk["read_bytes"] > 0
    assert warm["done"]["timings"]["prefill_ms"] < cold["done"]["timings"]["prefill_ms"] / 2


def test_blocks_evicted_from_ram_come_back_from_disk(model_path, reference, tmp_path) -> None:  # type: ignore[no-untyped-def]
    prompt = _long_prompt(reference)
    # Room for 20 blocks: the second prompt evicts the first one's blocks from RAM.
    engine = _engine(model_path, tmp_path, kv_budget_bytes=20 * 1_474_560)
    cold = _generate(engine, prompt, "a")
    _generate(engine, [7, *prompt[1:]], "b")
    again = _generate(engine, prompt, "c")
    assert again["tokens"] == cold["tokens"]
    assert again["done"]["cached_tokens"] == (len(prompt) - 1) // BLOCK * BLOCK
    assert engine.stats()["kv_disk"]["hits"] >= 1


def test_a_corrupt_or_torn_file_is_ignored_and_deleted(model_path, reference, tmp_path) -> None:  # type: ignore[no-untyped-def]
    prompt = _prompt(reference)
    first = _engine(model_path, tmp_path)
    cold = _generate(first, prompt)
    del first
    # The chain's third block: one flipped byte in its KV; its fifth: cut short (a crash
    # mid-write or a full disk). Which file holds which block is read from the files' order
    # of writing, so find the third and fifth by modification time.
    files = sorted(_block_files(tmp_path), key=lambda p: p.stat().st_mtime_ns)
    flipped, torn = files[2], files[4]
    data = bytearray(flipped.read_bytes())
    data[len(data) // 2] ^= 0x40
    flipped.write_bytes(bytes(data))
    torn.write_bytes(torn.read_bytes()[:100_000])

    second = _engine(model_path, tmp_path)
    warm = _generate(second, prompt, "again")
    assert warm["tokens"] == cold["tokens"]  # recomputed, not served from the bad file
    assert warm["done"]["cached_tokens"] == 2 * BLOCK  # the two intact blocks before it
    assert second.stats()["kv_disk"]["corrupt_files"] == 1
    # Deleted, and written again from the recomputed KV.
    assert second.stats()["kv_disk"]["written_blocks"] >= 1
    assert flipped.read_bytes() != bytes(data)


def test_another_model_file_or_kv_type_never_matches(model_path, reference, tmp_path) -> None:  # type: ignore[no-untyped-def]
    prompt = _prompt(reference)
    f16 = _engine(model_path, tmp_path)
    _generate(f16, prompt)
    other_model = _engine(model_path, tmp_path, model_digest="sha256:" + "cd" * 32)
    assert _generate(other_model, prompt, "m")["done"]["cached_tokens"] == 0
    assert other_model.stats()["kv_disk"]["hits"] == 0
    other_type = _engine(model_path, tmp_path, kv_type="q8_0")
    assert _generate(other_type, prompt, "t")["done"]["cached_tokens"] == 0
    dirs = {f16.stats()["kv_disk"]["dir"], other_model.stats()["kv_disk"]["dir"]}
    assert len(dirs | {other_type.stats()["kv_disk"]["dir"]}) == 3
    # Even this model's files put where the other model's go (same names: same prefix) are
    # refused: each file names its identity and the reader checks it.
    f16_dir = Path(f16.stats()["kv_disk"]["dir"])
    other_dir = Path(other_model.stats()["kv_disk"]["dir"])
    for f in f16_dir.glob("*.kvb"):
        (other_dir / f.name).write_bytes(f.read_bytes())
    again = _engine(model_path, tmp_path, model_digest="sha256:" + "cd" * 32)
    assert _generate(again, prompt, "m2")["done"]["cached_tokens"] == 0
    assert again.stats()["kv_disk"]["corrupt_files"] == 0  # intact, only not its own


def test_the_bound_holds_and_keeps_the_most_recent_prefix(model_path, reference, tmp_path) -> None:  # type: ignore[no-untyped-def]
    prompt = _prompt(reference)
    block_file = 1_474_560 + 1024  # a block's KV plus the file's header, at most
    bound = 10 * block_file
    engine = _engine(model_path, tmp_path, kv_disk_bytes=bound)
    for i in range(4):  # 4 x 6 blocks, far past the bound
        _generate(engine, [1, 100 + i, *prompt[2:]], f"p{i}", max_tokens=1)
    on_disk = sum(f.stat().st_size for f in _block_files(tmp_path))
    assert on_disk <= bound
    stats = engine.stats()["kv_disk"]
    assert stats["evicted_files"] > 0 and stats["bytes"] <= bound
    del engine
    # The latest prompt survived (least recently used files went first).
    fresh = _engine(model_path, tmp_path, kv_disk_bytes=bound)
    last = _generate(fresh, [1, 103, *prompt[2:]], "last", max_tokens=1)
    assert last["done"]["cached_tokens"] == (len(prompt) - 1) // BLOCK * BLOCK


def _gemma3_engine(checkpoint: Path, disk: Path):  # type: ignore[no-untyped-def]
    from llmd.worker.host import hf_config

    return _engine(
        checkpoint,
        disk,
        context_length=1024,
        kv_budget_bytes=16 << 20,
        hf_config=hf_config(str(checkpoint)),
    )


def test_a_sliding_window_model_loads_its_prefix_and_only_the_window_it_reads(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The tiny Gemma 3 (two sliding layers with a 5-position window, one full layer): a new
    engine (a restarted worker) loads every block's full-attention layers from disk but the
    sliding layers' window parts only for the window before the reuse point, and gives the
    cold tokens; without that window's part on disk, the reuse point moves back a block."""
    from .tiny_models import LONG_TOKENS, write_checkpoint

    checkpoint = tmp_path / "gemma3"
    write_checkpoint(checkpoint, "gemma3_text")
    disk = tmp_path / "kv"
    first = _gemma3_engine(checkpoint, disk)
    assert first.stats()["kv_disk"]["enabled"], first.stats()["kv_disk"]
    cold = _generate(first, LONG_TOKENS)  # 300 tokens: 4 full blocks
    full_dir = Path(first.stats()["kv_disk"]["dir"])
    del first
    (window_dir,) = [d for d in disk.iterdir() if d != full_dir]
    # Every block's full-attention layers; window parts of the blocks that still had one when
    # they were written, as in RAM: the window and the pool's two-block margin at the end of
    # the prefill (blocks 2 and 3).
    assert len(list(full_dir.glob("*.kvb"))) == 4
    assert len(list(window_dir.glob("*.kvb"))) == 2

    second = _gemma3_engine(checkpoint, disk)
    warm = _generate(second, LONG_TOKENS, "again")
    assert warm["tokens"] == cold["tokens"]
    assert warm["done"]["cached_tokens"] == 4 * BLOCK
    stats = second.stats()["kv_disk"]
    assert stats["hits"] == 1 and stats["hit_tokens"] == 4 * BLOCK
    assert stats["read_blocks"] == 4 + 1  # the last block's window part: positions 252..255
    del second

    # The fourth block's window part gone: its prefix cannot continue there; three blocks
    # (and the third's window part) still can.
    last = sorted(full_dir.glob("*.kvb"), key=lambda p: p.stat().st_mtime_ns)[3].name
    (window_dir / last).unlink()
    third = _gemma3_engine(checkpoint, disk)
    again = _generate(third, LONG_TOKENS, "third")
    assert again["tokens"] == cold["tokens"]
    assert again["done"]["cached_tokens"] == 3 * BLOCK
    assert third.stats()["kv_disk"]["hit_tokens"] == 3 * BLOCK
    del third

    # The next turn of the conversation (the prompt and more): from disk, then as a cold
    # engine without the tier computes it. The third engine rewrote the fourth block's part.
    turn = [*LONG_TOKENS, *cold["tokens"], 5, 9, 77, 31]
    fourth = _gemma3_engine(checkpoint, disk)
    resumed = _generate(fourth, turn, "turn")
    assert resumed["done"]["cached_tokens"] == 4 * BLOCK
    plain = _gemma3_engine(checkpoint, tmp_path / "other")
    assert resumed["tokens"] == _generate(plain, turn, "plain")["tokens"]
