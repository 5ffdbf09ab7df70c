"""Whether the engine will load a model file, asked of the engine itself at pull time.

Why: the pull's own checks (``install.check_gguf``: architecture, tokenizer, tensor types) are
a copy of what the engine knows, and a copy drifts; a Q4_K_M file once installed with success
and then failed its first request. So after those cheap checks a pull runs the engine's loader
in validation mode (``llmd.worker.check``: hyperparameters, every tensor's presence, shape and
type, no weight bytes read; ~50 ms plus the process start) and refuses the model with the
loader's own message. GGUF files only: a safetensors directory's loader reads its tensors as it
checks them, and ``install.check_hf_config`` covers what the engine refuses there.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

log = logging.getLogger("llmd.engine_check")

CHECK_TIMEOUT_S = 120.0


def engine_refusal(path: Path) -> str | None:
    """The engine's reason for refusing the GGUF file at `path`, or None when it loads it (or
    when no engine is installed to ask, which a pull does not treat as a refusal)."""
    try:
        done = subprocess.run(
            [sys.executable, "-m", "llmd.worker.check", str(path)],
            capture_output=True,
            text=True,
            timeout=CHECK_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return f"the engine's support check did not finish within {CHECK_TIMEOUT_S:.0f} s"
    try:
        result = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        tail = (done.stderr or "").strip().splitlines()[-1:] or [f"exit status {done.returncode}"]
        return f"the engine's support check failed: {tail[0]}"
    if result.get("ok") is None:
        log.warning("skipping the engine's support check: %s", result.get("error"))
        return None
    return None if result["ok"] else str(result.get("error") or "refused by the engine")
