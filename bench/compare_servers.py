"""llmd vs llama.cpp's `llama-server` over HTTP (OpenAI streaming API), on the same GGUF, the
same machine and the same thread count: time to first token (p50/p95), per-stream decode
tokens/s and aggregate tokens/s at 1, 4 and 16 concurrent streams, and a 10-turn chat whose
history grows (the workload where prefix reuse shows): TTFT per turn.

The machines are noisy, so every case runs on every server once per round, servers taking
turns case by case in an order that rotates each round (AB, BA, AB, ...); the table quotes, per
measure, the median over rounds of the per-round ratio llmd / llama.cpp. Each round has its own
prompts (the same for every server), so no round is served from the previous one's cache.

By default it starts both servers on free loopback ports and stops them at exit (Ctrl-C too):

  llmd serve --max-sequences 16 --threads N --context-length CTX
  llama-server -m GGUF -np 16 -c 16*CTX -cb -t N -tb N

Any OpenAI-compatible server already running can be measured instead, or as well (Ollama,
vLLM, a GPU machine's servers); ratios are then each target over --reference (default
llama.cpp when it runs, else the last target):

  python -m bench.compare_servers                            # llmd vs llama.cpp, 5 rounds
  python -m bench.compare_servers --start llmd \\
      --base-url ollama=http://127.0.0.1:11434 --model ollama=smollm2:135m

Writes bench/results/<timestamp>/: results.json (config, versions, every request of every
round, medians, per-round ratios), table.md, throughput_vs_concurrency.png, ttft_per_turn.png
(the plots need matplotlib: pip install ".[bench]").
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import platform
import shlex
import signal
import statistics
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

# Run as a file (python bench/compare_servers.py), the repo root is not on the path: add it.
try:
    from bench import loadgen, servers
except ImportError:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from bench import loadgen, servers

HERE = Path(__file__).resolve().parent
DEFAULT_MODEL = "smollm2-135m"
# a load case's measure -> (row label, scale, unit); chat TTFTs are in ms too
LOAD_MEASURES = {
    "aggregate_tok_s": ("aggregate tok/s", 1.0, ""),
    "decode_tok_s_p50": ("decode tok/s per stream (p50)", 1.0, ""),
    "ttft_s_p50": ("TTFT p50", 1000.0, " ms"),
    "ttft_s_p95": ("TTFT p95", 1000.0, " ms"),
}


class Interrupted(Exception):
    """SIGTERM, turned into an exception so that the servers are stopped on the way out."""


def _on_sigterm(signum: int, frame: object) -> None:
    raise Interrupted()


def _pairs(values: list[str], flag: str) -> dict[str, str]:
    out = {}
    for v in values:
        name, sep, rest = v.partition("=")
        if not sep or not name or not rest:
            raise SystemExit(f"{flag} takes NAME=VALUE, got {v!r}")
        out[name] = rest
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rounds", type=int, default=5)
    how_long = ap.add_mutually_exclusive_group()
    how_long.add_argument(
        "--duration", type=float, default=None, help="seconds of load per case (default 20)"
    )
    how_long.add_argument("--requests", type=int, default=None, help="requests per load case")
    ap.add_argument("--max-tokens", type=int, default=128, help="per request, every workload")
    ap.add_argument("--concurrency", default="1,4,16", help="comma-separated stream counts")
    ap.add_argument("--turns", type=int, default=10, help="turns of the chat (0: no chat)")
    ap.add_argument("--threads", type=int, default=os.cpu_count(), help="both servers (all cores)")
    ap.add_argument(
        "--slots", type=int, default=16, help="llmd --max-sequences and llama-server -np"
    )
    ap.add_argument("--ctx-per-slot", type=int, default=4096, help="context per sequence")
    ap.add_argument("--gguf", type=Path, default=None, help="default: smollm2-135m's GGUF")
    ap.add_argument("--llama-server", type=Path, default=servers.DEFAULT_LLAMA_SERVER)
    ap.add_argument("--llmd-args", default="", help="extra `llmd serve` arguments")
    ap.add_argument("--llama-server-args", default="", help="extra arguments, e.g. '-ngl 99'")
    ap.add_argument(
        "--start",
        action="append",
        choices=["llmd", "llama.cpp"],
        default=None,
        help="servers to start (repeatable; default both, none when --base-url is given)",
    )
    ap.add_argument(
        "--base-url",
        action="append",
        default=[],
        metavar="NAME=URL",
        help="measure a running OpenAI-compatible server too (repeatable)",
    )
    ap.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="NAME=MODEL",
        help=f"model name to send to target NAME (default {DEFAULT_MODEL})",
    )
    ap.add_argument("--reference", default=None, help="ratio denominator (default llama.cpp)")
    ap.add_argument("--out", type=Path, default=None, help="default bench/results/<timestamp>")
    ap.add_argument("--no-plots", action="store_true")
    args = ap.parse_args(argv)
    if args.duration is None and args.requests is None:
        args.duration = 20.0
    args.concurrency = [int(c) for c in args.concurrency.split(",") if c.strip()]
    args.base_urls = _pairs(args.base_url, "--base-url")
    args.models = _pairs(args.model, "--model")
    if args.start is None:
        args.start = [] if args.base_urls else ["llmd", "llama.cpp"]
    return args


# ---------------------------------------------------------------------- measuring


def _cases(args: argparse.Namespace) -> list[str]:
    return [f"c{c}" for c in args.concurrency] + (["chat"] if args.turns else [])


async def warm(target: loadgen.Target, args: argparse.Namespace) -> None:
    """Load the model and touch every code path once (a full batch, a second chat turn)
    before anything is timed; a target that fails here is misconfigured: stop."""
    widest = max(args.concurrency, default=1)
    load = await loadgen.run_load(target, widest, 16, requests=widest, seed=-1)
    failed = load.failed
    if args.turns:
        failed += (await loadgen.run_chat(target, 2, 16, seed=-1)).failed
    if failed:
        raise RuntimeError(f"{target.name}: warm-up request failed: {failed[0].error}")


async def measure(
    target: loadgen.Target, case: str, seed: int, args: argparse.Namespace
) -> dict[str, Any]:
    """One case on one target: its metrics and every request's record."""
    if case == "chat":
        chat = await loadgen.run_chat(target, args.turns, args.max_tokens, seed=seed)
        return {**chat.metrics(), "records": [r.summary() for r in chat.turns]}
    load = await loadgen.run_load(
        target,
        int(case[1:]),
        args.max_tokens,
        requests=args.requests,
        duration=args.duration,
        seed=seed,
    )
    return {**load.metrics(), "records": [r.summary() for r in load.requests]}


def _brief(case: str, m: dict[str, Any]) -> str:
    if case == "chat":
        ttfts = ", ".join(_fmt(t, 1000, "") for t in m["ttft_s_per_turn"])
        return f"TTFT ms per turn [{ttfts}]" + (f", {m['failed']} failed" if m["failed"] else "")
    return (
        f"{m['aggregate_tok_s']:.1f} tok/s, decode {_fmt(m['decode_tok_s_p50'], 1, '')} tok/s, "
        f"TTFT p50 {_fmt(m['ttft_s_p50'], 1000, ' ms')}, {_plural(m['requests'], 'request')}"
        + (f", {m['failed']} failed" if m["failed"] else "")
    )


async def run_rounds(
    targets: list[loadgen.Target], args: argparse.Namespace, rounds: list[dict[str, Any]]
) -> None:
    """Appends each finished round to `rounds` (so an interrupted run keeps what it has)."""
    for t in targets:
        print(f"warming {t.name} ({t.base_url})", flush=True)
        await warm(t, args)
    for r in range(args.rounds):
        order = targets[r % len(targets) :] + targets[: r % len(targets)]
        record: dict[str, Any] = {"round": r + 1, "order": [t.name for t in order], "cases": {}}
        for i, case in enumerate(_cases(args)):
            seed = 1000 * (r + 1) + i
            for t in order:
                m = await measure(t, case, seed, args)
                record["cases"].setdefault(case, {})[t.name] = m
                print(f"round {r + 1} {case:>5} {t.name:>10}: {_brief(case, m)}", flush=True)
        rounds.append(record)


# ---------------------------------------------------------------------- summarizing


def _measures(args: argparse.Namespace) -> Iterator[tuple[str, str, str]]:
    """(case, measure key, row label) of every table row, in order."""
    for c in args.concurrency:
        streams = _plural(c, "stream")
        for key, (label, *_rest) in LOAD_MEASURES.items():
            yield f"c{c}", key, f"{streams}: {label}"
    if args.turns:
        for turn in range(1, args.turns + 1):
            yield "chat", f"ttft_turn_{turn}", f"chat turn {turn}: TTFT"
        yield "chat", "ttft_s_mean", "chat: mean TTFT over turns"


def _value(case_metrics: dict[str, Any], key: str) -> float | None:
    if key.startswith("ttft_turn_"):
        per_turn = case_metrics["ttft_s_per_turn"]
        turn = int(key.rsplit("_", 1)[1])
        return per_turn[turn - 1] if turn <= len(per_turn) else None
    return case_metrics.get(key)


def summarize(
    rounds: list[dict[str, Any]], names: list[str], reference: str | None, args: argparse.Namespace
) -> dict[str, Any]:
    """Medians over rounds per target, and medians of per-round ratios target / reference."""
    medians: dict[str, dict[str, dict[str, float | None]]] = {}
    ratios: dict[str, dict[str, dict[str, Any]]] = {}
    for case, key, _label in _measures(args):
        for name in names:
            vals = [v for rd in rounds if (v := _value(rd["cases"][case][name], key)) is not None]
            medians.setdefault(case, {}).setdefault(key, {})[name] = (
                statistics.median(vals) if vals else None
            )
        if reference is None:
            continue
        for name in names:
            if name == reference:
                continue
            per_round = []
            for rd in rounds:
                a = _value(rd["cases"][case][name], key)
                b = _value(rd["cases"][case][reference], key)
                per_round.append(a / b if a is not None and b else None)
            valid = [x for x in per_round if x is not None]
            ratios.setdefault(name, {}).setdefault(case, {})[key] = {
                "per_round": per_round,
                "median": statistics.median(valid) if valid else None,
            }
    return {"medians": medians, "ratios": ratios}


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _fmt(v: float | None, scale: float, unit: str) -> str:
    if v is None:
        return "-"
    x = v * scale
    return f"{x:,.0f}{unit}" if abs(x) >= 100 else f"{x:.1f}{unit}"


def _scale(key: str) -> tuple[float, str]:
    if key in LOAD_MEASURES:
        _label, scale, unit = LOAD_MEASURES[key]
        return scale, unit
    return 1000.0, " ms"  # chat TTFTs


def _failures(rounds: list[dict[str, Any]], names: list[str]) -> dict[str, int]:
    return {
        n: sum(rd["cases"][c][n]["failed"] for rd in rounds for c in rd["cases"]) for n in names
    }


def _tokens_per_request(rounds: list[dict[str, Any]], name: str) -> float | None:
    toks = [
        q["tokens"]
        for rd in rounds
        for c, per in rd["cases"].items()
        if c != "chat"
        for q in per[name]["records"]
        if q["ok"]
    ]
    return statistics.fmean(toks) if toks else None


def _last_turn_prompt(rounds: list[dict[str, Any]], name: str) -> str:
    """'P (C)' for the chat's last turn: whether a server reused the history shows here."""
    last = [rd["cases"]["chat"][name]["records"][-1] for rd in rounds]
    prompt = [q["prompt_tokens"] for q in last if q["prompt_tokens"] is not None]
    cached = [q["cached_tokens"] for q in last if q["cached_tokens"] is not None]
    return (f"{statistics.median(prompt):.0f}" if prompt else "-") + (
        f" ({statistics.median(cached):.0f})" if cached else " (not reported)"
    )


def table(
    summary: dict[str, Any],
    rounds: list[dict[str, Any]],
    names: list[str],
    reference: str | None,
    header: str,
    args: argparse.Namespace,
) -> str:
    others = [n for n in names if n != reference] if reference else []
    cols = ["measure", *names] + [f"{n} / {reference}" for n in others]
    lines = [header, "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for case, key, label in _measures(args):
        scale, unit = _scale(key)
        row = [label]
        row += [_fmt(summary["medians"][case][key][n], scale, unit) for n in names]
        for n in others:
            med = summary["ratios"][n][case][key]["median"]
            row.append("-" if med is None else f"{med:.2f}x")
        lines.append("| " + " | ".join(row) + " |")
    toks = ", ".join(f"{n} {_fmt(_tokens_per_request(rounds, n), 1, '')}" for n in names)
    failures = _failures(rounds, names)
    lines += [
        "",
        (
            f"Ratios are medians over {_plural(len(rounds), 'round')} of each round's ratio; above 1x is "
            "better for tok/s, below 1x for TTFT. "
            if others
            else ""
        )
        + f"Generated tokens per load request (mean, max {args.max_tokens}): {toks}.",
    ]
    if args.turns:
        lines.append(
            "Chat, last turn, prompt tokens (of them served from cache), median: "
            + ", ".join(f"{n} {_last_turn_prompt(rounds, n)}" for n in names)
            + "."
        )
    if any(failures.values()):
        lines.append("Failed requests: " + ", ".join(f"{n} {k}" for n, k in failures.items()) + ".")
    return "\n".join(lines) + "\n"


def plots(
    rounds: list[dict[str, Any]], names: list[str], out: Path, args: argparse.Namespace
) -> list[Path]:
    """throughput_vs_concurrency.png and ttft_per_turn.png: medians over rounds, with bars
    from the lowest to the highest round (the noise the medians smooth over)."""
    try:
        import matplotlib
    except ImportError:
        print('matplotlib is missing, so no plots: pip install ".[bench]"', file=sys.stderr)
        return []
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def draw(ax: Any, xs: list[int], where: Callable[[int], tuple[str, str]], scale: float) -> None:
        for name in names:
            pts = []
            for x in xs:
                case, key = where(x)
                vals = [
                    v * scale
                    for rd in rounds
                    if (v := _value(rd["cases"][case][name], key)) is not None
                ]
                if vals:
                    mid = statistics.median(vals)
                    pts.append((x, mid, mid - min(vals), max(vals) - mid))
            if pts:
                xs_, mids, lo, hi = zip(*pts, strict=True)
                ax.errorbar(xs_, mids, yerr=[lo, hi], marker="o", capsize=3, label=name)
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend()

    written = []
    if args.concurrency:
        fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
        for ax, key, title in (
            (axes[0], "aggregate_tok_s", "aggregate tokens/s"),
            (axes[1], "decode_tok_s_p50", "decode tokens/s per stream (p50)"),
        ):
            ax.set_xscale("log", base=2)
            draw(ax, args.concurrency, lambda c, key=key: (f"c{c}", key), 1.0)
            ax.set_xlabel("concurrent streams")
            ax.set_title(title)
        fig.suptitle(
            f"max {args.max_tokens} tokens per request; median of {_plural(len(rounds), 'round')}"
        )
        fig.tight_layout()
        written.append(out / "throughput_vs_concurrency.png")
        fig.savefig(written[-1], dpi=120)
        plt.close(fig)
    if args.turns:
        fig, ax = plt.subplots(figsize=(7, 4.2))
        draw(ax, list(range(1, args.turns + 1)), lambda t: ("chat", f"ttft_turn_{t}"), 1000.0)
        ax.set_xlabel("turn (the history grows each turn)")
        ax.set_ylabel("time to first token (ms)")
        ax.set_title(f"multi-turn chat, max {args.max_tokens} tokens per reply")
        fig.tight_layout()
        written.append(out / "ttft_per_turn.png")
        fig.savefig(written[-1], dpi=120)
        plt.close(fig)
    return written


# ---------------------------------------------------------------------- running


def environment() -> dict[str, Any]:
    """What the figures depend on besides the servers: the CPU, the cores, the checkout."""
    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass

    def git(*a: str) -> str:
        r = subprocess.run(["git", *a], cwd=HERE, capture_output=True, text=True)
        return r.stdout.strip()

    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "git_commit": git("rev-parse", "HEAD"),
        "git_dirty": bool(git("status", "--porcelain")),
    }


def _targets(
    args: argparse.Namespace, gguf: Path | None
) -> tuple[list[servers.ManagedServer], list[loadgen.Target], dict[str, dict[str, Any]]]:
    """The servers to start (not started yet), every target, and how each was set up."""
    managed: list[servers.ManagedServer] = []
    targets: list[loadgen.Target] = []
    info: dict[str, dict[str, Any]] = {}
    if "llmd" in args.start:
        assert gguf is not None
        own_model = gguf != servers.default_gguf().resolve()
        srv = servers.llmd_server(
            threads=args.threads,
            max_sequences=args.slots,
            context_length=args.ctx_per_slot,
            extra=shlex.split(args.llmd_args),
            gguf=gguf if own_model else None,
        )
        managed.append(srv)
        model = servers.LLMD_BENCH_MODEL if own_model else DEFAULT_MODEL
        targets.append(loadgen.Target("llmd", srv.base_url, args.models.get("llmd", model)))
        version = servers.tool_version([sys.executable, "-m", "llmd", "--version"], srv.env)
        info["llmd"] = {
            "command": srv.argv,
            "version": version,
            "pythonpath": (srv.env or {}).get("PYTHONPATH"),  # set: the checkout's sources
        }
    if "llama.cpp" in args.start:
        assert gguf is not None
        srv = servers.llama_server(
            args.llama_server,
            gguf,
            threads=args.threads,
            slots=args.slots,
            ctx_per_slot=args.ctx_per_slot,
            extra=shlex.split(args.llama_server_args),
        )
        managed.append(srv)
        model = args.models.get("llama.cpp", DEFAULT_MODEL)
        targets.append(loadgen.Target("llama.cpp", srv.base_url, model))
        version = servers.tool_version([str(args.llama_server), "--version"])
        info["llama.cpp"] = {"command": srv.argv, "version": version}
    for name, url in args.base_urls.items():
        targets.append(loadgen.Target(name, url, args.models.get(name, DEFAULT_MODEL)))
        info[name] = {"base_url": url, "started_by_runner": False}
    for t in targets:
        info[t.name]["model"] = t.model
    if len({t.name for t in targets}) != len(targets):
        raise SystemExit("target names must differ")
    return managed, targets, info


def write_results(
    out: Path,
    args: argparse.Namespace,
    rounds: list[dict[str, Any]],
    targets: list[loadgen.Target],
    info: dict[str, Any],
    gguf: Path | None,
    started: str,
) -> None:
    names = [t.name for t in targets]
    reference = args.reference or ("llama.cpp" if "llama.cpp" in names else None)
    if reference is None and len(names) > 1:
        reference = names[-1]
    summary = summarize(rounds, names, reference, args)
    env = environment()
    model = gguf.name if gguf else ", ".join(sorted({t.model for t in targets}))
    load = (
        f"{args.duration:g} s per case" if args.duration else f"{args.requests} requests per case"
    )
    header = (
        f"{started[:10]}, {env['cpu']} ({env['cores']} cores), {model}, "
        f"{args.threads} threads each, {args.slots} slots, {_plural(len(rounds), 'round')}, {load}, "
        f"max {args.max_tokens} tokens, temperature 0; medians over rounds"
    )
    (out / "table.md").write_text(table(summary, rounds, names, reference, header, args))
    config = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    result = {
        "started": started,
        "config": {**config, "gguf": gguf and str(gguf), "reference": reference},
        "environment": env,
        "targets": info,
        "rounds": rounds,
        **summary,
    }
    (out / "results.json").write_text(json.dumps(result, indent=1))
    written = [] if args.no_plots else plots(rounds, names, out, args)
    print()
    print((out / "table.md").read_text())
    for f in [out / "results.json", out / "table.md", *written]:
        print(f"wrote {f}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # Only the servers the runner starts need the file (a --base-url server has its own).
    gguf = (args.gguf or servers.default_gguf()).resolve() if args.start else None
    started = dt.datetime.now().isoformat(timespec="seconds")
    out = args.out or HERE / "results" / started.replace(":", "")
    if "llama.cpp" in args.start and not args.llama_server.exists():
        raise SystemExit(f"{args.llama_server} is missing: build it with bench/build_llamacpp.sh")
    managed, targets, info = _targets(args, gguf)
    if not targets:
        raise SystemExit("nothing to measure: --start llmd/llama.cpp or --base-url NAME=URL")
    rounds: list[dict[str, Any]] = []
    signal.signal(signal.SIGTERM, _on_sigterm)
    code = 0
    try:
        for srv in managed:
            print(f"starting {srv.name}: {shlex.join(srv.argv)}", flush=True)
            srv.start()
        asyncio.run(run_rounds(targets, args, rounds))
    except (KeyboardInterrupt, Interrupted):
        print(f"\ninterrupted after {len(rounds)} complete rounds", file=sys.stderr)
        code = 130
    finally:
        for srv in managed:
            srv.stop()
            print(f"stopped {srv.name} (its log: {srv.log})", flush=True)
    if rounds:
        out.mkdir(parents=True, exist_ok=True)
        write_results(out, args, rounds, targets, info, gguf, started)
    return code


if __name__ == "__main__":
    sys.exit(main())
