"""Weights in 2 MiB pages (issue 31): decode streams every weight byte once per token, and with
4 KiB pages the stream stalls at every page boundary (native/core/huge_pages.h). The engine
asks Linux for transparent huge pages on its weight buffers before writing them; this checks
that a loaded model's weights really sit in huge pages where the machine offers them, and
that the text generated is the same as with them turned off (LLMD_HUGE_PAGES=0)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("llmd._engine")

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")

CHILD = """
import json, sys, llmd._engine as e
eng = e.Engine(sys.argv[1], context_length=512, max_sequences=1)
eng.submit("a", [1, 504, 3937, 282, 4649, 30], 16)
tokens = []
done = False
while not done:
    for ev in eng.poll(1000):
        if ev["type"] == "tokens":
            tokens += ev["tokens"]
        done = done or ev["type"] == "done"
huge = [l for l in open("/proc/self/smaps_rollup") if l.startswith("AnonHugePages:")]
print(json.dumps({"tokens": tokens, "huge_kib": int(huge[0].split()[1]) if huge else 0}))
"""


def _load(model: Path, huge_pages: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(model)],
        env={**os.environ, "LLMD_HUGE_PAGES": huge_pages},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(
    not THP.exists() or "[never]" in THP.read_text(),
    reason="this kernel offers no transparent huge pages",
)
def test_weights_sit_in_huge_pages_and_text_is_unchanged(model_path: Path) -> None:
    on = _load(model_path, "1")
    off = _load(model_path, "0")
    # The test model's token embedding alone (Q8_0, 49152 x 576) spans 14 whole huge pages.
    assert on["huge_kib"] >= 8 << 10, on
    assert off["huge_kib"] < on["huge_kib"], (off, on)
    assert len(on["tokens"]) == 16
    assert on["tokens"] == off["tokens"]
