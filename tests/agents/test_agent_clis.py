"""The real coding-agent CLIs against `llmd serve`: Claude Code (Anthropic Messages), Codex
(OpenAI Responses), opencode and Qwen Code (OpenAI chat completions), at the versions pinned in
llmd/cli/agent_config.py, configured exactly as `llmd agents NAME` and docs/agents.md say.

Each agent runs twice, non-interactively, in a temp dir holding notes.txt, asked to read it
and tell the number in it, through a logging proxy (capture_proxy.py) that keeps every request
and answer. Asserted, per agent:
  - the CLI exits 0, both runs (an expected failure, not a pass, where Claude Code or Codex
    gives up only because the model never ended its turn within the output cap: a model
    limit);
  - no request got a 4xx/5xx (or an error event inside a stream);
  - the second run's first full request (tools and all) was served >= 90% from the prefix
    cache (the usage the agent was sent: cached_tokens / cache_read_input_tokens);
  - every request that carried a tool result (the round trip: the agent ran the tool the
    model called and sent its output back) was answered 200.
What is NOT asserted by default: that the model calls the tool at all. The test model,
SmolLM2-135M, is far too weak to follow an agent's 2k-20k-token prompt reliably (it mostly
answers in prose), so whether a tool round trip happened is reported (the summary, and
LLMD_AGENT_CAPTURES/<agent>/summary.json), and asserted only with
LLMD_AGENT_TEST_REQUIRE_TOOL=1 (for a stronger model: LLMD_AGENT_TEST_MODEL=NAME).

Costs are kept down for CI (2 cores): each answer is capped at 512 tokens (the agents'
output-cap settings), Claude Code and Qwen Code get only their file-reading tool (fewer tools,
same request shapes; LLMD_AGENT_TEST_FULL=1 keeps every tool), the model is served with a
32k context (past SmolLM2's trained 8k: see --context-length). The CLIs are installed once
by install_agents.sh into ~/.cache/llmd/agents (or $LLMD_AGENTS_DIR); without node/npm, or
when the install fails (no network), the module is skipped with the reason.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import LiveServer, free_port, short_home, start_server, stop_server

# Opt-in: four CLIs (1.3 GB of npm packages) running twice each against a 135M model on two
# cores take 10-20 minutes, more than the whole suite's budget in CI. `make agents-test` runs it.
pytestmark = pytest.mark.skipif(
    os.environ.get("LLMD_AGENT_TESTS") != "1",
    reason="the real agent CLIs run with LLMD_AGENT_TESTS=1 (make agents-test)",
)

HERE = Path(__file__).parent
ROOT = HERE.parents[1]
MODEL = os.environ.get("LLMD_AGENT_TEST_MODEL", "smollm2-135m")
CONTEXT = 32768
MAX_OUTPUT = 512
RUN_TIMEOUT = float(os.environ.get("LLMD_AGENT_TEST_TIMEOUT", "420"))
FULL = os.environ.get("LLMD_AGENT_TEST_FULL") == "1"
REQUIRE_TOOL = os.environ.get("LLMD_AGENT_TEST_REQUIRE_TOOL") == "1"
SECRET = "4817"
AGENTS = ["claude", "codex", "opencode", "qwen"]

# The call each agent's file-reading tool takes, spelled out in the prompt in the markup llmd
# parses for a template without tools (SmolLM2's): a small model copies it far more often
# than it composes one.
TOOL_CALLS = {
    "claude": ("Read", "file_path"),
    "codex": ("exec_command", "cmd"),
    "opencode": ("read", "filePath"),
    "qwen": ("read_file", "absolute_path"),
}


def _prompt(agent: str, work: Path) -> str:
    name, arg = TOOL_CALLS[agent]
    value = f"cat {work / 'notes.txt'}" if agent == "codex" else str(work / "notes.txt")
    call = json.dumps({"name": name, "arguments": {arg: value}})
    return (
        "Read the file notes.txt and tell me the number in it. "
        f"To read it, reply with exactly this line:\n<tool_call>{call}</tool_call>"
    )


def _extra_args(agent: str) -> list[str]:
    if FULL:
        return []
    return {
        "claude": ["--tools", "Read"],
        "qwen": ["--core-tools", "read_file"],
    }.get(agent, [])


# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def agents_bin() -> Path:
    if not shutil.which("node") or not shutil.which("npm"):
        pytest.skip("node/npm are not installed (Debian: apt-get install nodejs npm)")
    proc = subprocess.run(
        ["bash", str(HERE / "install_agents.sh")],
        capture_output=True,
        text=True,
        timeout=1200,
        env={**os.environ, "PYTHON": sys.executable},
    )
    if proc.returncode != 0:
        pytest.skip(f"the agent CLIs could not be installed: {proc.stderr.strip()[-600:]}")
    return Path(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def llmd_server(agents_bin: Path) -> Iterator[LiveServer]:
    pytest.importorskip("llmd._engine", reason="the native engine (llmd._engine) is not built")
    home = short_home()
    # Codex names no output limit: without a server default a model that never ends its turn
    # would write until the context is full.
    live = start_server(
        home, "--context-length", str(CONTEXT), "--default-max-tokens", str(MAX_OUTPUT)
    )
    yield live
    stop_server(live)
    shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="module")
def captures_root() -> Path:
    root = os.environ.get("LLMD_AGENT_CAPTURES")
    path = Path(root) if root else Path(short_home())
    path.mkdir(parents=True, exist_ok=True)
    return path


class Proxy:
    def __init__(self, upstream: str, out: Path) -> None:
        self.port = free_port()
        self.out = out
        out.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.agents.capture_proxy",
                "--upstream",
                upstream,
                "--port",
                str(self.port),
                "--out",
                str(out),
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        line = self.proc.stdout.readline().decode() if self.proc.stdout else ""
        if "proxy on" not in line:
            raise RuntimeError(f"capture proxy did not start: {line}")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def records(self) -> list[dict]:
        return [json.loads(p.read_text()) for p in sorted(self.out.glob("[0-9]*.json"))]

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


# ---------------------------------------------------------------- reading the captures


def _is_main_request(r: dict) -> bool:
    body = r.get("body")
    return isinstance(body, dict) and bool(body.get("tools")) and r["method"] == "POST"


def _carries_tool_result(r: dict) -> bool:
    body = r.get("body")
    if not isinstance(body, dict):
        return False
    for m in body.get("messages") or []:
        if m.get("role") == "tool":
            return True
        content = m.get("content")
        if isinstance(content, list) and any(
            isinstance(c, dict) and c.get("type") == "tool_result" for c in content
        ):
            return True
    items = body.get("input")
    return isinstance(items, list) and any(
        isinstance(i, dict) and i.get("type") == "function_call_output" for i in items
    )


def _cache_split(r: dict) -> tuple[int, int] | None:
    """(cached, prompt) tokens of the exchange, from the usage the agent received."""
    usages = list(r.get("stream_usage") or [])
    if isinstance(r.get("response"), dict) and isinstance(r["response"].get("usage"), dict):
        usages.append(r["response"]["usage"])
    for u in reversed(usages):
        if "cache_read_input_tokens" in u:  # Anthropic: input_tokens excludes the cached part
            cached = u.get("cache_read_input_tokens") or 0
            total = (
                cached + (u.get("input_tokens") or 0) + (u.get("cache_creation_input_tokens") or 0)
            )
            if total:
                return cached, total
        if "prompt_tokens" in u:  # chat completions
            details = u.get("prompt_tokens_details") or {}
            return details.get("cached_tokens") or 0, u["prompt_tokens"]
        if "input_tokens" in u:  # Responses
            details = u.get("input_tokens_details") or {}
            return details.get("cached_tokens") or 0, u["input_tokens"]
    return None


def _errors(records: list[dict]) -> list[str]:
    """Requests llmd refused or failed. A client hanging up on a stream it no longer wants
    (Codex after `response.completed`, opencode abandoning its title request) is the client's
    choice, not an error, as long as llmd had answered 200."""
    out = []
    for r in records:
        status = r.get("status")
        stream_errors = [u for u in r.get("stream_usage") or [] if "stream_error" in u]
        if status is None or status >= 400 or stream_errors or r.get("proxy_error"):
            detail = r.get("response") if status and status >= 400 else stream_errors
            out.append(
                f"#{r['n']} {r['method']} {r['path']} -> {status}"
                f"{' (client gone: ' + r['client_gone'] + ')' if r.get('client_gone') else ''}"
                f"{' proxy: ' + r['proxy_error'] if r.get('proxy_error') else ''}: "
                f"{json.dumps(detail)[:500]}"
            )
    return out


# ---------------------------------------------------------------- running an agent


def _setup(agent: str, base: Path, proxy_url: str, agents_bin: Path) -> tuple[dict, Path]:
    from llmd.cli.agent_config import settings

    home = base / "home"
    work = base / "work"
    work.mkdir(parents=True, exist_ok=True)
    home.mkdir(parents=True, exist_ok=True)
    (work / "notes.txt").write_text(f"The secret number is {SECRET}.\n")
    s = settings(agent, proxy_url, MODEL, context_length=CONTEXT, max_output_tokens=MAX_OUTPUT)
    for path, text in s.files.items():
        target = home / path.removeprefix("~/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    env = {
        "HOME": str(home),
        "PATH": os.pathsep.join([str(agents_bin), os.environ.get("PATH", "/usr/bin:/bin")]),
        "LANG": "C.UTF-8",
        "TERM": "dumb",
        "NO_COLOR": "1",
        "CI": "1",
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_DATA_HOME": str(home / ".local" / "share"),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "XDG_STATE_HOME": str(home / ".local" / "state"),
        "CODEX_HOME": str(home / ".codex"),
        "QWEN_CODE_SUPPRESS_YOLO_WARNING": "1",
        **s.env,
    }
    return env, work


def _command(agent: str, work: Path) -> list[str]:
    from llmd.cli.agent_config import settings

    cmd = settings(agent, "http://x", MODEL).command
    prompt = _prompt(agent, work)
    cmd = [prompt if a == "PROMPT" else a for a in cmd]
    extra = _extra_args(agent)
    if agent == "codex":
        # Non-interactive and unsandboxed (the sandbox needs kernel features CI boxes lack);
        # it runs in a temp dir.
        cmd = [
            "codex",
            "exec",
            "--skip-git-repo-check",
            "--dangerously-bypass-approvals-and-sandbox",
            "--color",
            "never",
            prompt,
        ]
    return cmd + extra  # after the prompt: some options take several values


def _run(cmd: list[str], env: dict, work: Path) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            cmd,
            cwd=work,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT,
        )
    except subprocess.TimeoutExpired as exc:
        return subprocess.CompletedProcess(
            cmd,
            124,
            (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else exc.stdout or "",
            f"timed out after {RUN_TIMEOUT:.0f} s\n"
            + ((exc.stderr or b"").decode() if isinstance(exc.stderr, bytes) else exc.stderr or ""),
        )


@pytest.mark.parametrize("agent", AGENTS)
def test_agent_cli_against_llmd(
    agent: str, agents_bin: Path, llmd_server: LiveServer, captures_root: Path
) -> None:
    base = captures_root / agent
    shutil.rmtree(base, ignore_errors=True)
    proxy = Proxy(llmd_server.base_url, base / "requests")
    try:
        env, work = _setup(agent, base, proxy.url, agents_bin)
        cmd = _command(agent, work)
        runs = []
        for _ in range(2):
            started = time.time()
            first = len(proxy.records())
            proc = _run(cmd, env, work)
            time.sleep(0.5)  # the proxy writes an exchange as it ends
            runs.append(
                {
                    "rc": proc.returncode,
                    "seconds": round(time.time() - started, 1),
                    "stdout_tail": proc.stdout[-1500:],
                    "stderr_tail": proc.stderr[-1500:],
                    "requests": [r["n"] for r in proxy.records()[first:]],
                }
            )
        records = proxy.records()
    finally:
        proxy.stop()

    by_n = {r["n"]: r for r in records}
    run_records = [[by_n[n] for n in run["requests"] if n in by_n] for run in runs]
    main = [[r for r in rr if _is_main_request(r)] for rr in run_records]
    tool_results = [r for r in records if _carries_tool_result(r)]
    cache = _cache_split(main[1][0]) if len(main) > 1 and main[1] else None
    summary = {
        "agent": agent,
        "command": cmd,
        "runs": runs,
        "requests": [
            {
                "n": r["n"],
                "path": r["path"],
                "status": r.get("status"),
                "seconds": r.get("elapsed_s"),
                "tools": len((r.get("body") or {}).get("tools") or [])
                if isinstance(r.get("body"), dict)
                else 0,
                "tool_result": _carries_tool_result(r),
                "cache": _cache_split(r),
            }
            for r in records
        ],
        "tool_round_trips": len(tool_results),
        "second_run_cache": cache,
        "errors": _errors(records),
    }
    (base / "summary.json").write_text(json.dumps(summary, indent=1))
    print(
        json.dumps(
            {k: summary[k] for k in ("agent", "tool_round_trips", "second_run_cache", "errors")}
        )
    )

    where = f"(captures: {base})"
    assert not summary["errors"], f"{agent}: llmd refused requests {where}:\n" + "\n".join(
        summary["errors"]
    )
    assert all(main), f"{agent}: a run sent no request with tools {where}"
    assert cache is not None, f"{agent}: no usage reached the agent on run 2 {where}"
    cached, total = cache
    assert cached >= 0.9 * total, (
        f"{agent}: run 2's first request was {cached}/{total} cached (< 90%) {where}"
    )
    for r in tool_results:
        assert r.get("status") == 200, f"{agent}: tool result #{r['n']} -> {r.get('status')}"
    if REQUIRE_TOOL:
        assert tool_results, f"{agent}: the model never called a tool {where}"
    failed = [(i, run) for i, run in enumerate(runs) if run["rc"] != 0]
    if failed and all(_model_ran_past_the_cap(agent, run) for _, run in failed):
        # Every request was answered (asserted above); the CLI gave up because the model never
        # ended its turn within the output cap, which Claude Code and Codex treat as an error.
        # A model limit (SmolLM2-135M at the agent's default temperature), not a protocol one.
        pytest.xfail(f"{agent}: the model never ended its turn within {MAX_OUTPUT} tokens")
    for i, run in failed:
        raise AssertionError(
            f"{agent} run {i + 1} exited {run['rc']} {where}\nstdout: {run['stdout_tail']}\n"
            f"stderr: {run['stderr_tail']}"
        )


# What each CLI says when it gives up because an answer was cut by the output cap.
_CUT_BY_THE_CAP = {
    "claude": "output token maximum",  # "Claude's response exceeded the N output token maximum"
    "codex": "Incomplete response returned, reason: max_output_tokens",
}


def _model_ran_past_the_cap(agent: str, run: dict) -> bool:
    """Whether the CLI failed only because the model never ended its turn within the cap."""
    words = _CUT_BY_THE_CAP.get(agent)
    return words is not None and words in run["stdout_tail"] + run["stderr_tail"]
