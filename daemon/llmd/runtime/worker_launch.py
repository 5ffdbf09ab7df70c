"""How the daemon starts a worker: argv and environment for ``python -m llmd.worker``."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from llmd.runtime.blas import blas_environment


def _shim_dir() -> Path:
    home = os.environ.get("LLMD_HOME")
    base = Path(home) / "cache" if home else Path(tempfile.gettempdir()) / f"llmd-{os.getuid()}"
    return base / "libshim"


def worker_command(
    model_path: str,
    *,
    context_length: int | None = None,
    threads: int | None = None,
    max_sequences: int | None = None,
    kv_budget_bytes: int | None = None,
    kv_type: str | None = None,
    kv_disk_bytes: int | None = None,
    kv_disk_dir: str | None = None,
    model_digest: str | None = None,
    draft_model: str | None = None,
    mmproj: str | None = None,
) -> tuple[list[str], dict[str, str]]:
    """argv and env (a full copy of os.environ plus BLAS settings) for one worker process."""
    argv = [sys.executable, "-m", "llmd.worker", "--model", str(model_path)]
    if context_length:
        argv += ["--context-length", str(context_length)]
    if threads:
        argv += ["--threads", str(threads)]
    if max_sequences:
        argv += ["--max-sequences", str(max_sequences)]
    if kv_budget_bytes:
        argv += ["--kv-budget", str(kv_budget_bytes)]
    if kv_type:
        argv += ["--kv-type", kv_type]
    if kv_disk_bytes and kv_disk_dir:
        argv += ["--kv-disk", str(kv_disk_bytes), "--kv-disk-dir", str(kv_disk_dir)]
    if model_digest:
        argv += ["--model-digest", model_digest]
    if draft_model:
        argv += ["--draft-model", str(draft_model)]
    if mmproj:
        argv += ["--mmproj", str(mmproj)]
    env = dict(os.environ)
    env.update(blas_environment(_shim_dir()))
    n = threads or int(env.get("LLMD_THREADS", "0") or 0) or (os.cpu_count() or 1)
    # llmd's kernels and BLAS never run at the same moment (one MLX op at a time), so both
    # may use every core without oversubscribing.
    env.setdefault("OPENBLAS_NUM_THREADS", str(n))
    env["LLMD_THREADS"] = str(n)
    env["PYTHONUNBUFFERED"] = "1"
    return argv, env
