"""Pull-time GGUF conversion (convert.py) and the GGUF layout parser it relies on, checked
against the gguf package: its writer makes the inputs, its reader and dequantizer judge the
outputs."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import GGUFReader, GGUFValueType, GGUFWriter
from gguf.quants import dequantize, quantize

from llmd.store.convert import ConversionError, convert_gguf, plan_conversion
from llmd.store.gguf_layout import Truncated, parse_layout, read_layout
from llmd.store.install import check_gguf, check_hf_config
from llmd.store.manifests import UnsupportedModel

from .gguf_files import random_blocks, write_tensors

RNG = np.random.default_rng(7)


def q5k_blocks(rows: int, cols: int) -> np.ndarray:
    """Valid Q5_K bytes (gguf cannot quantize K-quants): random quants and scales with
    sane fp16 super-block scales d and dmin."""
    raw = RNG.integers(0, 256, size=(rows, cols // 256, 176), dtype=np.uint8)
    raw[:, :, 0:2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
    raw[:, :, 2:4] = np.frombuffer(np.float16(0.004).tobytes(), np.uint8)
    return raw.reshape(rows, -1)


def make_gguf(path: Path, arch: str = "llama") -> dict[str, tuple[int, np.ndarray]]:
    """A small GGUF with every kind of tensor a conversion meets; returns name -> (type,
    the weights it holds as float32)."""
    w = GGUFWriter(str(path), arch)
    w.add_context_length(2048)
    w.add_string("tokenizer.chat_template", "{{ messages }}")
    w.add_array("tokenizer.ggml.tokens", ["<s>", "</s>", "héllo", "wörld"])
    w.add_array("tokenizer.ggml.scores", [0.0, -1.5, 2.25, 3.0])
    w.add_key_value("llama.rope.dimension_sections", [1, 2, 3], GGUFValueType.ARRAY)
    w.add_uint32("general.file_type", 8)  # MOSTLY_Q5_0
    tensors: dict[str, tuple[int, np.ndarray]] = {}
    for name, ttype, shape in [
        ("blk.0.attn_q.weight", T.MXFP4, (64, 128)),  # no kernel: re-quantized to Q8_0
        ("blk.0.ffn_up.weight", T.Q5_1, (96, 64)),  # native: copied as is
        ("blk.0.ffn_down.weight", T.Q4_0, (64, 96)),
        ("blk.0.attn_norm.weight", T.F32, (64,)),
    ]:
        x = RNG.standard_normal(shape).astype(np.float32)
        data = x if ttype == T.F32 else quantize(x, ttype)
        tensors[name] = (ttype, x if ttype == T.F32 else dequantize(data, ttype))
        w.add_tensor(name, data, raw_dtype=None if ttype == T.F32 else ttype)
    xs = random_blocks(RNG, T.IQ4_XS, 8, 512, 1e-3)  # no kernel: re-encoded as IQ4_NL
    tensors["blk.0.ffn_gate.weight"] = (T.IQ4_XS, dequantize(xs, T.IQ4_XS))
    w.add_tensor("blk.0.ffn_gate.weight", xs, raw_dtype=T.IQ4_XS)
    k3 = random_blocks(RNG, T.Q3_K, 8, 512, 0.01)  # native since Q2_K / Q3_K have kernels
    tensors["blk.0.attn_v.weight"] = (T.Q3_K, dequantize(k3, T.Q3_K))
    w.add_tensor("blk.0.attn_v.weight", k3, raw_dtype=T.Q3_K)
    k5 = q5k_blocks(8, 512)  # native since Q5_K has kernels: copied as is
    tensors["blk.0.attn_k.weight"] = (T.Q5_K, dequantize(k5, T.Q5_K))
    w.add_tensor("blk.0.attn_k.weight", k5, raw_dtype=T.Q5_K)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return tensors


def fields(reader: GGUFReader) -> dict[str, object]:
    return {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}


def test_layout_matches_gguf_reader_and_reports_how_much_it_needs(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    make_gguf(path)
    layout = read_layout(path)
    reader = GGUFReader(path)
    assert [(t.name, t.type) for t in layout.tensors] == [
        (t.name, int(t.tensor_type)) for t in reader.tensors
    ]
    assert [layout.data_start + t.offset for t in layout.tensors] == [
        int(t.data_offset) for t in reader.tensors
    ]
    assert layout.architecture == "llama" and layout.context_length == 2048
    assert layout.quantization == "Q5_0"
    head = path.read_bytes()[:100]
    with pytest.raises(Truncated) as info:
        parse_layout(head)
    assert info.value.needed > 100


def test_conversion_keeps_metadata_and_weights(tmp_path: Path) -> None:
    src, dst = tmp_path / "src.gguf", tmp_path / "dst.gguf"
    original = make_gguf(src)
    layout = read_layout(src)
    plan = check_gguf(layout, "test")
    assert {n: (T(a).name, T(b).name) for n, (a, b) in plan.changes.items()} == {
        "blk.0.attn_q.weight": ("MXFP4", "Q8_0"),
        "blk.0.ffn_gate.weight": ("IQ4_XS", "IQ4_NL"),
    }
    assert "IQ4_XS -> IQ4_NL (1 tensors)" in plan.summary()
    done: list[int] = []
    convert_gguf(src, dst, layout, plan, lambda d, t: done.append(d))
    assert dst.stat().st_size == plan.output_size and done[-1] == sum(
        t.nbytes for t in layout.tensors
    )

    before, after = fields(GGUFReader(src)), fields(GGUFReader(dst))
    assert after.pop("llmd.converted_from") == plan.summary()
    assert after.pop("general.file_type") == before.pop("general.file_type")  # two targets
    assert after == before  # tokens, scores, template, nested types: all byte-identical

    out = {t.name: t for t in GGUFReader(dst).tensors}
    for name, (ttype, weights) in original.items():
        t = out[name]
        got = dequantize(t.data, t.tensor_type).reshape(weights.shape)
        if name in plan.changes:
            assert t.tensor_type == plan.changes[name][1]
            scale = np.abs(weights).max()
            assert np.abs(got - weights).max() <= scale / 100  # Q8_0: < 1 % of the range
        else:
            assert t.tensor_type == ttype and np.array_equal(got, weights)  # copied


def test_native_files_need_no_conversion_and_others_are_refused(tmp_path: Path) -> None:
    x = RNG.standard_normal((32, 64)).astype(np.float32)
    path = write_tensors(tmp_path / "q.gguf", {"w": (quantize(x, T.Q8_0), T.Q8_0)})
    assert not plan_conversion(read_layout(path)).needed

    mamba = tmp_path / "mamba.gguf"
    make_gguf(mamba, arch="mamba")
    with pytest.raises(UnsupportedModel, match="'mamba' model; llmd's engine runs llama"):
        check_gguf(read_layout(mamba), "hf.co/x/y")

    # Gemma 4 runs from safetensors only: its GGUFs are refused, its configs accepted
    gemma4 = tmp_path / "gemma4.gguf"
    make_gguf(gemma4, arch="gemma4")
    with pytest.raises(UnsupportedModel, match="'gemma4' GGUF; llmd runs gemma4 models from"):
        check_gguf(read_layout(gemma4), "hf.co/x/y")
    text = {"model_type": "gemma4_text"}
    assert check_hf_config({"model_type": "gemma4", "text_config": text}, "x") == "gemma4"
    assert check_hf_config(text, "x") == "gemma4_text"

    # an integer tensor is no weight llmd can run or convert
    data = bytearray(path.read_bytes())
    layout = read_layout(path)
    type_at = data.index(b"w", 24) + 1 + 4 + 16  # name, n_dims, two dims
    struct.pack_into("<I", data, type_at, int(T.I32))
    assert layout.tensors[0].type == T.Q8_0
    with pytest.raises(ConversionError, match="I32, which llmd can neither run nor convert"):
        plan_conversion(parse_layout(bytes(data)))


@pytest.mark.parametrize(
    ("arch", "model", "pre", "refusal"),
    [
        ("qwen2", "gpt2", "qwen2", None),
        ("qwen3", "gpt2", "qwen2", None),
        ("gemma3", "llama", None, None),  # llama.cpp's Gemma 3 GGUFs: SentencePiece
        # SentencePiece unigram: rebuilt for XLM-RoBERTa encoders (bert) only
        ("qwen2", "t5", None, "tokenizer model 't5'.*XLM-RoBERTa encoders"),
        ("t5", "t5", None, "a 't5' model"),  # T5 itself: its architecture is not run
        # accepted tokenizer: the next check is the kind (this file has no pooling_type)
        ("bert", "t5", "default", "encoder, which embeds or reranks but never generates"),
        ("llama", "gpt2", None, "pre-tokenizer 'default'"),
    ],
)
def test_new_architectures_pass_and_unbuildable_tokenizers_are_refused_from_the_header(
    tmp_path: Path, arch: str, model: str, pre: str | None, refusal: str | None
) -> None:
    """A pull learns from the GGUF header alone whether llmd can rebuild its tokenizer, so a
    model that could never be served is refused before its weights are downloaded."""
    path = tmp_path / f"{arch}.gguf"
    w = GGUFWriter(str(path), arch)
    w.add_tokenizer_model(model)
    if pre is not None:
        w.add_tokenizer_pre(pre)
    w.add_tensor("blk.0.attn_q.weight", RNG.standard_normal((32, 64)).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    if refusal is None:
        assert not check_gguf(read_layout(path), "hf.co/x/y").needed
    else:
        with pytest.raises(UnsupportedModel, match=refusal):
            check_gguf(read_layout(path), "hf.co/x/y")
