"""What runs only on macOS, checked here with the OS calls it makes faked (no Mac in CI).

Each test says what is faked: `sys.platform`, and the one command or file the code reads on a
Mac. What has never run on a real Mac is listed in the README ("Not yet run on a Mac").
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from llmd import limits
from llmd.worker import host

REPO = Path(__file__).parents[2]


def test_worker_rss_on_macos_comes_from_ps(monkeypatch: pytest.MonkeyPatch) -> None:
    # Faked: sys.platform, /proc (absent on macOS) and `ps` (its real output format: KiB).
    monkeypatch.setattr(sys, "platform", "darwin")
    real_open = open

    def no_proc(path: Any, *args: Any, **kwargs: Any) -> Any:
        if str(path).startswith("/proc/"):
            raise FileNotFoundError(path)
        return real_open(path, *args, **kwargs)

    calls: list[list[str]] = []

    def fake_ps(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        calls.append(argv)
        return subprocess.CompletedProcess(argv, 0, stdout="  123456\n", stderr="")

    monkeypatch.setattr("builtins.open", no_proc)
    monkeypatch.setattr(limits.subprocess, "run", fake_ps)
    assert limits.process_rss(4242) == 123456 * 1024
    assert calls == [["ps", "-o", "rss=", "-p", "4242"]]
    assert limits.process_rss() == 123456 * 1024 and calls[-1][-1] == str(os.getpid())


def test_a_gpu_worker_on_macos_is_the_metal_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "platform", "darwin")
    assert host._backend_name("gpu") == "mlx-metal"
    monkeypatch.setattr(sys, "platform", "linux")
    assert host._backend_name("gpu") == "mlx-cuda"
    assert host._backend_name("cpu") == "llmd-cpu"


def test_metal_kv_budget_is_a_share_of_unified_host_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # On a Mac the GPU's memory is the host's: the automatic KV budget never asks MLX for a
    # separate device's free memory (faked: sys.platform and the host's free memory).
    monkeypatch.setattr(sys, "platform", "darwin")
    monkeypatch.setattr(host, "available_host_memory", lambda: 32 << 30)
    assert host.auto_kv_budget("gpu") == 8 << 30
    assert host.auto_kv_budget("auto") == 8 << 30


def test_the_metal_preset_builds_for_apple_silicon_only() -> None:
    presets = {
        p["name"]: p
        for p in json.loads((REPO / "CMakePresets.json").read_text())["configurePresets"]
    }
    metal = presets["mlx-metal"]
    assert metal["condition"] == {"type": "equals", "lhs": "${hostSystemName}", "rhs": "Darwin"}
    cache = metal["cacheVariables"]
    assert cache["CMAKE_OSX_ARCHITECTURES"] == "arm64" and cache["LLMD_BACKEND"] == "mlx"
    assert cache["CMAKE_BUILD_TYPE"] == "Release"
    assert float(cache["CMAKE_OSX_DEPLOYMENT_TARGET"]) >= 14.0
