"""CPU at the sizes people run: llmd vs llama.cpp on random-weight models of Llama-3.2-1B and
Qwen3-4B shapes, in each quantization recipe people pull, measured in the same run.

Models are built once under `bench/.realistic/`: float16 weights written tensor by tensor
(`bench/gpu/make_random_gguf.py --dtype f16`), then each recipe with llama.cpp's own
`llama-quantize` (built from the sdist by `bench/build_llamacpp.sh`), so the per-tensor type
mix is exactly llama.cpp's. Then, per model, alternating rounds (the machines are noisy):

- pp512, pp4096, pp8k, pp16k: one prompt of that many tokens, prefill tokens/s. llmd: its engine in
  this process (`prefill_ms` of the request); llama.cpp: `llama-bench -p N -n 0`.
- tg128: 128 tokens generated one at a time after a 1-token prompt (`llama-bench -n 128`),
  and the fraction of the machine's measured read bandwidth that speed implies (the bytes a
  decode step reads: every weight but the token-embedding lookup).
- streams: 4 and 8 (`--streams`) concurrent chat streams over HTTP, aggregate tokens/s
  (`bench.compare_servers`, llama-server with as many slots as streams).
- rss: the resident memory of llmd's worker and of llama-server after a 4-stream load.

    bench/build_llamacpp.sh                                    # once
    python -m bench.realistic --shapes llama3.2-1b --types Q4_K_M,Q5_K_M --rounds 3
    python -m bench.realistic --tests pp512,tg128 --rounds 2   # every shape and type
    # llmd's AVX2 path against an AVX2-only llama.cpp build, on an AVX-512 machine:
    bench/build_llamacpp.sh --avx2                             # once: bench/.llamacpp/build-avx2
    python -m bench.realistic --cpu-path avx2 --llamacpp-bin bench/.llamacpp/build-avx2/bin

Each table names llmd's kernel path and the ISA the llama.cpp build was compiled for.

Prints one markdown table per model (with the machine's kernel path) and writes
bench/results/realistic-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# Run as a file (python bench/realistic.py), the repo root is not on the path: add it.
try:
    from bench import servers
except ImportError:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from bench import servers

HERE = Path(__file__).resolve().parent
CACHE = HERE / ".realistic"
LLAMA_BIN = HERE / ".llamacpp" / "build" / "bin"
SHAPES = ("llama3.2-1b", "qwen3-4b")
# Shapes measured on request: rows no multiple of 256 (qwen2.5-0.5b: llama.cpp's K-quant recipes
# fall back to Q5_0 / Q5_1 / Q8_0 there, and llmd converts those), and a GQA ratio of 6 with
# 128-wide heads and attention biases (qwen2.5-1.5b: the size of an editor-completion model).
EXTRA_SHAPES = ("qwen2.5-0.5b", "qwen2.5-1.5b")
SMOKE_SHAPES = ("tiny",)  # make_random_gguf's few-MB preset: checks this script, measures nothing
TYPES = ("Q4_0", "Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0")
# Recipes measured on request: the 2-3 bit ones, IQ4, IQ3 and the 5-bit legacy types (IQ4_XS and
# IQ3_S have no llmd kernel: llmd runs the file a pull converts it into, llmd_file; llama.cpp the
# original). IQ3_XXS and the IQ2/IQ1 types need an importance matrix to quantize, so none here.
EXTRA_TYPES = ("Q2_K", "Q3_K_S", "Q3_K_M", "Q3_K_L", "IQ4_XS", "IQ4_NL", "IQ3_S", "IQ3_M")
EXTRA_TYPES += ("Q5_0", "Q5_1")
TOOLS = ("llama-bench", "llama-server")  # what --llamacpp-bin must hold
PREFILLS = {"pp512": 512, "pp4096": 4096, "pp8k": 8192, "pp16k": 16384}
TESTS = (*PREFILLS, "tg128", "streams", "rss")
STREAMS = (4, 8)
CPU_PATHS = ("avx512vnni", "avx2", "scalar")  # what LLMD_CPU_PATH accepts on x86


# --- models -------------------------------------------------------------------------------


def build_model(shape: str, qtype: str, cache: Path = CACHE) -> Path:
    """The GGUF of `shape` in recipe `qtype`, made (and kept) under `cache` if missing. Always
    quantized by the default (native) build's `llama-quantize`: the file, not the tool's ISA,
    is what both engines are measured on, so an AVX2-only build needs no quantizer of its own."""
    cache.mkdir(parents=True, exist_ok=True)
    f16 = cache / f"{shape}-f16.gguf"
    if not f16.exists():
        print(f"writing {f16.name} (random float16 weights)", flush=True)
        tmp = f16.with_suffix(".tmp")
        subprocess.run(
            [
                sys.executable,
                str(HERE / "gpu" / "make_random_gguf.py"),
                "--preset",
                shape,
                "--dtype",
                "f16",
                "--out",
                str(tmp),
            ],
            check=True,
        )
        tmp.rename(f16)
    out = cache / f"{shape}-{qtype.lower()}.gguf"
    if not out.exists():
        print(f"quantizing {out.name} with llama-quantize", flush=True)
        tmp = out.with_suffix(".tmp")
        subprocess.run(
            [str(LLAMA_BIN / "llama-quantize"), str(f16), str(tmp), qtype],
            check=True,
            capture_output=True,
        )
        tmp.rename(out)
        _settle()
    return out


def llmd_file(model: Path) -> Path:
    """The file llmd runs for `model`: the model itself, or (for a recipe with types the engine
    has no kernel for: Q3_K_M, IQ4_XS, ...) the copy a pull converts it into, made once beside
    it. llama.cpp keeps the original; the table notes the conversion and both sizes."""
    from llmd.store.convert import convert_gguf, plan_conversion
    from llmd.store.gguf_layout import read_layout

    layout = read_layout(model)
    plan = plan_conversion(layout, model.stat().st_size)
    if not plan.needed:
        return model
    out = model.with_name(f"{model.stem}.llmd.gguf")
    # A copy an older llmd made (another conversion target) is remade: the plan knows the size.
    if not out.exists() or out.stat().st_size != plan.output_size:
        print(f"converting {model.name} as a pull does: {plan.summary()}", flush=True)
        tmp = out.with_suffix(".tmp")
        convert_gguf(model, tmp, layout, plan)
        tmp.rename(out)
        _settle()
    return out


def _settle() -> None:
    """Write a just-made file's dirty pages out before anything is timed: measured while 1.5 GB
    of a fresh conversion was still being written back, llmd's tg128 on it read 8.8 tok/s,
    and 13.8 once the disk was quiet (Zen 1, 1B IQ4_XS)."""
    os.sync()


def _sizes(converted: Path, model: Path) -> str:
    return f"{converted.name} ({converted.stat().st_size / 1e6:.0f} MB, from {model.stat().st_size / 1e6:.0f} MB)"


def decode_bytes(model: Path) -> int:
    """Bytes one decode step reads: every tensor but the token embedding, which is a row
    lookup, unless the output projection reuses it (tied embeddings)."""
    import gguf

    tensors = {t.name: int(t.n_bytes) for t in gguf.GGUFReader(str(model)).tensors}
    tied = "output.weight" not in tensors
    return sum(n for name, n in tensors.items() if tied or name != "token_embd.weight")


def _parallel_best(fn: Callable[..., Any], parts: list[tuple[Any, ...]], tries: int) -> float:
    """Best wall time of `fn` run on each of `parts` at once, one thread each (numpy releases
    the GIL), over `tries` runs."""
    best = float("inf")
    for _ in range(tries):
        workers = [threading.Thread(target=fn, args=p) for p in parts]
        t0 = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        best = min(best, time.perf_counter() - t0)
    return best


def read_bandwidth(threads: int, gib: float = 1.0, tries: int = 4) -> float:
    """The machine's read bandwidth in bytes/s: `threads` threads OR-reducing disjoint slices
    of a `gib` GiB array of 64-bit words, best of `tries`. (An earlier float64 `np.sum`
    probe was bound by the adds, ~20 GB/s a core on a Zen 5 box that reads 35-40, so decode
    showed "over 100% of bandwidth" there.)"""
    import numpy as np

    data = np.ones(int(gib * 2**30) // 8, dtype=np.uint64)
    parts = [(p,) for p in np.array_split(data, threads)]
    return data.nbytes / _parallel_best(np.bitwise_or.reduce, parts, tries)


def copy_bandwidth(threads: int, gib: float = 1.0, tries: int = 4) -> float:
    """The machine's copy bandwidth in bytes/s (bytes read plus bytes written): `threads`
    threads each copying a disjoint slice of a `gib` GiB array into another, best of `tries`."""
    import numpy as np

    src = np.ones(int(gib * 2**30) // 8, dtype=np.uint64)
    dst = np.zeros_like(src)
    parts = list(zip(np.array_split(dst, threads), np.array_split(src, threads), strict=True))
    return 2 * src.nbytes / _parallel_best(np.copyto, parts, tries)


# --- the engines ---------------------------------------------------------------------------


class LlmdEngine:
    """llmd's engine on one model, in this process, as the worker runs it (default KV type,
    step budget and kernels)."""

    def __init__(self, model: Path, threads: int, longest: int) -> None:
        from llmd import _engine

        _engine.set_threads(threads)
        self.native = _engine
        context = longest + 256
        self.engine = _engine.Engine(
            str(model), context_length=context, max_sequences=8, kv_budget_bytes=4 << 30
        )
        self.vocab = int(self.engine.info()["vocab_size"])
        self.rng = random.Random(0)

    def _run(self, prompt: list[int], max_tokens: int) -> dict[str, Any]:
        self.engine.submit(f"b{self.rng.random()}", prompt, max_tokens)
        while True:
            for ev in self.engine.poll(1000):
                if ev["type"] == "done":
                    return ev
                if ev["type"] == "error":
                    raise RuntimeError(ev["message"])

    def prefill(self, n: int) -> float:
        """tokens/s of one fresh n-token prompt (random ids: no prefix cache hit)."""
        prompt = [self.rng.randrange(300, self.vocab) for _ in range(n)]
        return n / (self._run(prompt, 1)["timings"]["prefill_ms"] / 1000)

    def decode(self, n: int = 128) -> float:
        done = self._run([self.rng.randrange(300, self.vocab)], n + 1)
        return n / (done["timings"]["decode_ms"] / 1000)


def llama_bench(
    model: Path,
    threads: int,
    n_prompt: int,
    n_gen: int,
    bin_dir: Path = LLAMA_BIN,
    warmup: bool = True,
) -> float:
    """llama-bench's tokens/s for one test (`-p n_prompt -n 0` or `-p 0 -n n_gen`), from the
    llama.cpp build in `bin_dir`. Its warmup runs the whole test once more (a 16k prefill
    twice), so `warmup=False` (`--no-warmup`) is what lets a pp16k pair fit one window."""
    out = subprocess.run(
        [
            str(bin_dir / "llama-bench"),
            "-m",
            str(model),
            "-p",
            str(n_prompt),
            "-n",
            str(n_gen),
            "-t",
            str(threads),
            "-r",
            "1",
            "-o",
            "json",
            *([] if warmup else ["--no-warmup"]),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return float(json.loads(out.stdout)[0]["avg_ts"])


def stream_aggregates(
    model: Path,
    threads: int,
    rounds: int,
    duration: float,
    streams: tuple[int, ...] = STREAMS,
    bin_dir: Path = LLAMA_BIN,
) -> dict[str, Any]:
    """Aggregate tokens/s of `streams` concurrent streams over HTTP, both servers, from
    `bench.compare_servers` (which alternates them; llmd's worker inherits LLMD_CPU_PATH), as
    {"c4": {"llmd": .., "llama.cpp": .., "ratio": ..}, ...}."""
    out = CACHE / "streams" / dt.datetime.now().strftime("%Y%m%dT%H%M%S")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.compare_servers",
            "--gguf",
            str(model),
            "--rounds",
            str(rounds),
            "--duration",
            str(duration),
            "--concurrency",
            ",".join(map(str, streams)),
            "--turns",
            "0",
            "--max-tokens",
            "64",
            "--ctx-per-slot",
            "2048",
            "--threads",
            str(threads),
            "--llama-server",
            str(bin_dir / "llama-server"),
            "--out",
            str(out),
            "--no-plots",
        ],
        cwd=HERE.parent,
        check=True,
    )
    got = json.loads((out / "results.json").read_text())
    table = {}
    for c in streams:
        agg = got["medians"][f"c{c}"]["aggregate_tok_s"]
        ratio = got["ratios"]["llmd"][f"c{c}"]["aggregate_tok_s"]["median"]
        table[f"c{c}"] = {"llmd": agg["llmd"], "llama.cpp": agg["llama.cpp"], "ratio": ratio}
    return table


def _group_rss(pgid: int, match: Callable[[str], bool]) -> int:
    """Summed VmRSS (bytes) of the processes of group `pgid` whose command line matches."""
    total = 0
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if int((proc / "stat").read_text().rsplit(")", 1)[1].split()[2]) != pgid:
                continue
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if not match(cmd):
                continue
            for line in (proc / "status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except (OSError, ValueError, IndexError):
            continue
    return total


def server_rss(
    model: Path, threads: int, duration: float, bin_dir: Path = LLAMA_BIN
) -> dict[str, int]:
    """Resident bytes of llmd's worker and of llama-server after `duration` s of 4 streams,
    each server alone on the machine (4 slots each, 2,048 tokens of context per slot)."""
    import asyncio

    from bench import loadgen

    result = {}
    cases = [
        (
            "llmd",
            lambda: servers.llmd_server(
                threads=threads, max_sequences=4, context_length=2048, gguf=model
            ),
            servers.LLMD_BENCH_MODEL,
            lambda cmd: "llmd.worker" in cmd,
        ),
        (
            "llama.cpp",
            lambda: servers.llama_server(
                bin_dir / "llama-server", model, threads=threads, slots=4, ctx_per_slot=2048
            ),
            "model",
            lambda cmd: "llama-server" in cmd,
        ),
    ]
    for name, make, model_name, is_engine in cases:
        with make() as server:
            server.start(timeout=600)
            target = loadgen.Target(name, server.base_url, model_name)
            asyncio.run(loadgen.run_load(target, 4, 64, duration=duration))
            assert server.proc is not None
            result[name] = _group_rss(server.proc.pid, is_engine)
    return result


# --- the run -------------------------------------------------------------------------------


def measure(model: Path, args: argparse.Namespace, bandwidth: float) -> dict[str, Any]:
    from llmd import _engine  # after main() set LLMD_CPU_PATH: the path the worker runs too

    tests = args.tests
    rows: dict[str, dict[str, Any]] = {}
    llmd_model = llmd_file(model)  # llama.cpp runs `model`, llmd what a pull installs from it
    prefills = {t: PREFILLS[t] for t in tests if t in PREFILLS}
    engine_tests = prefills or "tg128" in tests
    llmd = None
    if engine_tests:
        try:
            llmd = LlmdEngine(llmd_model, args.threads, max(prefills.values(), default=512))
        except RuntimeError as exc:  # types are converted above: an architecture, say
            print(f"  llmd's engine refuses {llmd_model.name} ({exc}): engine tests skipped")
    if llmd is not None:
        # Warm-up, as llama-bench runs one: weights paged in, and the kernels' scratch grown to
        # a full step (the engine feeds every prompt in steps of at most 512 rows: a shorter
        # warm-up left the first measured prefill growing it, 5-10% below the next ones).
        llmd.prefill(512)
        rounds: list[dict[str, dict[str, float]]] = []
        for i in range(args.rounds):
            got: dict[str, dict[str, float]] = {"llmd": {}, "llama.cpp": {}}
            for who in ("llmd", "llama.cpp") if i % 2 == 0 else ("llama.cpp", "llmd"):
                for test, n in prefills.items():
                    got[who][test] = (
                        llmd.prefill(n)
                        if who == "llmd"
                        else llama_bench(
                            model, args.threads, n, 0, args.llamacpp_bin, args.llama_warmup
                        )
                    )
                    # Each figure as it lands: a window that ends mid-round keeps it.
                    print(f"    {who} {test}: {got[who][test]:.1f} tok/s", flush=True)
                if "tg128" in tests:
                    got[who]["tg128"] = (
                        llmd.decode(128)
                        if who == "llmd"
                        else llama_bench(
                            model, args.threads, 0, 128, args.llamacpp_bin, args.llama_warmup
                        )
                    )
                    print(f"    {who} tg128: {got[who]['tg128']:.1f} tok/s", flush=True)
            print(f"  round {i + 1}: {json.dumps(got)}", flush=True)
            rounds.append(got)
        del llmd
        for test in [*prefills, *(["tg128"] if "tg128" in tests else [])]:
            ours = [r["llmd"][test] for r in rounds]
            ref = [r["llama.cpp"][test] for r in rounds]
            rows[test] = {
                "llmd": statistics.median(ours),
                "llama.cpp": statistics.median(ref),
                "ratio": statistics.median(o / r for o, r in zip(ours, ref, strict=True)),
            }
        if "tg128" in tests:
            step_bytes = {"llmd": decode_bytes(llmd_model), "llama.cpp": decode_bytes(model)}
            rows["tg128"]["bandwidth_fraction"] = {
                who: rows["tg128"][who] * step_bytes[who] / bandwidth
                for who in ("llmd", "llama.cpp")
            }
    if "streams" in tests:
        got_streams = stream_aggregates(
            model, args.threads, args.rounds, args.duration, args.streams, args.llamacpp_bin
        )
        for case, row in got_streams.items():
            rows[f"{case[1:]} streams"] = row
    if "rss" in tests:
        rss = server_rss(model, args.threads, args.duration, args.llamacpp_bin)
        rows["rss"] = {**rss, "ratio": rss["llmd"] / rss["llama.cpp"]}
    return {
        "model": model.name,
        "llmd_file": None if llmd_model == model else _sizes(llmd_model, model),
        "kernel_path": _engine.active_kernel_path(),
        "llamacpp": args.llamacpp_isa,
        "rows": rows,
    }


def markdown(result: dict[str, Any]) -> str:
    lines = [
        f"**{result['model']}** (llmd kernels: {result['kernel_path'] or 'n/a'}; "
        f"llama.cpp: {result.get('llamacpp') or 'n/a'})"
        + (
            f"; llmd runs the pull's conversion {result['llmd_file']}"
            if result.get("llmd_file")
            else ""
        ),
        "",
        "| test | llmd | llama.cpp | llmd / llama.cpp |",
        "|---|---|---|---|",
    ]
    for test, row in result["rows"].items():
        if test == "rss":
            llmd, ref = f"{row['llmd'] / 2**20:,.0f} MiB", f"{row['llama.cpp'] / 2**20:,.0f} MiB"
        else:
            llmd, ref = f"{row['llmd']:,.1f} tok/s", f"{row['llama.cpp']:,.1f} tok/s"
            if "bandwidth_fraction" in row:
                frac = row["bandwidth_fraction"]
                llmd += f" ({frac['llmd']:.0%} of bw)"
                ref += f" ({frac['llama.cpp']:.0%} of bw)"
        # compare_servers gives no ratio where a server finished nothing in the window.
        ratio = "-" if row["ratio"] is None else f"{row['ratio']:.2f}x"
        lines.append(f"| {test} | {llmd} | {ref} | {ratio} |")
    return "\n".join(lines)


def llamacpp_isa(bin_dir: Path) -> str:
    """The ISA a llama.cpp build was compiled for, from its CPU backend's `ggml_cpu_has_*`
    (compile-time flags, not the machine's), read in a child process so two builds' libraries
    never share one: "AVX-512 VNNI build", "AVX2 build", ..."""
    probe = (
        "import ctypes, sys; lib = ctypes.CDLL(sys.argv[1]); "
        "print(' '.join(f for f in ('avx512_vnni', 'avx512', 'avx2') "
        "if getattr(lib, 'ggml_cpu_has_' + f)()))"
    )
    try:
        out = subprocess.run(
            [sys.executable, "-c", probe, str(bin_dir / "libggml-cpu.so")],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        return f"{bin_dir} (ISA unknown)"
    isa = "AVX-512 VNNI" if "avx512_vnni" in out else "AVX-512" if "avx512" in out else "AVX2"
    return f"{isa} build" if out else "build without AVX2"


def cpu_flags() -> str:
    try:
        flags = next(
            ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("flags")
        ).split()
    except (OSError, StopIteration):
        return "unknown"
    return "AVX-512 VNNI" if "avx512_vnni" in flags else "AVX2" if "avx2" in flags else "no AVX2"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--types", default=",".join(TYPES))
    ap.add_argument("--tests", default=",".join(TESTS))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--duration", type=float, default=20.0, help="seconds per stream case")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--streams", default=",".join(map(str, STREAMS)), help="stream counts")
    ap.add_argument(
        "--llamacpp-bin",
        type=Path,
        default=LLAMA_BIN,
        help="the llama.cpp build whose llama-bench and llama-server are measured (e.g. "
        "bench/.llamacpp/build-avx2/bin); the models are quantized by the default build",
    )
    ap.add_argument(
        "--cpu-path",
        choices=CPU_PATHS,
        default=None,
        help="force llmd's kernel path (LLMD_CPU_PATH, for the engine and the server's worker)",
    )
    ap.add_argument("--cache", type=Path, default=CACHE, help="where the GGUF files are kept")
    ap.add_argument(
        "--no-llama-warmup",
        dest="llama_warmup",
        action="store_false",
        help="pass --no-warmup to llama-bench (its warmup repeats the whole test: a pp16k pair "
        "then needs twice the window)",
    )
    args = ap.parse_args(argv)
    args.streams = tuple(int(c) for c in args.streams.split(","))
    args.shapes = args.shapes.split(",")
    args.types = args.types.split(",")
    args.tests = args.tests.split(",")
    for name, given, known in (
        ("shape", args.shapes, SHAPES + EXTRA_SHAPES + SMOKE_SHAPES),
        ("type", args.types, TYPES + EXTRA_TYPES),
        ("test", args.tests, TESTS),
    ):
        unknown = sorted(set(given) - set(known))
        if unknown:
            ap.error(f"unknown {name} {', '.join(unknown)} (known: {', '.join(known)})")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    for tool in (LLAMA_BIN / "llama-quantize", *(args.llamacpp_bin / t for t in TOOLS)):
        if not tool.exists():
            raise SystemExit(f"{tool} is missing: run bench/build_llamacpp.sh")
    if args.cpu_path:
        # Before the engine is imported, and inherited by every server's worker.
        os.environ["LLMD_CPU_PATH"] = args.cpu_path
    args.llamacpp_isa = llamacpp_isa(args.llamacpp_bin)
    bandwidth = read_bandwidth(args.threads)
    copy = copy_bandwidth(args.threads)
    print(
        f"read bandwidth ({args.threads} threads): {bandwidth / 1e9:.1f} GB/s, "
        f"copy {copy / 1e9:.1f} GB/s (read + written)",
        flush=True,
    )
    results = []
    for shape in args.shapes:
        for qtype in args.types:
            model = build_model(shape, qtype, args.cache)
            print(f"{model.name}: {', '.join(args.tests)}", flush=True)
            result = measure(model, args, bandwidth)
            results.append(result)
            print("\n" + markdown(result) + "\n", flush=True)
    header = (
        f"{dt.date.today()}, {cpu_flags()}, {os.cpu_count()} cores, {args.threads} threads each, "
        f"{args.rounds} alternating rounds (medians), read bandwidth {bandwidth / 1e9:.1f} GB/s, "
        f"copy bandwidth {copy / 1e9:.1f} GB/s"
    )
    print(header + "\n\n" + "\n\n".join(markdown(r) for r in results))
    out = HERE / "results" / f"realistic-{dt.datetime.now():%Y-%m-%dT%H%M%S}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"header": header, "results": results}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
