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
