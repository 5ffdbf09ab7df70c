"""llmd's quantized CPU kernels on arm64 (NEON, sdot), without an arm machine.

Builds the MLX-free self-test (native/tests/kernel_selftest.cpp) with the arm64 cross compiler
and runs it under qemu user-mode emulation; the same program is also built with the host
compiler and run natively, so the harness is exercised even where the cross tools are absent.
Every runnable path's output is checked against the `gguf` package's dequantize reference with
the tolerance of test_kernels.py, and each row must be bit-identical whether it is computed in
a batch or alone.

Cross tools (Debian): apt-get install -y g++-aarch64-linux-gnu qemu-user-static
"""

from __future__ import annotations

import os
import platform
import shutil
import struct
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from .kernel_checks import activation_block, activation_rounding_tolerance, kernel_weights
from .kquants import QUANTIZERS

NATIVE = Path(__file__).parents[2] / "native"
COMMON = ["mlx/kernels/dispatch.cpp", "mlx/kernels/qgemm_scalar.cpp"]
COMMON += ["core/thread_pool.cpp", "core/tensor_types.cpp", "tests/kernel_selftest.cpp"]
# Per-file flags, as in native/CMakeLists.txt.
X86_FILES = {
    "mlx/kernels/qgemm_avx2.cpp": ["-mavx2", "-mfma", "-mf16c"],
    "mlx/kernels/qgemm_avx512vnni.cpp": ["-mavx2", "-mfma", "-mf16c", "-mavx512f", "-mavx512bw"]
    + ["-mavx512vl", "-mavx512vnni"],
}
ARM_FILES = {
    "mlx/kernels/qgemm_neon.cpp": ["-march=armv8-a"],
    "mlx/kernels/qgemm_neondot.cpp": ["-march=armv8.2-a+dotprod"],
}
ARM_DEFINES = ["-DLLMD_HAVE_NEON_KERNELS"]

TYPES = {
    GGMLQuantizationType.Q4_0: "Q4_0",
    GGMLQuantizationType.Q4_1: "Q4_1",
    GGMLQuantizationType.Q8_0: "Q8_0",
    GGMLQuantizationType.IQ4_NL: "IQ4_NL",
    GGMLQuantizationType.Q5_0: "Q5_0",
    GGMLQuantizationType.Q5_1: "Q5_1",
}
SHAPES = [(1, 32), (7, 96), (33, 576)]  # (n, k), n odd
# K-quants (the project's own quantizers: gguf cannot write them); rows of 256-weight blocks.
KQUANT_TYPES = {GGMLQuantizationType[name]: name for name in QUANTIZERS}
KQUANT_SHAPES = [(1, 256), (7, 768)]
ROWS = (1, 2, 5, 67)


def _build(cxx: str, files: dict[str, list[str]], defines: list[str], out: Path) -> Path:
    """Compiles each source with its own flags (in parallel) and links `out`, statically."""
    out.parent.mkdir(parents=True, exist_ok=True)
    sources = {f: [] for f in COMMON} | files

    def compile_one(item: tuple[str, list[str]]) -> Path:
        src, flags = item
        obj = out.parent / (Path(src).name + ".o")
        cmd = [cxx, "-std=c++20", "-O2", f"-I{NATIVE}", *defines, *flags, "-c", str(NATIVE / src)]
        subprocess.run([*cmd, "-o", str(obj)], check=True, capture_output=True, text=True)
        return obj

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        objs = list(pool.map(compile_one, sources.items()))
    subprocess.run(
        [cxx, "-static", *map(str, objs), "-pthread", "-o", str(out)],
        check=True,
        capture_output=True,
        text=True,
    )
    return out


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict]]:
    """Writes the case file; returns it with each case's reference and tolerance."""
    rng = np.random.default_rng(20240611)
    path = tmp_path_factory.mktemp("selftest") / "cases.bin"
    meta = []
    with path.open("wb") as f:
        kinds = [(q, name, SHAPES) for q, name in TYPES.items()]
        kinds += [(q, name, KQUANT_SHAPES) for q, name in KQUANT_TYPES.items()]
        for qtype, name, shapes in kinds:
            for n, k in shapes:
                if name in QUANTIZERS:
                    w = rng.standard_normal((n, k), dtype=np.float32) * 0.05
                    packed = np.ascontiguousarray(QUANTIZERS[name](w)[0])
                else:
                    packed = kernel_weights(rng, n, k, qtype)
                w_deq = dequantize(packed, qtype).astype(np.float64)
                for rows in ROWS:
                    x = rng.standard_normal((rows, k), dtype=np.float32)
                    f.write(struct.pack("<Iiii", int(qtype), n, k, rows))
                    f.write(packed.tobytes())
                    f.write(np.ascontiguousarray(x, dtype="<f4").tobytes())
                    ref = x.astype(np.float64) @ w_deq.T
                    label = f"{name} n={n} k={k} rows={rows}"
                    meta.append({"label": label, "shape": (rows, n), "ref": ref})
                    block = activation_block(name)
                    meta[-1]["tol"] = activation_rounding_tolerance(x, w_deq, block)
    return path, meta


def _run(cmd: list[str], case_file: Path, env_extra: dict[str, str] | None = None):
    """Runs the self-test on `case_file`; returns its output file and its stdout."""
    out = case_file.parent / "out.bin"
    env = {k: v for k, v in os.environ.items() if k != "LLMD_CPU_PATH"} | (env_extra or {})
    proc = subprocess.run(
        [*cmd, str(case_file), str(out)], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out.read_bytes(), proc.stdout


def _parse(blob: bytes, meta: list[dict]) -> dict[str, list[tuple[np.ndarray, np.ndarray]]]:
    (n_paths,) = struct.unpack_from("<I", blob)
    names = [blob[4 + 16 * i : 20 + 16 * i].rstrip(b"\0").decode() for i in range(n_paths)]
    pos = 4 + 16 * n_paths
    results: dict[str, list] = {p: [] for p in names}
    for case in meta:
        rows, n = case["shape"]
        for p in names:
            pair = []
            for _ in range(2):
                pair.append(np.frombuffer(blob, "<f4", rows * n, pos).reshape(rows, n))
                pos += 4 * rows * n
            results[p].append(tuple(pair))
    assert pos == len(blob)
    return results


def _check(results: dict, meta: list[dict]) -> None:
    for path, per_case in results.items():
        for case, (batched, alone) in zip(meta, per_case, strict=True):
            err = np.abs(batched - case["ref"])
            excess = (err - case["tol"]).max()
            assert (err <= case["tol"]).all(), f"{path} {case['label']}: max excess {excess}"
            assert np.array_equal(batched, alone), f"{path} {case['label']}: batch-dependent row"


# Linked in place of qgemm_avx512vnni.cpp on a host that cannot run it: that file alone took
# 36 s of the test's ~40 s of compiling on a 2-core Zen 1, for kernels the host never runs.
NO_VNNI_STUB = """// This CPU cannot run the AVX-512 VNNI kernels: the self-test links without them.
#include "mlx/kernels/qgemm.h"
namespace llmd::kernels {
const KernelTable* avx512vnni_table() { return nullptr; }
}  // namespace llmd::kernels
"""


def _host_runs(path: str) -> bool:
    """Whether the engine runs kernel `path` on this CPU (True without a built engine)."""
    try:
        from llmd._engine import runnable_kernel_paths
    except ImportError:
        return True
    return path in runnable_kernel_paths()


def _host_files(build: Path) -> tuple[dict[str, list[str]], list[str]]:
    machine = platform.machine().lower()
    if machine in ("x86_64", "amd64"):
        files = dict(X86_FILES)
        if not _host_runs("avx512vnni"):
            del files["mlx/kernels/qgemm_avx512vnni.cpp"]
            stub = build / "no_vnni.cpp"
            stub.write_text(NO_VNNI_STUB)
            files[str(stub)] = []  # an absolute path: NATIVE / it is itself
        return files, []
    if machine in ("aarch64", "arm64"):
        return ARM_FILES, ARM_DEFINES
    return {}, []


def test_selftest_native(cases, tmp_path_factory) -> None:
    """The harness on the host CPU: every runnable path it compiled in."""
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no host C++ compiler (g++/c++) on PATH")
    case_file, meta = cases
    build = tmp_path_factory.mktemp("host")
    files, defines = _host_files(build)
    exe = _build(cxx, files, defines, build / "kernel_selftest")
    blob, stdout = _run([str(exe)], case_file)
    results = _parse(blob, meta)
    assert list(results)[-1] == "scalar", stdout
    _check(results, meta)


def _qemu() -> str | None:
    return shutil.which("qemu-aarch64-static") or shutil.which("qemu-aarch64")


@pytest.fixture(scope="module")
def arm64_selftest(tmp_path_factory) -> tuple[str, Path]:
    cxx = shutil.which("aarch64-linux-gnu-g++")
    qemu = _qemu()
    if cxx is None or qemu is None:
        missing = "aarch64-linux-gnu-g++" if cxx is None else "qemu-aarch64(-static)"
        pytest.skip(
            f"{missing} not installed (apt-get install -y g++-aarch64-linux-gnu qemu-user-static)"
        )
    exe = _build(cxx, ARM_FILES, ARM_DEFINES, tmp_path_factory.mktemp("arm64") / "kernel_selftest")
    return qemu, exe


# qemu's `max` CPU has the dot-product extension; Cortex-A53 (Armv8.0) has not.
@pytest.mark.parametrize(
    "cpu,expected", [("max", ["neondot", "neon", "scalar"]), ("cortex-a53", ["neon", "scalar"])]
)
def test_selftest_arm64_under_qemu(cases, arm64_selftest, cpu: str, expected: list[str]) -> None:
    qemu, exe = arm64_selftest
    case_file, meta = cases
    env = {"QEMU_LD_PREFIX": "/usr/aarch64-linux-gnu"}
    blob, stdout = _run([qemu, "-cpu", cpu, str(exe)], case_file, env)
    results = _parse(blob, meta)
    assert list(results) == expected, stdout
    assert f"active: {expected[0]}" in stdout
    _check(results, meta)
