"""Each model config's `Arch`, kept on disk: a later process reads it instead of building the model again.

`jobs.memory.parts.arch_from_config` builds the model on torch's meta device and reads its shapes: exact, but it
imports torch and transformers (~3-5 s, most of a `tunedeck plan`) for a value that depends only on the
config.json, the installed transformers and torch, and the code that reads the shapes. Those four make the key:
the config as canonical JSON, `jobs.models.library.stamp` of both packages, and the source of
`jobs/memory/parts.py` and `jobs/memory/shape.py`. Any of them changing is a new key, so the Arch is built
again; nothing is ever taken from a stale entry. Files live in `$TUNEDECK_HOME/cache/arch/<key>.json`.

An Arch read back holds the config.json dict as its shape's `config` (the methods peft counts itself build
the transformers config from it, `jobs.memory.params.counted_by_peft`).

    arch = read_arch(config_text)       # the kept Arch, or None: not kept yet
    keep_arch(config_text, arch)        # after building it (jobs.memory.model_config)
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

from jobs.memory.parts import Arch, LayerLinear
from jobs.memory.shape import Linear, ModelShape
from jobs.models.moe_layout import MoeLayout

log = logging.getLogger(__name__)

_HERE = Path(__file__).resolve().parent


def read_arch(config_text: str, cache: Path | None = None) -> Arch | None:
    """The kept Arch of the config in `config_text` (canonical JSON), or None: not kept yet (or unreadable,
    logged), so the caller builds it and `keep_arch`s it."""
    path = _path(config_text, cache)
    if not path.is_file():
        return None
    try:
        return arch_from_json(json.loads(path.read_text()), json.loads(config_text))
    except (OSError, ValueError, KeyError, TypeError):
        log.warning("unreadable architecture cache %s: building it again", path, exc_info=True)
        return None


def keep_arch(config_text: str, arch: Arch, cache: Path | None = None) -> None:
    """Keep `arch` for the config in `config_text`; whole or not at all (another process may read it now)."""
    path = _path(config_text, cache)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    partial.write_text(json.dumps(arch_to_json(arch)))
    partial.replace(path)


def _path(config_text: str, cache: Path | None) -> Path:
    return (cache if cache is not None else _cache_dir()) / f"{cache_key(config_text)}.json"


def cache_key(config_text: str) -> str:
    """What an Arch depends on: the config, the libraries that build the model, the code that reads it."""
    from jobs.models.library import stamp

    digest = hashlib.sha256(config_text.encode())
    for part in (stamp("transformers"), stamp("torch"), _code()):
        digest.update(b"\0" + part.encode())
    return digest.hexdigest()[:32]


@functools.cache
def _code() -> str:
    files = ("parts.py", "shape.py", "../models/moe_layout.py")
    return "".join(hashlib.sha256((_HERE / name).read_bytes()).hexdigest() for name in files)


def arch_to_json(arch: Arch) -> dict[str, Any]:
    data = asdict(arch)  # nested dataclasses become dicts, tuples stay lists in JSON
    data["shape"].pop("config", None)  # a transformers object: the config.json it came from is the key
    data["shape"].pop("picked", None)
    return data


def arch_from_json(data: dict[str, Any], config: dict[str, Any]) -> Arch:
    shape = dict(data["shape"])
    shape["linears"] = tuple(Linear(**lin) for lin in shape["linears"])
    shape["unmodelled"] = tuple(shape.get("unmodelled", ()))
    moe = shape.get("moe")
    moe_fields: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in (moe or {}).items()}
    shape["moe"] = MoeLayout(**moe_fields) if moe else None
    fields = dict(data)
    fields["param_shapes"] = tuple(tuple(s) for s in data["param_shapes"])
    fields["block_linears"] = tuple(LayerLinear(**lin) for lin in data["block_linears"])
    fields["dropouts"] = tuple(data.get("dropouts", (0.0, 0.0, 0.0)))
    fields["shape"] = ModelShape(**shape, config=config)
    return Arch(**fields)


def _cache_dir() -> Path:
    from storage.settings import data_dir

    return data_dir() / "cache" / "arch"
