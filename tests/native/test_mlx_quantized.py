"""MLX-quantized safetensors (mlx-lm's `convert -q` layout: `quantization` {group_size, bits}
in config.json, each quantized module X as X.weight uint32-packed, X.scales, X.biases with
w = scale * q + bias per group) load without expanding to float.

Reference: the float32 checkpoint of the values the quantized one dequantizes to
(mx.dequantize), written beside it by tiny_models.write_mlx_quantized_checkpoint.

- "mlx-cpu" (the device backend, MLX's quantized_matmul) and 8-bit weights on "cpu" (MLX's
  quantized_matmul on the CPU: no GGUF type is 8-bit affine with a bias) give the reference's
  logits to fp32 tolerance.
- 4-bit weights on "cpu" are repacked into GGUF Q4_1 blocks for llmd's kernels. The repack is
  exact (scales and biases are bf16 values, which float16 holds exactly here), checked by
  loading the same blocks written as a Q4_1 GGUF: the logits agree to fp32 tolerance. Against
  the float reference they differ by the kernels' own error (activations quantized to int8
  rows, as for every GGUF model on this backend): bounded by Q4_1_KERNEL_BOUND.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from .conftest import generate_in_worker, run_all
from .tiny_models import (
    CONFIGS,
    TOKENS,
    write_gguf,
    write_mlx_lm_gemma4,
    write_mlx_lm_qwen3_5_moe,
    write_mlx_quantized_checkpoint,
)

native = pytest.importorskip("llmd._engine")
pytest.importorskip("mlx.core")

ARCHS = ["qwen2", "qwen3", "gemma3_text"]
BACKENDS = ["cpu", "mlx-cpu"]
TIGHT = 1e-4
# llmd's Q4_1 kernels quantize activation rows to int8 (as llama.cpp's do); measured
# 1.5e-2 (qwen2) .. 4.5e-2 (gemma3) of the logits' scale on these tiny models.
Q4_1_KERNEL_BOUND = 8e-2
# (bits, group_size): the tiny models' widths are 64 and 96, so groups of 64 leave the
# 96-wide down projection float (as mlx-lm does) and groups of 128 need the wider config.
SCHEMES = [(4, 32), (4, 64), (8, 32), (8, 64), (4, 128), (8, 128)]


def _config(arch: str, group: int) -> dict:
    c = dict(CONFIGS[arch])
    if group == 128:
        c.update(hidden_size=128, intermediate_size=256)
        if "head_dim" not in c:
            c["head_dim"] = 32
    return c


def _engine(path: Path, backend: str, **kw):  # type: ignore[no-untyped-def]
    from llmd.worker.host import hf_config

    return native.Engine(
        str(path),
        context_length=256,
        max_sequences=8,
        kv_budget_bytes=16 << 20,
        backend=backend,
        hf_config=hf_config(str(path)),
        **kw,
    )


def _max_rel(ours: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(ours - ref).max() / np.abs(ref).max())


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("mlxq")
    out = {}
    for arch in ARCHS:
        for bits, group in SCHEMES:
            q, d = root / f"{arch}-{bits}g{group}", root / f"{arch}-{bits}g{group}-dq"
            write_mlx_quantized_checkpoint(q, d, arch, bits, group, config=_config(arch, group))
            out[arch, bits, group] = (q, d)
    return out


def _quantized_layers(arch: str, group: int) -> list[str]:
    """The engine's layer names whose weights mlx-lm quantizes at this group size."""
    c = _config(arch, group)
    names = [
        f"blk.{i}.{n}" for i in range(c["num_hidden_layers"]) for n in ("attn_qkv", "ffn_gate_up")
    ]
    if c["intermediate_size"] % group == 0:
        names += [f"blk.{i}.ffn_down" for i in range(c["num_hidden_layers"])]
    return [*names, "output"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("bits", "group"), SCHEMES)
@pytest.mark.parametrize("arch", ARCHS)
def test_quantized_logits_paths_and_memory(
    checkpoints, arch: str, bits: int, group: int, backend: str
) -> None:  # type: ignore[no-untyped-def]
    q, d = checkpoints[arch, bits, group]
    engine, ref_engine = _engine(q, backend), _engine(d, backend)
    info = engine.info()
    assert info["weight_format"] == f"safetensors:mlx-affine{bits}g{group}"
    ours = engine.score(TOKENS, 1)[: len(TOKENS)]
    ref = ref_engine.score(TOKENS, 1)[: len(TOKENS)]
    chunked = engine.score(TOKENS, 12)[: len(TOKENS) - 11]
    q4_1 = backend == "cpu" and bits == 4
    bound = Q4_1_KERNEL_BOUND if q4_1 else TIGHT
    assert _max_rel(ours, ref) < bound, _max_rel(ours, ref)
    assert _max_rel(chunked, ours[11:]) < (Q4_1_KERNEL_BOUND if q4_1 else TIGHT)
    # Every quantized layer runs a quantized path: no float copy of it.
    paths = engine.matmul_paths()
    expected = "llmd:q4_1:" if q4_1 else f"mlx:qmm:affine{bits}g{group}:cpu"
    for name in _quantized_layers(arch, group):
        assert paths[name].startswith(expected), (name, paths[name])
    # Resident weights: packed values plus a float32 scale and bias per group (MLX's
    # format, also the embedding table's), or 20 bytes per 32 weights (Q4_1), against 32
    # bits per float weight.
    per_weight = max(5, bits + 64 / group) if q4_1 else bits + 64 / group
    assert info["weight_bytes"] <= ref_engine.info()["weight_bytes"] * max(per_weight / 32, 0.5)
    if group != 64:  # every matrix quantized
        assert info["weight_bytes"] <= ref_engine.info()["weight_bytes"] * per_weight / 32 * 1.01


@pytest.mark.parametrize("arch", ARCHS)
def test_q4_1_repack_is_exact(checkpoints, tmp_path: Path, arch: str) -> None:
    """The CPU backend's Q4_1 blocks equal those of a Q4_1 GGUF made from the same MLX groups:
    same logits to fp32 tolerance (the GGUF loader is another path, so not bitwise)."""
    q, _ = checkpoints[arch, 4, 32]
    gguf = tmp_path / "q4_1.gguf"
    write_gguf(gguf, arch, quant="Q4_1-from-mlx")
    if arch == "gemma3_text":  # GGUF has no query_pre_attn_scalar (see test_architectures)
        cfg = json.loads((q / "config.json").read_text())
        cfg["query_pre_attn_scalar"] = cfg["head_dim"]
        (q / "config.json").write_text(json.dumps(cfg))
    try:
        ours = _engine(q, "cpu").score(TOKENS, 1)[: len(TOKENS)]
    finally:
        if arch == "gemma3_text":
            cfg.pop("query_pre_attn_scalar")
            (q / "config.json").write_text(json.dumps(cfg))
    engine = _engine(gguf, "cpu")
    assert engine.matmul_paths()["blk.0.attn_qkv"].startswith("llmd:q4_1:")
    theirs = engine.score(TOKENS, 1)[: len(TOKENS)]
    assert _max_rel(ours, theirs) < TIGHT, _max_rel(ours, theirs)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_equals_the_dequantized_reference(checkpoints, arch: str, backend: str) -> None:  # type: ignore[no-untyped-def]
    bits = 8 if backend == "cpu" else 4  # paths with fp32-exact products
    q, d = checkpoints[arch, bits, 64]
    prompt = TOKENS[:9]
    ours = run_all(_engine(q, backend), {"g": {"prompt": prompt, "max_tokens": 16}})["g"]["tokens"]
    ref = run_all(_engine(d, backend), {"g": {"prompt": prompt, "max_tokens": 16}})["g"]["tokens"]
    assert ours == ref


@pytest.mark.parametrize("backend", BACKENDS)
def test_per_module_settings_and_inexact_scales(tmp_path: Path, backend: str) -> None:
    """mlx-lm's per-module settings (8-bit groups of 32 in a 4-bit, 64 model) and scales that
    float16 cannot hold (no exact Q4_1 repack: MLX's kernel runs those layers on "cpu")."""
    q, d = tmp_path / "q", tmp_path / "dq"
    o_proj, gate = "model.layers.1.self_attn.o_proj", "model.layers.0.mlp.gate_proj"
    write_mlx_quantized_checkpoint(q, d, "qwen3", 4, 64, overrides={o_proj: (8, 32), gate: (4, 32)})
    engine = _engine(q, backend)
    paths = engine.matmul_paths()
    assert paths["blk.1.attn_output"] == "mlx:qmm:affine8g32:cpu"
    # gate (4-bit, 32) and up (4-bit, 64) stay quantized as two pieces; blk.1's stack is one.
    pieces = paths["blk.0.ffn_gate_up"].split("+")
    if backend == "cpu":
        assert len(pieces) == 2 and all(p.startswith("llmd:q4_1:") for p in pieces)
    else:
        assert pieces == ["mlx:qmm:affine4g32:cpu", "mlx:qmm:affine4g64:cpu"]
    assert paths["blk.1.ffn_gate_up"].startswith(
        "llmd:q4_1" if backend == "cpu" else "mlx:qmm:affine4g64"
    )
    bound = Q4_1_KERNEL_BOUND if backend == "cpu" else TIGHT
    ref = _engine(d, backend).score(TOKENS, 1)[: len(TOKENS)]
    assert _max_rel(engine.score(TOKENS, 1)[: len(TOKENS)], ref) < bound

    q, d = tmp_path / "nq", tmp_path / "ndq"
    write_mlx_quantized_checkpoint(q, d, "qwen3", 4, 32, nudge_scales=True)
    engine = _engine(q, backend)
    assert set(engine.matmul_paths().values()) == {"mlx:qmm:affine4g32:cpu"}
    ref = _engine(d, backend).score(TOKENS, 1)[: len(TOKENS)]
    assert _max_rel(engine.score(TOKENS, 1)[: len(TOKENS)], ref) < TIGHT


def test_worker_serves_an_mlx_quantized_directory(tmp_path: Path) -> None:
    """The worker, launched as the daemon launches it, generates the reference's tokens."""
    q, d = tmp_path / "q", tmp_path / "dq"
    write_mlx_quantized_checkpoint(q, d, "qwen3", 4, 32)
    prompt = TOKENS[:9]
    ref = run_all(_engine(d, "mlx-cpu"), {"g": {"prompt": prompt, "max_tokens": 16}})["g"]["tokens"]
    ready, tokens = generate_in_worker(q, "mlx-cpu", prompt, 16)
    assert ready["model"]["weight_format"] == "safetensors:mlx-affine4g32"
    assert tokens == ref


@pytest.mark.parametrize(
    ("quant", "message"),
    [
        ({"group_size": 64, "bits": 3}, "3 bits"),
        ({"group_size": 16, "bits": 4}, "group_size 16"),
        ({"group_size": 32, "bits": 4, "mode": "mxfp4"}, "mode 'mxfp4'"),
        ({"quant_method": "gptq", "bits": 4}, "'gptq'"),
        (
            {
                "group_size": 64,
                "bits": 4,
                "model.layers.0.mlp.up_proj": {"group_size": 64, "bits": 2},
            },
            "2 bits",
        ),
    ],
)
def test_unsupported_quantization_is_refused_naming_it(
    checkpoints, tmp_path: Path, quant: dict, message: str
) -> None:
    """At pull time (the config alone) and at load time."""
    from llmd.store.install import check_hf_config
    from llmd.store.manifests import UnsupportedModel

    q, _ = checkpoints["qwen3", 4, 64]
    config = {**json.loads((q / "config.json").read_text()), "quantization": quant}
    config.pop("quantization_config")
    with pytest.raises(UnsupportedModel, match=message):
        check_hf_config(config, "x")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps(config))
    (bad / "model.safetensors").symlink_to(q / "model.safetensors")
    with pytest.raises(RuntimeError, match=message):
        _engine(bad, "cpu")


def test_mlx_quantized_configs_of_every_architecture_pass_the_pull_check() -> None:
    from llmd.store.install import check_hf_config

    quant = {
        "group_size": 64,
        "bits": 4,
        "model.layers.0.router.proj": {"group_size": 64, "bits": 8},
    }
    for arch in ("qwen2", "qwen3", "gemma3_text", "qwen3_5_moe_text", "gemma4_text"):
        config = {**CONFIGS[arch], "quantization": quant, "quantization_config": quant}
        assert check_hf_config(config, "x") == CONFIGS[arch]["model_type"]


def _assert_matches_dequantized(  # type: ignore[no-untyped-def]
    engine, dequantized: Path, backend: str, q4_1: bool, argmax_share: float
) -> None:
    """Logits (and, when exact, greedy tokens) of a quantized MoE checkpoint against its
    dequantized float twin. With llmd's Q4_1 kernels (int8 activations) a near-tied routing
    choice can flip, so only the first position's logits and the argmax agreement at
    `argmax_share` of the positions are held to."""
    ours = engine.score(TOKENS, 1)[: len(TOKENS)]
    ref = _engine(dequantized, backend).score(TOKENS, 1)[: len(TOKENS)]
    if q4_1:
        assert _max_rel(ours[:1], ref[:1]) < Q4_1_KERNEL_BOUND
        assert (ours.argmax(1) == ref.argmax(1)).mean() >= argmax_share
    else:
        assert _max_rel(ours, ref) < TIGHT, _max_rel(ours, ref)
        prompt = TOKENS[:9]
        got = run_all(engine, {"g": {"prompt": prompt, "max_tokens": 12}})["g"]["tokens"]
        want = run_all(_engine(dequantized, backend), {"g": {"prompt": prompt, "max_tokens": 12}})
        assert got == want["g"]["tokens"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("bits", [4, 8])
def test_qwen3_5_moe_as_mlx_lm_saves_it(tmp_path: Path, bits: int, backend: str) -> None:
    """mlx-lm's layout (switch_mlp experts, conv1d [C, K, 1], norms holding 1 + w, 8-bit
    router): experts run gather_qmm, dense layers as above. On "cpu" with 4 bits the Q4_1
    kernels' activation error can flip a near-tied top-k routing choice, so that case is
    checked at the first position and by its argmax instead of at every position."""
    q, d = tmp_path / "q", tmp_path / "dq"
    write_mlx_lm_qwen3_5_moe(q, d, bits, 32)
    engine = _engine(q, backend)
    assert engine.info()["architecture"] == "qwen3_5_moe"
    paths = engine.matmul_paths()
    for i in range(4):
        assert paths[f"blk.{i}.ffn_gate_up_exps"] == f"mlx:gather_qmm:affine{bits}g32:cpu"
        assert paths[f"blk.{i}.ffn_down_exps"] == f"mlx:gather_qmm:affine{bits}g32:cpu"
        assert paths[f"blk.{i}.ffn_gate_inp"] == "mlx:qmm:affine8g64:cpu"
    q4_1 = backend == "cpu" and bits == 4
    dense = "llmd:q4_1:" if q4_1 else f"mlx:qmm:affine{bits}g32:cpu"
    for name in ("blk.0.ssm_in", "blk.0.ssm_out", "blk.3.attn_qkv", "blk.3.attn_output", "output"):
        assert paths[name].startswith(dense), (name, paths[name])
    _assert_matches_dequantized(engine, d, backend, q4_1, argmax_share=0.9)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("arch", ["gemma4_text", "gemma4_moe"])
def test_gemma4_as_mlx_lm_saves_it(tmp_path: Path, arch: str, bits: int, backend: str) -> None:
    """mlx-lm's Gemma 4 layout (no k/v projections in KV-shared layers, experts as
    experts.switch_glu, 8-bit router): experts run gather_qmm, the per-layer-input
    projections and dense layers as above. On "cpu" with 4 bits the Q4_1 kernels' int8
    activations are amplified by Gemma's norms after each projection (measured up to 0.43 of
    the logits' scale at later positions of the tiny model, 1.2e-2 at the first), so that case
    is checked at the first position and by its argmax."""
    q, d = tmp_path / "q", tmp_path / "dq"
    write_mlx_lm_gemma4(q, d, arch, bits, 32)
    engine = _engine(q, backend)
    assert engine.info()["architecture"] == "gemma4"
    paths = engine.matmul_paths()
    q4_1 = backend == "cpu" and bits == 4
    dense = "llmd:q4_1:" if q4_1 else f"mlx:qmm:affine{bits}g32:cpu"
    names = ["blk.0.attn_qkv", "blk.0.attn_output", "blk.0.ffn_gate_up", "blk.0.ffn_down", "output"]
    if arch == "gemma4_moe":
        assert paths["blk.0.ffn_gate_up_exps"] == f"mlx:gather_qmm:affine{bits}g32:cpu"
        assert paths["blk.0.ffn_down_exps"] == f"mlx:gather_qmm:affine{bits}g32:cpu"
        assert paths["blk.0.ffn_gate_inp"] == "mlx:qmm:affine8g64:cpu"
    else:
        names += ["blk.0.inp_gate", "per_layer_model_proj"]  # 8-wide ones stay float
        assert paths["blk.0.proj"].startswith("mlx:matmul:f32")
    for name in names:
        assert paths[name].startswith(dense), (name, paths[name])
    _assert_matches_dequantized(engine, d, backend, q4_1, argmax_share=0.85)


def test_llmd_pull_of_a_local_mlx_quantized_directory(llmd_home: Path, tmp_path: Path) -> None:
    """`llmd pull ./dir` publishes it (labelled by its bits) and the engine loads the
    published tree; an unsupported setting is refused before anything is copied."""
    from llmd.paths import get_paths
    from llmd.store.install import import_local
    from llmd.store.manifests import UnsupportedModel
    from llmd.store.model_store import ModelStore

    q = tmp_path / "q"
    write_mlx_quantized_checkpoint(q, tmp_path / "dq", "qwen3", 4, 32)
    store = ModelStore(get_paths())
    record = import_local(store, q, "tiny-q4", None)
    assert record.quantization == "4-bit" and record.architecture == "qwen3"
    engine = _engine(Path(store.get("tiny-q4").path), "cpu")
    assert engine.info()["weight_format"] == "safetensors:mlx-affine4g32"
    config = json.loads((q / "config.json").read_text())
    config["quantization"] = config["quantization_config"] = {"group_size": 64, "bits": 6}
    (q / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedModel, match="6 bits"):
        import_local(store, q, "tiny-q6", None)
    assert [r.name for r in store.list()] == ["tiny-q4"]


@pytest.mark.parametrize(("backend", "bits"), [("cpu", 4), ("cpu", 8), ("mlx-cpu", 4)])
def test_batched_sequences_give_their_solo_tokens(checkpoints, backend: str, bits: int) -> None:
    """DESIGN §4: a sequence's output does not depend on its batch neighbours, on every
    quantized path (llmd's Q4_1 kernels, MLX's quantized_matmul on either backend)."""
    q, _ = checkpoints["qwen3", bits, 32]
    engine = _engine(q, backend, step_token_budget=16)
    rng = np.random.default_rng(3)
    reqs = {
        f"p{n}": {"prompt": [int(t) for t in rng.integers(3, 128, n)], "max_tokens": 10}
        for n in (1, 5, 23, 40)
    }
    solo = {k: run_all(engine, {k: r})[k]["tokens"] for k, r in reqs.items()}
    together = run_all(engine, reqs)
    assert {k: v["tokens"] for k, v in together.items()} == solo


@pytest.mark.parametrize("backend", BACKENDS)
def test_quantized_experts_batched_give_solo_tokens(tmp_path: Path, backend: str) -> None:
    """gather_qmm over a step's (row, expert) pairs: neighbours do not change a sequence."""
    q = tmp_path / "q"
    write_mlx_lm_qwen3_5_moe(q, tmp_path / "dq", 4, 32)
    engine = _engine(q, backend, step_token_budget=16)
    rng = np.random.default_rng(4)
    reqs = {
        f"p{n}": {"prompt": [int(t) for t in rng.integers(3, 128, n)], "max_tokens": 8}
        for n in (1, 6, 30)
    }
    solo = {k: run_all(engine, {k: r})[k]["tokens"] for k, r in reqs.items()}
    together = run_all(engine, reqs)
    assert {k: v["tokens"] for k, v in together.items()} == solo


def test_a_multimodal_wrapper_keeps_its_quantization(tmp_path: Path) -> None:
    """mlx-lm writes `quantization` and `quantization_config` at the top of a multimodal
    config (Qwen3.5, Gemma 3/4 repos): the text model's flattened config keeps both."""
    from llmd.worker.host import hf_config

    quant = {"group_size": 64, "bits": 4, "language_model.model.layers.0.mlp.gate": {"bits": 8}}
    config = {
        "model_type": "qwen3_5_moe",
        "text_config": CONFIGS["qwen3_5_moe_text"],
        "vision_config": {"depth": 1},
        "quantization": quant,
        "quantization_config": quant,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    flat = hf_config(str(tmp_path))
    assert flat["quantization.bits"] == flat["quantization_config.bits"] == 4
    assert flat["quantization.language_model.model.layers.0.mlp.gate.bits"] == 8
    assert "vision_config.depth" not in flat
