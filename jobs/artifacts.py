"""What a successful run leaves behind: a self-describing bundle folder and its zip.

    runs/<id>/bundle/            adapter_model.safetensors + adapter_config.json (peft methods)
                                 or model.safetensors + config.json (full fine-tune),
                                 tokenizer files, spec.yaml, metrics.json, README.md
    runs/<id>/<name>-adapter.zip the same files, zipped (<name>-model.zip for a full fine-tune)

Weights are written as safetensors only; nothing is ever pickled. The zip's sha256 and size are
recorded with `store.add_artifact(kind="bundle")`, the folder as kind="adapter" / "model".
"""

from __future__ import annotations

import hashlib
import json
import re
import zipfile
from pathlib import Path
from typing import Any

from jobs.spec import JobSpec, Method

PICKLE_SUFFIXES = {".bin", ".pt", ".pth", ".pkl", ".pickle"}


def sha256_of(path: Path) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def safe_name(text: str) -> str:
    """A file-name-safe version of a run name."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-.") or "run"


def write_bundle(bundle: Path, spec: JobSpec, model: Any, tokenizer: Any, metrics: dict[str, float],
                 output_dir: Path | None = None) -> Path:
    """Save weights (safetensors), tokenizer, spec, metrics and a model card into `bundle`.

    `output_dir`: the training output folder (PiSSA/OLoRA keep their initial adapter there)."""
    bundle.mkdir(parents=True, exist_ok=True)
    if spec.method is Method.FULL:
        model.save_pretrained(str(bundle), safe_serialization=True)
    else:
        from jobs.adapter_setup import save_adapter

        save_adapter(spec, model, bundle, output_dir)
    if tokenizer is not None:
        tokenizer.save_pretrained(str(bundle))
    (bundle / "spec.yaml").write_text(spec.to_yaml())
    (bundle / "metrics.json").write_text(json.dumps(metrics, indent=2, sort_keys=True))
    (bundle / "README.md").write_text(model_card(spec, metrics))
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


def write_artifacts(store: Any, run_id: int, spec: JobSpec, model: Any, tokenizer: Any,
                    metrics: dict[str, float]) -> Path:
    """Write the bundle and zip under run_dir(run_id) and record both in the store; returns the zip."""
    from storage.settings import run_dir

    root = run_dir(run_id)
    bundle = write_bundle(root / "bundle", spec, model, tokenizer, metrics, output_dir=root / "output")
    full = spec.method is Method.FULL
    archive = zip_bundle(bundle, root / f"{safe_name(spec.display_name)}-{'model' if full else 'adapter'}.zip")
    store.add_artifact(run_id, "bundle", str(archive), archive.stat().st_size, sha256_of(archive))
    weights = bundle / ("model.safetensors" if full else "adapter_model.safetensors")
    if weights.exists():
        size = sum(p.stat().st_size for p in bundle.rglob("*") if p.is_file())
        store.add_artifact(run_id, "model" if full else "adapter", str(bundle), size, sha256_of(weights))
    return archive


# ---------------------------------------------------------------------- model card
def _tricks(spec: JobSpec) -> list[str]:
    """Human names of the memory tricks the spec turned on."""
    out = [f"micro-batch {spec.per_device_train_batch_size} x {spec.gradient_accumulation_steps} accumulation "
           f"(effective batch {spec.effective_batch_size})", f"precision {spec.precision.value}",
           f"optimizer {spec.optim.value}", f"max_length {spec.max_length}"]
    if spec.gradient_checkpointing:
        out.append("gradient checkpointing")
    if spec.packing:
        out.append("packing")
    if spec.method is Method.QLORA:
        out.append("4-bit NF4 base with double quantization (QLoRA)")
    if spec.method is Method.LORA_8BIT:
        out.append("8-bit base (LLM.int8)")
    return out


def model_card(spec: JobSpec, metrics: dict[str, float]) -> str:
    """README.md for the bundle: base model, method, tricks, data, results, how to load it."""
    def fmt(v: float) -> str:
        return f"{int(v):,}" if float(v).is_integer() and abs(v) >= 100 else f"{v:.4g}"

    results = "\n".join(f"| {k} | {fmt(v)} |" for k, v in sorted(metrics.items()))
    tricks = "\n".join(f"- {t}" for t in _tricks(spec))
    method = spec.method.value
    if spec.method in {Method.LORA, Method.DORA, Method.QLORA, Method.LORA_8BIT}:
        method += f" (r={spec.lora_r}, alpha={spec.lora_alpha}, targets {spec.lora_target_modules})"
        if spec.lora_init.value != "default":
            method += f", {spec.lora_init.value} initialisation"
    from jobs.spec import METHOD_DESCRIPTIONS, applies_to

    if spec.method not in {Method.LORA, Method.DORA, Method.QLORA, Method.LORA_8BIT, Method.FULL}:
        knobs = [f"{name}={getattr(spec, name).value if hasattr(getattr(spec, name), 'value') else getattr(spec, name)}"
                 for name in ("lora_r", "lora_alpha", "lora_target_modules", "mora_type", "adapter_len",
                              "adapter_layers", "oft_block_size", "num_virtual_tokens") if applies_to(name, spec.method)]
        method += f" ({METHOD_DESCRIPTIONS[spec.method]}{'; ' if knobs else ''}{', '.join(knobs)})"
    if spec.method is Method.FULL:
        load = (f"```python\nfrom transformers import AutoModelForCausalLM, AutoTokenizer\n\n"
                f"model = AutoModelForCausalLM.from_pretrained(\"path/to/this/folder\")\n"
                f"tokenizer = AutoTokenizer.from_pretrained(\"path/to/this/folder\")\n```\n")
    else:
        load = (f"```python\nfrom peft import PeftModel\nfrom transformers import AutoModelForCausalLM, AutoTokenizer\n\n"
                f"base = AutoModelForCausalLM.from_pretrained(\"{spec.model}\")  # the base model (tunedeck name or path)\n"
                f"model = PeftModel.from_pretrained(base, \"path/to/this/folder\")\n"
                f"tokenizer = AutoTokenizer.from_pretrained(\"path/to/this/folder\")\n```\n")
        if spec.method is Method.QLORA:
            load += "\nThe adapter was trained on a 4-bit base; it loads on a 16-bit base as well.\n"
        if spec.method is Method.MORA:
            load = (f"MoRA is not a peft method: load it with tunedeck's `jobs/mora.py` importable (it registers "
                    f"MoRA as a LoRA variant on peft's LoRA layers).\n\n```python\nfrom jobs.mora import load_mora\n"
                    f"from transformers import AutoModelForCausalLM, AutoTokenizer\n\n"
                    f"base = AutoModelForCausalLM.from_pretrained(\"{spec.model}\")  # the base model (tunedeck name or path)\n"
                    f"model = load_mora(base, \"path/to/this/folder\")  # PeftModel; merge_and_unload() works\n"
                    f"tokenizer = AutoTokenizer.from_pretrained(\"path/to/this/folder\")\n```\n")
        if spec.lora_init.value in {"pissa", "olora"}:
            load += (f"\nTrained with {spec.lora_init.value} initialisation (which changes the base weights); the adapter "
                     f"here was converted (rank 2r) so that it applies to the original base model.\n")
    data = spec.dataset + (f" (eval: {spec.eval_dataset})" if spec.eval_dataset else "")
    return (f"# {spec.display_name}\n\nFine-tuned with tunedeck ({spec.trainer.value.upper()}).\n\n"
            f"- Base model: `{spec.model}`\n- Method: {method}\n- Data: `{data}`\n"
            f"- Learning rate {spec.learning_rate:g}, {spec.lr_scheduler_type.value} schedule, "
            f"{'max_steps ' + str(spec.max_steps) if spec.max_steps > 0 else f'{spec.num_train_epochs:g} epoch(s)'}, "
            f"seed {spec.seed}\n\n## Memory tricks\n{tricks}\n\n## Results\n| metric | value |\n|---|---|\n"
            f"{results}\n\n## How to load\n{load}\nThe full job spec is in `spec.yaml`; re-run it with tunedeck.\n")
