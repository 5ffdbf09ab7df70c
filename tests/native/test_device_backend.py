"""The device backend (MLX's kernels, KV in MLX arrays: what runs on CUDA and Metal) checked on
MLX's CPU device, so its graph, weight re-packing and attention are tested on machines without a
GPU. MLX's CPU quantized kernels are slow, so the cases here are short; on a GPU machine the full
parity and isolation suites run with LLMD_TEST_BACKEND=gpu, and the GPU tests below run too."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from unittest.mock import ANY

import numpy as np
import pytest

from .conftest import run_all

ROOT = Path(__file__).parents[2]
NEAR_TIE = 0.5


def _case(reference: dict, name: str) -> dict:
    return next(c for c in reference["cases"] if c["name"] == name)


def native_engine(*args, **kw):  # type: ignore[no-untyped-def]
    return pytest.importorskip("llmd._engine").Engine(*args, **kw)


def _has_gpu() -> bool:
    mx = pytest.importorskip("mlx.core")
    return bool(mx.is_available(mx.gpu))


@pytest.fixture(scope="module")
def device_engine(model_path: Path):  # type: ignore[no-untyped-def]
    native = pytest.importorskip("llmd._engine")
    return native.Engine(
        str(model_path),
        context_length=1024,
        max_sequences=4,
        kv_budget_bytes=64 << 20,
        backend="gpu" if _has_gpu() else "mlx-cpu",
        draft_row_cost=0.0,  # drafting priced as free: the drafted-rows check always drafts
    )


def test_every_weight_runs_mlx_kernels_in_repacked_formats(device_engine) -> None:  # type: ignore[no-untyped-def]
    paths = device_engine.matmul_paths()
    assert len(paths) == 30 * 4 + 1
    # Q4_1 and Q8_0 map exactly onto MLX's 4/8-bit affine groups: nothing is requantized.
    assert all(p.startswith("mlx:qmm:q4_1->affine4:") for k, p in paths.items() if k != "output")
    assert paths["output"].startswith("mlx:qmm:q8_0->affine8:")
    info = device_engine.info()
    assert info["backend"] in ("gpu", "mlx-cpu") and info["device_name"]


def test_teacher_forced_argmax_matches_llamacpp(device_engine, reference: dict) -> None:  # type: ignore[no-untyped-def]
    case = _case(reference, "capital_france")
    prompt, gen, gaps = case["prompt_ids"], case["generated_ids"], case["top2_gaps"]
    logits = device_engine.score(prompt + gen[:-1], len(prompt))
    ours = np.argmax(logits, axis=1)
    decided = [i for i, g in enumerate(gaps) if g > NEAR_TIE]
    assert decided
    assert [int(ours[i]) for i in decided] == [gen[i] for i in decided]


def test_batched_decode_of_unequal_lengths_matches_solo_runs(
    device_engine, reference: dict
) -> None:  # type: ignore[no-untyped-def]
    """Three sequences of different lengths decode in one masked attention call per layer,
    reading each sequence's KV in place from its decode lane (no per-step gather of KV), and
    give exactly their solo greedy tokens."""
    names = ["capital_france", "python_code", "emoji"]
    reqs = {n: {"prompt": _case(reference, n)["prompt_ids"], "max_tokens": 6} for n in names}
    solo = {n: run_all(device_engine, {n: r})[n]["tokens"] for n, r in reqs.items()}
    before = device_engine.stats()["attention_paths"]
    together = run_all(device_engine, reqs)
    for n in names:
        assert together[n]["tokens"] == solo[n], n
    assert solo["capital_france"] == _case(reference, "capital_france")["generated_ids"][:6]
    assert device_engine.stats()["max_rows_sampled_in_a_step"] >= 3
    after = device_engine.stats()["attention_paths"]
    # 5 batched decode steps (the first token comes from each prefill), none gathered.
    assert after["decode_lanes"] - before["decode_lanes"] >= 5
    assert after["decode_gather"] == before["decode_gather"]
    assert after["lane_fills"] - before["lane_fills"] == 3  # each sequence copied in once


def test_decode_lanes_follow_sequences_that_finish_and_join(device_engine, reference: dict) -> None:  # type: ignore[no-untyped-def]
    """Sequences leave the batch (their lane is freed while others keep theirs: the batch then
    attends over lanes out of row order) and a late one joins mid-decode from a cached prefix
    (copied into the free lane once): every sequence still gets its solo greedy tokens, and
    the steps read lanes, never a gather."""
    prompts = {
        n: _case(reference, n)["prompt_ids"] for n in ["capital_france", "python_code", "emoji"]
    }
    lengths = {"capital_france": 2, "python_code": 9, "emoji": 5}
    solo = {
        n: run_all(device_engine, {n: {"prompt": prompts[n], "max_tokens": k}})[n]["tokens"]
        for n, k in lengths.items()
    }
    late = {"prompt": prompts["capital_france"], "max_tokens": 4}
    late_solo = run_all(device_engine, {"late": late})["late"]["tokens"]
    before = device_engine.stats()["attention_paths"]
    for n, k in lengths.items():
        device_engine.submit(n, prompts[n], k)
    got: dict[str, list[int]] = {n: [] for n in [*lengths, "late"]}
    pending = set(got)
    submitted_late = False
    while pending:
        for ev in device_engine.poll(1000):
            if ev["type"] == "tokens":
                got[ev["id"]] += ev["tokens"]
            else:
                pending.discard(ev["id"])
        if not submitted_late and "capital_france" not in pending:
            device_engine.submit("late", **late)  # python_code and emoji are mid-decode
            submitted_late = True
    assert {n: got[n] for n in lengths} == solo
    assert got["late"] == late_solo
    after = device_engine.stats()["attention_paths"]
    assert after["decode_gather"] == before["decode_gather"]
    assert after["lane_fills"] - before["lane_fills"] >= 4


def _lanes_keep_solo_tokens(engine, prompts: dict[str, list[int]], n: int, late: str) -> dict:  # type: ignore[no-untyped-def]
    """Runs each prompt alone, then all but `late` together with `late` submitted once the
    first finishes (it joins mid-decode: copied into a free lane); asserts every sequence got
    its solo greedy tokens and that batched decode read lanes, never a gather. Returns the
    attention path counts of the batched run."""
    lengths = {rid: n + 4 * i for i, rid in enumerate(prompts)}
    lengths[late] = n
    solo = {
        rid: run_all(engine, {rid: {"prompt": p, "max_tokens": lengths[rid]}})[rid]["tokens"]
        for rid, p in prompts.items()
    }
    before = engine.stats()["attention_paths"]
    first = [rid for rid in prompts if rid != late]
    for rid in first:
        engine.submit(rid, prompts[rid], lengths[rid])
    got: dict[str, list[int]] = {rid: [] for rid in prompts}
    pending = set(first)
    while pending:
        for ev in engine.poll(1000):
            if ev["type"] == "tokens":
                got[ev["id"]] += ev["tokens"]
            else:
                pending.discard(ev["id"])
                if ev["id"] == first[0]:
                    engine.submit(late, prompts[late], lengths[late])
                    pending.add(late)
    assert got == solo
    after = engine.stats()["attention_paths"]
    delta = {k: after[k] - before[k] for k in after}
    assert delta["decode_gather"] == 0, delta
    assert delta["decode_lanes"] >= n, delta
    assert delta["lane_fills"] >= len(prompts), delta
    return delta


@pytest.mark.parametrize("kv_type", ["f32", "q8_0"])
def test_sliding_window_layers_decode_from_lane_rings(tmp_path: Path, kv_type: str) -> None:
    """Gemma 3's sliding layers (window 5) read rings of the decode lanes: sequences far past
    the window, one joining mid-decode, get their solo greedy tokens, in float and in q8_0
    KV, and no step gathers."""
    from .tiny_models import LONG_TOKENS, TOKENS, tiny_engine, write_checkpoint

    write_checkpoint(tmp_path, "gemma3_text")
    engine = tiny_engine(tmp_path, kv_type, backend="mlx-cpu", context_length=512, max_sequences=4)
    prompts = {"long": LONG_TOKENS[:150], "short": TOKENS, "late": LONG_TOKENS[::-1][:40]}
    _lanes_keep_solo_tokens(engine, prompts, 12, late="late")


def test_quantized_kv_decodes_from_lanes(tmp_path: Path) -> None:
    """With q8_0 KV the lanes hold the rows its codes dequantize to: batched decode reads them
    in place and each sequence keeps its solo greedy tokens. A tiny Qwen3 (every layer full
    attention; tiny_models.py): what is checked is the lanes' bookkeeping, and MLX's CPU device
    ran the test model's six prompts at ~7 tokens/s (21 s)."""
    from .tiny_models import LONG_TOKENS, TOKENS, tiny_engine, write_checkpoint

    write_checkpoint(tmp_path, "qwen3")
    engine = tiny_engine(tmp_path, "q8_0", backend="mlx-cpu", context_length=512, max_sequences=4)
    assert engine.kv_cache()["type"] == "q8_0"
    prompts = {"long": LONG_TOKENS[:150], "short": TOKENS, "late": LONG_TOKENS[::-1][:40]}
    _lanes_keep_solo_tokens(engine, prompts, 5, late="late")


def _run_batched(engine, requests: dict[str, dict], lanes_held: bool = False) -> dict[str, dict]:  # type: ignore[no-untyped-def]
    """run_all until a decode step held both requests. The engine starts the first request the
    moment it is submitted; a 10-token answer of a tiny model takes a few milliseconds, so on a
    loaded machine it can end before the second is submitted, and no step batches them (a 20 ms
    pause between the two submits does that every time). `lanes_held`: also until the last step
    was batched, so the lanes are still held. Whether an idle engine wakes before the second
    submit is a race, and one that started a step early ends a step early (its partner's last
    step alone gives the lanes back), so every other try gives the first request one more
    token: whichever way the race goes, one of the two shapes ends both on the same step.
    Returns each request's tokens and done event, and the max_tokens it ran with."""
    first = next(iter(requests))
    for attempt in range(8):
        shaped = {rid: dict(r) for rid, r in requests.items()}
        if lanes_held and attempt % 2 == 1:
            shaped[first]["max_tokens"] += 1
        before = engine.stats()["attention_paths"]
        got = run_all(engine, shaped)
        after = engine.stats()["attention_paths"]
        batched = (
            after["decode_lanes"] + after["decode_gather"]
            > before["decode_lanes"] + before["decode_gather"]
        )
        if batched and (not lanes_held or engine.stats()["kv_lane_bytes"] > 0):
            return {rid: {**got[rid], "max_tokens": shaped[rid]["max_tokens"]} for rid in got}
    pytest.fail("the two requests never shared a decode step in 8 tries")


def test_lane_memory_counts_in_the_kv_budget(tmp_path: Path) -> None:
    """Decode lanes are KV memory: the engine reports their bytes inside kv_bytes, evicts idle
    cached blocks to make room for them (as for a new block), refuses them when the blocks in
    use leave no room (the step then gathers, with the same tokens), and gives the room back to
    blocks once no batched decode needs them."""
    from llmd.worker.host import hf_config

    from .tiny_models import LONG_TOKENS, TOKENS, write_checkpoint

    write_checkpoint(tmp_path, "qwen3")

    def engine(budget_bytes: int):  # type: ignore[no-untyped-def]
        return native_engine(
            str(tmp_path),
            context_length=512,
            max_sequences=4,
            kv_budget_bytes=budget_bytes,
            backend="mlx-cpu",
            hf_config=hf_config(str(tmp_path)),
        )

    roomy = engine(16 << 20)
    block = roomy.kv_cache()["bytes_per_token"] * 64
    pair = {
        "a": {"prompt": TOKENS, "max_tokens": 10},
        "b": {"prompt": LONG_TOKENS[:30], "max_tokens": 10},
    }
    solo = {rid: run_all(roomy, {rid: r})[rid]["tokens"] for rid, r in pair.items()}
    # One more token than asked, for the try that gives the first request one more.
    longer = run_all(roomy, {"a": {**pair["a"], "max_tokens": 11}})["a"]["tokens"]
    assert longer[:10] == solo["a"]
    held = _run_batched(roomy, pair, lanes_held=True)
    assert held == {
        "a": {"tokens": longer[: held["a"]["max_tokens"]], "done": ANY, "max_tokens": ANY},
        "b": {"tokens": solo["b"], "done": ANY, "max_tokens": 10},
    }
    lane_bytes = roomy.stats()["kv_lane_bytes"]  # still held: no step has run since
    assert lane_bytes > 0
    assert roomy.stats()["kv_bytes"] >= lane_bytes + 2 * block  # the pair's blocks and the lanes
    assert roomy.stats()["attention_paths"]["lanes_refused"] == 0

    # Two blocks in use and no idle one: no room for the lanes, refused; the step gathers.
    tight_blocks = 2 + lane_bytes // block - 1
    tight = engine(tight_blocks * block)
    got = _run_batched(tight, pair)
    assert {rid: got[rid]["tokens"] for rid in pair} == solo
    paths = tight.stats()["attention_paths"]
    assert paths["lanes_refused"] > 0 and paths["decode_gather"] > 0 and paths["decode_lanes"] == 0
    assert tight.stats()["kv_lane_bytes"] == 0
    assert tight.stats()["kv_bytes"] <= tight_blocks * block

    # Enough room once idle cached blocks go: a long prompt's blocks are evicted for the lanes.
    budget = 2 + lane_bytes // block + 2
    evicting = engine(budget * block)
    long_prompt = (LONG_TOKENS + LONG_TOKENS)[: (budget - 1) * 64 - 8]
    run_all(evicting, {"long": {"prompt": long_prompt, "max_tokens": 1}})
    idle_before = evicting.stats()["kv_idle_cached_blocks"]
    assert idle_before >= budget - 2
    got = _run_batched(evicting, pair)
    assert {rid: got[rid]["tokens"] for rid in pair} == solo
    stats = evicting.stats()
    assert stats["attention_paths"]["decode_lanes"] > 0
    assert stats["attention_paths"]["lanes_refused"] == 0
    assert stats["kv_bytes"] <= budget * block
    # The lanes cost cached prefix: the long prompt finds fewer of its blocks, and gets the
    # blocks the lanes held if it needs them (blocks come first: the lanes are dropped).
    again = run_all(evicting, {"long": {"prompt": long_prompt, "max_tokens": 2}})["long"]
    assert again["done"]["type"] == "done" and len(again["tokens"]) == 2, again["done"]
    assert again["done"]["cached_tokens"] < idle_before * 64
    assert evicting.stats()["kv_lane_bytes"] == 0


def test_random_q4_0_model_gives_the_same_tokens_on_both_backends(tmp_path: Path) -> None:
    """The benchmark's model generator writes a loadable GGUF, and Q4_0 re-packed for the
    device backend computes what llmd's CPU kernels compute."""
    native = pytest.importorskip("llmd._engine")
    out = tmp_path / "tiny.gguf"
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench/gpu/make_random_gguf.py"),
            "--preset",
            "tiny",
            "--out",
            str(out),
        ],
        check=True,
        capture_output=True,
    )
    tokens = {}
    for backend in ("cpu", "mlx-cpu"):
        e = native.Engine(
            str(out), context_length=256, max_sequences=2, kv_budget_bytes=8 << 20, backend=backend
        )
        assert e.info()["weight_format"] == "gguf:Q4_0"
        tokens[backend] = run_all(e, {"a": {"prompt": [1, 5, 6, 7, 8], "max_tokens": 12}})["a"][
            "tokens"
        ]
    assert len(tokens["cpu"]) == 12
    assert tokens["cpu"] == tokens["mlx-cpu"]


def test_unknown_or_unavailable_backend_is_refused(model_path: Path) -> None:
    native = pytest.importorskip("llmd._engine")
    with pytest.raises(RuntimeError, match="unknown backend 'tpu'"):
        native.Engine(str(model_path), backend="tpu")
    if not _has_gpu():
        with pytest.raises(RuntimeError, match="no GPU"):
            native.Engine(str(model_path), backend="gpu")


def test_forked_siblings_copy_device_kv(device_engine, reference: dict) -> None:  # type: ignore[no-untyped-def]
    """The device backend copies a partial KV block in its own storage for a sibling choice."""
    prompt = _case(reference, "capital_france")["prompt_ids"]
    assert len(prompt) % 64 != 0
    solo = run_all(device_engine, {"solo": {"prompt": prompt, "max_tokens": 6}})["solo"]["tokens"]
    before = device_engine.stats()["forked_sequences"]
    out = run_all(
        device_engine,
        {
            "p": {"prompt": prompt, "max_tokens": 6},
            "c": {"prompt": prompt, "max_tokens": 6, "prefill_of": "p"},
        },
    )
    assert device_engine.stats()["forked_sequences"] == before + 1
    assert out["p"]["tokens"] == out["c"]["tokens"] == solo


# SmolLM2-135M, batch-1 decode step on the CPU device: 90.5 primitives per layer op by op, ~63
# with the compiled pieces (bench/README.md, issue 22).
MAX_PRIMITIVES_PER_LAYER = 70

_STEP_GRAPH = """
import json, sys
from llmd import _engine as native
e = native.Engine(sys.argv[1], context_length=512, max_sequences=2, kv_budget_bytes=32 << 20,
                  backend="mlx-cpu")
def run(rid, prompt, n):
    e.submit(rid, prompt, n)
    while not any(ev["type"] == "done" for ev in e.poll(100)):
        pass
if len(sys.argv) > 2:  # switched on for this request only, as bench/mlx_vs_mlxlm.py does
    native.record_step_graphs(sys.argv[2] == "on")
prompt_tokens = int(sys.argv[3]) if len(sys.argv) > 3 else 70  # 70: KV over two blocks
run("a", list(range(100, 100 + prompt_tokens)), 3)
print(json.dumps(native.last_step_graph()))
"""


def test_decode_step_graph_is_reported_and_reads_kv_in_place(model_path: Path) -> None:
    """Under LLMD_PROFILE=1 the engine reports the MLX primitives of its last step (what
    bench/mlx_vs_mlxlm.py compares with mlx-lm's). A lone sequence's batch-1 decode step reads
    its KV in place (no gather copy of keys or values, no gather of the sampled row), runs one
    quantized product per projection plus the lm_head, and rotates queries and keys in one
    RoPE op per layer (on the CPU device mx.fast's rope falls back to one Sin per call)."""
    pytest.importorskip("llmd._engine")
    env = {**os.environ, "LLMD_PROFILE": "1"}  # the llmd this test imports (installed or not)
    out = subprocess.run(
        [sys.executable, "-c", _STEP_GRAPH, str(model_path)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    graph = json.loads(out.stdout.strip().splitlines()[-1])
    assert graph["total"] == sum(v for k, v in graph.items() if k != "total")
    assert "Gather" not in graph
    assert graph["QuantizedMatmul"] == 30 * 4 + 1
    assert graph["Scatter"] == 30 * 2  # keys and values written in place, once per layer
    assert graph["Sin"] == 30
    # The whole step stays below mlx-lm's 116 primitives per layer for this model.
    assert graph["total"] / 30 < 100


def _step_graph(model_path: Path, *args: str) -> dict:
    """The last step's primitives from _STEP_GRAPH in a process of its own, without the
    profiler (args: the recording switch, then the prompt length)."""
    pytest.importorskip("llmd._engine")
    env = {k: v for k, v in os.environ.items() if k != "LLMD_PROFILE"}
    out = subprocess.run(
        [sys.executable, "-c", _STEP_GRAPH, str(model_path), *args],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def recorded_step_graph(model_path: Path) -> dict:
    """A decode step's graph, recording switched on for its request (each run prefills ~10 s
    on MLX's CPU device: two tests read this one)."""
    return _step_graph(model_path, "on")


def test_decode_step_runs_its_elementwise_pieces_compiled(recorded_step_graph: dict) -> None:
    """The device path's norms, SwiGLU and RoPE-with-KV-split are mx::compile'd functions
    (native/mlx/compiled_ops.h): each run of elementwise ops is one fused `Compiled` node, so a
    batch-1 decode step evaluates far fewer primitives than op by op (2,715 for this model
    before, mlx-lm 3,488), with the same products and KV writes."""
    graph = recorded_step_graph
    compiled = sum(v for k, v in graph.items() if k.startswith("Compiled"))
    # Per layer at least: the two norms' tails, SwiGLU and RoPE's rotation; plus the final norm.
    assert compiled >= 30 * 4 + 1, graph
    # Every RMSNorm's rsqrt and scaling runs inside a compiled node, none op by op.
    assert "Rsqrt" not in graph, graph
    assert graph["QuantizedMatmul"] == 30 * 4 + 1
    assert graph["Scatter"] == 30 * 2
    assert graph["total"] / 30 < MAX_PRIMITIVES_PER_LAYER, graph


# Tiny checkpoints (tests/native/tiny_models.py, float weights), batch-1 decode step on the CPU
# device: primitives per layer before the head norms and the quantized-KV rounding were
# compiled, and the bound each now stays under (bench/README.md, issue 22).
_HEAD_NORM_STEPS = [
    # arch, KV type, layers, per layer op by op (before), bound
    ("qwen3", "f16", 2, 97.5, 90),
    ("gemma3_text", "f16", 3, 105.3, 97),
    ("qwen3", "q8_0", 2, 185.5, 150),
    ("qwen3", "q4_0", 2, 209.5, 180),
]


@pytest.mark.parametrize(("arch", "kv_type", "layers", "before", "bound"), _HEAD_NORM_STEPS)
def test_head_norms_and_quantized_kv_rounding_run_compiled(
    tmp_path: Path, arch: str, kv_type: str, layers: int, before: float, bound: float
) -> None:
    """Qwen3 and Gemma 3 normalise every query and key head (QK-norm), and a quantized KV
    store rounds every written row to q8_0 / q4_0 codes: on the device path both are compiled
    functions (native/mlx/compiled_ops.h), so a decode step runs no RMSNorm op by op (no Rsqrt
    node outside a fused one) and evaluates fewer primitives per layer than op by op did."""
    from llmd.worker.host import hf_config

    from .tiny_models import write_checkpoint

    native = pytest.importorskip("llmd._engine")
    write_checkpoint(tmp_path, arch)
    engine = native.Engine(
        str(tmp_path),
        context_length=256,
        max_sequences=2,
        kv_budget_bytes=16 << 20,
        backend="mlx-cpu",
        kv_type=kv_type,
        hf_config=hf_config(str(tmp_path)),
    )
    native.record_step_graphs(True)
    try:
        run_all(engine, {"a": {"prompt": list(range(5, 40)), "max_tokens": 3}})
        graph = native.last_step_graph()
    finally:
        native.record_step_graphs(False)
    assert "Rsqrt" not in graph, graph
    assert graph["Scatter"] == layers * (4 if kv_type != "f16" else 2), graph  # codes and scales
    assert before > bound
    assert graph["total"] / layers < bound, graph


def test_step_graph_recording_is_switched_on_per_request_without_the_profiler(
    model_path: Path, recorded_step_graph: dict
) -> None:
    """The benchmark times llmd without LLMD_PROFILE (whose per-step graph export would slow
    the timed steps) and switches graph recording on for the one step it counts: the whole
    step is then counted, though the device path hands each layer to MLX as it is built."""
    assert _step_graph(model_path, "off", "3") == {}  # a short prompt: nothing is recorded anyway
    on = recorded_step_graph
    assert on["QuantizedMatmul"] == 30 * 4 + 1  # every layer's products, not the last part's
    assert on["Scatter"] == 30 * 2


def test_speculative_drafts_verify_on_the_device_path(device_engine, text_model) -> None:  # type: ignore[no-untyped-def]
    """The device graph returns logits for every drafted row of a segment, and rejected
    drafts' KV (past the sequence's length in MLX's arrays) never leaks into later steps:
    greedy output with prompt-lookup drafts is the same as without."""
    # A counting pattern the model continues: prompt lookup drafts it right.
    prompt = text_model.encode("1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3,")
    plain = run_all(device_engine, {"p": {"prompt": prompt, "max_tokens": 24}})["p"]
    spec = run_all(device_engine, {"s": {"prompt": prompt, "max_tokens": 24, "max_draft": 6}})["s"]
    assert spec["tokens"] == plain["tokens"]
    assert spec["done"]["accepted_tokens"] > 0
