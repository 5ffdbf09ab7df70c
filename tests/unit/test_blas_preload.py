"""The worker gets OpenBLAS preloaded only where that build can run.

cmeel-openblas 0.3.31 is a SKYLAKEX-only build: on an AVX2-only CPU its sgemm kernels are
illegal instructions, and a preloaded worker died of SIGILL in its first float matmul (every
safetensors model). The decision is read from the library file and /proc/cpuinfo, never by
loading the library into the daemon.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from llmd.runtime.blas import (
    blas_environment,
    cpu_flags,
    find_openblas,
    openblas_build,
    openblas_runs_here,
)

AVX512 = {"avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd"}


def _library(tmp_path: Path, config: bytes, extra: bytes = b"") -> Path:
    lib = tmp_path / "libopenblas.so.0"
    lib.write_bytes(b"\x7fELF\x00junk\x00" + config + b"\x00\x00more\x00" + extra + b"\x00")
    return lib


def test_a_fixed_avx512_build_is_not_preloaded_on_an_avx2_cpu(tmp_path: Path) -> None:
    lib = _library(tmp_path, b"OpenBLAS 0.3.31 NO_AFFINITY SKYL", b"SKYLAKEX")
    build = openblas_build(lib)
    assert build == (False, {"SKYLAKEX"})
    assert not openblas_runs_here(build, {"avx", "avx2", "fma"}, "x86_64")
    assert openblas_runs_here(build, AVX512, "x86_64")


def test_a_target_counts_only_as_a_whole_word(tmp_path: Path) -> None:
    """A target name inside a longer symbol (ZENITH, SKYLAKEX_KERNEL) is not a build target,
    so it cannot stop a ZEN build from being preloaded on an AVX2 CPU."""
    lib = _library(
        tmp_path,
        b"OpenBLAS 0.3.29 NO_AFFINITY ZEN",
        b"ZENITH\x00SKYLAKEX_KERNEL\x00xHASWELL\x00ZEN",
    )
    assert openblas_build(lib) == (False, {"ZEN"})
    assert openblas_runs_here(openblas_build(lib), {"avx", "avx2", "fma"}, "x86_64")


def test_dynamic_builds_run_anywhere_and_unknown_ones_nowhere(tmp_path: Path) -> None:
    dynamic = _library(tmp_path, b"OpenBLAS 0.3.31 DYNAMIC_ARCH NO_AFFINITY Haswell", b"SKYLAKEX")
    assert openblas_runs_here(openblas_build(dynamic), {"sse2"}, "x86_64")
    (tmp_path / "other").mkdir()
    unknown = _library(tmp_path / "other", b"OpenBLAS 0.3.31 NO_AFFINITY")
    assert not openblas_runs_here(openblas_build(unknown), AVX512, "x86_64")
    assert openblas_build(tmp_path / "missing.so") is None


def test_this_machine_gets_a_preload_only_if_the_installed_build_runs_here(tmp_path: Path) -> None:
    """On this CPU: the installed cmeel-openblas is preloaded exactly when its target's
    instructions are all present (an AVX2-only CI box gets MLX's own BLAS instead)."""
    import platform

    lib = find_openblas()
    if lib is None:
        pytest.skip("cmeel-openblas is not installed")
    runs = openblas_runs_here(openblas_build(lib), cpu_flags(), platform.machine())
    env = blas_environment(tmp_path / "shim")
    assert ("LD_PRELOAD" in env) == runs
