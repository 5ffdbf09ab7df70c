"""The `llmd` command line, in process (store commands need no daemon)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

from click.testing import CliRunner

from llmd import __version__
from llmd.cli import main


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
    src = tmp_path / "tiny.gguf"
    src.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 0))
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


def test_failures_exit_nonzero_with_a_message(llmd_home: Path) -> None:
    code, out = invoke("pull", "smollm2-360m")
    assert code == 1 and "not downloadable yet" in out
    code, out = invoke("rm", "ghost")
    assert code == 1 and "not installed" in out
    code, out = invoke("run", "smollm2-135m")
    assert code == 2 and "PROMPT" in out
