"""What a successful run leaves behind: a self-describing bundle folder and its zip.

    runs/<id>/bundle/            adapter_model.safetensors + adapter_config.json (peft methods)
                                 or model.safetensors + config.json (full fine-tune),
                                 tokenizer files, spec.yaml, metrics.json, samples.json, README.md
    runs/<id>/<name>-adapter.zip the same files, zipped (<name>-model.zip for a full fine-tune)

Weights are written as safetensors only; nothing is ever pickled. The zip's sha256 and size are
recorded with `store.add_artifact(kind="bundle")`, the folder as kind="adapter" / "model".
"""

from __future__ import annotations

import json
import re
import zipfile
from pathlib import Path
from typing import Any

from jobs.data.digests import hash_file
from jobs.spec.enums import Method
from jobs.spec.job import JobSpec
from jobs.spec.tricks import checkpointing
from jobs.train.figures import FIGURES, format_figure
from storage.roles import RunArtifacts

PICKLE_SUFFIXES = {".bin", ".pt", ".pth", ".pkl", ".pickle"}


def sha256_of(path: Path) -> str:
    """Hex sha256 of a file (`jobs.data.digests.hash_file`)."""
    return hash_file(path).hex()


def safe_name(text: str) -> str:
    """A file-name-safe version of a run name."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-.") or "run"


def name_base_model(bundle: Path, base: str) -> None:
    """Point the adapter's `base_model_name_or_path` at a name plain peft can load (not a tunedeck name)."""
    config_path = bundle / "adapter_config.json"
    if config_path.is_file():
        config = json.loads(config_path.read_text())
        config["base_model_name_or_path"] = base
        config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def write_bundle(
    bundle: Path,
    spec: JobSpec,
    model: Any,
    tokenizer: Any,
    metrics: dict[str, float],
    output_dir: Path | None = None,
    extra_files: dict[str, str] | None = None,
    card_extra: str = "",
) -> Path:
    """Save weights (safetensors), tokenizer, spec, metrics and a model card into `bundle`.

    `output_dir`: the training output folder (PiSSA/OLoRA keep their initial adapter there).
    `extra_files`: more text files (name -> content), e.g. the before/after samples; `card_extra`: text
    appended to the card (their table)."""
    from jobs.models.registry import base_reference

    bundle.mkdir(parents=True, exist_ok=True)
    if spec.method is Method.FULL:
        model.save_pretrained(str(bundle), safe_serialization=True)
    else:
        from jobs.train.adapter_setup import save_adapter

        save_adapter(spec, model, bundle, output_dir)
        name_base_model(bundle, base_reference(spec.model))
    if tokenizer is not None:
        tokenizer.save_pretrained(str(bundle))
    (bundle / "spec.yaml").write_text(spec.to_yaml())
    (bundle / "metrics.json").write_text(json.dumps(metrics, indent=2, sort_keys=True))
    chat = bool(getattr(tokenizer, "chat_template", None))
    for name, text in (extra_files or {}).items():
        (bundle / name).write_text(text)
    vision = getattr(tokenizer, "image_processor", None) is not None  # a vision-language model's processor
    (bundle / "README.md").write_text(model_card(spec, metrics, chat, vision) + card_extra)
    pickled = [p.name for p in bundle.rglob("*") if p.suffix in PICKLE_SUFFIXES]
    if pickled:  # a library changed its defaults: refuse to ship pickles
        raise RuntimeError(f"bundle would contain pickled files {pickled}; only safetensors are allowed")
    return bundle


def zip_bundle(bundle: Path, dest: Path) -> Path:
    """Zip the bundle folder's files (flat, relative names) into `dest`."""
    tmp = dest.with_suffix(".zip.tmp")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for path in sorted(bundle.rglob("*")):
            if path.is_file():
                zf.write(path, path.relative_to(bundle).as_posix())
    tmp.replace(dest)
    return dest


def write_artifacts(
    store: RunArtifacts,
    run_id: int,
    spec: JobSpec,
    model: Any,
    tokenizer: Any,
    metrics: dict[str, float],
    extra_files: dict[str, str] | None = None,
    card_extra: str = "",
) -> Path:
    """Write the bundle and zip under the run's folder and record both in the store; returns the zip."""
    root = store.run_dir(run_id)
    bundle = write_bundle(
        root / "bundle",
        spec,
        model,
        tokenizer,
        metrics,
        output_dir=root / "output",
        extra_files=extra_files,
        card_extra=card_extra,
    )
    full = spec.method is Method.FULL
    archive = zip_bundle(bundle, root / f"{safe_name(spec.display_name)}-{'model' if full else 'adapter'}.zip")
    store.add_artifact(run_id, "bundle", str(archive), archive.stat().st_size, sha256_of(archive))
    weights = bundle / ("model.safetensors" if full else "adapter_model.safetensors")
    if weights.exists():
        size = sum(p.stat().st_size for p in bundle.rglob("*") if p.is_file())
        store.add_artifact(run_id, "model" if full else "adapter", str(bundle), size, sha256_of(weights))
    return archive


def bundle_of(store: RunArtifacts, run_id: int) -> str | None:
    """The path of the run's recorded bundle zip (what "download" means), or None: never an export."""
    found = [a.path for a in store.artifacts(run_id) if a.kind == "bundle"]
    return found[-1] if found else None


# ---------------------------------------------------------------------- model card
def _tricks(spec: JobSpec) -> list[str]:
    """Human names of the memory tricks the spec turned on."""
    out = [
        f"micro-batch {spec.per_device_train_batch_size} x {spec.gradient_accumulation_steps} accumulation "
        f"(effective batch {spec.effective_batch_size})",
        f"precision {spec.precision.value}",
        f"optimizer {spec.optim.value}",
        f"max_length {spec.max_length}",
    ]
    if (words := checkpointing.described(spec)) is not None:
        out.append(words)
    if spec.packing:
        out.append("packing")
    if spec.method is Method.QLORA:
        out.append("4-bit NF4 base with double quantization (QLoRA)")
    if spec.method is Method.LORA_8BIT:
        out.append("8-bit base (LLM.int8)")
    return out


LOAD_PROMPT = "Tell me about volcanoes."


def load_snippet(spec: JobSpec, chat: bool = True) -> str:
    """A Python snippet, run from the unzipped bundle folder, that loads the result with plain
    transformers (+ peft) and answers one prompt greedily; tests run it as written."""
    from jobs.models.registry import base_reference

    ask = (
        f'messages = [{{"role": "user", "content": "{LOAD_PROMPT}"}}]\n'
        'inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",\n'
        "                                       return_dict=True)\n"
        if chat
        else f'inputs = tokenizer("{LOAD_PROMPT}", return_tensors="pt")\n'
    ) + (
        "output = model.generate(**inputs, max_new_tokens=40, do_sample=False)\n"
        'print(tokenizer.decode(output[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True))\n'
    )
    if spec.method is Method.FULL:
        return (
            "Run this from the folder this file is in:\n\n```python\n"
            "from transformers import AutoModelForCausalLM, AutoTokenizer\n\n"
            'model = AutoModelForCausalLM.from_pretrained(".")\n'
            'tokenizer = AutoTokenizer.from_pretrained(".")\n' + ask + "```\n"
        )
    mora = spec.method is Method.MORA
    text = (
        "MoRA is not a peft method: run this with tunedeck's `jobs/config/mora.py` importable (it registers MoRA "
        "as a LoRA variant on peft's LoRA layers), "
        if mora
        else "Run this "
    ) + (
        "from the folder this file is in (`adapter_config.json` names the same base model):"
        "\n\n```python\n"
        + ("from jobs.config.mora import load_mora\n" if mora else "from peft import PeftModel\n")
        + "from transformers import AutoModelForCausalLM, AutoTokenizer\n\n"
        f'base = AutoModelForCausalLM.from_pretrained("{base_reference(spec.model)}")\n'
        + (
            'model = load_mora(base, ".")  # a PeftModel; merge_and_unload() works\n'
            if mora
            else 'model = PeftModel.from_pretrained(base, ".")\n'
        )
        + 'tokenizer = AutoTokenizer.from_pretrained(".")  # with the chat template the run trained on\n'
        + ask
        + "```\n"
    )
    if spec.method is Method.QLORA:
        text += "\nThe adapter was trained on a 4-bit base; it loads on a 16-bit base as well.\n"
    if spec.lora_init.value in {"pissa", "olora"}:
        text += (
            f"\nTrained with {spec.lora_init.value} initialisation (which changes the base weights); the adapter "
            "here was converted (rank 2r) so that it applies to the original base model.\n"
        )
    return text


def provenance_note(spec: JobSpec) -> str:
    """A built-in base model's note on how tunedeck's copy differs from the hub's, or nothing."""
    from jobs.models.registry import BUILTIN_MODELS

    builtin = BUILTIN_MODELS.get(spec.model)
    return (
        f"\n## About the base model\nNote: {builtin.provenance}\n" if builtin is not None and builtin.provenance else ""
    )


def model_card(spec: JobSpec, metrics: dict[str, float], chat: bool = True, vision: bool = False) -> str:
    """README.md for the bundle: base model, method, tricks, data, results, how to load it (`vision`: a
    vision-language model, loaded with its processor: `jobs.train.vision_card`)."""

    def fmt(v: float) -> str:
        return f"{int(v):,}" if float(v).is_integer() and abs(v) >= 100 else f"{v:.4g}"

    # The figures first, named and formatted as the dashboard shows them (jobs.train.figures), then the rest.
    keys = {f.key for f in FIGURES}
    results = "\n".join(
        [f"| {f.label} ({f.key}) | {format_figure(f, metrics[f.key])} |" for f in FIGURES if f.key in metrics]
        + [f"| {k} | {fmt(v)} |" for k, v in sorted(metrics.items()) if k not in keys]
    )
    tricks = "\n".join(f"- {t}" for t in _tricks(spec))
    method = spec.method.value
    if spec.method in {Method.LORA, Method.DORA, Method.QLORA, Method.LORA_8BIT}:
        method += f" (r={spec.lora_r}, alpha={spec.lora_alpha}, targets {spec.lora_target_modules})"
        if spec.lora_init.value != "default":
            method += f", {spec.lora_init.value} initialisation"
    from jobs.spec.enums import METHOD_DESCRIPTIONS
    from jobs.spec.field_info import applies_to

    if spec.method not in {Method.LORA, Method.DORA, Method.QLORA, Method.LORA_8BIT, Method.FULL}:
        knobs = [
            f"{name}={getattr(spec, name).value if hasattr(getattr(spec, name), 'value') else getattr(spec, name)}"
            for name in (
                "lora_r",
                "lora_alpha",
                "lora_target_modules",
                "mora_type",
                "adapter_len",
                "adapter_layers",
                "oft_block_size",
                "num_virtual_tokens",
            )
            if applies_to(name, spec.method)
        ]
        method += f" ({METHOD_DESCRIPTIONS[spec.method]}{'; ' if knobs else ''}{', '.join(knobs)})"
    if vision:
        from jobs.train.vision_card import vision_load_snippet

        load = vision_load_snippet(spec)
    else:
        load = load_snippet(spec, chat)
    data = spec.dataset + (f" (eval: {spec.eval_dataset})" if spec.eval_dataset else "")
    return (
        f"# {spec.display_name}\n\nFine-tuned with tunedeck ({spec.trainer.value.upper()}).\n\n"
        f"- Base model: `{spec.model}`\n- Method: {method}\n- Data: `{data}`\n"
        f"- Learning rate {spec.learning_rate:g}, {spec.lr_scheduler_type.value} schedule, "
        f"{'max_steps ' + str(spec.max_steps) if spec.max_steps > 0 else f'{spec.num_train_epochs:g} epoch(s)'}, "
        f"seed {spec.seed}\n\n## Memory tricks\n{tricks}\n\n## Results\n| metric | value |\n|---|---|\n"
        f"{results}\n\n## How to load\n{load}\nThe full job spec is in `spec.yaml`; re-run it with tunedeck.\n"
        f"{provenance_note(spec)}"
    )
