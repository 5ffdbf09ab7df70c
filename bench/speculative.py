"""Speculative decoding: llmd with and without its n-gram (prompt-lookup) drafter and, with
--draft, its draft-model drafter; llama-server with its own n-gram speculative modes and, with
--draft, its draft model (`-md`), on the same GGUFs, in the same run.

Workloads (greedy, so every configuration produces the same kind of text):
- edit: the model rewrites a ~500-token Python file it was given, with a one-line change
  (what coding agents do all day: the output mostly repeats the input);
- free: free text (a story), where prompt lookup finds little to draft.
Each at 1 stream and at 4 concurrent streams. Per configuration: decode tokens/s per stream
(first token to last: the prompt's prefill, served from the prefix cache after the warmup,
is not what speculation changes) and aggregate tokens/s (all streams' tokens over the wall
time). Rounds alternate the configurations; the table quotes medians over rounds, and ratios
as medians of per-round ratios.

  python -m bench.speculative --rounds 3            # writes bench/results/speculative-*.json

llama-server's speculative flags differ between versions: the ones this binary accepts are
found from its --help (`--spec-type ngram-*`, or `--lookup-*`), one configuration per mode;
--llama-spec NAME='FLAGS' adds or replaces them.

  python -m bench.speculative --draft self     # + the test model drafting for itself
  python -m bench.speculative --draft 10       # + a draft of its first 10 layers (bench/draft_gguf.py)
  python -m bench.speculative --draft q4_0     # + the model requantized as Q4_0

With --draft, llmd loads the draft in the model's worker (`--draft-model`) and requests pick
the drafter; llama-server gets `-md DRAFT` at its default draft length and at --max-draft.

Another model (a random-weight 1B-shaped GGUF of bench/realistic.py) with --model; --tokens
caps each workload's output, --llama-modes keeps a few of llama-server's n-gram modes, so a
run on a slower model fits a quiet window:

  python -m bench.speculative --model bench/.realistic/llama3.2-1b-q4_0.gguf --tokens 160 \
      --workloads edit --llama-modes ngram-map-k4v --rounds 2
  python -m bench.speculative --model bench/.realistic/llama3.2-1b-q4_0.gguf --draft 2 --draft-only
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

try:
    from bench import loadgen, servers
except ImportError:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from bench import loadgen, servers

HERE = Path(__file__).resolve().parent

EDIT_FILE = '''"""A small task queue with retries, backed by a JSON file."""

import json
import os
import time
from dataclasses import dataclass, field


@dataclass
class Task:
    name: str
    payload: dict
    attempts: int = 0
    max_attempts: int = 3
    created: float = field(default_factory=time.time)

    def should_retry(self):
        return self.attempts < self.max_attempts


class TaskQueue:
    def __init__(self, path):
        self.path = path
        self.tasks = []
        if os.path.exists(path):
            self.load()

    def load(self):
        with open(self.path, encoding="utf-8") as handle:
            raw = json.load(handle)
        self.tasks = [Task(**item) for item in raw]

    def save(self):
        data = [task.__dict__ for task in self.tasks]
        with open(self.path, "w", encoding="utf-8") as handle:
            json.dump(data, handle, indent=2)

    def push(self, name, payload):
        task = Task(name=name, payload=payload)
        self.tasks.append(task)
        self.save()
        return task

    def pop(self):
        if not self.tasks:
            return None
        task = self.tasks.pop(0)
        self.save()
        return task

    def run(self, handlers):
        done = 0
        while self.tasks:
            task = self.pop()
            handler = handlers.get(task.name)
            if handler is None:
                print(f"no handler for {task.name}")
                continue
            try:
                handler(task.payload)
                done += 1
            except Exception as error:
                task.attempts += 1
                print(f"task {task.name} failed: {error}")
                if task.should_retry():
                    self.tasks.append(task)
                    self.save()
        return done
'''

EDIT_PROMPT = [
    {
        "role": "user",
        "content": "Here is a Python file:\n```python\n"
        + EDIT_FILE
        + "```\nChange `max_attempts: int = 3` to `max_attempts: int = 5`. Reply with the whole "
        "updated file and nothing else.",
    }
]
FREE_PROMPT = [
    {"role": "user", "content": "Write a long story about a lighthouse keeper and a storm."}
]
WORKLOADS = {"edit": (EDIT_PROMPT, 600), "free": (FREE_PROMPT, 300)}


DRAFT_NAME = "bench-draft"


def draft_file(gguf: Path, spec: str) -> Path:
    """The draft GGUF for --draft: the model itself, a copy of its first N layers, or a copy
    requantized as Q4_0 / Q8_0 (bench/draft_gguf.py)."""
    if spec == "self":
        return gguf
    from bench.draft_gguf import write_requantized, write_truncated

    out = HERE / "results" / f"draft-{gguf.stem}-{spec}.gguf"
    out.parent.mkdir(parents=True, exist_ok=True)
    if not out.exists():
        if spec.isdigit():
            write_truncated(gguf, out, int(spec))
        else:
            write_requantized(gguf, out, spec.upper())
    return out


def llama_spec_modes(binary: Path) -> dict[str, list[str]]:
    """The n-gram speculative configurations this llama-server has, from its --help."""
    try:
        text = subprocess.run(
            [str(binary), "--help"], capture_output=True, text=True, timeout=60
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    modes: dict[str, list[str]] = {}
    if "--spec-type" in text:
        line = next((ln for ln in text.splitlines() if "--spec-type" in ln), "")
        rest = text[text.index("--spec-type") :][:600]
        for name in ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache"):
            if name in rest or name in line:
                modes[f"llama.cpp {name}"] = ["--spec-type", name]
    if "--lookup-ngram-min" in text or "--lookup" in text.split():
        modes.setdefault("llama.cpp lookup", ["--lookup-ngram-min", "1"])
    return modes


async def one_case(
    target: loadgen.Target,
    workload: str,
    streams: int,
    extra: dict[str, Any],
    max_tokens: int | None = None,
    timeout: float = 600.0,
) -> dict[str, Any]:
    messages, default_tokens = WORKLOADS[workload]
    max_tokens = min(default_tokens, max_tokens or default_tokens)
    async with loadgen.client_session(timeout) as session:
        start = asyncio.get_running_loop().time()
        results = await asyncio.gather(
            *(
                loadgen.stream_chat(session, target, messages, max_tokens, extra_body=extra)
                for _ in range(streams)
            )
        )
        wall = asyncio.get_running_loop().time() - start
    bad = [r.error for r in results if not r.ok]
    if bad:
        raise RuntimeError(f"{target.name} {workload} x{streams}: {bad[0]}")
    decode = [r.decode_tps for r in results if r.decode_tps]
    return {
        "decode_tok_s": statistics.median(decode) if decode else None,
        "aggregate_tok_s": sum(r.tokens for r in results) / wall,
        "tokens": [r.tokens for r in results],
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-draft", type=int, default=8, help="llmd's --speculative-max-draft")
    ap.add_argument("--llama-server", type=Path, default=servers.DEFAULT_LLAMA_SERVER)
    ap.add_argument("--no-llama", action="store_true", help="measure llmd only")
    ap.add_argument(
        "--llama-spec",
        action="append",
        default=[],
        metavar="NAME=FLAGS",
        help="a llama-server configuration (added to, or replacing, the detected ones)",
    )
    ap.add_argument(
        "--draft",
        default="",
        help="also measure draft-model drafting: 'self' (the model drafts for itself), N (a "
        "draft cut from the model's first N layers) or Q4_0 / Q8_0 (the model requantized)",
    )
    ap.add_argument("--draft-only", action="store_true", help="leave out the n-gram modes")
    ap.add_argument("--streams", default="1,4")
    ap.add_argument("--workloads", default="edit,free")
    ap.add_argument(
        "--model", type=Path, default=None, help="a GGUF to serve (default: the test model)"
    )
    ap.add_argument("--tokens", type=int, default=0, help="cap each workload's output tokens")
    ap.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        help="seconds a request may take (llama-server's 4 slots prefill the 1B's 3,172-token "
        "edit prompt one after another: ~11 min on a 2-core Zen 1)",
    )
    ap.add_argument(
        "--skip",
        action="append",
        default=[],
        metavar="NAME",
        help="leave out a configuration by name (e.g. 'llama.cpp'), to split a long run",
    )
    ap.add_argument(
        "--llama-modes",
        default="",
        help="comma-separated llama-server n-gram modes to keep (e.g. ngram-map-k4v; "
        "default: every mode this build lists)",
    )
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    gguf = args.model or servers.default_gguf()
    model_name = servers.LLMD_BENCH_MODEL if args.model else "smollm2-135m"
    streams = [int(s) for s in args.streams.split(",")]
    workloads = args.workloads.split(",")
    draft = draft_file(gguf, args.draft) if args.draft else None
    extra = ["--speculative", "ngram", "--speculative-max-draft", str(args.max_draft)]
    if draft is not None:
        extra += ["--draft-model", DRAFT_NAME]
    llmd = servers.llmd_server(
        threads=args.threads,
        max_sequences=4,
        context_length=4096,
        extra=extra,
        installs={DRAFT_NAME: draft} if draft is not None else None,
        gguf=args.model,
    )
    configs: list[tuple[str, Any, dict[str, Any]]] = []  # (name, server, extra body)
    if not args.no_llama and not args.llama_server.exists():
        print(
            f"{args.llama_server} is missing (bench/build_llamacpp.sh): llmd only", file=sys.stderr
        )
        args.no_llama = True
    configs.append(("llmd", llmd, {"speculative": False}))
    if not args.draft_only:
        configs.append(("llmd ngram", llmd, {"speculative": {"type": "ngram"}}))
    if draft is not None:
        configs.append(("llmd draft", llmd, {"speculative": {"type": "draft_model"}}))
    if not args.no_llama:
        modes = {"llama.cpp": []}
        if not args.draft_only:
            keep = {f"llama.cpp {m}" for m in args.llama_modes.split(",") if m}
            detected = llama_spec_modes(args.llama_server)
            modes |= {k: v for k, v in detected.items() if not keep or k in keep}
        if draft is not None:
            md = ["-md", str(draft), "-td", str(args.threads), "-tbd", str(args.threads)]
            modes["llama.cpp -md"] = md
            modes[f"llama.cpp -md n{args.max_draft}"] = md + [
                "--spec-draft-n-max",
                str(args.max_draft),
            ]
        for item in args.llama_spec:
            name, _, flags = item.partition("=")
            modes[name] = flags.split()
        for name, flags in modes.items():
            srv = servers.llama_server(
                args.llama_server,
                gguf,
                threads=args.threads,
                slots=4,
                ctx_per_slot=4096,
                extra=flags,
                name=name,
            )
            configs.append((name, srv, {}))
    configs = [c for c in configs if c[0] not in args.skip]
    results: dict[str, Any] = {"rounds": [], "config": vars(args)}
    refused: set[str] = set()
    try:
        llmd.start()
        for rnd in range(args.rounds):
            order = configs if rnd % 2 == 0 else list(reversed(configs))
            row: dict[str, Any] = {}
            for name, srv, extra in order:
                if name in refused:
                    continue
                # One llama-server at a time: ggml's threads spin while waiting, so two on
                # the same cores starve each other (ENVIRONMENT.md).
                if srv is not llmd:
                    try:
                        srv.start()
                    except RuntimeError as exc:  # a mode this build refuses: say so, go on
                        print(f"{name}: did not start: {exc}", file=sys.stderr)
                        results.setdefault("refused", {})[name] = str(exc)[-600:]
                        refused.add(name)
                        continue
                try:
                    target = loadgen.Target(name, srv.base_url, model_name)
                    # Warm: each prompt prefilled (then cached) by as many concurrent requests
                    # as the most streams measured (llama-server caches a prompt per slot), the
                    # edit run whole as before (a drafter that learns across requests sees it).
                    for w in workloads:
                        cap = args.tokens if w == "edit" else 2
                        asyncio.run(
                            one_case(
                                target, w, max(streams), extra, max_tokens=cap, timeout=args.timeout
                            )
                        )
                    for w in workloads:
                        for n in streams:
                            row[f"{name}|{w}|{n}"] = asyncio.run(
                                one_case(
                                    target,
                                    w,
                                    n,
                                    extra,
                                    max_tokens=args.tokens,
                                    timeout=args.timeout,
                                )
                            )
                            print(name, w, n, row[f"{name}|{w}|{n}"], flush=True)
                finally:
                    if srv is not llmd:
                        srv.stop()
            results["rounds"].append(row)
    finally:
        llmd.stop()
        for _, srv, _ in configs:
            srv.stop()
    configs = [c for c in configs if c[0] not in refused]
    names = [c[0] for c in configs]
    summary = summarize(results["rounds"], names, workloads, streams)
    results["summary"] = summary
    out = HERE / "results" / f"speculative-{dt.datetime.now():%Y%m%d-%H%M%S}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2, default=str))
    print(markdown(summary, names, workloads, streams))
    print(f"results: {out}")
    return 0


def summarize(
    rounds: list[dict[str, Any]], names: list[str], workloads: list[str], streams: list[int]
) -> dict[str, Any]:
    """Medians over rounds per configuration, and per-round ratio medians: each llmd drafter
    (ngram, draft) over llmd without, and over each llama-server configuration."""
    out: dict[str, Any] = {}
    for w in workloads:
        for n in streams:
            for key in ("decode_tok_s", "aggregate_tok_s"):
                per = {
                    name: [r[f"{name}|{w}|{n}"][key] for r in rounds if f"{name}|{w}|{n}" in r]
                    for name in names
                }
                cell: dict[str, Any] = {
                    name: statistics.median(v) for name, v in per.items() if v and None not in v
                }
                for mine in ("llmd ngram", "llmd draft"):
                    spec = per.get(mine, [])
                    for name in names:
                        if name in ("llmd ngram", "llmd draft") or not per.get(name) or not spec:
                            continue
                        pairs = zip(spec, per[name], strict=True)
                        ratios = [a / b for a, b in pairs if a and b]
                        if ratios:
                            cell[f"{mine} / {name}"] = statistics.median(ratios)
                out[f"{w}|{n}|{key}"] = cell
    return out


def markdown(
    summary: dict[str, Any], names: list[str], workloads: list[str], streams: list[int]
) -> str:
    lines = ["| workload | streams | measure | " + " | ".join(names) + " | llmd drafter vs |", ""]
    lines[1] = "|" + "---|" * (len(names) + 4)
    for w in workloads:
        for n in streams:
            for key in ("decode_tok_s", "aggregate_tok_s"):
                cell = summary[f"{w}|{n}|{key}"]
                vals = " | ".join(f"{cell[name]:.1f}" if name in cell else "-" for name in names)
                ratios = ", ".join(
                    f"{k.split(' / ')[0][5:]}/{k.split(' / ')[1]} {v:.2f}x"
                    for k, v in cell.items()
                    if " / " in k
                )
                lines.append(f"| {w} | {n} | {key} | {vals} | {ratios} |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
