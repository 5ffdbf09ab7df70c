"""The disk tier on the device path (KV in MLX arrays, native/mlx/device_attention.h), run on
MLX's CPU device ("mlx-cpu") as the other device-path tests are: blocks written from the device
store come back into it for a new engine (a restarted worker, a reloaded model) and after
eviction from RAM, quantized KV included, with the greedy tokens of a cold prefill; files of
another KV type, another model file or the CPU backend's layout are never served.

The model is the tiny random Qwen3 checkpoint of tiny_models.py, not the test model: what is
checked here is block bookkeeping, file identity and that reloaded KV decodes exactly as the
computed one did, which any model shows, and MLX's CPU device prefills the test model at ~7
tokens/s (its quantized matmul runs row by row): these tests took ~150 s of the suite with it.
The disk tier on the test model is tests/native/test_kv_disk.py's (CPU backend) and
tests/integration/test_kv_disk_served.py's (served)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from .conftest import run_all
from .test_kv_disk import _engine as _cpu_backend_engine
from .tiny_models import CONFIGS, write_checkpoint

BLOCK = 64
ARCH = "qwen3"


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny") / ARCH
    write_checkpoint(path, ARCH)
    return path


@pytest.fixture(scope="module")
def prompt() -> list[int]:
    """Two full blocks and a few tokens of the tiny vocabulary (no BOS/EOS ids)."""
    rng = np.random.default_rng(7)
    return rng.integers(3, CONFIGS[ARCH]["vocab_size"], size=2 * BLOCK + 6).tolist()


def _engine(model_path: Path, disk: Path, **options):  # type: ignore[no-untyped-def]
    """test_kv_disk's engine on the device path, within the tiny model's trained context."""
    from llmd.worker.host import hf_config

    context = CONFIGS[ARCH]["max_position_embeddings"]
    options = {
        "context_length": context,
        "backend": "mlx-cpu",
        "hf_config": hf_config(str(model_path)),
        **options,
    }
    return _cpu_backend_engine(model_path, disk, **options)


def _generate(engine, prompt: list[int], rid: str, max_tokens: int = 12) -> dict:  # type: ignore[no-untyped-def]
    result = run_all(engine, {rid: {"prompt": prompt, "max_tokens": max_tokens}})[rid]
    engine.flush_kv_disk()
    return result


@pytest.mark.parametrize("kv_type", ["f16", "q8_0"])
def test_a_new_device_engine_loads_the_prefix_into_its_store(
    model_path, prompt, tmp_path, kv_type
) -> None:  # type: ignore[no-untyped-def]
    first = _engine(model_path, tmp_path, kv_type=kv_type)
    assert first.info()["backend"] == "mlx-cpu"  # the device path, on MLX's CPU device
    disk = first.stats()["kv_disk"]
    assert disk["enabled"], disk
    cold = _generate(first, prompt, "cold")
    assert cold["done"]["cached_tokens"] == 0
    assert first.stats()["kv_disk"]["written_blocks"] == (len(prompt) - 1) // BLOCK
    del first

    second = _engine(model_path, tmp_path, kv_type=kv_type)
    warm = _generate(second, prompt, "warm")
    assert warm["tokens"] == cold["tokens"]
    assert warm["done"]["cached_tokens"] == (len(prompt) - 1) // BLOCK * BLOCK
    disk = second.stats()["kv_disk"]
    assert disk["hits"] == 1 and disk["hit_tokens"] == warm["done"]["cached_tokens"]
    assert disk["read_blocks"] == (len(prompt) - 1) // BLOCK and disk["loads"] == 1


def test_blocks_evicted_from_the_device_store_come_back_from_disk(
    model_path, prompt, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    probe = _engine(model_path, tmp_path / "probe")
    block_bytes = probe.kv_cache()["bytes_per_token"] * BLOCK
    del probe
    # Room for 4 blocks: the second prompt (3 blocks with its answer) evicts at least one of
    # the first one's 2 cached blocks, which then comes back from disk.
    engine = _engine(model_path, tmp_path, kv_budget_bytes=4 * block_bytes)
    cold = _generate(engine, prompt, "a")
    _generate(engine, [7, *prompt[1:]], "b")
    again = _generate(engine, prompt, "c")
    assert again["tokens"] == cold["tokens"]
    assert again["done"]["cached_tokens"] == (len(prompt) - 1) // BLOCK * BLOCK
    assert engine.stats()["kv_disk"]["hits"] >= 1


def test_device_files_never_match_another_type_model_or_the_cpu_layout(
    model_path, prompt, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    prompt = prompt[:70]  # one full block
    # The CPU backend with float32 KV: the same KV type as the device path on MLX's CPU
    # device, in another layout (transposed key tiles): its files must not be read there.
    cpu = _engine(model_path, tmp_path, backend="cpu", kv_type="f32")
    cold = _generate(cpu, prompt, "cpu")
    device = _engine(model_path, tmp_path)
    assert device.stats()["kv_disk"]["dir"] != cpu.stats()["kv_disk"]["dir"]
    assert _generate(device, prompt, "device")["done"]["cached_tokens"] == 0
    other_model = _engine(model_path, tmp_path, model_digest="sha256:" + "cd" * 32)
    assert _generate(other_model, prompt, "m")["done"]["cached_tokens"] == 0
    other_type = _engine(model_path, tmp_path, kv_type="q4_0")
    assert _generate(other_type, prompt, "t")["done"]["cached_tokens"] == 0
    dirs = {e.stats()["kv_disk"]["dir"] for e in (cpu, device, other_model, other_type)}
    assert len(dirs) == 4
    # The device's own files put where the CPU backend reads (the same names: the same
    # prefix) are never served: each file names its identity and the reader checks it.
    cpu_dir = Path(cpu.stats()["kv_disk"]["dir"])
    copied = list(Path(device.stats()["kv_disk"]["dir"]).glob("*.kvb"))
    assert copied
    for f in copied:
        (cpu_dir / f.name).write_bytes(f.read_bytes())
    del cpu
    again = _engine(model_path, tmp_path, backend="cpu", kv_type="f32")
    served = _generate(again, prompt, "cpu2")
    assert served["done"]["cached_tokens"] == 0
    assert served["tokens"] == cold["tokens"]
