"""`python -m bench.realistic`'s options for comparing like with like: a forced llmd kernel path
against a llama.cpp build of the same ISA (issue 31). Nothing here measures: the checks are
that the options reach the run and that a wrong build is refused before anything starts."""

from __future__ import annotations

from pathlib import Path

import pytest
from bench import realistic


def test_options_for_an_avx2_comparison_are_taken(tmp_path: Path) -> None:
    args = realistic.parse_args(
        ["--cpu-path", "avx2", "--llamacpp-bin", str(tmp_path), "--streams", "4", "--tests", "pp8k"]
    )
    assert args.cpu_path == "avx2"
    assert args.llamacpp_bin == tmp_path
    assert args.streams == (4,)
    assert args.tests == ["pp8k"]


def test_an_unknown_kernel_path_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        realistic.parse_args(["--cpu-path", "sse4"])
    assert "avx2" in capsys.readouterr().err  # the error lists the paths that exist


def test_a_build_without_the_tools_is_refused_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    native = tmp_path / "native"
    native.mkdir()
    (native / "llama-quantize").touch()
    monkeypatch.setattr(realistic, "LLAMA_BIN", native)
    empty = tmp_path / "build-avx2"
    empty.mkdir()
    with pytest.raises(SystemExit, match=str(empty / "llama-bench")):
        realistic.main(["--llamacpp-bin", str(empty), "--shapes", "tiny", "--types", "Q8_0"])


def test_the_isa_of_a_folder_without_ggml_is_unknown(tmp_path: Path) -> None:
    assert realistic.llamacpp_isa(tmp_path) == f"{tmp_path} (ISA unknown)"


def test_no_llama_warmup_reaches_llama_bench(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """llama-bench's warmup repeats the whole test (a 16k prefill twice), so the pp16k pair only
    fits one window without it: the option must reach llama-bench's command line."""
    seen: list[list[str]] = []

    class Done:
        stdout = '[{"avg_ts": 42.0}]'

    def run(cmd: list[str], **_: object) -> Done:
        seen.append(cmd)
        return Done()

    monkeypatch.setattr(realistic.subprocess, "run", run)
    args = realistic.parse_args(["--tests", "pp16k", "--no-llama-warmup"])
    assert (
        realistic.llama_bench(tmp_path / "m.gguf", 2, 16384, 0, tmp_path, args.llama_warmup) == 42.0
    )
    assert realistic.llama_bench(tmp_path / "m.gguf", 2, 16384, 0, tmp_path) == 42.0
    assert "--no-warmup" in seen[0]
    assert "--no-warmup" not in seen[1]  # the default keeps llama-bench's warmup


def test_extra_recipes_and_odd_shapes_are_accepted() -> None:
    args = realistic.parse_args(["--types", "Q3_K_S,IQ4_XS", "--shapes", "qwen2.5-0.5b"])
    assert args.types == ["Q3_K_S", "IQ4_XS"] and args.shapes == ["qwen2.5-0.5b"]


def test_llmd_runs_what_a_pull_installs(tmp_path: Path) -> None:
    """A file with a type llmd has no kernel for is measured as the pull converts it (made once,
    beside it); a file that runs natively is measured as it is."""
    import numpy as np
    from gguf import GGMLQuantizationType as T
    from gguf import GGUFReader
    from gguf.quants import quantize

    from .gguf_files import random_blocks, write_tensors

    rng = np.random.default_rng(3)

    def write(path: Path, iq4_xs: bool) -> Path:
        x = rng.standard_normal((8, 256)).astype(np.float32)
        tensors = {"blk.0.ffn_up.weight": (quantize(x, T.Q8_0), T.Q8_0)}
        tensors["blk.0.attn_q.weight"] = (random_blocks(rng, T.Q2_K, 8, 256, 0.01), T.Q2_K)
        if iq4_xs:
            tensors["blk.0.ffn_gate.weight"] = (
                random_blocks(rng, T.IQ4_XS, 8, 256, 1e-3),
                T.IQ4_XS,
            )
        return write_tensors(path, tensors)

    native = write(tmp_path / "m-q2_k.gguf", iq4_xs=False)
    assert realistic.llmd_file(native) == native
    mixed = write(tmp_path / "m-iq4_xs.gguf", iq4_xs=True)
    ours = realistic.llmd_file(mixed)
    assert ours == tmp_path / "m-iq4_xs.llmd.gguf"
    types = {t.name: t.tensor_type for t in GGUFReader(ours).tensors}
    assert types == {
        "blk.0.ffn_up.weight": T.Q8_0,
        "blk.0.attn_q.weight": T.Q2_K,
        "blk.0.ffn_gate.weight": T.IQ4_NL,
    }
    made = ours.stat().st_mtime_ns
    assert realistic.llmd_file(mixed) == ours and ours.stat().st_mtime_ns == made  # kept


def test_a_case_a_server_finished_nothing_in_gets_no_ratio() -> None:
    """A streams window shorter than the first token's wait leaves llama.cpp's aggregate 0 and
    compare_servers no ratio: the table says so instead of the run dying before printing it."""
    result = {
        "model": "m.gguf",
        "kernel_path": "avx2",
        "llamacpp": "AVX2 build",
        "rows": {"4 streams": {"llmd": 0.1, "llama.cpp": 0.0, "ratio": None}},
    }
    assert "| 4 streams | 0.1 tok/s | 0.0 tok/s | - |" in realistic.markdown(result)
