"""Write a random-weight llama or qwen3 GGUF of a given shape, tensor by tensor, with the `gguf`
package.

Why: the GPU benchmark needs an 8B-shaped model on a machine that cannot download one. The
weights are random Q4_0 blocks (uniform 4-bit codes, one float16 scale per 32 weights chosen so
weights have a std of ~0.02), written straight as blocks: nothing is ever held in float32, and
only one tensor is in memory at a time. `--dtype q8_0 / q4_k_m / q5_k_m / q6_k` write random
blocks of those types the same way, with llama-quantize's per-tensor mix for the _K_M recipes
(Q6_K output and some attn_v / ffn_down): the GPU session has minutes, not the time to write a
16 GB F16 file and quantize it, and a kernel's speed does not depend on the values. With `--dtype f16` the weights are float16 normals of
std 0.02 instead, the input `llama-quantize` turns into each of llama.cpp's recipes (what
`bench/realistic.py` does). The vocabulary is a synthetic SentencePiece-style list
(control, byte and filler tokens) so llama.cpp's tools load the file too. Text is gibberish;
speed is what it is for.

    python bench/gpu/make_random_gguf.py --preset llama3-8b --out /tmp/llama3-8b-q4_0.gguf
    python bench/gpu/make_random_gguf.py --preset qwen3-4b --dtype f16 --out /tmp/qwen3-4b-f16.gguf
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

Q = gguf.GGMLQuantizationType
Q4_0 = Q.Q4_0
BLOCK_ELEMS, BLOCK_BYTES = 32, 18
# ChatML, so that chat requests work over HTTP on both servers (the vocabulary is synthetic).
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@dataclass(frozen=True)
class Shape:
    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int
    context: int
    rope_theta: float
    arch: str = "llama"
    head_dim: int = 0  # 0: hidden / heads
    tied: bool = False  # no output.weight: the logits reuse token_embd (Qwen3-4B does)

    @property
    def hd(self) -> int:
        return self.head_dim or self.hidden // self.heads


PRESETS = {
    # Meta-Llama-3-8B's dimensions.
    "llama3-8b": Shape(128256, 4096, 32, 32, 8, 14336, 8192, 500000.0),
    # Llama-3.2-1B's dimensions (re-quantize with llama-quantize --allow-requantize to get a
    # Q4_K_M file with llama.cpp's own per-tensor type mix).
    "llama3.2-1b": Shape(128256, 2048, 16, 32, 8, 8192, 8192, 500000.0),
    # Qwen3-4B's dimensions (head_dim 128 with a 2560 hidden size, QK-norm, tied embeddings).
    "qwen3-4b": Shape(151936, 2560, 36, 32, 8, 9728, 40960, 1000000.0, "qwen3", 128, True),
    # Qwen2.5-0.5B's dimensions: hidden 896 is no multiple of 256, so llama-quantize's K-quant
    # recipes fall back to Q5_0 / Q5_1 / Q8_0 for every tensor whose rows are 896 long.
    "qwen2.5-0.5b": Shape(151936, 896, 24, 14, 2, 4864, 32768, 1000000.0, "qwen2", 64, True),
    # Qwen2.5(-Coder)-1.5B's dimensions: 6 query heads per KV head of 128, a 8,960-wide FFN, the
    # size people run for editor completions.
    "qwen2.5-1.5b": Shape(151936, 1536, 28, 12, 2, 8960, 32768, 1000000.0, "qwen2", 128, True),
    # A few MB: for tests of this script and of loaders.
    "tiny": Shape(512, 128, 2, 4, 2, 256, 512, 10000.0),
    # Small models for the cuda backend's GPU tests (native/cuda/tests/test_model.cpp): head size
    # 64 with the test model's GQA ratio of 3, head size 128 with 4, and a K-quant-able hidden size.
    "tiny-gqa3": Shape(1000, 384, 3, 6, 2, 1024, 2048, 10000.0),
    "tiny-hd128": Shape(1000, 512, 3, 4, 1, 1536, 2048, 500000.0),
    "tiny-qwen3": Shape(1000, 256, 2, 4, 2, 768, 2048, 1000000.0, "qwen3", 64, True),
    "tiny-qwen2": Shape(1000, 384, 2, 6, 2, 768, 2048, 1000000.0, "qwen2"),
}


def q4_0_blocks(rng: np.random.Generator, rows: int, cols: int, std: float = 0.02) -> np.ndarray:
    """[rows, cols / 32 * 18] uint8: random codes, scales ~ std / 4.6 (the std of q - 8)."""
    n_blocks = rows * cols // BLOCK_ELEMS
    blocks = rng.integers(0, 256, size=(n_blocks, BLOCK_BYTES), dtype=np.uint8)
    scales = (std / 4.6 * rng.uniform(0.8, 1.2, size=n_blocks)).astype(np.float16)
    blocks[:, :2] = scales.view(np.uint8).reshape(n_blocks, 2)
    return blocks.reshape(rows, cols // BLOCK_ELEMS * BLOCK_BYTES)


def k_quant_blocks(
    rng: np.random.Generator, qtype: Q, rows: int, cols: int, std: float = 0.02
) -> np.ndarray:
    """Random blocks of a K-quant or Q8_0 (any bit pattern is a valid block), with the float16
    super-scales set so that the weights' spread is near `std`: the speed of the kernels does
    not depend on the values, and the CUDA tests need finite, moderate logits."""
    elems, nbytes = gguf.GGML_QUANT_SIZES[qtype]
    n_blocks = rows * cols // elems
    blocks = rng.integers(0, 256, size=(n_blocks, nbytes), dtype=np.uint8)

    def put_f16(offset: int, value: float) -> None:
        v = (value * rng.uniform(0.8, 1.2, size=n_blocks)).astype(np.float16)
        blocks[:, offset : offset + 2] = v.view(np.uint8).reshape(n_blocks, 2)

    if qtype == Q.Q8_0:  # d, 32 int8 (std ~74)
        put_f16(0, std / 74)
    elif qtype in (Q.Q4_K, Q.Q5_K):  # d, dmin, 6-bit scales/mins: w = d*sc*q - dmin*m
        levels = 8 if qtype == Q.Q4_K else 16
        put_f16(0, std / (32 * levels * 0.6))
        put_f16(2, std / (32 * levels * 0.6) * levels)
    elif qtype == Q.Q6_K:  # ql, qh, int8 scales, then d: w = d*scale*(q - 32)
        put_f16(208, std / (64 * 18))
    else:
        raise ValueError(f"no random blocks for {qtype.name}")
    return blocks.reshape(rows, cols // elems * nbytes)


def use_more_bits(i: int, n: int) -> bool:
    """llama.cpp's Q*_K_M rule for which attn_v / ffn_down layers get Q6_K."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


# Per-tensor type of each recipe: (name, layer index or -1, layer count) -> quantization type.
FILE_TYPES = {
    "q4_0": gguf.LlamaFileType.MOSTLY_Q4_0,
    "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
    "q4_k_m": gguf.LlamaFileType.MOSTLY_Q4_K_M,
    "q5_k_m": gguf.LlamaFileType.MOSTLY_Q5_K_M,
    "q6_k": gguf.LlamaFileType.MOSTLY_Q6_K,
    "f16": gguf.LlamaFileType.MOSTLY_F16,
}


def tensor_type(dtype: str, name: str, layer: int, n_layers: int) -> Q:
    """The type llama-quantize's recipe gives this tensor (Q*_K_M: Q6_K for the output matrix and
    for attn_v / ffn_down of the layers use_more_bits picks)."""
    if dtype in ("q4_0", "q8_0", "q6_k", "f16"):
        return {"q4_0": Q.Q4_0, "q8_0": Q.Q8_0, "q6_k": Q.Q6_K, "f16": Q.F16}[dtype]
    base = Q.Q4_K if dtype == "q4_k_m" else Q.Q5_K
    if name == "output.weight":
        return Q.Q6_K
    if name.endswith(("attn_v.weight", "ffn_down.weight")) and use_more_bits(layer, n_layers):
        return Q.Q6_K
    return base


def vocabulary(n: int) -> tuple[list[str], list[float], list[int]]:
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3] + [6] * 256
    tokens += [f"\u2581w{i}" for i in range(n - len(tokens))]
    types += [1] * (n - len(types))
    scores = [0.0] * 259 + [-float(i) for i in range(n - 259)]
    return tokens, scores, types


def tensor_plan(s: Shape) -> list[tuple[str, int, int]]:
    """(name, rows, cols) in file order; rows == 0 marks a 1-D float32 norm of `cols`."""
    hd = s.hd
    plan = [("token_embd.weight", s.vocab, s.hidden)]
    for i in range(s.layers):
        b = f"blk.{i}."
        plan += [
            (b + "attn_norm.weight", 0, s.hidden),
            (b + "attn_q.weight", s.heads * hd, s.hidden),
            (b + "attn_k.weight", s.kv_heads * hd, s.hidden),
            (b + "attn_v.weight", s.kv_heads * hd, s.hidden),
        ]
        if s.arch == "qwen3":
            plan += [(b + "attn_q_norm.weight", 0, hd), (b + "attn_k_norm.weight", 0, hd)]
        if s.arch == "qwen2":  # q/k/v biases
            plan += [(b + "attn_q.bias", 0, s.heads * hd), (b + "attn_k.bias", 0, s.kv_heads * hd)]
            plan += [(b + "attn_v.bias", 0, s.kv_heads * hd)]
        plan += [
            (b + "attn_output.weight", s.hidden, s.heads * hd),
            (b + "ffn_norm.weight", 0, s.hidden),
            (b + "ffn_gate.weight", s.ffn, s.hidden),
            (b + "ffn_up.weight", s.ffn, s.hidden),
            (b + "ffn_down.weight", s.hidden, s.ffn),
        ]
    plan += [("output_norm.weight", 0, s.hidden)]
    if not s.tied:
        plan += [("output.weight", s.vocab, s.hidden)]
    return plan


def f16_rows(rng: np.random.Generator, rows: int, cols: int, std: float = 0.02) -> np.ndarray:
    """[rows, cols] float16 normals, drawn a slice at a time (a 150k x 2560 embedding would
    otherwise need 1.5 GB of float32 at once)."""
    out = np.empty((rows, cols), dtype=np.float16)
    step = max(1, (1 << 24) // cols)
    for r in range(0, rows, step):
        out[r : r + step] = rng.standard_normal((min(step, rows - r), cols), dtype=np.float32) * std
    return out


def write(shape: Shape, out: Path, seed: int = 0, dtype: str = "q4_0") -> None:
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(out), shape.arch)
    w.add_name(f"random-{shape.arch}")
    w.add_block_count(shape.layers)
    w.add_context_length(shape.context)
    w.add_embedding_length(shape.hidden)
    w.add_feed_forward_length(shape.ffn)
    w.add_head_count(shape.heads)
    w.add_head_count_kv(shape.kv_heads)
    w.add_rope_dimension_count(shape.hd)
    w.add_key_length(shape.hd)
    w.add_value_length(shape.hd)
    w.add_rope_freq_base(shape.rope_theta)
    w.add_layer_norm_rms_eps(1e-6 if shape.arch == "qwen3" else 1e-5)
    w.add_file_type(FILE_TYPES[dtype])
    w.add_chat_template(CHATML)
    tokens, scores, types = vocabulary(shape.vocab)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    plan = tensor_plan(shape)

    def qtype_of(name: str) -> Q:
        layer = int(name.split(".")[1]) if name.startswith("blk.") else -1
        return tensor_type(dtype, name, layer, shape.layers)

    for name, rows, cols in plan:
        if rows == 0:
            w.add_tensor_info(name, (cols,), np.dtype(np.float32), cols * 4)
        elif qtype_of(name) == Q.F16:
            w.add_tensor_info(name, (rows, cols), np.dtype(np.float16), rows * cols * 2)
        else:
            elems, block_bytes = gguf.GGML_QUANT_SIZES[qtype_of(name)]
            nbytes = rows * cols // elems * block_bytes
            w.add_tensor_info(
                name, (rows, nbytes // rows), np.dtype(np.uint8), nbytes, raw_dtype=qtype_of(name)
            )
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, rows, cols in plan:
        qtype = qtype_of(name) if rows else None
        if rows == 0 and name.endswith(".bias"):
            w.write_tensor_data(rng.normal(0.0, 0.5, size=cols).astype(np.float32))
        elif rows == 0:
            w.write_tensor_data(np.ones(cols, dtype=np.float32))
        elif qtype == Q.F16:
            w.write_tensor_data(f16_rows(rng, rows, cols))
        elif qtype == Q.Q4_0:
            w.write_tensor_data(q4_0_blocks(rng, rows, cols))
        else:
            w.write_tensor_data(k_quant_blocks(rng, qtype, rows, cols))
    w.close()


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--preset", choices=sorted(PRESETS), default="llama3-8b")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", choices=sorted(FILE_TYPES), default="q4_0")
    args = ap.parse_args()
    write(PRESETS[args.preset], args.out, args.seed, args.dtype)
    print(f"wrote {args.out} ({args.out.stat().st_size / 2**30:.2f} GiB)")


if __name__ == "__main__":
    main()
