"""sentence-transformers ``Dense`` modules: the projections some embedding models apply to the
pooled vector before normalising it (EmbeddingGemma's 768 -> 3072 -> 768, many fine-tuned
BERTs' tanh projection). The engine pools; this applies ``activation(W @ v + b)`` for each Dense
module in ``modules.json`` order, then the Normalize module's L2 normalisation when the model
has one.

A Dense module's directory holds ``config.json`` (in_features, out_features, bias,
activation_function) and ``model.safetensors`` (``linear.weight`` [out, in], ``linear.bias``).
The pull refuses what this cannot run (model_kind.py, ``dense_problem``): another activation,
or weights only in a pickle (``pytorch_model.bin``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# sentence-transformers' activation_function values (the torch class's import path).
ACTIVATIONS = {
    "torch.nn.modules.linear.Identity": lambda x: x,
    "torch.nn.modules.activation.Tanh": np.tanh,
}


def dense_paths(directory: Path) -> list[str]:
    """The directories of the Dense modules that modules.json names, in order."""
    try:
        modules = json.loads((directory / "modules.json").read_text())
    except (OSError, ValueError):
        return []
    if not isinstance(modules, list):
        return []
    return [
        str(m.get("path", ""))
        for m in modules
        if isinstance(m, dict) and str(m.get("type", "")).endswith("Dense")
    ]


def dense_problem(directory: Path, path: str) -> str | None:
    """Why the Dense module at `path` cannot run (None when it can)."""
    try:
        config = json.loads((directory / path / "config.json").read_text())
    except (OSError, ValueError):
        return f"its Dense module {path} has no readable config.json"
    activation = str(config.get("activation_function", "torch.nn.modules.activation.Tanh"))
    if activation not in ACTIVATIONS:
        return f"its Dense module {path} uses activation {activation}, which llmd does not run yet"
    if not (directory / path / "model.safetensors").is_file():
        return f"its Dense module {path} has no model.safetensors (pickled weights are not loaded)"
    return None


@dataclass
class _Dense:
    weight: np.ndarray  # [out, in] float32
    bias: np.ndarray | None
    activation: str

    def __call__(self, v: np.ndarray) -> np.ndarray:
        y = self.weight @ v
        if self.bias is not None:
            y = y + self.bias
        return ACTIVATIONS[self.activation](y)


class DenseHead:
    """The model's Dense modules, loaded once by the worker."""

    def __init__(self, layers: list[_Dense]) -> None:
        self.layers = layers

    @classmethod
    def load(cls, directory: Path, width: int) -> DenseHead | None:
        """The head of a Hugging Face directory, None when it has no Dense module. Raises
        ValueError when one cannot run or does not fit the `width` of the pooled vector."""
        if not directory.is_dir():
            return None
        layers = []
        for path in dense_paths(directory):
            if problem := dense_problem(directory, path):
                raise ValueError(problem)
            config = json.loads((directory / path / "config.json").read_text())
            tensors = _load_safetensors(directory / path / "model.safetensors")
            weight = tensors["linear.weight"].astype(np.float32)
            if weight.shape[1] != width:
                raise ValueError(
                    f"Dense module {path} takes {weight.shape[1]} values, but the pooled vector "
                    f"has {width}"
                )
            bias = tensors.get("linear.bias") if config.get("bias", True) else None
            activation = str(config.get("activation_function", "torch.nn.modules.activation.Tanh"))
            layers.append(
                _Dense(weight, None if bias is None else bias.astype(np.float32), activation)
            )
            width = weight.shape[0]
        return cls(layers) if layers else None

    def apply(self, values: list[float], normalize: bool) -> list[float]:
        v = np.asarray(values, dtype=np.float32)
        for layer in self.layers:
            v = layer(v)
        if normalize:
            norm = float(np.linalg.norm(v))
            v = v / max(norm, 1e-12)  # as torch.nn.functional.normalize
        return [float(x) for x in v]


def _load_safetensors(path: Path) -> dict[str, np.ndarray]:
    """A safetensors file's tensors as float32 numpy arrays, read through MLX (which the worker
    already has: it reads bfloat16, which numpy cannot)."""
    import mlx.core as mx

    return {k: np.array(v.astype(mx.float32)) for k, v in mx.load(str(path)).items()}
