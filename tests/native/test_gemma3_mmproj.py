"""Gemma 3's vision tower from llama.cpp's mmproj GGUF (native/mlx/siglip.cpp) against
transformers.

tests/fixtures/gemma3_mmproj_llamacpp_f16.gguf is what llama.cpp's own converter
(`convert_hf_to_gguf.py --mmproj --outtype f16`, run by tests/fixtures/record_gemma3_mmproj.py)
writes for tiny_models.write_gemma3_multimodal's checkpoint: the same 2-layer SigLIP tower and
projector whose transformers embeddings and image-prompt logits are in
tests/fixtures/gemma3_vision_transformers.npz. So the tower read from llama.cpp's names,
layouts and metadata (`v.*`, `mm.*`, `clip.vision.*`, the soft-embedding norm stored as 1 + w)
must give transformers' embeddings, and a GGUF Gemma 3 (tiny_models.write_gguf: the same
decoder weights under llama.cpp's names) fed them must answer as when fed transformers' own.

Tolerance: 1e-4 of the largest value, as tests/native/test_gemma3_vision.py: the weights are
bf16-representable, so the converter's float16 copies hold them exactly; what differs is
summation order.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from . import vision_scaffold as vs
from .test_gemma3_vision import FIXTURE, TOLERANCE, _pixels
from .tiny_models import CONFIGS, GEMMA3_MULTIMODAL, close_gguf, write_gemma3_multimodal, write_gguf

native = pytest.importorskip("llmd._engine")

LLAMACPP_MMPROJ = Path(__file__).parents[1] / "fixtures" / "gemma3_mmproj_llamacpp_f16.gguf"


def _names() -> list[str]:
    return json.loads(np.load(FIXTURE)["cases"].tobytes())


@pytest.mark.parametrize("backend", ["cpu", "mlx-cpu"])
def test_llamacpp_mmproj_embeddings_match_transformers(backend: str) -> None:
    ref = np.load(FIXTURE)
    names = _names()
    tower = native.VisionTower(str(LLAMACPP_MMPROJ), {}, backend=backend)
    assert (tower.architecture, tower.image_size) == ("gemma3", 64)
    # 16x16 patches pooled by llama.cpp's default 4: 16 tokens, projected to the text width.
    assert (tower.tokens_per_image, tower.hidden_size) == (16, 64)
    out = tower.encode(_pixels(names))
    assert out.shape == (2, 16, 64)
    for i, name in enumerate(names):
        assert vs.rel(out[i], ref[f"{name}.embeddings"]) < TOLERANCE, name
    assert vs.rel(out[0], out[1]) > 0.1


def test_written_mmproj_is_what_llamacpp_writes(tmp_path: Path) -> None:
    """tiny_models.write_gemma3_mmproj (which the served tests use for other precisions)
    writes the converter's metadata, names, types and values."""
    from gguf import GGUFReader

    from .tiny_models import write_gemma3_mmproj

    ours_path = tmp_path / "mmproj.gguf"
    write_gemma3_mmproj(ours_path, "F16")
    ours, theirs = GGUFReader(str(ours_path)), GGUFReader(str(LLAMACPP_MMPROJ))
    # What the converter derives from the directory's name, and the file-format keys.
    naming = ("GGUF.", "general.name", "general.basename", "general.finetune", "general.size_")
    naming += ("general.quantization_version",)

    def fields(r: GGUFReader) -> dict:
        return {k: (f.types, f.contents()) for k, f in r.fields.items() if not k.startswith(naming)}

    assert fields(ours) == fields(theirs)
    mine = {t.name: t for t in ours.tensors}
    assert sorted(mine) == sorted(t.name for t in theirs.tensors)
    for t in theirs.tensors:
        m = mine[t.name]
        assert (m.tensor_type, list(m.shape)) == (t.tensor_type, list(t.shape)), t.name
        assert np.array_equal(np.asarray(m.data), np.asarray(t.data)), t.name


def test_f32_mmproj_encodes_as_the_checkpoint_does(tmp_path: Path) -> None:
    """An `--outtype f32` mmproj (float weights on llmd's float GEMM) and the Hugging Face
    directory's tower give the same rows."""
    from llmd.worker.host import multimodal_config

    from .tiny_models import write_gemma3_mmproj

    write_gemma3_mmproj(tmp_path / "mmproj.gguf", "F32")
    write_gemma3_multimodal(tmp_path / "hf")
    pixels = _pixels(_names())
    ours = native.VisionTower(str(tmp_path / "mmproj.gguf"), {}).encode(pixels)
    hf_tower = native.VisionTower(str(tmp_path / "hf"), multimodal_config(str(tmp_path / "hf")))
    assert vs.rel(ours, hf_tower.encode(pixels)) < 1e-5


@pytest.mark.parametrize("backend", ["cpu", "mlx-cpu"])
def test_q8_0_mmproj_stays_close_to_transformers(tmp_path: Path, backend: str) -> None:
    """A Q8_0 mmproj (repos publish them beside F16): its layers on llmd's quantized kernels.
    The writer's tensors equal what the converter's `--outtype q8_0` writes (checked by hand;
    rows of 48 stay F16 there too). Measured: 1.1% and 1.6% of the largest embedding value
    from transformers' (8-bit rounding through two layers); a wrong layout is 10% or more."""
    from .tiny_models import write_gemma3_mmproj

    write_gemma3_mmproj(tmp_path / "mmproj-Q8_0.gguf", "Q8_0")
    ref = np.load(FIXTURE)
    names = _names()
    tower = native.VisionTower(str(tmp_path / "mmproj-Q8_0.gguf"), {}, backend=backend)
    out = tower.encode(_pixels(names))
    for i, name in enumerate(names):
        assert vs.rel(out[i], ref[f"{name}.embeddings"]) < 2e-2, name


def test_head_size_off_the_kernels_multiple_encodes_as_mlx_sdpa(tmp_path: Path) -> None:
    """SigLIP so400m's heads are 1152 / 16 = 72 wide, which llmd's CPU attention kernels (head
    sizes in multiples of 16) take padded with zero columns, the queries rescaled: a tower with
    24-wide heads on the host backend gives the rows MLX's SDPA gives on mlx-cpu, image by
    image (each image's patches see only their own image)."""
    from .tiny_models import GEMMA3_VISION, gemma3_vision_weights, write_gemma3_mmproj

    vision = {**GEMMA3_VISION, "hidden_size": 48, "num_attention_heads": 2}
    tensors = gemma3_vision_weights(vision=vision)
    write_gemma3_mmproj(tmp_path / "mmproj.gguf", "F32", vision, tensors=tensors)
    pixels = np.random.default_rng(7).uniform(-1, 1, (2, 3, 64, 64)).astype(np.float32)
    host = native.VisionTower(str(tmp_path / "mmproj.gguf"), {}, backend="cpu").encode(pixels)
    sdpa = native.VisionTower(str(tmp_path / "mmproj.gguf"), {}, backend="mlx-cpu").encode(pixels)
    assert host.shape == (2, 16, 64)
    assert vs.rel(host, sdpa) < 1e-5
    alone = native.VisionTower(str(tmp_path / "mmproj.gguf"), {}, backend="cpu").encode(pixels[1:])
    assert vs.rel(host[1], alone[0]) < 1e-5
    assert vs.rel(host[0], host[1]) > 0.1


def test_mmproj_of_another_projector_is_refused(tmp_path: Path) -> None:
    from gguf import GGUFWriter

    path = tmp_path / "mmproj-qwen.gguf"
    w = GGUFWriter(str(path), "clip")
    w.add_string("clip.projector_type", "qwen2vl_merger")
    w.add_bool("clip.has_vision_encoder", True)
    w.add_tensor("v.patch_embd.weight", np.zeros((4, 4), dtype=np.float32))
    close_gguf(w)
    with pytest.raises(RuntimeError, match="not a Gemma 3 or Qwen3.5 mmproj.*qwen2vl_merger"):
        native.VisionTower(str(path), {})


def gemma3_gguf(path: Path) -> Path:
    """write_gemma3_multimodal's decoder as a GGUF (its text config: no final soft-capping)."""
    config = {**CONFIGS["gemma3_text"], "final_logit_softcapping": None}
    write_gguf(path, "gemma3_text", config=config)
    return path


@pytest.mark.parametrize("backend", ["cpu", "mlx-cpu"])
def test_gguf_model_with_mmproj_answers_as_with_transformers_embeddings(
    tmp_path: Path, backend: str
) -> None:
    """The fixture's two-image prompt on a GGUF Gemma 3, its image rows from llama.cpp's
    mmproj, against the same GGUF fed transformers' recorded embeddings of those images.

    Not against transformers' logits: the tiny config's query_pre_attn_scalar (24) is not its
    head_dim (32), which a GGUF cannot say (llama.cpp derives the scale from the head size),
    so the GGUF decoder is a slightly different model from the checkpoint's."""
    from llmd.worker.vision import gemma3_layout, layout_images

    ref = np.load(FIXTURE)
    names = _names()
    pixels = _pixels(names)
    model = gemma3_gguf(tmp_path / "tiny-gemma3.gguf")
    layout = gemma3_layout(GEMMA3_MULTIMODAL)

    def first_logprobs(embeddings: list[np.ndarray]) -> np.ndarray:
        prompt, embedded = layout_images(
            ref["prompt_ids"].tolist(), embeddings, list(pixels), layout
        )
        engine = native.Engine(  # one engine each: the same image ids would hit its cache
            str(model), context_length=256, max_sequences=8, backend=backend, kv_type="f32"
        )
        return vs.first_logprobs(engine, "a", prompt, embedded)[0]

    tower = native.VisionTower(str(LLAMACPP_MMPROJ), {}, backend=backend)
    ours = first_logprobs(list(tower.encode(pixels)))
    want = first_logprobs([ref[f"{n}.embeddings"] for n in names])
    assert np.abs(ours - want).max() / np.abs(want).max() < TOLERANCE
    # The images matter: without them (zero rows) the answer moves far more than that.
    blind = first_logprobs([np.zeros((16, 64), np.float32)] * 2)
    assert np.abs(blind - want).max() / np.abs(want).max() > 100 * TOLERANCE
