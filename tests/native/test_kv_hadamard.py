"""Hadamard-rotated quantized KV (issue 25): with `--kv-type q8_0 | q4_0` the engine stores
keys and values multiplied by an orthonormal Walsh-Hadamard matrix (core/hadamard.h), rotates
queries the same way and rotates each attention output back, as llama.cpp does by default.

What a user notices: the same quantized KV costs less quality (a model whose keys have outlier
channels, as the test model's do, loses far less with q4_0), greedy output with q8_0 stays
what f16 KV gives on the parity prompts, and a disk cache written before the rotation (format
1, unrotated blocks) is never served. Underneath, the transform is exactly llama.cpp's matrix
and changes nothing in float arithmetic: only what the quantizer sees.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from .conftest import run_all
from .kernel_checks import attention_case, attention_reference

native = pytest.importorskip("llmd._engine")
PATHS = native.runnable_kernel_paths()
QUANT_TYPES = ["q8_0", "q4_0"]


def _sylvester(n: int) -> np.ndarray:
    """Natural-order Walsh-Hadamard matrix / sqrt(n): H[i][j] = (-1)^popcount(i & j) / sqrt(n)
    (what llama.cpp's ggml_gen_hadamard builds)."""
    i = np.arange(n)
    bits = np.vectorize(lambda x: bin(x).count("1"))(i[:, None] & i[None, :])
    return np.where(bits % 2 == 0, 1.0, -1.0) / np.sqrt(n)


def _rotate(x: np.ndarray, block: int) -> np.ndarray:
    """Runs of `block` numbers of each row times the Hadamard matrix, in float64."""
    rows, d = x.shape
    return (x.astype(np.float64).reshape(rows, d // block, block) @ _sylvester(block)).reshape(
        rows, d
    )


@pytest.mark.parametrize("n", [32, 64, 128, 256])
def test_the_transform_is_the_orthonormal_walsh_hadamard_matrix(n: int) -> None:
    rows = native.hadamard_rotate(np.eye(n, dtype=np.float32), n)
    assert np.abs(rows - _sylvester(n)).max() <= 1e-6
    rng = np.random.default_rng(n)
    x = (rng.standard_normal((5, 4 * n)) * 10).astype(np.float32)
    once = native.hadamard_rotate(x, n)
    # Orthonormal (norms kept) and its own inverse.
    assert np.allclose(np.linalg.norm(once, axis=1), np.linalg.norm(x, axis=1), rtol=1e-6)
    assert np.abs(native.hadamard_rotate(once, n) - x).max() <= 1e-5 * np.abs(x).max()


def test_rotation_sizes_follow_llamacpp() -> None:
    """Keys (and queries): the largest power of two dividing the head; values: at most 64."""
    assert native.hadamard_blocks(64) == (64, 64)
    assert native.hadamard_blocks(128) == (128, 64)
    assert native.hadamard_blocks(256) == (256, 64)
    assert native.hadamard_blocks(96) == (32, 32)  # a head that is no power of two: runs of 32


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("head_dim", [64, 128])
def test_rotation_changes_nothing_without_quantization(path: str, head_dim: int) -> None:
    """With float32 KV, rotating q, k, v and the output back gives the unrotated attention up
    to float32 rounding: the rotation is exact in the math."""
    q, k, v, n_pos, first_pos = attention_case(11, 300, head_dim)
    plain = native.kernel_attention(q, k, v, n_pos, first_pos, "f32", path)
    rotated = native.kernel_attention(q, k, v, n_pos, first_pos, "f32", path, rotate=True)
    assert np.abs(rotated - plain).max() <= 1e-5 * np.abs(v).max()


def _outlier_keys(seed: int, n: int, head_dim: int) -> tuple:  # type: ignore[type-arg]
    """attention_case with keys like the test model's: a few channels 20x the others (they set
    a block's scale, and the small numbers beside them round to a few levels)."""
    q, k, v, n_pos, first_pos = attention_case(seed, n, head_dim)
    k[:, [3, 40]] *= 20.0
    q[:, [3, 40]] /= 20.0  # scores keep their spread
    return q, k, v, n_pos, first_pos


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("kv_type", QUANT_TYPES)
@pytest.mark.parametrize("head_dim", [64, 128])
def test_rotated_quantized_attention_is_exact_over_what_it_stores_and_closer_to_float(
    path: str, kv_type: str, head_dim: int
) -> None:
    q, k, v, n_pos, first_pos = _outlier_keys(5, 400, head_dim)
    kb, vb = native.hadamard_blocks(head_dim)
    out = native.kernel_attention(q, k, v, n_pos, first_pos, kv_type, path, rotate=True)
    # Against the numbers a pool of kv_type holds for the rotated k and v (float64 math, output
    # rotated back): only float32 accumulation and rounding of the rotations differ.
    kq, vq = native.kv_roundtrip(
        _rotate(k, kb).astype(np.float32), _rotate(v, vb).astype(np.float32), kv_type
    )
    stored = _rotate(attention_reference(_rotate(q, kb), kq, vq, n_pos, first_pos), vb)
    assert np.abs(out - stored).max() <= 2e-5 * np.abs(v).max(), (path, kv_type)
    # Against float KV: within the quantization error, and nearer than the unrotated blocks.
    exact = attention_reference(q, k, v, n_pos, first_pos)
    plain = native.kernel_attention(q, k, v, n_pos, first_pos, kv_type, path)
    err_rot = np.abs(out - exact).max()
    err_plain = np.abs(plain - exact).max()
    assert err_rot <= (0.05 if kv_type == "q8_0" else 0.5) * np.abs(v).max()
    assert err_rot < err_plain, (kv_type, err_rot, err_plain)


def _engine(model_path: Path, kv_type: str, **options):  # type: ignore[no-untyped-def]
    options.setdefault("context_length", 2048)
    return native.Engine(
        str(model_path), backend=options.pop("backend", "cpu"), kv_type=kv_type, **options
    )


NEAR_TIE = 0.5  # test_parity_llamacpp.py's: the only divergence allowed against llama.cpp
STOP_IDS = [2]


def test_q8_0_greedy_output_equals_the_reference_on_the_parity_prompts(
    model_path: Path, reference: dict
) -> None:
    """The parity prompts' greedy continuations with q8_0 KV are llama.cpp's (f16 KV) up to
    each case's first near-tie, as f16 KV's are."""
    cases = reference["cases"]
    requests = {
        c["name"]: {
            "prompt": c["prompt_ids"],
            "max_tokens": len(c["generated_ids"]),
            "stop_tokens": STOP_IDS,
        }
        for c in cases
    }
    results = run_all(_engine(model_path, "q8_0"), requests)
    compared = 0
    for case in cases:
        ref = [t for t in case["generated_ids"] if t not in STOP_IDS]
        first_tie = next((i for i, g in enumerate(case["top2_gaps"]) if g <= NEAR_TIE), len(ref))
        n = min(first_tie, len(ref))
        assert results[case["name"]]["tokens"][:n] == ref[:n], case["name"]
        compared += n
    assert compared > 50  # as test_parity_llamacpp.py, which compares the same tokens with f16 KV


# The format of a block file (kv_disk.cpp's Header, native byte order, then the identity,
# the payload and a checksum over all three).
_HEADER = struct.Struct("=8sQIIQQQ64i")


def _as_format_1(data: bytes) -> tuple[bytes, bytes]:
    """A format-2 block file rewritten as the same block's file from before the rotation: the
    identity names format 1 and the checksums are recomputed, so the file is intact. Returns
    the file and its identity."""
    fields = list(_HEADER.unpack_from(data))
    identity_len = fields[2]
    identity = data[_HEADER.size : _HEADER.size + identity_len]
    assert identity.startswith(b"llmd-kv-disk-2|")
    old = b"llmd-kv-disk-1|" + identity[len(b"llmd-kv-disk-2|") :]
    fields[1] = native.kv_disk_checksum(old)
    header = _HEADER.pack(*fields)
    payload = data[_HEADER.size + identity_len : -8]
    total = native.kv_disk_checksum(header)
    total = native.kv_disk_checksum(old, total)
    total = native.kv_disk_checksum(payload, total)
    return header + old + payload + struct.pack("=Q", total), old


def test_the_disk_tier_never_serves_blocks_from_before_the_rotation(
    model_path: Path, reference: dict, tmp_path: Path
) -> None:
    prompt = next(c["prompt_ids"] for c in reference["cases"] if c["name"] == "long_1000")[:400]
    settings = {
        "kv_disk_dir": str(tmp_path),
        "kv_disk_bytes": 1 << 30,
        "model_digest": "sha256:" + "ab" * 32,
    }
    first = _engine(model_path, "q8_0", **settings)
    cold = run_all(first, {"a": {"prompt": prompt, "max_tokens": 12}})["a"]
    first.flush_kv_disk()
    new_dir = Path(first.stats()["kv_disk"]["dir"])
    del first
    files = sorted(new_dir.glob("*.kvb"))
    assert len(files) == (len(prompt) - 1) // 64
    # An intact format-1 cache in its own directory (what an upgrade leaves behind), and the
    # same files put where format 2 reads.
    old_dir = tmp_path / f"{native.kv_disk_checksum(_as_format_1(files[0].read_bytes())[1]):016x}"
    old_dir.mkdir()
    for f in files:
        old, _ = _as_format_1(f.read_bytes())
        (old_dir / f.name).write_bytes(old)
        f.write_bytes(old)
    second = _engine(model_path, "q8_0", **settings)
    again = run_all(second, {"b": {"prompt": prompt, "max_tokens": 12}})["b"]
    assert again["done"]["cached_tokens"] == 0  # recomputed, none served
    assert again["tokens"] == cold["tokens"]
    disk = second.stats()["kv_disk"]
    assert disk["hits"] == 0 and disk["read_blocks"] == 0
    assert disk["corrupt_files"] == 0  # refused as another format's, not as damaged
