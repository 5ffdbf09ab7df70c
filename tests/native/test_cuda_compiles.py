"""native/cuda builds for the GPUs llmd targets, on a machine without one.

No GPU runs here or in CI, so the CUDA kernels' correctness and speed are checked on a lent GPU
machine (bench/gpu/cuda_session.sh, native/cuda/tests). What CI can check is that every kernel
file compiles to machine code for Ampere (sm_80) and Hopper (sm_90) with nvcc from PyPI (the
test extra installs it), and that the backend's host code compiles against the CUDA headers, so
a user's `CMAKE_ARGS=-DLLMD_CUDA=ON pip install '.[cuda]'` does not fail on a syntax error no
GPU session caught. The one file that calls cuBLAS is left to the GPU build (cuBLAS' headers
come with a 570 MB wheel). Ada (sm_89) runs Ampere's instructions in these kernels (none
branches on `__CUDA_ARCH__`, asserted below), so a third pass would check nothing new and cost
CI ~35 s on a 2-core Zen 1 (nvcc's front end alone takes ~12 s a file per arch there). For the
same reason the front end runs once, for compute_80, and ptxas assembles its PTX into machine
code for both sm_80 and sm_90: with no arch branch the front end reads the same source for
either, and Hopper's machine code is still built (and its ptxas errors still caught).
"""

from __future__ import annotations

import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CUDA_DIR = ROOT / "native" / "cuda"
ARCHS = ("80", "90")


def _toolkit() -> Path | None:
    try:
        import nvidia  # the nvidia-cuda-* wheels share this namespace package
    except ImportError:
        return None
    for base in nvidia.__path__:
        root = Path(base) / "cu13"
        if (root / "bin" / "nvcc").exists():
            return root
    return None


TOOLKIT = _toolkit()
pytestmark = pytest.mark.skipif(
    TOOLKIT is None, reason="nvcc from PyPI (the test extra) is not installed"
)


def _uses_cublas(path: Path) -> bool:
    return "cublas" in path.read_text()


def _run(argv: list[str]) -> tuple[list[str], subprocess.CompletedProcess[str]]:
    return argv, subprocess.run(argv, capture_output=True, text=True, timeout=900)


def test_every_kernel_file_compiles_for_ampere_and_hopper(tmp_path: Path) -> None:
    kernels = sorted(p for p in CUDA_DIR.glob("*.cu") if not _uses_cublas(p))
    assert kernels, "native/cuda has no kernel files"
    device_code = [*CUDA_DIR.glob("*.cu"), *CUDA_DIR.glob("*.cuh")]
    assert not any("__CUDA_ARCH__" in f.read_text() for f in device_code), (
        "a kernel branches on the arch: compile for Ada (sm_89) too"
    )
    gencode = [f"-gencode=arch=compute_{ARCHS[0]},code=[{','.join(f'sm_{a}' for a in ARCHS)}]"]
    jobs = [
        [
            str(TOOLKIT / "bin" / "nvcc"),
            "-std=c++20",
            "-O3",
            "--expt-relaxed-constexpr",
            f"-I{ROOT / 'native'}",
            *gencode,
            # The two archs' ptxas runs side by side: matmul_gemv.cu alone spends ~47 s in
            # ptxas on a 2-core Zen 1, and sets the test's length.
            "--threads=2",
            "-c",
            str(k),
            "-o",
            str(tmp_path / (k.stem + ".o")),
        ]
        for k in kernels
    ]
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(_run, jobs))
    failed = [f"{argv[-3]}:\n{r.stderr[-3000:]}" for argv, r in results if r.returncode != 0]
    assert not failed, "\n".join(failed)
    for k in kernels:
        assert (tmp_path / (k.stem + ".o")).stat().st_size > 0


def test_host_code_compiles_against_the_cuda_headers() -> None:
    compiler = shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        pytest.skip("no C++ compiler")
    sources = [
        p
        for p in [*CUDA_DIR.glob("*.cpp"), *(CUDA_DIR / "tests").glob("*.cpp")]
        if not _uses_cublas(p)
    ]
    assert any(p.name == "cuda_model.cpp" for p in sources)
    jobs = [
        [
            compiler,
            "-std=c++20",
            "-fsyntax-only",
            f"-I{TOOLKIT / 'include'}",
            f"-I{ROOT / 'native'}",
            str(s),
        ]
        for s in sources
    ]
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(_run, jobs))
    failed = [f"{argv[-1]}:\n{r.stderr[-3000:]}" for argv, r in results if r.returncode != 0]
    assert not failed, "\n".join(failed)
