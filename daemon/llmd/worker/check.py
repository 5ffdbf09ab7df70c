"""`python -m llmd.worker.check PATH`: the engine's own support check on a model, for pulls.

Why a separate process: the check runs the native loader (``_engine.check_model``: every check a
load makes, no weight bytes read), and the daemon never runs native code in its own process, so
a loader bug on a hostile file costs this process, not the daemon. Prints one JSON object:
``{"ok": true, "info": {...}}`` or ``{"ok": false, "error": "..."}``.
"""

from __future__ import annotations

import json
import os
import sys


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m llmd.worker.check MODEL_PATH", file=sys.stderr)
        return 2
    try:
        from llmd import _engine  # type: ignore[attr-defined]
    except ImportError as exc:
        print(json.dumps({"ok": None, "error": f"the native engine is not installed: {exc}"}))
        return 0
    backend = os.environ.get("LLMD_BACKEND", "auto")
    try:
        info = _engine.check_model(args[0], backend=backend)
    except (RuntimeError, ValueError) as exc:
        print(json.dumps({"ok": False, "error": str(exc)}))
        return 0
    print(json.dumps({"ok": True, "info": info}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
