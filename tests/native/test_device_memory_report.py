"""The memory an MLX device backend holds is reported (issue 22, Metal readiness).

On a Mac the engine's weights and KV live in Metal's unified memory, allocated by MLX, which a
process's RSS does not show the way a user expects; on CUDA they are not in the RSS at all. The
worker reports MLX's allocator counters in its stats, and `llmd status` prints them. MLX's CPU
device uses the same allocator interface, so the report is checked here on `mlx-cpu`; llmd's own
CPU kernels hold their weights in host memory (the RSS) and report none.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.native.conftest import read_event, send, worker_process

pytest.importorskip("llmd._engine", reason="the native engine (llmd._engine) is not built")


def _stats(model: Path, backend: str) -> dict:
    with worker_process(model, backend) as (proc, _):
        send(
            proc,
            {"type": "generate", "id": "g", "prompt": [1, 2, 3], "max_tokens": 2, "sampling": {}},
        )
        while read_event(proc)["type"] != "done":
            pass
        send(proc, {"type": "stats"})
        while (event := read_event(proc))["type"] != "stats":
            pass
    return {**event, **event.get("extra", {})}


def test_an_mlx_device_worker_reports_the_device_memory_it_holds(model_path: Path) -> None:
    memory = _stats(model_path, "mlx-cpu")["device_memory"]
    # The test model's weights alone are ~100 MB on the device.
    assert memory["active_bytes"] > 50 << 20
    assert memory["peak_bytes"] >= memory["active_bytes"]
    assert memory["cache_bytes"] >= 0
    assert "device_memory" not in _stats(model_path, "cpu")
