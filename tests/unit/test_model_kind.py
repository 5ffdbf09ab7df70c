"""A model's kind (generate, embed, rerank) as llmd decides it at pull time from the model's
own files (model_kind.py), and the refusals of what it cannot serve yet."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmd.store.model_kind import (
    GENERATE,
    KindError,
    ModelKind,
    bidirectional_config,
    check_architecture,
    kind_of_gguf,
    kind_of_hf_dir,
)


def _st_dir(tmp_path: Path, mode: str, *, normalize: bool, dense: bool = False) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    modules = [
        {"idx": 0, "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    if dense:
        modules.append({"idx": 2, "path": "2_Dense", "type": "sentence_transformers.models.Dense"})
    if normalize:
        modules.append(
            {"idx": 3, "path": "3_Normalize", "type": "sentence_transformers.models.Normalize"}
        )
    (tmp_path / "modules.json").write_text(json.dumps(modules))
    (tmp_path / "1_Pooling").mkdir(parents=True)
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps({mode: True}))
    return tmp_path


def test_sentence_transformers_files_make_an_embedding_model(tmp_path: Path) -> None:
    last = _st_dir(tmp_path, "pooling_mode_lasttoken", normalize=True)
    kind = kind_of_hf_dir(last, "Qwen3-Embedding-0.6B")
    assert kind == ModelKind("embed", "last", True)
    assert kind.describe() == "embed (last-token pooling, normalized)"


def test_mean_pooling_without_normalize(tmp_path: Path) -> None:
    kind = kind_of_hf_dir(_st_dir(tmp_path, "pooling_mode_mean_tokens", normalize=False), "m")
    assert kind == ModelKind("embed", "mean", False)


def test_what_cannot_be_pooled_is_refused(tmp_path: Path) -> None:
    with pytest.raises(KindError, match="max pooling is not supported yet"):
        kind_of_hf_dir(_st_dir(tmp_path / "max", "pooling_mode_max_tokens", normalize=True), "m")
    cls = kind_of_hf_dir(_st_dir(tmp_path / "cls", "pooling_mode_cls_token", normalize=True), "m")
    assert cls == ModelKind("embed", "cls", True)
    assert cls.describe() == "embed (CLS-token pooling, normalized)"
    assert check_architecture(cls, "bert", "m") == cls
    with pytest.raises(KindError, match="CLS pooling needs an encoder"):
        check_architecture(cls, "qwen3", "m")


def _dense(directory: Path, activation: str, weights: bool = True) -> None:
    (directory / "2_Dense").mkdir()
    config = {"in_features": 4, "out_features": 2, "bias": True, "activation_function": activation}
    (directory / "2_Dense" / "config.json").write_text(json.dumps(config))
    if weights:
        (directory / "2_Dense" / "model.safetensors").write_bytes(b"")


def test_dense_modules_are_served_unless_they_cannot_run(tmp_path: Path) -> None:
    ok = _st_dir(tmp_path / "ok", "pooling_mode_mean_tokens", normalize=True, dense=True)
    _dense(ok, "torch.nn.modules.activation.Tanh")
    assert kind_of_hf_dir(ok, "m") == ModelKind("embed", "mean", True)
    gelu = _st_dir(tmp_path / "gelu", "pooling_mode_mean_tokens", normalize=True, dense=True)
    _dense(gelu, "torch.nn.modules.activation.GELU")
    with pytest.raises(KindError, match="activation torch.nn.modules.activation.GELU"):
        kind_of_hf_dir(gelu, "m")
    pickled = _st_dir(tmp_path / "bin", "pooling_mode_mean_tokens", normalize=True, dense=True)
    _dense(pickled, "torch.nn.modules.linear.Identity", weights=False)
    with pytest.raises(KindError, match="no model.safetensors"):
        kind_of_hf_dir(pickled, "m")


def test_matryoshka_is_read_from_the_model_card(tmp_path: Path) -> None:
    plain = _st_dir(tmp_path / "plain", "pooling_mode_mean_tokens", normalize=True)
    assert not kind_of_hf_dir(plain, "m").matryoshka
    (plain / "README.md").write_text("# bge\nA general embedding model.\n")
    assert not kind_of_hf_dir(plain, "m").matryoshka
    mrl = _st_dir(tmp_path / "mrl", "pooling_mode_mean_tokens", normalize=True)
    (mrl / "README.md").write_text("Trained with Matryoshka Representation Learning.")
    kind = kind_of_hf_dir(mrl, "m")
    assert kind.matryoshka and kind.describe() == "embed (mean pooling, normalized, Matryoshka)"


def test_encoders_only_embed() -> None:
    with pytest.raises(KindError, match="encoder, which embeds or reranks but never generates"):
        check_architecture(GENERATE, "nomic-bert", "m")
    with pytest.raises(KindError, match="this one has no classifier"):
        check_architecture(ModelKind("rerank"), "bert", "m")


def test_cross_encoders_are_rerankers_with_a_classifier(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(
        json.dumps({"architectures": ["XLMRobertaForSequenceClassification"]})
    )
    kind = kind_of_hf_dir(tmp_path, "bge-reranker-v2-m3")
    assert kind == ModelKind("rerank", "cls") and kind.describe() == "rerank (cross-encoder)"
    assert check_architecture(kind, "xlm-roberta", "m") == kind
    with pytest.raises(KindError, match="sequence-classification rerankers of architecture qwen3"):
        check_architecture(kind, "qwen3", "m")

    def rank(key, default=None):  # type: ignore[no-untyped-def]
        return 4 if key.endswith(".pooling_type") else default

    assert kind_of_gguf(rank, "bert", "f.gguf") == ModelKind("rerank", "cls")

    # llama.cpp's converter writes no pooling_type for XLMRobertaForSequenceClassification
    # (bge-reranker-v2-m3): the classifier head alone makes an encoder a cross-encoder...
    def none(key, default=None):  # type: ignore[no-untyped-def]
        return default

    assert kind_of_gguf(none, "bert", "f.gguf", classifier=True) == ModelKind("rerank", "cls")
    assert kind_of_gguf(none, "bert", "f.gguf") == GENERATE  # refused later: encoders embed
    # ... not a decoder's (its rerank files say pooling_type rank, refused above)
    assert kind_of_gguf(none, "qwen3", "f.gguf", classifier=True) == GENERATE


def test_a_plain_decoder_generates_and_a_reranker_is_known_by_its_name(tmp_path: Path) -> None:
    assert kind_of_hf_dir(tmp_path, "SmolLM2-135M-Instruct") == GENERATE
    assert kind_of_hf_dir(tmp_path, "Qwen/Qwen3-Reranker-0.6B").kind == "rerank"
    assert kind_of_hf_dir(tmp_path, "my-model", requested="rerank").kind == "rerank"


def test_gguf_pooling_type() -> None:
    def meta(pooling: int | None):  # type: ignore[no-untyped-def]
        return lambda key, default=None: pooling if key == "qwen3.pooling_type" else default

    assert kind_of_gguf(meta(None), "qwen3", "f.gguf") == GENERATE
    assert kind_of_gguf(meta(3), "qwen3", "f.gguf") == ModelKind("embed", "last", True)
    assert kind_of_gguf(meta(1), "qwen3", "f.gguf") == ModelKind("embed", "mean", True)
    cls = kind_of_gguf(meta(2), "qwen3", "f.gguf")
    with pytest.raises(KindError, match="CLS pooling needs an encoder"):
        check_architecture(cls, "qwen3", "f.gguf")
    with pytest.raises(KindError, match="reranking GGUF files .* of decoders"):
        kind_of_gguf(meta(4), "qwen3", "f.gguf")


def test_embedding_models_of_other_architectures_are_refused() -> None:
    embed = ModelKind("embed", "mean", True)
    assert check_architecture(embed, "qwen3", "m") == embed
    assert check_architecture(GENERATE, "gemma3_text", "m") == GENERATE
    with pytest.raises(KindError, match="architecture gemma3_text are not supported yet"):
        check_architecture(embed, "gemma3_text", "m")


def test_a_bidirectional_gemma3_only_embeds(tmp_path: Path) -> None:
    """EmbeddingGemma (a gemma3_text config with use_bidirectional_attention) embeds with the
    pooling its sentence-transformers files name; without them, or asked to generate or
    rerank, it is refused at pull, since it cannot produce text."""
    from tests.native.tiny_embedding_models import write_embeddinggemma_dir

    write_embeddinggemma_dir(tmp_path / "eg")
    assert bidirectional_config(tmp_path / "eg")
    kind = kind_of_hf_dir(tmp_path / "eg", "eg")
    assert kind == ModelKind("embed", "mean", True, matryoshka=True)
    assert check_architecture(kind, "gemma3_text", "m", bidirectional=True) == kind
    assert kind.describe() == "embed (mean pooling, normalized, Matryoshka)"
    for other in (GENERATE, ModelKind("rerank")):
        with pytest.raises(KindError, match="bidirectional attention.*never generates"):
            check_architecture(other, "gemma3_text", "m", bidirectional=True)
    (tmp_path / "eg" / "modules.json").unlink()  # no sentence-transformers files: generate
    kind = kind_of_hf_dir(tmp_path / "eg", "eg")
    with pytest.raises(KindError, match="needs a sentence-transformers Pooling module"):
        check_architecture(kind, "gemma3_text", "m", bidirectional=True)
    assert not bidirectional_config(tmp_path)  # no config.json at all


def test_a_pull_may_say_the_kind_of_a_directory_but_not_of_a_gguf(
    llmd_home: Path, tmp_path: Path
) -> None:
    from llmd.paths import get_paths
    from llmd.store.manifests import StoreError
    from llmd.store.model_store import ModelStore
    from tests.native.tiny_embedding_models import write_reranker_dir
    from tests.native.tiny_models import write_loadable_gguf

    write_reranker_dir(tmp_path / "plain-qwen3")  # nothing in its name or files says rerank
    store = ModelStore(get_paths())
    assert store.pull(str(tmp_path / "plain-qwen3"), "plain").kind == "generate"
    assert store.pull(str(tmp_path / "plain-qwen3"), "scorer", kind="rerank").kind == "rerank"
    assert store.get("scorer").kind == "rerank"  # stored in the manifest
    gguf = write_loadable_gguf(tmp_path / "model.gguf")
    with pytest.raises(StoreError, match="Hugging Face directories only"):
        store.pull(str(gguf), "g", kind="embed")
