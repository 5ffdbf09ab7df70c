"""How far each SIMD kernel path is from the scalar one, for llmd and for llama.cpp.

Why: llmd's SIMD paths and its scalar path compute the same integer block dots but sum the
float partial results in different orders (8 lanes then a horizontal sum, or block by block),
and every matmul's output is quantized to int8 again for the next one, so a last-bit difference
flips a rounding now and then and grows through 30 layers. llama.cpp's SIMD builds do the same
against its scalar build. The question (issue 31) is whether llmd's spread is within
llama.cpp's own: this measures both on the test model, on the first generated token of each
parity prompt (tests/fixtures/llamacpp_reference.json), as the largest |log p| difference over
the scalar reference's top 5 tokens.

    bench/build_llamacpp.sh                             # the native build (AVX-512 here)
    # and the two reference builds this compares it with (llama-server only):
    cmake -S SRC -B bench/.llamacpp/build-scalar -DGGML_NATIVE=OFF -DGGML_SSE42=OFF \\
        -DGGML_AVX=OFF -DGGML_AVX2=OFF -DGGML_BMI2=OFF -DGGML_FMA=OFF -DGGML_F16C=OFF \\
        -DGGML_LLAMAFILE=OFF ...; cmake --build bench/.llamacpp/build-scalar --target llama-server
    cmake -S SRC -B bench/.llamacpp/build-avx2 -DGGML_NATIVE=OFF -DGGML_AVX2=ON ...
    python -m bench.simd_spread
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import numpy as np

from bench.servers import default_gguf, llama_server

HERE = Path(__file__).resolve().parent
FIXTURE = HERE.parent / "tests" / "fixtures" / "llamacpp_reference.json"
TOP = 5
LLAMACPP_BUILDS = {"scalar": "build-scalar", "avx2": "build-avx2", "native": "build"}

_LLMD_FIRST_TOKEN = r"""
import json, sys
import numpy as np
from llmd import _engine as e
cases = json.loads(sys.stdin.read())
eng = e.Engine(sys.argv[1], context_length=2048, max_sequences=1, backend="cpu")
out = {"path": e.active_kernel_path(), "logprobs": []}
for ids in cases:
    row = eng.score(ids + [ids[-1]], len(ids))[0].astype(np.float64)
    out["logprobs"].append((row - row.max() - np.log(np.exp(row - row.max()).sum())).tolist())
print(json.dumps(out))
"""


def llmd_logprobs(model: str, path: str, prompts: list[list[int]]) -> list[np.ndarray]:
    done = subprocess.run(
        [sys.executable, "-c", _LLMD_FIRST_TOKEN, model],
        input=json.dumps(prompts),
        env={**os.environ, "LLMD_CPU_PATH": path},
        capture_output=True,
        text=True,
        check=True,
    )
    out = json.loads(done.stdout)
    assert out["path"] == path, f"asked for {path}, ran {out['path']}"
    return [np.array(lp) for lp in out["logprobs"]]


def llamacpp_top(
    binary: Path, model: str, prompts: list[list[int]]
) -> list[dict[int, float] | None]:
    server = llama_server(binary, Path(model), threads=2, slots=1, ctx_per_slot=2048)
    tops = []
    with server:
        server.start()
        for ids in prompts:
            body = {
                "prompt": ids,
                "n_predict": 1,
                "n_probs": 20,
                "temperature": 0,
                "post_sampling_probs": False,
                "cache_prompt": False,
            }
            req = urllib.request.Request(
                server.base_url + "/completion",
                json.dumps(body).encode(),
                {"Content-Type": "application/json"},
            )
            with urllib.request.urlopen(req, timeout=120) as r:
                out = json.load(r)
            # llama-server leaves out the probabilities of a token that ends inside a UTF-8
            # character (the Chinese and emoji prompts): those prompts are not compared.
            probs = out.get("completion_probabilities")
            top = probs[0]["top_logprobs"] if probs else []
            tops.append({int(t["id"]): float(t["logprob"]) for t in top} or None)
    return tops


def spread(reference: list[dict[int, float] | None], other: list[dict[int, float] | None]) -> float:
    """Largest |log p| difference over each prompt's reference top 5 (a token missing from
    the other's top 20 counts as its 20th log p); prompts either side lacks are skipped."""
    worst = 0.0
    for ref, oth in zip(reference, other, strict=True):
        if ref is None or oth is None:
            continue
        floor = min(oth.values())
        for tok in sorted(ref, key=ref.get, reverse=True)[:TOP]:
            worst = max(worst, abs(ref[tok] - oth.get(tok, floor)))
    return worst


def as_top(lps: list[np.ndarray]) -> list[dict[int, float] | None]:
    return [{int(t): float(lp[t]) for t in np.argsort(-lp)[:20]} for lp in lps]


def main() -> None:
    model = str(default_gguf())
    prompts = [c["prompt_ids"] for c in json.loads(FIXTURE.read_text())["cases"]]
    from llmd import _engine

    paths = ["scalar", *(p for p in ("avx2", "avx512vnni") if p in _engine.runnable_kernel_paths())]
    ours = {p: as_top(llmd_logprobs(model, p, prompts)) for p in paths}
    theirs = {}
    for name, build in LLAMACPP_BUILDS.items():
        binary = HERE / ".llamacpp" / build / "bin" / "llama-server"
        if binary.exists():
            theirs[name] = llamacpp_top(binary, model, prompts)
    print(
        f"max |log p| difference from the same engine's scalar path, first token of "
        f"{len(prompts)} prompts, over the scalar path's top {TOP}:"
    )
    for p in paths[1:]:
        print(f"  llmd {p:11} {spread(ours['scalar'], ours[p]):.4f}")
    for name in theirs:
        if name != "scalar" and "scalar" in theirs:
            print(f"  llama.cpp {name:6} {spread(theirs['scalar'], theirs[name]):.4f}")
    if "native" in theirs:
        print("against llama.cpp's native build:")
        for p in paths:
            print(f"  llmd {p:11} {spread(theirs['native'], ours[p]):.4f}")


if __name__ == "__main__":
    main()
