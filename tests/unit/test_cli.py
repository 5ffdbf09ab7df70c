"""The `llmd` command line, in process (store commands need no daemon)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from llmd import __version__
from llmd.cli.main import main
from tests.unit.test_store_catalog_paths import fake_gguf


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


def test_version() -> None:
    code, out = invoke("--version")
    assert code == 0 and __version__ in out


def test_help_explains_every_command() -> None:
    code, top = invoke("--help")
    assert code == 0 and "7477" in top and "LLMD_HOME" in top
    for cmd, must_mention in {
        "serve": "--port",
        "run": "PROMPT",
        "pull": "--name",
        "list": "--json",
        "rm": "NAME",
    }.items():
        assert cmd in top
        code, out = invoke(cmd, "--help")
        assert code == 0 and must_mention in out and len(out.splitlines()) > 5, cmd


def test_pull_list_rm_roundtrip(llmd_home: Path, tmp_path: Path) -> None:
    # A llama GGUF with a tensor and a vocabulary: pulls refuse what the engine cannot run.
    src = fake_gguf(tmp_path / "tiny.gguf")
    code, out = invoke("pull", str(src), "--name", "tiny")
    assert code == 0 and "installed tiny" in out
    code, out = invoke("list")
    assert code == 0 and out.splitlines()[1].split()[0] == "tiny"
    code, out = invoke("list", "--json")
    assert [r["name"] for r in json.loads(out)] == ["tiny"]
    code, out = invoke("rm", "tiny")
    assert code == 0 and "removed tiny" in out
    code, out = invoke("list")
    assert "no models installed" in out


def test_failures_exit_nonzero_with_a_message(
    llmd_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every catalog family runs now: pretend Qwen3 does not, to see the refusal's message.
    monkeypatch.setattr("llmd.store.model_support.SUPPORTED_ARCHITECTURES", ("llama",))
    code, out = invoke("pull", "qwen3-4b")
    assert code == 1 and "'qwen3' model; llmd's engine runs llama" in out
    code, out = invoke("rm", "ghost")
    assert code == 1 and "not installed" in out
    code, out = invoke("run", "smollm2-135m")
    assert code == 2 and "PROMPT" in out


def test_sizes_parse_and_bad_kv_budget_is_refused_by_serve(llmd_home: Path) -> None:
    from llmd.limits import parse_size

    assert parse_size("2GiB") == 2 << 30
    assert parse_size("512MB") == 512_000_000
    assert parse_size("64 MiB") == 64 << 20
    assert parse_size("4096") == 4096
    result = CliRunner().invoke(main, ["serve", "--kv-budget", "lots"])
    assert result.exit_code != 0
    assert "--kv-budget" in result.output and "not a size" in result.output


def test_auto_kv_budget_is_a_bounded_share_of_free_memory() -> None:
    from llmd.limits import KV_BUDGET_MAX, KV_BUDGET_MIN, available_host_memory
    from llmd.worker.host import auto_kv_budget

    budget = auto_kv_budget("cpu")
    assert KV_BUDGET_MIN <= budget <= KV_BUDGET_MAX
    assert budget <= max(KV_BUDGET_MIN, available_host_memory() // 4)
