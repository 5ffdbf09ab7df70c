"""The disk tier for a model with recurrent state (Qwen3.5-MoE's Gated DeltaNet layers, on the
tiny fixture): a prefix resumes only from a snapshot of the recurrent state at its end, so the
snapshots the prefix cache keeps (the prompt's last block boundary, and the latest one a
sequence reached) are written beside the blocks and loaded with them. A new engine (a restarted
worker) then gives the cold tokens from disk; a torn snapshot is ignored and the prefix
recomputed; the next turn of a conversation resumes from the snapshot its previous turn left."""

from __future__ import annotations

from pathlib import Path

import pytest

from .conftest import run_all
from .tiny_models import LONG_TOKENS, write_checkpoint

native = pytest.importorskip("llmd._engine")

BLOCK = 64
DIGEST = "sha256:" + "ef" * 32


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("qwen3_5_moe")
    write_checkpoint(path, "qwen3_5_moe_text")
    return path


def _engine(path: Path, backend: str, disk: Path, **kw):  # type: ignore[no-untyped-def]
    from llmd.worker.host import hf_config

    opts = {
        "context_length": 512,
        "kv_budget_bytes": 16 << 20,
        "kv_disk_dir": str(disk),
        "kv_disk_bytes": 1 << 30,
        "model_digest": DIGEST,
        **kw,
    }
    return native.Engine(str(path), backend=backend, hf_config=hf_config(str(path)), **opts)


def _generate(engine, prompt: list[int], rid: str, max_tokens: int) -> dict:  # type: ignore[no-untyped-def]
    result = run_all(engine, {rid: {"prompt": prompt, "max_tokens": max_tokens}})[rid]
    engine.flush_kv_disk()
    return result


@pytest.mark.parametrize("backend", ["cpu", "mlx-cpu"])
def test_a_restarted_engine_resumes_the_prefix_from_its_state_snapshot(
    checkpoint, tmp_path, backend
) -> None:  # type: ignore[no-untyped-def]
    disk = tmp_path / "kv"
    # 300 tokens: the prompt's last block boundary is 256 (4 blocks); 24 tokens more reach 320,
    # the boundary the sequence's latest snapshot is kept at.
    first = _engine(checkpoint, backend, disk)
    stats = first.stats()["kv_disk"]
    assert stats["enabled"], stats
    cold = _generate(first, LONG_TOKENS, "cold", 24)
    assert cold["done"]["cached_tokens"] == 0
    block_dir = Path(first.stats()["kv_disk"]["dir"])
    del first
    (state_dir,) = [d for d in disk.iterdir() if d != block_dir]
    assert len(list(block_dir.glob("*.kvb"))) == 5  # blocks 0-4: the prompt's and the answer's
    assert len(list(state_dir.glob("*.kvb"))) == 2  # snapshots at 256 and 320

    second = _engine(checkpoint, backend, disk)
    warm = _generate(second, LONG_TOKENS, "warm", 24)
    assert warm["tokens"] == cold["tokens"]
    assert warm["done"]["cached_tokens"] == 4 * BLOCK
    stats = second.stats()["kv_disk"]
    assert stats["hits"] == 1 and stats["hit_tokens"] == 4 * BLOCK and stats["state_hits"] == 1
    del second

    # The conversation's next turn: the prompt, the answer and more, resumed from the snapshot
    # at 320 that the first engine left, with the tokens an engine without the tier computes.
    turn = [*LONG_TOKENS, *cold["tokens"], 5, 9, 77, 31]
    third = _engine(checkpoint, backend, disk)
    resumed = _generate(third, turn, "turn", 8)
    assert resumed["done"]["cached_tokens"] == 5 * BLOCK
    assert third.stats()["kv_disk"]["state_hits"] == 1
    plain = _engine(checkpoint, backend, tmp_path / "other", kv_disk_bytes=0)
    assert resumed["tokens"] == _generate(plain, turn, "plain", 8)["tokens"]


def test_a_torn_state_snapshot_is_ignored_and_the_prefix_recomputed(checkpoint, tmp_path) -> None:  # type: ignore[no-untyped-def]
    disk = tmp_path / "kv"
    first = _engine(checkpoint, "cpu", disk)
    cold = _generate(first, LONG_TOKENS, "cold", 12)
    block_dir = Path(first.stats()["kv_disk"]["dir"])
    del first
    (state_dir,) = [d for d in disk.iterdir() if d != block_dir]
    (snapshot,) = state_dir.glob("*.kvb")  # at 256, the prompt's last block boundary
    snapshot.write_bytes(snapshot.read_bytes()[:1000])  # a crash mid-write

    second = _engine(checkpoint, "cpu", disk)
    again = _generate(second, LONG_TOKENS, "again", 12)
    assert again["tokens"] == cold["tokens"]
    # Without a state at any boundary the blocks are of no use: nothing is reused.
    assert again["done"]["cached_tokens"] == 0
    stats = second.stats()["kv_disk"]
    assert stats["corrupt_files"] == 1 and stats["hits"] == 0 and stats["state_hits"] == 0
    del second
    # Written again from the recomputed prefix: the next engine resumes from it.
    third = _engine(checkpoint, "cpu", disk)
    assert _generate(third, LONG_TOKENS, "third", 12)["done"]["cached_tokens"] == 4 * BLOCK
