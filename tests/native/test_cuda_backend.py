"""`--backend cuda` (native/cuda) where it cannot run: a build without the CUDA kernels, or a
machine without a GPU, refuses it with a message saying what to do, never falls back silently to
another backend. Where it can run (a GPU machine with -DLLMD_CUDA=ON), native/cuda/tests
checks it against the CPU backend (bench/gpu/cuda_session.sh)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

native = pytest.importorskip("llmd._engine")
pytestmark = pytest.mark.skipif(native.cuda_available(), reason="this build runs the cuda backend")


def test_engine_refuses_cuda_backend_with_a_clear_message(model_path: Path) -> None:
    with pytest.raises(RuntimeError, match=r"LLMD_CUDA=ON|no CUDA device"):
        native.Engine(
            str(model_path),
            context_length=256,
            max_sequences=1,
            kv_budget_bytes=8 << 20,
            backend="cuda",
        )


def test_unknown_backend_names_cuda_among_the_choices(model_path: Path) -> None:
    with pytest.raises(RuntimeError, match="expected auto, cpu, gpu, mlx-cpu or cuda"):
        native.Engine(
            str(model_path),
            context_length=256,
            max_sequences=1,
            kv_budget_bytes=8 << 20,
            backend="tpu",
        )


def test_worker_with_cuda_backend_exits_with_the_reason(model_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "llmd.worker", "--model", str(model_path), "--backend", "cuda"],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert r.returncode != 0
    assert "LLMD_CUDA=ON" in r.stdout + r.stderr or "no CUDA device" in r.stdout + r.stderr
