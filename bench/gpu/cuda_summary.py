"""Summarize a native/cuda GPU session (bench/gpu/cuda_session.sh): llmd's cuda backend vs
llama.cpp's CUDA build per test and file, as medians over rounds and the median of per-round
ratios, and tg128 as a fraction of the bandwidth limit (the weights read once per token at the
device-to-device copy rate the kernel benchmark measured in the same run).

    python bench/gpu/cuda_summary.py model_bench.txt kernel_bench.txt
"""

from __future__ import annotations

import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

LINE = re.compile(r"^(RESULT|LLAMACPP) file=(\S+) test=(\S+) tok_s=([\d.]+)")
ORDER = [
    "tg128",
    "tg128_nograph",
    "pp512",
    "pp4096",
    "pp4096_chunk2048",
    "batch8",
    "batch32",
    "batch32_gemv",
    "batch32_gemm",
]
REFERENCE = {
    "tg128_nograph": "tg128",
    "pp4096_chunk2048": "pp4096",
    "batch32_gemm": "batch32",
    "batch32_gemv": "batch32",
}


def parse(text: str) -> dict[tuple[str, str, str], list[float]]:
    runs: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    for line in text.splitlines():
        m = LINE.match(line.strip())
        if m:
            runs[(m[1], m[2], m[3])].append(float(m[4]))
    return runs


def copy_bandwidth(text: str) -> float | None:
    """The first 'copy ... N GB/s' figure of the kernel benchmark, if it printed one."""
    for line in text.splitlines():
        if "copy" in line.lower():
            m = re.search(r"([\d.]+)\s*GB/s", line)
            if m:
                return float(m[1])
    return None


def main() -> None:
    runs = parse(Path(sys.argv[1]).read_text())
    bw = copy_bandwidth(Path(sys.argv[2]).read_text()) if len(sys.argv) > 2 else None
    files = sorted({f for (_, f, _) in runs})
    print(f"copy bandwidth: {bw:.0f} GB/s" if bw else "copy bandwidth: not measured")
    print("| file | test | llmd tok/s | llama.cpp tok/s | llmd / llama.cpp | llmd % of limit |")
    print("|---|---|---|---|---|---|")
    for f in files:
        size = Path(f).stat().st_size if Path(f).exists() else 0
        for test in ORDER:
            ours = runs.get(("RESULT", f, test), [])
            theirs = runs.get(("LLAMACPP", f, REFERENCE.get(test, test)), [])
            if not ours:
                continue
            ratios = [a / b for a, b in zip(ours, theirs, strict=False) if b > 0]
            ratio = f"{statistics.median(ratios):.2f}x" if ratios else "-"
            ref = f"{statistics.median(theirs):,.1f}" if theirs else "-"
            limit = "-"
            if bw and size and test.startswith("tg"):
                limit = f"{statistics.median(ours) * size / (bw * 1e9) * 100:.0f}%"
            name = Path(f).name
            print(
                f"| {name} | {test} | {statistics.median(ours):,.1f} | {ref} | {ratio} | {limit} |"
            )


if __name__ == "__main__":
    main()
