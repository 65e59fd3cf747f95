"""What the installed transformers knows about model configs, without importing it where that can be helped.

Importing transformers imports torch (~3-5 s), and a command that only reads a config.json (`tunedeck plan`)
needs from it just the model types it knows (`CONFIG_MAPPING`). That list is asked of transformers once per
installed version and kept in `$TUNEDECK_HOME/cache/transformers/`; `stamp` names an installed package
(version, where it lives and when it was installed) without importing it, so a cache keyed by it is dropped when
the package changes.

    knows_model_type("qwen2")      # True: read from transformers' generated table, or asked of transformers
    known_model_types()            # frozenset({"llama", "qwen2", ...})
    stamp("transformers")          # "5.24.0 /.../site-packages/transformers 1764...": part of cache keys
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import importlib.util
import json
import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)


@functools.cache
def stamp(package: str) -> str:
    """The installed `package` (version, folder, mtime of its __init__.py), read without importing it."""
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        return f"{package} missing"
    return f"{importlib.metadata.version(package)} {Path(spec.origin).parent} {os.stat(spec.origin).st_mtime_ns}"


def transformers_version() -> str:
    return importlib.metadata.version("transformers")


def knows_model_type(model_type: str) -> bool:
    """Whether the installed transformers has a config class for `model_type`. Its generated table of model
    types (`models/auto/auto_mappings.py`, a data module that imports only `collections`) is read first without
    importing transformers; a type missing there is looked up in CONFIG_MAPPING itself (`known_model_types`),
    which only ever adds to that table."""
    return model_type in _generated_model_types() or model_type in known_model_types()


@functools.cache
def _generated_model_types() -> frozenset[str]:
    """The keys of transformers' generated CONFIG_MAPPING_NAMES, read from its file; empty when this install
    has no such file (an older or newer layout: `known_model_types` answers then)."""
    spec = importlib.util.find_spec("transformers")
    if spec is None or spec.origin is None:
        return frozenset()
    path = Path(spec.origin).parent / "models" / "auto" / "auto_mappings.py"
    loaded = importlib.util.spec_from_file_location("_tunedeck_transformers_auto_mappings", path)
    if not path.is_file() or loaded is None or loaded.loader is None:
        return frozenset()
    module = importlib.util.module_from_spec(loaded)
    try:
        loaded.loader.exec_module(module)
        return frozenset(module.CONFIG_MAPPING_NAMES)
    except (ImportError, AttributeError, SyntaxError, TypeError):  # the file is not the table it was
        log.warning("transformers' %s is not the table of model types it was: asking transformers", path)
        return frozenset()


def known_model_types(cache: Path | None = None) -> frozenset[str]:
    """The `model_type`s the installed transformers has a config class for (its CONFIG_MAPPING)."""
    folder = cache if cache is not None else _cache_dir()
    path = folder / f"model-types-{hashlib.sha256(stamp('transformers').encode()).hexdigest()[:16]}.json"
    if path not in _KNOWN:
        _KNOWN[path] = _read(path) or _ask_transformers(path)
    return _KNOWN[path]


_KNOWN: dict[Path, frozenset[str]] = {}


def _read(path: Path) -> frozenset[str] | None:
    try:
        return frozenset(json.loads(path.read_text()))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError):
        log.warning("unreadable %s: asking transformers again", path, exc_info=True)
        return None


def _ask_transformers(path: Path) -> frozenset[str]:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    types = frozenset(CONFIG_MAPPING.keys())
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    partial.write_text(json.dumps(sorted(types)))
    partial.replace(path)  # whole or not at all: another process may read it at the same time
    return types


def _cache_dir() -> Path:
    from storage.settings import data_dir

    return data_dir() / "cache" / "transformers"
