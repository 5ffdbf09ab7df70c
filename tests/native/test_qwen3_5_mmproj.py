"""Qwen3.5's vision tower from llama.cpp's mmproj GGUF (native/mlx/qwen_vision.cpp,
`qwen3vl_merger`) against transformers, and the GGUF Qwen3.5-MoE fed its rows.

The mmproj is what llama.cpp's converter writes (`convert_hf_to_gguf.py --mmproj`) for the
tiny multimodal checkpoint of test_qwen3_5_vision.py: tiny_qwen35_gguf.write_qwen3_5_mmproj,
held to the converter's recorded output by test_qwen3_5_gguf.py (the patch embedding's two
temporal frames as two tensors, the merger as mm.0 / mm.2, the merger's norm as v.post_ln).
The same tower code reads the checkpoint and the mmproj (one loader, a name map), so the
embeddings must be transformers' (tests/fixtures/qwen3_5_vision_transformers.npz), and the
GGUF text model (tiny_qwen35_gguf.write_qwen35moe_gguf: the checkpoint's language model, its
M-RoPE split in rope.dimension_sections) fed them must give transformers' logits for the
two-image prompt.

Tolerance: 1e-4 of the largest value, as test_qwen3_5_vision.py (float32 both sides, the same
bf16-representable weights).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from .test_qwen3_5_vision import FIXTURE, TOLERANCE, _images
from .tiny_models import QWEN3_5_MULTIMODAL, close_gguf, write_qwen3_5_moe_multimodal
from .tiny_qwen35_gguf import write_qwen3_5_mmproj, write_qwen35moe_gguf
from .vision_scaffold import first_logprobs as _first_logprobs
from .vision_scaffold import log_softmax as _log_softmax
from .vision_scaffold import rel as _rel

native = pytest.importorskip("llmd._engine")


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("qwen35-mmproj")
    return {
        "mmproj": write_qwen3_5_mmproj(d / "mmproj-F32.gguf"),
        "model": write_qwen35moe_gguf(d / "tiny-qwen3.5-F32.gguf"),
    }


def _names() -> list[str]:
    return json.loads(np.load(FIXTURE)["cases"].tobytes())


@pytest.mark.parametrize("backend", ["cpu", "mlx-cpu"])
def test_mmproj_embeddings_match_transformers(files: dict[str, Path], backend: str) -> None:
    ref = np.load(FIXTURE)
    names = _names()
    images = _images(names)
    tower = native.VisionTower(str(files["mmproj"]), {}, backend=backend)
    assert (tower.architecture, tower.image_size, tower.hidden_size) == ("qwen3_5_moe", 0, 64)
    assert (tower.patch_values, tower.merge_size) == (96, 2)
    out = tower.encode_patches(np.concatenate([p for p, _ in images]), [g for _, g in images])
    assert [o.shape for o in out] == [(12, 64), (10, 64)]
    for emb, name in zip(out, names, strict=True):
        assert _rel(emb, ref[f"{name}.embeddings"]) < TOLERANCE, name
    assert _rel(out[0][:10], out[1]) > 0.1


def test_f16_mmproj_stays_close_to_transformers(tmp_path: Path) -> None:
    """`--outtype f16` (what repos publish): the matrices on llmd's F16 path. The weights are
    bf16-representable, which float16 holds but for the smallest magnitudes."""
    ref = np.load(FIXTURE)
    names = _names()
    images = _images(names)
    path = write_qwen3_5_mmproj(tmp_path / "mmproj-F16.gguf", "F16")
    out = native.VisionTower(str(path), {}, backend="cpu").encode_patches(
        np.concatenate([p for p, _ in images]), [g for _, g in images]
    )
    for emb, name in zip(out, names, strict=True):
        assert _rel(emb, ref[f"{name}.embeddings"]) < 1e-3, name


def test_mmproj_and_checkpoint_towers_agree_on_a_large_image(
    files: dict[str, Path], tmp_path: Path
) -> None:
    """2112 patches (several attention chunks) through both loaders of the one tower."""
    from llmd.worker.host import multimodal_config

    write_qwen3_5_moe_multimodal(tmp_path / "hf")
    grid = (1, 48, 44)
    patches = np.random.default_rng(5).normal(size=(48 * 44, 96)).astype(np.float32)
    ours = native.VisionTower(str(files["mmproj"]), {}).encode_patches(patches, [grid])[0]
    hf = native.VisionTower(str(tmp_path / "hf"), multimodal_config(str(tmp_path / "hf")))
    assert _rel(ours, hf.encode_patches(patches, [grid])[0]) < 1e-5


@pytest.mark.parametrize("backend", ["cpu", "mlx-cpu"])
def test_gguf_model_with_mmproj_answers_as_transformers(
    files: dict[str, Path], backend: str
) -> None:
    """The fixture's two-image prompt on the GGUF Qwen3.5-MoE, its image rows from the
    mmproj at their M-RoPE positions (the worker's layout, found in the GGUF's vocabulary),
    against transformers' logits for the same prompt and images."""
    from llmd.store.gguf_metadata import read_gguf_metadata
    from llmd.worker.vision import content_digest, qwen_gguf_layout, surrogate_ids

    ref = np.load(FIXTURE)
    images = _images(_names())
    tower = native.VisionTower(str(files["mmproj"]), {}, backend=backend)
    layout = qwen_gguf_layout(
        read_gguf_metadata(files["model"])["tokenizer.ggml.tokens"], tower.merge_size
    )
    assert layout.image_token == QWEN3_5_MULTIMODAL["image_token_id"]
    out = tower.encode_patches(np.concatenate([p for p, _ in images]), [g for _, g in images])
    prompt = ref["prompt_ids"].tolist()
    embedded: list = []
    i = 0
    for (pixels, (_, h, w)), emb in zip(images, out, strict=True):
        i = prompt.index(layout.image_token, i)
        prompt[i : i + len(emb)] = surrogate_ids(content_digest(pixels), len(emb))
        embedded.append((i, emb, False, (h // 2, w // 2)))
        i += len(emb)
    engine = native.Engine(
        str(files["model"]), context_length=256, max_sequences=4, backend=backend, kv_type="f32"
    )
    lp, done = _first_logprobs(engine, "a", prompt, embedded)
    want = _log_softmax(ref["logits"][-1])
    scale = float(np.abs(ref["logits"][-1]).max())
    assert np.abs(lp - want).max() / scale < TOLERANCE
    assert done["prompt_tokens"] == len(prompt)


def test_an_mmproj_for_another_model_is_refused(files: dict[str, Path], tmp_path: Path) -> None:
    """A Qwen3.5 mmproj beside a GGUF Gemma 3 (the worker compares the tower with the model)
    and a Qwen3-VL one (deepstack layers, which Qwen3.5 has not) are refused by name."""
    from gguf import GGUFReader, GGUFWriter

    from llmd.worker.vision import ImageEncoder

    from .test_gemma3_mmproj import gemma3_gguf

    gemma = native.Engine(str(gemma3_gguf(tmp_path / "g.gguf")), context_length=64)
    with pytest.raises(ValueError, match="qwen3_5_moe tower, the model gemma3"):
        ImageEncoder.load(str(tmp_path / "g.gguf"), gemma, None, mmproj=str(files["mmproj"]))
    src = GGUFReader(str(files["mmproj"]))
    w = GGUFWriter(str(tmp_path / "deep.gguf"), "clip")
    w.add_string("clip.projector_type", "qwen3vl_merger")
    w.add_bool("clip.has_vision_encoder", True)
    w.add_array("clip.vision.is_deepstack_layers", [True, False])
    for t in src.tensors:
        w.add_tensor(t.name, np.asarray(t.data))
    close_gguf(w)
    with pytest.raises(RuntimeError, match="deepstack"):
        native.VisionTower(str(tmp_path / "deep.gguf"), {})
