"""`llmd pull ./model.gguf` with llama.cpp's vision tower beside it: the mmproj is installed
with the model when its rows are the model's width, and left alone otherwise (a folder of
downloads may hold another model's)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from llmd.paths import get_paths
from llmd.store.model_store import ModelStore
from tests.native.tiny_models import CONFIGS, write_gguf

pytest.importorskip("llmd._engine", reason="the pull checks that the engine loads the model")

MMPROJ = Path(__file__).parents[1] / "fixtures" / "gemma3_mmproj_llamacpp_f16.gguf"


def test_local_gguf_brings_its_mmproj(llmd_home: Path, tmp_path: Path) -> None:
    model = tmp_path / "tiny-gemma3-F32.gguf"
    write_gguf(model, "gemma3_text")  # hidden size 64: the mmproj's projection_dim
    shutil.copyfile(MMPROJ, tmp_path / "mmproj-tiny-gemma3-F16.gguf")
    record = ModelStore(get_paths()).pull(str(model), "tiny-gemma3")
    assert Path(record.mmproj).read_bytes() == MMPROJ.read_bytes()
    assert Path(record.mmproj).parent == get_paths().blobs  # copied into the store


def test_mmproj_of_another_width_is_left_alone(llmd_home: Path, tmp_path: Path) -> None:
    model = tmp_path / "tiny-qwen3-F32.gguf"
    write_gguf(model, "qwen3", config={**CONFIGS["qwen3"], "hidden_size": 96})
    shutil.copyfile(MMPROJ, tmp_path / "mmproj-F16.gguf")
    assert ModelStore(get_paths()).pull(str(model), "tiny-qwen3").mmproj == ""
