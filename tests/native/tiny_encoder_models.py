"""Tiny random encoder embedding models (BERT, XLM-RoBERTa, nomic-bert), built with numpy only,
as Hugging Face directories laid out as sentence-transformers saves them (config.json,
model.safetensors, tokenizer.json, modules.json, 1_Pooling/config.json) and as GGUF files with
llama.cpp's names and metadata (architectures ``bert`` and ``nomic-bert``). The tests pull them
into llmd; the fixture recorder (tests/fixtures/record_encoder_embeddings.py) runs the
reference on the very same files.

The tokenizer is a real WordPiece one (lowercasing, punctuation split, "##" continuations) over
a made-up vocabulary: words ``w0``..``wN``, continuations ``##s`` and ``##ing``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from tests.native.tiny_models import close_gguf, write_safetensors

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
VOCAB = 96
# XLM-RoBERTa's specials sit where its own tokenizer puts them (<s> 0, <pad> 1, </s> 2).
XLMR_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]

CONFIGS: dict[str, dict] = {
    "bert": {
        "architectures": ["BertModel"],
        "model_type": "bert",
        "vocab_size": VOCAB,
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 96,
        "hidden_act": "gelu",
        "max_position_embeddings": 64,
        "type_vocab_size": 2,
        "layer_norm_eps": 1e-12,
        "pad_token_id": 0,
        "position_embedding_type": "absolute",
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
    },
    "xlm-roberta": {
        "architectures": ["XLMRobertaModel"],
        "model_type": "xlm-roberta",
        "vocab_size": VOCAB,
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 96,
        "hidden_act": "gelu",
        "max_position_embeddings": 66,  # 64 positions after padding_idx + 1
        "type_vocab_size": 1,
        "layer_norm_eps": 1e-5,
        "pad_token_id": 1,
        "bos_token_id": 0,
        "eos_token_id": 2,
        "position_embedding_type": "absolute",
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
    },
    # nomic-ai's NomicBertConfig keys (GPT-2 style), as nomic-embed-text-v1.5's config.json.
    "nomic_bert": {
        "architectures": ["NomicBertModel"],
        "model_type": "nomic_bert",
        "vocab_size": VOCAB,
        "n_embd": 64,
        "n_layer": 2,
        "n_head": 4,
        "n_inner": 96,
        "n_positions": 128,
        "activation_function": "swiglu",
        "rotary_emb_base": 1000,
        "rotary_emb_fraction": 1.0,
        "rotary_emb_interleaved": False,
        "qkv_proj_bias": False,
        "mlp_fc1_bias": False,
        "mlp_fc2_bias": False,
        "prenorm": False,
        "type_vocab_size": 2,
        "layer_norm_epsilon": 1e-12,
        "pad_token_id": 0,
    },
}

# The pooling each test model's sentence-transformers config asks for (and its Normalize).
POOLING = {"bert": ("cls", True), "xlm-roberta": ("mean", True), "nomic_bert": ("mean", True)}
GGUF_POOLING_TYPE = {"mean": 1, "cls": 2, "last": 3, "rank": 4}
GGUF_ARCH = {"bert": "bert", "xlm-roberta": "bert", "nomic_bert": "nomic-bert"}


def vocabulary(arch: str, size: int = VOCAB) -> list[str]:
    specials = XLMR_SPECIALS if arch == "xlm-roberta" else SPECIALS
    words = [f"w{i}" for i in range(len(specials), size - 2)]
    return [*specials, *words, "##s", "##ing"]


def weights(arch: str, seed: int = 0, config: dict | None = None) -> dict[str, np.ndarray]:
    """The checkpoint's tensors with Hugging Face names (float32); `config` replaces
    CONFIGS[arch] (benchmarks: real models' shapes)."""
    c = config or CONFIGS[arch]
    rng = np.random.default_rng(seed)
    nomic = arch == "nomic_bert"
    h = c["n_embd"] if nomic else c["hidden_size"]
    f = c["n_inner"] if nomic else c["intermediate_size"]
    layers = c["n_layer"] if nomic else c["num_hidden_layers"]

    def mat(*shape: int, scale: float = 0.15) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    def norm(prefix: str) -> dict[str, np.ndarray]:
        return {
            f"{prefix}.weight": (1 + mat(h, scale=0.1)).astype(np.float32),
            f"{prefix}.bias": mat(h, scale=0.05),
        }

    w: dict[str, np.ndarray] = {
        "embeddings.word_embeddings.weight": mat(c["vocab_size"], h, scale=0.5),
        "embeddings.token_type_embeddings.weight": mat(c["type_vocab_size"], h, scale=0.2),
    }
    if nomic:
        w.update(norm("emb_ln"))
        for i in range(layers):
            b = f"encoder.layers.{i}."
            w[b + "attn.Wqkv.weight"] = mat(3 * h, h)
            w[b + "attn.out_proj.weight"] = mat(h, h)
            w.update(norm(b + "norm1"))
            w[b + "mlp.fc11.weight"] = mat(f, h)
            w[b + "mlp.fc12.weight"] = mat(f, h)
            w[b + "mlp.fc2.weight"] = mat(h, f)
            w.update(norm(b + "norm2"))
        return w
    w["embeddings.position_embeddings.weight"] = mat(c["max_position_embeddings"], h, scale=0.2)
    w.update(norm("embeddings.LayerNorm"))
    for i in range(layers):
        b = f"encoder.layer.{i}."
        for proj in ("query", "key", "value"):
            w[f"{b}attention.self.{proj}.weight"] = mat(h, h)
            w[f"{b}attention.self.{proj}.bias"] = mat(h, scale=0.05)
        w[b + "attention.output.dense.weight"] = mat(h, h)
        w[b + "attention.output.dense.bias"] = mat(h, scale=0.05)
        w.update(norm(b + "attention.output.LayerNorm"))
        w[b + "intermediate.dense.weight"] = mat(f, h)
        w[b + "intermediate.dense.bias"] = mat(f, scale=0.05)
        w[b + "output.dense.weight"] = mat(h, f)
        w[b + "output.dense.bias"] = mat(h, scale=0.05)
        w.update(norm(b + "output.LayerNorm"))
    # BertModel / XLMRobertaModel load a pooler (unused by sentence-transformers' pooling).
    w["pooler.dense.weight"] = mat(h, h)
    w["pooler.dense.bias"] = mat(h, scale=0.05)
    return w


def write_tokenizer(directory: Path, arch: str) -> None:
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

    tokens = vocabulary(arch)
    vocab = {t: i for i, t in enumerate(tokens)}
    xlmr = arch == "xlm-roberta"
    unk, cls, sep = ("<unk>", "<s>", "</s>") if xlmr else ("[UNK]", "[CLS]", "[SEP]")
    tk = Tokenizer(models.WordPiece(vocab, unk_token=unk))
    tk.normalizer = normalizers.BertNormalizer(lowercase=True, strip_accents=False)
    tk.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tk.add_special_tokens(XLMR_SPECIALS if xlmr else SPECIALS)
    # Pairs as each family's own tokenizer joins them (cross-encoders read query and document
    # as one input): BERT "[CLS] A [SEP] B [SEP]" (B of type 1), XLM-R "<s> A </s></s> B </s>"
    # (one token type).
    pair = f"{cls} $A {sep} {sep} $B {sep}" if xlmr else f"{cls} $A {sep} $B:1 {sep}:1"
    tk.post_processor = processors.TemplateProcessing(
        single=f"{cls} $A {sep}",
        pair=pair,
        special_tokens=[(cls, vocab[cls]), (sep, vocab[sep])],
    )
    tk.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(
        json.dumps({"cls_token": cls, "sep_token": sep, "unk_token": unk, "model_max_length": 64})
    )


# A sentence-transformers Dense module after the pooling: hidden -> DENSE_OUT, tanh (Dense's
# default activation), with a bias.
DENSE_OUT = 48
TANH = "torch.nn.modules.activation.Tanh"


def dense_weights(hidden: int, seed: int = 5) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "linear.weight": (rng.standard_normal((DENSE_OUT, hidden)) * 0.2).astype(np.float32),
        "linear.bias": (rng.standard_normal(DENSE_OUT) * 0.05).astype(np.float32),
    }


def write_sentence_transformers_modules(
    directory: Path, hidden: int, pooling: str, normalize: bool, dense: bool = False
) -> None:
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {
            "idx": 1,
            "name": "1",
            "path": "1_Pooling",
            "type": "sentence_transformers.models.Pooling",
        },
    ]
    if dense:
        modules.append(
            {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"}
        )
        (directory / "2_Dense").mkdir(exist_ok=True)
        config = {"in_features": hidden, "out_features": DENSE_OUT, "bias": True}
        (directory / "2_Dense" / "config.json").write_text(
            json.dumps({**config, "activation_function": TANH})
        )
        write_safetensors(
            directory / "2_Dense" / "model.safetensors", dense_weights(hidden), dtype="F32"
        )
    if normalize:
        modules.append(
            {
                "idx": 2,
                "name": "2",
                "path": "2_Normalize",
                "type": "sentence_transformers.models.Normalize",
            }
        )
    (directory / "modules.json").write_text(json.dumps(modules, indent=1))
    (directory / "1_Pooling").mkdir(exist_ok=True)
    (directory / "1_Pooling" / "config.json").write_text(
        json.dumps(
            {
                "word_embedding_dimension": hidden,
                "pooling_mode_cls_token": pooling == "cls",
                "pooling_mode_mean_tokens": pooling == "mean",
                "pooling_mode_max_tokens": False,
                "pooling_mode_mean_sqrt_len_tokens": False,
                "pooling_mode_weightedmean_tokens": False,
                "pooling_mode_lasttoken": pooling == "last",
                "include_prompt": True,
            }
        )
    )


def write_encoder_dir(
    directory: Path, arch: str, seed: int = 11, *, dense: bool = False, card: str = ""
) -> None:
    """A sentence-transformers directory of `arch` ("bert", "xlm-roberta", "nomic_bert"); with
    `dense`, mean pooling then a Dense module (tanh) then Normalize; `card`: its README.md."""
    directory.mkdir(parents=True, exist_ok=True)
    c = CONFIGS[arch]
    write_safetensors(directory / "model.safetensors", weights(arch, seed), dtype="F32")
    (directory / "config.json").write_text(json.dumps(c, indent=1))
    pooling, normalize = ("mean", True) if dense else POOLING[arch]
    hidden = c.get("hidden_size", c.get("n_embd"))
    write_sentence_transformers_modules(directory, hidden, pooling, normalize, dense)
    write_tokenizer(directory, arch)
    if card:
        (directory / "README.md").write_text(card)


def gguf_tensors(arch: str, seed: int = 11, config: dict | None = None) -> dict[str, np.ndarray]:
    """The same weights under llama.cpp's tensor names, as its converter writes them
    (XLM-RoBERTa's position rows before padding_idx + 1 dropped)."""
    w = weights(arch, seed, config)
    c = config or CONFIGS[arch]
    out = {
        "token_embd.weight": w["embeddings.word_embeddings.weight"],
        "token_types.weight": w["embeddings.token_type_embeddings.weight"],
    }
    if arch == "nomic_bert":
        out["token_embd_norm.weight"] = w["emb_ln.weight"]
        out["token_embd_norm.bias"] = w["emb_ln.bias"]
        for i in range(c["n_layer"]):
            b, g = f"encoder.layers.{i}.", f"blk.{i}."
            out[g + "attn_qkv.weight"] = w[b + "attn.Wqkv.weight"]
            out[g + "attn_output.weight"] = w[b + "attn.out_proj.weight"]
            out[g + "ffn_up.weight"] = w[b + "mlp.fc11.weight"]
            out[g + "ffn_gate.weight"] = w[b + "mlp.fc12.weight"]
            out[g + "ffn_down.weight"] = w[b + "mlp.fc2.weight"]
            for hf, gg in (("norm1", "attn_output_norm"), ("norm2", "layer_output_norm")):
                out[f"{g}{gg}.weight"] = w[f"{b}{hf}.weight"]
                out[f"{g}{gg}.bias"] = w[f"{b}{hf}.bias"]
        return out
    positions = w["embeddings.position_embeddings.weight"]
    if arch == "xlm-roberta":
        positions = positions[c["pad_token_id"] + 1 :]
    out["position_embd.weight"] = positions
    out["token_embd_norm.weight"] = w["embeddings.LayerNorm.weight"]
    out["token_embd_norm.bias"] = w["embeddings.LayerNorm.bias"]
    names = {
        "attention.self.query": "attn_q",
        "attention.self.key": "attn_k",
        "attention.self.value": "attn_v",
        "attention.output.dense": "attn_output",
        "attention.output.LayerNorm": "attn_output_norm",
        "intermediate.dense": "ffn_up",
        "output.dense": "ffn_down",
        "output.LayerNorm": "layer_output_norm",
    }
    for i in range(c["num_hidden_layers"]):
        for hf, gg in names.items():
            for kind in ("weight", "bias"):
                out[f"blk.{i}.{gg}.{kind}"] = w[f"encoder.layer.{i}.{hf}.{kind}"]
    return out


RERANKERS = {
    "bert": "BertForSequenceClassification",
    "xlm-roberta": "XLMRobertaForSequenceClassification",
}


def classifier_weights(arch: str, seed: int = 13) -> dict[str, np.ndarray]:
    """A one-label sequence-classification head with each family's Hugging Face names:
    RoBERTa's classifier.dense + classifier.out_proj, BERT's pooler (in weights()) +
    classifier."""
    h = CONFIGS[arch]["hidden_size"]
    rng = np.random.default_rng(seed)

    def mat(*shape: int, scale: float) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    if arch == "xlm-roberta":
        return {
            "classifier.dense.weight": mat(h, h, scale=0.2),
            "classifier.dense.bias": mat(h, scale=0.05),
            "classifier.out_proj.weight": mat(1, h, scale=0.5),
            "classifier.out_proj.bias": mat(1, scale=0.1),
        }
    return {"classifier.weight": mat(1, h, scale=0.5), "classifier.bias": mat(1, scale=0.1)}


def reranker_config(arch: str) -> dict:
    config = {**CONFIGS[arch], "architectures": [RERANKERS[arch]], "num_labels": 1}
    config["id2label"], config["label2id"] = {"0": "LABEL_0"}, {"LABEL_0": 0}
    if arch == "bert":
        config["sep_token_id"] = vocabulary(arch).index("[SEP]")
    return config


def write_reranker_dir(directory: Path, arch: str, seed: int = 11) -> None:
    """A cross-encoder reranker directory (name it "...reranker..."): `arch`'s encoder under
    its task model's prefix ("bert." / "roberta.") with a one-label classification head."""
    directory.mkdir(parents=True, exist_ok=True)
    prefix = "roberta." if arch == "xlm-roberta" else "bert."
    w = weights(arch, seed)
    if arch == "xlm-roberta":  # RoBERTa's head replaces the pooler
        del w["pooler.dense.weight"], w["pooler.dense.bias"]
    tensors = {prefix + k: v for k, v in w.items()} | classifier_weights(arch)
    write_safetensors(directory / "model.safetensors", tensors, dtype="F32")
    (directory / "config.json").write_text(json.dumps(reranker_config(arch), indent=1))
    write_tokenizer(directory, arch)


def write_reranker_gguf(path: Path, seed: int = 11) -> None:
    """The BERT reranker as llama.cpp's converter writes one: pooling_type rank, the pooler as
    ``cls``, the classifier as ``cls.output``."""
    head = classifier_weights("bert")
    w = weights("bert", seed)
    extra = {
        "cls.weight": w["pooler.dense.weight"],
        "cls.bias": w["pooler.dense.bias"],
        "cls.output.weight": head["classifier.weight"],
        "cls.output.bias": head["classifier.bias"],
    }
    write_encoder_gguf(path, "bert", seed, pooling="rank", extra=extra)


def write_encoder_gguf(
    path: Path,
    arch: str,
    seed: int = 11,
    pooling: str | None = None,
    extra: dict[str, np.ndarray] | None = None,
    quant: str = "F32",
    config: dict | None = None,
) -> None:
    """An F32 GGUF of the directory's weights, with a WordPiece vocabulary in llama.cpp's
    converted form ("▁" for word starts, no "##") and ``{arch}.pooling_type``; `extra`: more
    tensors; `quant` F16 or Q8_0 stores the layers' matrices so (as published files are)."""
    from gguf import GGMLQuantizationType, GGUFWriter, quantize

    c = config or CONFIGS[arch]
    g = GGUF_ARCH[arch]
    nomic = arch == "nomic_bert"
    w = GGUFWriter(str(path), g)
    h = c["n_embd"] if nomic else c["hidden_size"]
    w.add_block_count(c["n_layer"] if nomic else c["num_hidden_layers"])
    positions = c["n_positions"] if nomic else c["max_position_embeddings"]
    if arch == "xlm-roberta":
        positions -= c["pad_token_id"] + 1
    w.add_context_length(positions)
    w.add_embedding_length(h)
    w.add_feed_forward_length(c["n_inner"] if nomic else c["intermediate_size"])
    w.add_head_count(c["n_head"] if nomic else c["num_attention_heads"])
    w.add_layer_norm_eps(c["layer_norm_epsilon"] if nomic else c["layer_norm_eps"])
    w.add_causal_attention(False)
    w.add_uint32(f"{g}.pooling_type", GGUF_POOLING_TYPE[pooling or POOLING[arch][0]])
    if nomic:
        w.add_rope_freq_base(float(c["rotary_emb_base"]))
    tokens = []
    vocab = vocabulary(arch, c["vocab_size"])
    for t in vocab:
        if t.startswith("##"):
            tokens.append(t[2:])
        elif t.startswith("[") or t.startswith("<"):
            tokens.append(t)
        else:
            tokens.append("\u2581" + t)
    w.add_tokenizer_model("bert")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in SPECIALS or t in XLMR_SPECIALS else 1 for t in vocab])
    specials = XLMR_SPECIALS if arch == "xlm-roberta" else SPECIALS
    cls, sep, unk = (0, 2, 3) if arch == "xlm-roberta" else (2, 3, 1)
    w.add_bos_token_id(cls)  # llama.cpp's converter: [CLS] is the BOS token
    w.add_sep_token_id(sep)
    w.add_unk_token_id(unk)
    w.add_pad_token_id(specials.index("<pad>") if arch == "xlm-roberta" else 0)
    w.add_token_type_count(c["type_vocab_size"])
    for name, x in (gguf_tensors(arch, seed, config) | (extra or {})).items():
        x = np.ascontiguousarray(x, dtype=np.float32)
        if quant == "F32" or x.ndim != 2 or not name.startswith("blk."):
            w.add_tensor(name, x)
        elif quant == "F16":
            w.add_tensor(name, x.astype(np.float16))
        else:
            q8 = GGMLQuantizationType.Q8_0
            w.add_tensor(name, quantize(x, q8), raw_dtype=q8)
    close_gguf(w)
