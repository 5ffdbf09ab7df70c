"""Per-kernel time of a decode step, from Nsight Compute's CSV (bench/gpu/cuda_session.sh runs
`ncu --nvtx --nvtx-include decode/ --metrics gpu__time_duration.sum --print-units base --csv`
over the `model_profile_step` benchmark, which runs its decode steps eagerly inside that range).

    python bench/gpu/cuda_profile.py ncu.csv --steps 3 --label "batch 1"

Prints, per kernel (template arguments shortened), launches and microseconds per step and the
share of the step's kernel time; the launches per step are what one CUDA graph replaces.
"""

from __future__ import annotations

import argparse
import csv
import re
from collections import defaultdict
from pathlib import Path


def short(name: str) -> str:
    name = re.sub(r"\(.*$", "", name)  # parameter list
    name = re.sub(r"^void ", "", name)
    name = (
        name.replace("llmd::cuda::", "")
        .replace("(anonymous namespace)::", "")
        .replace("<unnamed>::", "")
    )
    return name if len(name) <= 70 else name[:67] + "..."


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("csv", type=Path)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--label", default="")
    args = ap.parse_args()
    lines = args.csv.read_text(errors="replace").splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        print(f"{args.label}: no kernels profiled ({args.csv})")
        return
    ns: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    for row in csv.DictReader(lines[start:]):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        name = short(row["Kernel Name"])
        ns[name] += float(row["Metric Value"].replace(",", ""))
        calls[name] += 1
    total = sum(ns.values())
    launches = sum(calls.values())
    print(
        f"### {args.label}: {launches / args.steps:.0f} kernels, {total / args.steps / 1e3:.1f} us of kernel time per step"
    )
    print("| kernel | launches / step | us / step | share |")
    print("|---|---|---|---|")
    for name in sorted(ns, key=ns.get, reverse=True):
        per = ns[name] / args.steps / 1e3
        print(
            f"| {name} | {calls[name] / args.steps:.0f} | {per:.1f} | {ns[name] / total * 100:.0f}% |"
        )


if __name__ == "__main__":
    main()
