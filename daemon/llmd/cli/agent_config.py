"""The settings that point a coding agent's CLI at llmd: Claude Code (Anthropic Messages),
Codex (OpenAI Responses), opencode and Qwen Code (OpenAI chat completions). One source for
`llmd agents NAME`, docs/agents.md and the tests that run the real CLIs
(tests/agents/test_agent_clis.py), so what a user is told is what was tested.

Every agent is kept offline: telemetry, update checks, error reports and model-list fetches
off. Their prompts are long (system prompt + tools: 7k-20k tokens), so the model needs a
context that holds them (`llmd serve --context-length`), and a CPU prefill of that takes a
while: the timeouts are raised to 10 minutes."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

AGENTS = ("claude", "codex", "opencode", "qwen")

# The npm packages and the versions tested against llmd (tests/agents/install_agents.sh).
PACKAGES = {
    "claude": ("@anthropic-ai/claude-code", "2.1.332"),
    "codex": ("@openai/codex", "0.169.0"),
    "opencode": ("opencode-ai", "1.18.33"),
    "qwen": ("@qwen-code/qwen-code", "0.24.4"),
}

TIMEOUT_MS = 600_000  # a CPU prefill of a 20k-token agent prompt can take minutes


@dataclass
class AgentSettings:
    agent: str
    title: str
    env: dict[str, str]
    files: dict[str, str] = field(default_factory=dict)  # path (~ = home) -> contents
    command: list[str] = field(default_factory=list)  # a non-interactive run, PROMPT last
    interactive: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def settings(
    agent: str,
    base_url: str,
    model: str,
    *,
    api_key: str | None = None,
    context_length: int | None = None,
    max_output_tokens: int | None = None,
) -> AgentSettings:
    """The settings for AGENT against llmd at BASE_URL (http://HOST:PORT, no /v1) serving
    MODEL. `api_key`: llmd's --api-key, if it has one (any placeholder otherwise: the CLIs
    refuse to start without a key). `context_length`: the context llmd serves the model with,
    which the agent uses to decide when to compact. `max_output_tokens` caps each answer (the
    agents ask for 32k by default; llmd clamps that to what is left of the context)."""
    base_url = base_url.rstrip("/")
    key = api_key or "llmd"
    if agent == "claude":
        env = {
            "ANTHROPIC_BASE_URL": base_url,
            "ANTHROPIC_AUTH_TOKEN": key,
            "ANTHROPIC_MODEL": model,
            "ANTHROPIC_SMALL_FAST_MODEL": model,
            "ANTHROPIC_DEFAULT_OPUS_MODEL": model,
            "ANTHROPIC_DEFAULT_SONNET_MODEL": model,
            "ANTHROPIC_DEFAULT_HAIKU_MODEL": model,
            "CLAUDE_CODE_SUBAGENT_MODEL": model,
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_ERROR_REPORTING": "1",
            "DISABLE_BUG_COMMAND": "1",
            "API_TIMEOUT_MS": str(TIMEOUT_MS),
        }
        if context_length:
            env["CLAUDE_CODE_MAX_CONTEXT_TOKENS"] = str(context_length)
        if max_output_tokens:
            env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] = str(max_output_tokens)
        return AgentSettings(
            agent,
            "Claude Code (Anthropic Messages: POST /v1/messages)",
            env,
            command=["claude", "-p", "PROMPT", "--allowedTools", "Read"],
            interactive=["claude"],
            notes=[
                "ANTHROPIC_AUTH_TOKEN is sent as `Authorization: Bearer`; any value works "
                "unless llmd runs with --api-key.",
                "`--allowedTools Read` lets `claude -p` read files without asking; "
                "`--tools Read` also shrinks the prompt to that one tool (faster on a CPU).",
            ],
        )
    if agent == "codex":
        toml = [
            f'model = "{model}"',
            'model_provider = "llmd"',
            "check_for_update_on_startup = false",
        ]
        if context_length:
            toml.append(f"model_context_window = {context_length}")
        toml += [
            "",
            "[model_providers.llmd]",
            'name = "llmd"',
            f'base_url = "{base_url}/v1"',
            'wire_api = "responses"',
            'env_key = "LLMD_API_KEY"',
            f"stream_idle_timeout_ms = {TIMEOUT_MS}",
            "request_max_retries = 1",
            "stream_max_retries = 1",
            "",
            "[analytics]",
            "enabled = false",
            "",
            "[feedback]",
            "enabled = false",
            "",
            "[otel]",
            'exporter = "none"',
        ]
        return AgentSettings(
            agent,
            "Codex (OpenAI Responses: POST /v1/responses)",
            {"LLMD_API_KEY": key},
            files={"~/.codex/config.toml": "\n".join(toml) + "\n"},
            command=[
                "codex",
                "exec",
                "--skip-git-repo-check",
                "--sandbox",
                "workspace-write",
                "PROMPT",
            ],
            interactive=["codex"],
            notes=[
                "The file goes to $CODEX_HOME/config.toml ($CODEX_HOME defaults to ~/.codex).",
                'Codex no longer accepts wire_api = "chat": llmd serves /v1/responses.',
                "`codex exec` reads stdin when it is not a terminal: give it </dev/null in "
                "scripts.",
            ],
        )
    if agent == "opencode":
        model_entry: dict = {"name": f"{model} (llmd)", "tool_call": True}
        if context_length or max_output_tokens:
            model_entry["limit"] = {
                "context": context_length or 8192,
                "output": max_output_tokens or 4096,
            }
        config = {
            "$schema": "https://opencode.ai/config.json",
            "model": f"llmd/{model}",
            "small_model": f"llmd/{model}",
            "autoupdate": False,
            "share": "disabled",
            "provider": {
                "llmd": {
                    "npm": "@ai-sdk/openai-compatible",
                    "name": "llmd",
                    "options": {
                        "baseURL": f"{base_url}/v1",
                        "apiKey": key,
                        "timeout": TIMEOUT_MS,
                    },
                    "models": {model: model_entry},
                }
            },
        }
        return AgentSettings(
            agent,
            "opencode (OpenAI chat completions: POST /v1/chat/completions)",
            {
                "OPENCODE_DISABLE_AUTOUPDATE": "1",
                "OPENCODE_DISABLE_MODELS_FETCH": "1",
                "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
                "OPENCODE_DISABLE_SHARE": "1",
                "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
            },
            files={"~/.config/opencode/opencode.json": json.dumps(config, indent=2) + "\n"},
            command=["opencode", "run", "PROMPT"],
            interactive=["opencode"],
            notes=[
                "Or put the JSON anywhere and point OPENCODE_CONFIG at it; a project's own "
                "opencode.json is merged over it.",
                "opencode also asks the model for a session title (a short request without "
                "tools) before the real one.",
            ],
        )
    if agent == "qwen":
        generation: dict = {"timeout": TIMEOUT_MS, "streamIdleTimeoutMs": TIMEOUT_MS}
        if context_length:
            generation["contextWindowSize"] = context_length
        if max_output_tokens:
            generation["samplingParams"] = {"max_tokens": max_output_tokens}
        qwen_settings = {
            "security": {"auth": {"selectedType": "openai"}},
            "model": {"name": model, "generationConfig": generation},
            "privacy": {"usageStatisticsEnabled": False},
            "telemetry": {"enabled": False},
            "general": {"disableAutoUpdate": True, "disableUpdateNag": True},
        }
        return AgentSettings(
            agent,
            "Qwen Code (OpenAI chat completions: POST /v1/chat/completions)",
            {
                "OPENAI_BASE_URL": f"{base_url}/v1",
                "OPENAI_API_KEY": key,
                "OPENAI_MODEL": model,
            },
            files={"~/.qwen/settings.json": json.dumps(qwen_settings, indent=2) + "\n"},
            command=["qwen", "--auth-type", "openai", "--approval-mode", "yolo", "PROMPT"],
            interactive=["qwen", "--auth-type", "openai"],
            notes=[
                "`--approval-mode yolo` runs tools without asking (use `auto-edit` or the "
                "default to be asked).",
            ],
        )
    raise ValueError(f"unknown agent {agent!r}; one of {', '.join(AGENTS)}")


def render(s: AgentSettings, *, shell: str = "sh") -> str:
    """The settings as a user types them: exports, files (with a heredoc each), commands."""
    lines = [f"# {s.title}"]
    for k, v in s.env.items():
        lines.append(f"export {k}={_quote(v)}")
    for path, text in s.files.items():
        shell_path = path.replace("~", "$HOME", 1)
        lines.append(f"mkdir -p \"$(dirname {shell_path})\" && cat > {shell_path} <<'EOF'")
        lines.append(text.rstrip("\n"))
        lines.append("EOF")
    if s.interactive:
        lines.append(" ".join(s.interactive) + "   # interactive")
    if s.command:
        lines.append(
            " ".join(_quote(a) if a != "PROMPT" else '"PROMPT"' for a in s.command)
            + "   # one task, non-interactive"
        )
    for note in s.notes:
        lines.append(f"# {note}")
    return "\n".join(lines) + "\n"


def _quote(v: str) -> str:
    safe = all(c.isalnum() or c in "-_./:@=," for c in v)
    return v if safe and v else "'" + v.replace("'", "'\\''") + "'"
