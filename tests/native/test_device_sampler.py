"""Sampling on the device (native/mlx/device_sampler.h): decode rows whose request needs
nothing else of the logits get their token picked where the logits are, from the distribution
the host sampler draws from, with the same seeded draws, so a seed gives the same tokens on
either; requests that need the logits on the host (logprobs here) keep the host sampler."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from .conftest import run_all
from .test_speculative import _exact

native = pytest.importorskip("llmd._engine")

SETTINGS = [
    {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0},
    {"temperature": 0.6, "top_k": 5, "top_p": 1.0, "min_p": 0.0},
    {"temperature": 1.3, "top_k": 0, "top_p": 0.8, "min_p": 0.0},
    {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.2},
    {"temperature": 0.9, "top_k": 8, "top_p": 0.7, "min_p": 0.05},
]


@pytest.mark.parametrize("params", SETTINGS)
def test_device_sampler_draws_the_host_samplers_distribution(params: dict) -> None:
    """200k seeded draws of one row of logits: each token's frequency sits within 5 standard
    errors of the exact probability (nothing outside the kept set), and the same seed gives
    the host sampler's counts (the same uniform draws pick the same tokens)."""
    rng = np.random.default_rng(3)
    logits = rng.normal(0, 2, size=40).astype(np.float32)
    p = _exact(logits.astype(np.float64), **params)
    draws = 200_000
    counts = np.array(native.device_sample_counts(logits.tolist(), draws, seed=5, **params))
    freq = counts / draws
    se = np.sqrt(p * (1 - p) / draws) + 1e-9
    assert np.all(np.abs(freq - p) <= 5 * se + 1e-4), (freq, p)
    assert counts[p == 0].sum() == 0
    host = np.array(native.sample_counts(logits.tolist(), -1, draws, seed=5, **params))
    assert np.abs(counts - host).sum() <= draws * 1e-4  # float32 vs float64 sums at a boundary


def test_device_sampler_greedy_is_the_first_largest_logit() -> None:
    logits = [0.5, 2.0, -1.0, 2.0, 1.0]
    assert native.device_sample_counts(logits, 3, temperature=0.0) == [0, 3, 0, 0, 0]
    assert native.device_sample_counts(logits, 2, temperature=1.0, top_k=1) == [0, 2, 0, 0, 0]


# The llama family (Qwen3), Gemma 4 (sliding and full layers, KV sharing, per-layer inputs)
# and Qwen3.5-MoE (recurrent linear-attention layers beside full attention): each forward
# takes the step's sampling.
@pytest.fixture(scope="module", params=["qwen3", "gemma4_text", "qwen3_5_moe_text"])
def tiny_engine(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    from llmd.worker.host import hf_config

    from .tiny_models import write_checkpoint

    path: Path = tmp_path_factory.mktemp("tiny_sampler") / request.param
    write_checkpoint(path, request.param)
    return native.Engine(
        str(path),
        context_length=256,
        max_sequences=8,
        kv_budget_bytes=16 << 20,
        backend="mlx-cpu",
        hf_config=hf_config(str(path)),
    )


def test_decode_tokens_are_sampled_on_the_device_with_the_host_samplers_tokens(tiny_engine) -> None:  # type: ignore[no-untyped-def]
    """Through the engine (MLX's device path): greedy and seeded sampled requests give the same
    tokens whether their decode rows are sampled on the device (plain requests) or on the host
    (asking for logprobs needs the logits row), and the stats say which sampler ran."""
    from .tiny_models import TOKENS

    n = 8
    sampled = {"temperature": 0.9, "top_k": 20, "top_p": 0.9}
    requests = {"greedy": {"prompt": TOKENS, "max_tokens": n}}
    requests |= {
        f"s{seed}": {"prompt": TOKENS, "max_tokens": n, "seed": seed, **sampled}
        for seed in range(12)
    }
    before = tiny_engine.stats()["sampler"]
    device = run_all(tiny_engine, requests)
    middle = tiny_engine.stats()["sampler"]
    host = run_all(tiny_engine, {rid: {**r, "top_logprobs": 0} for rid, r in requests.items()})
    after = tiny_engine.stats()["sampler"]
    # Each request's first token comes from its prompt's logits (host); the rest from decode rows.
    assert middle["device"] - before["device"] == len(requests) * (n - 1)
    assert middle["host"] - before["host"] == len(requests)
    assert after["device"] == middle["device"]
    assert after["host"] - middle["host"] == len(requests) * n
    same = [rid for rid in requests if device[rid]["tokens"] == host[rid]["tokens"]]
    assert "greedy" in same
    assert len(same) >= len(requests) - 1, {
        rid: (device[rid]["tokens"], host[rid]["tokens"]) for rid in requests
    }
    # Sampling did sample: the seeds do not all give one sequence.
    assert len({tuple(device[f"s{seed}"]["tokens"]) for seed in range(12)}) > 3
