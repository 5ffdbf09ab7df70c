"""Hub pulls in the daemon's PullManager against the fake hub (tests/fakes/fake_hub.py), over
real HTTP with real files (the test model among them): fresh, resumed, corrupted, refused,
shared, and the store commands that follow (cp, rm, gc)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import time
from collections import namedtuple
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import GGUFWriter
from gguf.quants import quantize

from llmd.paths import get_paths
from llmd.store.downloader import DownloadOptions
from llmd.store.manifests import StoreError, UnsupportedModel
from llmd.store.model_store import ModelStore
from llmd.store.pulls import PullManager
from tests.fakes.fake_hub import TOKEN, FakeHub
from tests.native.tiny_models import loadable_llama_config, write_loadable_gguf

REPO = "test-org/SmolLM2-135M-Instruct-GGUF"
FILE = "SmolLM2-135M-Instruct-Q4_1.gguf"
NAME = f"hf.co/{REPO}:Q4_1"
PROBE_SLACK = 8 << 20  # bytes the header probe may fetch on top of the file
PADDED_REPO, PADDED = "test-org/padded-GGUF", "padded-Q8_0.gguf"  # 24 MiB, quicker to fetch


def tiny_gguf(path: Path, arch: str = "llama", pad_mb: int = 0) -> Path:
    """A small GGUF: for "llama" a model the engine loads (Q8_0, plus `pad_mb` MiB of F32
    zeros); for another architecture a Q8_0 tensor only, which pulls refuse unread."""
    if arch == "llama":
        return write_loadable_gguf(path, pad_mb=pad_mb)
    w = GGUFWriter(str(path), arch)
    w.add_context_length(256)
    rows = np.random.default_rng(1).standard_normal((32, 64)).astype(np.float32)
    w.add_tensor("blk.0.attn_q.weight", quantize(rows, T.Q8_0), raw_dtype=T.Q8_0)
    if pad_mb:
        w.add_tensor("pad", np.zeros(pad_mb << 18, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture
async def hub(model_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    import huggingface_hub.constants

    fake = FakeHub()
    fake.add_repo(REPO, {FILE: model_path, "README.md": b"# a model card\n"})
    small = tiny_gguf(tmp_path / "tiny.gguf")
    fake.add_repo("test-org/tiny-GGUF", {"tiny-Q8_0.gguf": small})
    fake.add_repo("gated-org/tiny-GGUF", {"tiny-Q8_0.gguf": small}, gated=True)
    fake.add_repo(PADDED_REPO, {PADDED: tiny_gguf(tmp_path / PADDED, pad_mb=24)})
    await fake.start()
    monkeypatch.setenv("HF_ENDPOINT", fake.endpoint)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    yield fake
    await fake.stop()


def manager(**options: Any) -> PullManager:
    opts = {"backoff": 0.01, "checkpoint_interval": 0.05, **options}
    return PullManager(ModelStore(get_paths()), DownloadOptions(**opts))


Pulled = namedtuple("Pulled", "events final")


async def pull(m: PullManager, source: str, name: str | None = None, **kw: Any) -> Pulled:
    job = m.start(source, name, **kw)
    events = [e async for e in job.follow()]
    return Pulled(events, events[-1])


def blob_files(home: Path) -> list[str]:
    d = home / "data/models/blobs"
    return sorted(p.name for p in d.iterdir()) if d.exists() else []


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


async def test_fresh_pull_is_verified_published_and_listed(
    hub: FakeHub, llmd_home: Path, model_path: Path
) -> None:
    m = manager()
    try:
        events, final = await pull(m, NAME)
    finally:
        await m.close()
    assert final["status"] == "success", final
    statuses = [e["status"] for e in events]
    assert statuses[0] == "pulling manifest"
    digest = sha256(model_path)
    progress = [e for e in events if e["status"] == f"pulling {digest[:12]}"]
    assert progress[-1]["completed"] == progress[-1]["total"] == model_path.stat().st_size
    assert progress[-1]["digest"] == f"sha256:{digest}"
    i = statuses.index("verifying sha256 digest")
    assert statuses.index("writing manifest") > i and statuses[-1] == "success"

    [record] = ModelStore(get_paths()).list()
    assert record.name == NAME and record.digest == f"sha256:{digest}"
    assert (record.format, record.quantization, record.architecture) == ("gguf", "Q4_1", "llama")
    assert record.context_length == 8192 and record.source.startswith(f"hf:{REPO}@")
    assert sha256(Path(record.path)) == digest
    assert blob_files(llmd_home) == [f"sha256-{digest}"]  # no partials left
    cdn = hub.requests("cdn", FILE)
    assert cdn and all(r["auth"] is None for r in hub.log)  # no token anywhere
    assert model_path.stat().st_size <= hub.served[FILE] <= model_path.stat().st_size + PROBE_SLACK


async def test_dropped_connection_resumes_with_a_range_request(
    hub: FakeHub, llmd_home: Path, model_path: Path
) -> None:
    hub.drop_after[FILE] = 40_000_000
    m = manager()
    try:
        _, final = await pull(m, NAME)
    finally:
        await m.close()
    assert final["status"] == "success", final
    ranges = [r["range"] for r in hub.requests("cdn", FILE)]
    assert any(r.startswith("bytes=40000000-") for r in ranges), ranges  # resumed there
    size = model_path.stat().st_size
    assert hub.served[FILE] <= size + PROBE_SLACK  # the first 40 MB were not fetched again
    assert sha256(Path(ModelStore(get_paths()).get(NAME).path)) == sha256(model_path)


async def test_an_interrupted_pull_resumes_after_a_restart(
    hub: FakeHub, llmd_home: Path, model_path: Path
) -> None:
    hub.drop_after[FILE] = 30_000_000
    one_stream = {"parallel_threshold": 1 << 40}  # one connection: exact byte counts
    first = manager(retries=0, **one_stream)
    try:
        _, final = await pull(first, NAME)
    finally:
        await first.close()
    assert final["error"]["code"] == "hub_unreachable"
    assert "`llmd pull` again resumes" in final["error"]["message"]
    store = ModelStore(get_paths())
    assert store.list() == [] and store.resolve(NAME) is None  # nothing half-done is visible
    digest = sha256(model_path)
    state = json.loads((llmd_home / f"data/models/blobs/sha256-{digest}.partial.json").read_text())
    assert sum(s[2] for s in state["segments"]) == 30_000_000

    served_before = hub.served[FILE]
    second = manager(**one_stream)  # a new daemon: only the files on disk carry over
    try:
        _, final = await pull(second, NAME)
    finally:
        await second.close()
    assert final["status"] == "success", final
    size = model_path.stat().st_size
    assert hub.requests("cdn", FILE)[-1]["range"] == f"bytes=30000000-{size - 1}"
    assert hub.served[FILE] - served_before <= size - 30_000_000 + PROBE_SLACK
    assert sha256(Path(store.get(NAME).path)) == digest
    assert blob_files(llmd_home) == [f"sha256-{digest}"]


async def test_a_flipped_byte_is_rejected_and_nothing_is_installed(
    hub: FakeHub, llmd_home: Path
) -> None:
    hub.corrupt[PADDED] = 20_000_123
    m = manager()
    try:
        _, final = await pull(m, f"hf.co/{PADDED_REPO}")
    finally:
        await m.close()
    assert final["error"]["code"] == "integrity_error"
    assert "failed verification" in final["error"]["message"]
    assert ModelStore(get_paths()).list() == []
    assert blob_files(llmd_home) == []  # the corrupt download is gone, not kept for resume


async def test_hub_errors_say_what_to_do(hub: FakeHub, llmd_home: Path) -> None:
    m = manager()
    try:
        _, final = await pull(m, "hf.co/nobody/nothing-GGUF:Q4_0")
        assert final["error"]["code"] == "model_not_found"
        assert "repository nobody/nothing-GGUF was not found" in final["error"]["message"]

        _, final = await pull(m, f"hf.co/{REPO}:Q5_K_M")
        message = final["error"]["message"]
        assert "has no Q5_K_M GGUF file" in message and "tags it has: Q4_1" in message

        _, final = await pull(m, "hf.co/gated-org/tiny-GGUF:Q8_0")
        message = final["error"]["message"]
        assert final["error"]["code"] == "hub_access_denied"
        assert "gated or private" in message and "HF_TOKEN" in message
        assert "huggingface-cli login" in message

        _, final = await pull(m, "hf.co/gated-org/tiny-GGUF:Q8_0", token="hf_wrong")
        assert "refused access" in final["error"]["message"]
    finally:
        await m.close()
    offline = manager()
    try:
        _, final = await pull(offline, "hf.co/test-org/tiny-GGUF", endpoint="http://127.0.0.1:9")
    finally:
        await offline.close()
    assert final["error"]["code"] == "hub_unreachable"
    message = final["error"]["message"]
    assert "could not reach the Hugging Face hub at http://127.0.0.1:9" in message
    assert "HF_ENDPOINT" in message
    assert ModelStore(get_paths()).list() == []


async def test_gated_repo_with_a_token_from_env_or_token_file(
    hub: FakeHub, llmd_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import huggingface_hub.constants

    m = manager()
    try:
        monkeypatch.setenv("HF_TOKEN", TOKEN)
        _, final = await pull(m, "hf.co/gated-org/tiny-GGUF", "from-env")
        assert final["status"] == "success", final
        monkeypatch.delenv("HF_TOKEN")
        (tmp_path / "token").write_text(TOKEN)
        monkeypatch.setattr(huggingface_hub.constants, "HF_TOKEN_PATH", str(tmp_path / "token"))
        _, final = await pull(m, "hf.co/gated-org/tiny-GGUF", "from-file")
        assert final["status"] == "success", final
    finally:
        await m.close()
    resolves = hub.requests("resolve")
    assert resolves and all(r["auth"] == f"Bearer {TOKEN}" for r in resolves)
    assert all(r["auth"] is None for r in hub.requests("cdn"))  # never sent to the CDN
    # a request naming another endpoint never gets the daemon's own token
    (tmp_path / "token").unlink()
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    other = manager()
    try:
        _, final = await pull(
            other, "hf.co/gated-org/tiny-GGUF", "elsewhere", endpoint=hub.endpoint + "/"
        )
        assert final["status"] == "success"  # the same endpoint, spelled differently
        _, final = await pull(
            other,
            "hf.co/gated-org/tiny-GGUF",
            "x",
            endpoint=hub.endpoint.replace("127.0.0.1", "localhost"),
        )
        assert final["error"]["code"] == "hub_access_denied"
    finally:
        await other.close()


async def test_concurrent_pulls_share_one_download(
    hub: FakeHub, llmd_home: Path, model_path: Path
) -> None:
    hub.chunk_delay = 0.002
    m = manager()
    try:
        a = m.start(NAME)
        b = m.start(NAME)
        c = m.start(NAME, "second-name")  # another name, the same file: one blob download
        assert a is b and c is not a
        results = await asyncio.gather(*[_collect(j) for j in (a, b, c)])
    finally:
        await m.close()
    for events in results:
        assert events[-1]["status"] == "success", events[-1]
        assert any(e.get("completed") == e.get("total") for e in events if "total" in e)
    size = model_path.stat().st_size
    assert size <= hub.served[FILE] <= size + 2 * PROBE_SLACK  # one download, two probes
    store = ModelStore(get_paths())
    assert store.get(NAME).path == store.get("second-name").path


async def _collect(job: Any) -> list[dict[str, Any]]:
    return [e async for e in job.follow()]


async def test_parallel_segments_for_large_files(
    hub: FakeHub, llmd_home: Path, tmp_path: Path
) -> None:
    m = manager(parallel_threshold=1 << 20, min_segment=4 << 20, connections=4)
    try:
        _, final = await pull(m, f"hf.co/{PADDED_REPO}", "padded")
    finally:
        await m.close()
    assert final["status"] == "success", final
    starts = {int(r["range"].split("=")[1].split("-")[0]) for r in hub.requests("cdn", PADDED)}
    assert len(starts - {0}) >= 3  # four segments fetched side by side
    assert sha256(Path(ModelStore(get_paths()).get("padded").path)) == sha256(tmp_path / PADDED)


async def test_unsupported_architecture_is_refused_before_the_download(
    hub: FakeHub, llmd_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mamba = tiny_gguf(tmp_path / "mamba.gguf", arch="mamba", pad_mb=24)
    hub.add_repo("test-org/mamba-GGUF", {"mamba-Q8_0.gguf": mamba})
    m = manager()
    try:
        _, final = await pull(m, "hf.co/test-org/mamba-GGUF:Q8_0")
        assert final["error"]["code"] == "unsupported_model"
        assert "'mamba' model; llmd's engine runs llama" in final["error"]["message"]
        assert hub.served["mamba-Q8_0.gguf"] <= 1 << 20  # the header only, of 24 MB
        # Every catalog family runs now: pretend Qwen3 does not, to see the catalog refuse it.
        monkeypatch.setattr("llmd.store.model_support.SUPPORTED_ARCHITECTURES", ("llama",))
        with pytest.raises(UnsupportedModel, match="'qwen3' model"):
            m.start("qwen3-0.6b")  # the catalog knows: refused before any request
        with pytest.raises(StoreError, match="neither a catalog name"):
            m.start("no-such-model")
    finally:
        await m.close()
    assert ModelStore(get_paths()).list() == []


async def test_free_disk_is_checked_before_downloading(
    hub: FakeHub, llmd_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shutil

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(
        shutil, "disk_usage", lambda _p: usage(10**9, 10**9 - 50_000_000, 50_000_000)
    )
    m = manager()
    try:
        _, final = await pull(m, NAME)
    finally:
        await m.close()
    assert final["error"]["code"] == "insufficient_storage"
    message = final["error"]["message"]
    assert "not enough free disk space" in message and "50.0 MB free" in message
    assert "llmd gc" in message
    assert hub.served[FILE] <= PROBE_SLACK  # nothing but the header was fetched


async def test_safetensors_repo_becomes_a_tree_of_verified_files(
    hub: FakeHub, llmd_home: Path
) -> None:
    config = json.dumps({"model_type": "llama", "max_position_embeddings": 4096}).encode()
    weights = b"\x08\x00\x00\x00\x00\x00\x00\x00{}      " + os.urandom(4096)
    hub.add_repo(
        "test-org/tiny-hf",
        {
            "config.json": config,
            "tokenizer.json": b"{}",
            "model.safetensors": weights,
            "README.md": b"card",
        },
    )
    hub.add_repo(
        "test-org/mamba-hf",
        {"config.json": b'{"model_type": "mamba"}', "model.safetensors": weights},
    )
    m = manager()
    try:
        _, final = await pull(m, "hf.co/test-org/tiny-hf")
        assert final["status"] == "success", final
        _, refused = await pull(m, "hf.co/test-org/mamba-hf")
    finally:
        await m.close()
    record = ModelStore(get_paths()).get("hf.co/test-org/tiny-hf")
    assert record.format == "safetensors" and record.architecture == "llama"
    assert record.context_length == 4096
    tree = Path(record.path)
    assert sorted(p.name for p in tree.iterdir()) == [
        "README.md",  # the model card: whether it was trained for Matryoshka truncation
        "config.json",
        "model.safetensors",
        "tokenizer.json",
    ]
    assert (tree / "model.safetensors").read_bytes() == weights
    assert refused["error"]["code"] == "unsupported_model"
    assert "'mamba' model" in refused["error"]["message"]
    assert not hub.requests("cdn", "model.safetensors")[1:]  # the refused repo's weights: never


async def test_cp_rm_and_gc(hub: FakeHub, llmd_home: Path) -> None:
    m = manager()
    try:
        _, final = await pull(m, "hf.co/test-org/tiny-GGUF:Q8_0")
    finally:
        await m.close()
    assert final["status"] == "success", final
    store = ModelStore(get_paths())
    original = store.get("hf.co/test-org/tiny-GGUF:Q8_0")
    copy = store.copy(original.name, "alias")
    assert copy.path == original.path and copy.digest == original.digest
    store.remove(original.name)
    assert Path(copy.path).exists()  # still used by the alias

    blobs = llmd_home / "data/models/blobs"
    orphan = blobs / f"sha256-{'0' * 64}"
    orphan.write_bytes(b"left by a crash")
    stale, fresh = blobs / f"sha256-{'1' * 64}.partial", blobs / f"sha256-{'2' * 64}.partial"
    stale.write_bytes(b"x" * 10)
    fresh.write_bytes(b"y" * 10)
    week_ago = time.time() - 8 * 86400
    os.utime(stale, (week_ago, week_ago))
    with store.pull_lock():
        with pytest.raises(StoreError, match="a pull is running"):
            store.gc()
    report = store.gc()
    assert report.blobs == [orphan.name] and report.partials == [stale.name]
    assert not orphan.exists() and not stale.exists() and fresh.exists()
    assert Path(copy.path).exists()
    assert store.gc(partial_max_age=0).partials == [fresh.name]
    store.remove("alias")
    assert blob_files(llmd_home) == []


async def test_a_gguf_the_engine_cannot_run_natively_is_converted_once(
    hub: FakeHub, llmd_home: Path, tmp_path: Path
) -> None:
    from llmd.store.gguf_layout import read_layout
    from llmd.store.model_support import NATIVE_GGUF_TYPES
    from tests.unit.test_hub_convert import q5k_blocks

    def kquant_mix(name: str, x: np.ndarray) -> tuple[np.ndarray, Any] | None:
        # TQ2_0 and MXFP4 tensors (converted) among native ones, Q5_K and Q5_0 (native) included.
        if name == "blk.0.ffn_gate.weight":
            return q5k_blocks(*x.shape), T.Q5_K
        if name == "blk.0.attn_k.weight":
            return quantize(x, T.Q5_0), T.Q5_0
        if name in ("blk.0.attn_q.weight", "blk.0.ffn_up.weight"):
            t = T.TQ2_0 if "attn" in name else T.MXFP4
            return quantize(x, t), t
        return None

    config = loadable_llama_config(hidden=256)
    write_loadable_gguf(tmp_path / "k.gguf", config=config, tensor_data=kquant_mix)
    hub.add_repo("test-org/kquant-GGUF", {"kquant-Q5_K_M.gguf": tmp_path / "k.gguf"})
    m = manager()
    try:
        events, final = await pull(m, "hf.co/test-org/kquant-GGUF:Q5_K_M")
        assert final["status"] == "success", final
        served = hub.served["kquant-Q5_K_M.gguf"]
        _, again = await pull(m, "hf.co/test-org/kquant-GGUF:Q5_K_M", "second-name")
    finally:
        await m.close()
    assert "MXFP4 -> Q8_0 (1 tensors)" in final["note"] and "Q5_K" not in final["note"]
    assert "Q5_0" not in final["note"]
    assert final["quantization"] == "Q8_0"
    from llmd.store.model_facts import describe

    engine = describe(ModelStore(get_paths()).get("hf.co/test-org/kquant-GGUF:Q5_K_M"))["engine"]
    assert engine.startswith("native kernels: ") and "not runnable" not in engine
    assert engine.endswith(
        "converted at pull from the source's MXFP4 -> Q8_0 (1 tensors), TQ2_0 -> Q8_0 (1 tensors)"
    )
    native = engine.split(";")[0]
    assert "Q5_K 1" in native and "Q5_0 1" in native  # kept, and listed among the native kernels
    assert any(e["status"] == "converting" for e in events)
    store = ModelStore(get_paths())
    record = store.get("hf.co/test-org/kquant-GGUF:Q5_K_M")
    layout = read_layout(record.path)
    assert all(t.type in NATIVE_GGUF_TYPES for t in layout.tensors)
    types = {t.name: t.type for t in layout.tensors}
    assert types["blk.0.ffn_gate.weight"] == T.Q5_K and types["blk.0.attn_k.weight"] == T.Q5_0
    assert record.source_digest == f"sha256:{sha256(tmp_path / 'k.gguf')}"
    assert blob_files(llmd_home) == [Path(record.path).name]  # the unconverted file is gone
    # the same upstream file again: no download, no conversion, the same blob
    assert again["status"] == "success" and hub.served["kquant-Q5_K_M.gguf"] == served
    assert store.get("second-name").path == record.path


async def test_a_download_the_engine_would_refuse_is_not_installed(
    hub: FakeHub, llmd_home: Path, tmp_path: Path
) -> None:
    # Passes every check the pull makes from the header (architecture, tokenizer, types); the
    # engine's loader refuses its rope scaling once the file is here: the pull fails with its
    # words, after saying it asked, and the downloaded blob does not stay.
    yarn = write_loadable_gguf(tmp_path / "y.gguf", metadata={"llama.rope.scaling.type": "yarn"})
    hub.add_repo("test-org/yarn-GGUF", {"yarn-Q8_0.gguf": yarn})
    m = manager()
    try:
        events, final = await pull(m, "hf.co/test-org/yarn-GGUF")
    finally:
        await m.close()
    assert final["error"]["code"] == "unsupported_model", final
    assert "the engine cannot load it" in final["error"]["message"]
    assert "'yarn' is not supported" in final["error"]["message"]
    assert any(e.get("status") == "checking that the engine loads it" for e in events)
    assert ModelStore(get_paths()).list() == [] and blob_files(llmd_home) == []


async def test_embedding_and_reranker_repos_are_pulled_with_their_kind(
    hub: FakeHub, llmd_home: Path
) -> None:
    config = json.dumps({"model_type": "qwen3", "max_position_embeddings": 4096}).encode()
    weights = b"\x08\x00\x00\x00\x00\x00\x00\x00{}      " + os.urandom(4096)
    modules = [
        {"idx": 0, "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    hub.add_repo(
        "test-org/tiny-embedding",
        {
            "config.json": config,
            "model.safetensors": weights,
            "modules.json": json.dumps(modules).encode(),
            "1_Pooling/config.json": b'{"pooling_mode_lasttoken": true}',
        },
    )
    hub.add_repo("test-org/tiny-Reranker", {"config.json": config, "model.safetensors": weights})
    m = manager()
    try:
        _, embedder = await pull(m, "hf.co/test-org/tiny-embedding")
        _, reranker = await pull(m, "hf.co/test-org/tiny-Reranker")
    finally:
        await m.close()
    assert embedder["status"] == "success" and reranker["status"] == "success"
    store = ModelStore(get_paths())
    record = store.get("hf.co/test-org/tiny-embedding")
    assert (record.kind, record.pooling, record.normalize) == ("embed", "last", True)
    assert (Path(record.path) / "1_Pooling" / "config.json").is_file()
    assert store.get("hf.co/test-org/tiny-Reranker").kind == "rerank"


MMPROJ_FIXTURE = Path(__file__).parents[1] / "fixtures" / "gemma3_mmproj_llamacpp_f16.gguf"


async def test_gguf_pull_fetches_the_repos_mmproj(
    hub: FakeHub, llmd_home: Path, tmp_path: Path
) -> None:
    """A repo that ships llama.cpp's vision tower beside its quantizations: the pull fetches
    the F16 mmproj (not the F32 one, not as the model), verified, recorded in the manifest,
    and removing the model frees it."""
    small = tiny_gguf(tmp_path / "tiny.gguf")
    f32 = tmp_path / "mmproj-F32.gguf"
    f32.write_bytes(MMPROJ_FIXTURE.read_bytes() + b"\0" * 64)  # another file, another digest
    hub.add_repo(
        "test-org/tiny-vision-GGUF",
        {"tiny-Q8_0.gguf": small, "mmproj-F16.gguf": MMPROJ_FIXTURE, "mmproj-F32.gguf": f32},
    )
    m = manager()
    try:
        events, final = await pull(m, "hf.co/test-org/tiny-vision-GGUF:Q8_0")
    finally:
        await m.close()
    assert final["status"] == "success", final
    assert any(e["status"] == "pulling the vision tower mmproj-F16.gguf" for e in events)
    store = ModelStore(get_paths())
    [record] = store.list()
    assert sha256(Path(record.path)) == sha256(small)
    assert sha256(Path(record.mmproj)) == sha256(MMPROJ_FIXTURE)
    assert hub.requests("cdn", "mmproj-F16.gguf") and not hub.requests("cdn", "mmproj-F32.gguf")
    assert sorted(blob_files(llmd_home)) == sorted(
        f"sha256-{sha256(p)}" for p in (small, MMPROJ_FIXTURE)
    )
    store.remove(record.name)
    assert blob_files(llmd_home) == []


async def test_gguf_pull_without_an_mmproj_records_none(hub: FakeHub, llmd_home: Path) -> None:
    m = manager()
    try:
        _, final = await pull(m, "hf.co/test-org/tiny-GGUF:Q8_0")
    finally:
        await m.close()
    assert final["status"] == "success", final
    [record] = ModelStore(get_paths()).list()
    assert record.mmproj == ""
