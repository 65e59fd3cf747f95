"""Take a finished run away as one model: the adapter merged into a 16-bit (or fp32) base, checked.

    tunedeck export RUN_ID --merged [--dtype bf16|fp16|fp32]
    result = export_merged(store, run_id, "bf16")      # MergedExport: folder, zip, checks

What it does, in order, logging each step (a merge of a large model takes minutes, so there is
no fixed timeout; progress goes to the log):
1. loads the run's base model unquantized in the chosen dtype (a QLoRA or 8-bit run's adapter
   was trained against a quantized base: merged into the 16-bit base its answers can differ a
   little, which the check measures and the card says);
2. loads the run's adapter from its bundle with peft and answers the check prompts greedily;
3. merges (`merge_and_unload`; methods that add virtual tokens instead of changing weights, such
   as prompt, prefix and P-tuning, cannot merge and are refused with the reason);
4. answers the same prompts with the merged model: the greedy answers must be equal (QLoRA and
   8-bit runs: at least `QUANTIZED_TOKEN_AGREEMENT` of the answer tokens agree), and the largest
   logit difference on the prompts is recorded; a vision-language run is also asked about one drawn
   image (`jobs.export.vision`);
5. saves safetensors, tokenizer (a vision-language run: its processor), generation config and a model card to
   `runs/<id>/export/merged-<dtype>/`, zips it to `runs/<id>/<name>-merged-<dtype>.zip` (the one
   file of it the dashboard serves), records both with their sha256.
"""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from jobs.errors import Problem
from jobs.spec.enums import Method
from jobs.spec.job import JobSpec, SpecError
from jobs.train.artifacts import safe_name, sha256_of, zip_bundle
from jobs.train.before_after import BUILT_IN_PROMPTS, greedy
from storage.roles import ArtifactReader, RunArtifacts, RunReader

log = logging.getLogger("jobs.export.merged")

DTYPES = ("bf16", "fp16", "fp32")
CHECK_PROMPTS = BUILT_IN_PROMPTS
QUANTIZED_METHODS = {Method.QLORA, Method.LORA_8BIT}
QUANTIZED_TOKEN_AGREEMENT = 0.8
CHECK_NEW_TOKENS = 32


@dataclass
class MergeCheck:
    """Merged vs unmerged on the check prompts."""

    prompts: list[str]
    unmerged: list[str]
    merged: list[str]
    token_agreement: float  # share of answer token positions that agree, over all prompts
    max_logit_diff: float  # largest |logit| difference over the prompts' positions
    passed: bool
    rule: str

    @property
    def equal(self) -> bool:
        return self.unmerged == self.merged


@dataclass
class MergedExport:
    folder: Path
    archive: Path
    sha256: str
    dtype: str
    check: MergeCheck
    notes: list[str] = field(default_factory=list)


class ExportError(SpecError):
    """A run that cannot be exported this way, with the reason and the fix."""


def _refuse(problem: str, fix: str, field_name: str = "run") -> ExportError:
    return ExportError([Problem(field_name, problem, fix)])


def finished_spec(store: RunReader, run_id: int) -> JobSpec:
    """The spec of a run that succeeded; refuses missing and unfinished runs."""
    from jobs.spec.stored import finished_problem

    run = store.get_run(run_id)
    problem = finished_problem(run, run_id, "export")
    if problem is not None:
        raise _refuse(*problem)
    assert run is not None  # finished_problem refuses a missing run
    return JobSpec.from_json(run.spec_json)


def adapter_folder(store: ArtifactReader, run_id: int) -> tuple[JobSpec, Path]:
    """The run's spec and its saved adapter folder; refuses runs that have none to merge."""
    from jobs.spec.stored import result_folder

    spec = finished_spec(store, run_id)
    if spec.method is Method.FULL:
        raise _refuse(
            f"run {run_id} is a full fine-tune: its bundle is already a whole model, nothing to merge",
            "download the run's bundle; it loads with AutoModelForCausalLM.from_pretrained",
        )
    folder = result_folder(store, run_id, "adapter", "adapter_config.json")
    if folder is None:
        raise _refuse(f"run {run_id} has no saved adapter folder", "train it again; its bundle was not written")
    return spec, folder


def token_agreement(ids_a: list[list[int]], ids_b: list[list[int]]) -> float:
    """Share of answer token positions (over all answers, the longer one counting) that hold the same token."""
    agree = total = 0
    for a, b in zip(ids_a, ids_b):
        total += max(len(a), len(b))
        agree += sum(1 for x, y in zip(a, b) if x == y)
    return agree / total if total else 1.0


def compare(
    unmerged: tuple[list[list[int]], list[Any]],
    merged: tuple[list[list[int]], list[Any]],
    tokenizer: Any,
    quantized: bool,
    prompts: list[str] | None = None,
) -> MergeCheck:
    """The check's verdict: equal answers, or (quantized bases) enough agreeing tokens."""
    (ids_a, logits_a), (ids_b, logits_b) = unmerged, merged
    agreement = token_agreement(ids_a, ids_b)
    diff = max(float((x - y).abs().max()) for x, y in zip(logits_a, logits_b))
    texts_a = [tokenizer.decode(a, skip_special_tokens=True).strip() for a in ids_a]
    texts_b = [tokenizer.decode(b, skip_special_tokens=True).strip() for b in ids_b]
    if quantized:
        rule = f"token agreement >= {QUANTIZED_TOKEN_AGREEMENT:.0%} (adapter trained on a quantized base)"
        passed = agreement >= QUANTIZED_TOKEN_AGREEMENT
    else:
        rule = "greedy answers equal"
        passed = texts_a == texts_b
    return MergeCheck(prompts or list(CHECK_PROMPTS), texts_a, texts_b, agreement, diff, passed, rule)


def export_merged(store: RunArtifacts, run_id: int, dtype: str = "bf16") -> MergedExport:
    """Merge run `run_id`'s adapter into its base in `dtype`, check it, save and record it."""
    import torch
    from peft import PeftModel
    from transformers import AutoTokenizer

    from jobs.export.image_check import IMAGE_QUESTION
    from jobs.export.vision import image_greedy
    from jobs.models.loading import load_model_and_tokenizer
    from jobs.models.references import resolve_model
    from jobs.models.vision import is_vision_config

    if dtype not in DTYPES:
        raise _refuse(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}", "use --dtype bf16, fp16 or fp32", "dtype")
    spec, adapter = adapter_folder(store, run_id)
    notes = []
    if spec.method in QUANTIZED_METHODS:
        notes.append(
            f"The adapter was trained on a {'4' if spec.method is Method.QLORA else '8'}-bit base and is "
            f"merged here into the unquantized base ({dtype}); its answers can differ a little from the "
            "quantized training setup (see the check below)."
        )
    torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
    log.info("export run %s: loading base %s in %s", run_id, spec.model, dtype)
    base, _ = load_model_and_tokenizer(
        resolve_model(spec.model, trust_remote_code=spec.trust_remote_code),
        torch_dtype=torch_dtype,
        trust_remote_code=spec.trust_remote_code,
    )
    processor = None
    if is_vision_config(base.config):  # the processor the run trained with: tokenizer, image processor, template
        from transformers import AutoProcessor

        processor = AutoProcessor.from_pretrained(str(adapter))
    tokenizer = processor.tokenizer if processor is not None else AutoTokenizer.from_pretrained(str(adapter))
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    log.info("export run %s: loading the adapter from %s", run_id, adapter)
    model = PeftModel.from_pretrained(base, str(adapter)).eval()
    config = model.peft_config["default"]
    if getattr(config, "is_prompt_learning", False) or getattr(config, "is_adaption_prompt", False):
        raise _refuse(
            f"run {run_id} used {spec.method.value}: it adds learned virtual tokens instead of changing "
            "weights, so there is nothing to merge into the base",
            "use the adapter bundle with peft (PeftModel.from_pretrained), or train with LoRA to merge",
        )
    log.info("export run %s: answering %d check prompts with the adapter", run_id, len(CHECK_PROMPTS))
    unmerged = greedy(model, tokenizer, CHECK_PROMPTS, CHECK_NEW_TOKENS, with_logits=True)
    prompts = list(CHECK_PROMPTS)
    if processor is not None:
        prompts.append(f"[image] {IMAGE_QUESTION}")
        _add(unmerged, image_greedy(model, processor, CHECK_NEW_TOKENS))
    log.info("export run %s: merging", run_id)
    try:
        merged_model = model.merge_and_unload()
    except (NotImplementedError, AttributeError, ValueError) as exc:
        raise _refuse(
            f"peft cannot merge this run's {spec.method.value} adapter: {exc}",
            "use the adapter bundle with peft (PeftModel.from_pretrained)",
        ) from exc
    merged = greedy(merged_model, tokenizer, CHECK_PROMPTS, CHECK_NEW_TOKENS, with_logits=True)
    if processor is not None:
        _add(merged, image_greedy(merged_model, processor, CHECK_NEW_TOKENS))
    check = compare(unmerged, merged, tokenizer, spec.method in QUANTIZED_METHODS, prompts)
    log.info(
        "export run %s: check %s (%s; token agreement %.3f, max logit diff %.3g)",
        run_id,
        "passed" if check.passed else "FAILED",
        check.rule,
        check.token_agreement,
        check.max_logit_diff,
    )
    if not check.passed:
        raise _refuse(
            f"the merged model's answers differ from the adapter's ({check.rule} not met: token "
            f"agreement {check.token_agreement:.0%})",
            "export with --dtype fp32 (less rounding in the merge), or use the adapter bundle",
        )
    return _save(store, run_id, spec, dtype, merged_model, processor or tokenizer, check, notes)


def _add(answers: tuple[list[list[int]], list[Any]], answer: tuple[list[int], Any]) -> None:
    """Append one more prompt's answer ids and logits to `greedy`'s (ids, logits)."""
    answers[0].append(answer[0])
    answers[1].append(answer[1])


def _save(
    store: RunArtifacts,
    run_id: int,
    spec: JobSpec,
    dtype: str,
    merged_model: Any,
    tokenizer: Any,
    check: MergeCheck,
    notes: list[str],
) -> MergedExport:
    """Write the checked merged model with its card under the run's `export/`, zip it and record both."""
    from jobs.models.registry import base_reference
    from jobs.models.vision import is_vision_config

    root = store.run_dir(run_id) / "export"
    folder = root / f"merged-{dtype}"
    if folder.exists():
        shutil.rmtree(folder)  # a re-export replaces the previous one of the same dtype
    folder.mkdir(parents=True)
    merged_model.config.name_or_path = base_reference(spec.model)
    merged_model.save_pretrained(str(folder), safe_serialization=True)
    tokenizer.save_pretrained(str(folder))  # a vision-language run's processor: its tokenizer too
    (folder / "export-check.json").write_text(json.dumps(asdict(check), indent=2))
    vision = is_vision_config(merged_model.config)
    (folder / "README.md").write_text(merged_card(spec, run_id, dtype, check, notes, vision))
    archive = zip_bundle(folder, store.run_dir(run_id) / f"{safe_name(spec.display_name)}-merged-{dtype}.zip")
    digest = sha256_of(archive)
    size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    weights = sorted(folder.glob("*.safetensors"))
    store.add_artifact(run_id, "merged", str(folder), size, sha256_of(weights[0]) if weights else digest)
    store.add_artifact(run_id, "export", str(archive), archive.stat().st_size, digest)
    log.info("export run %s: wrote %s (%s)", run_id, archive, digest)
    return MergedExport(folder, archive, digest, dtype, check, notes)


def merged_card(
    spec: JobSpec, run_id: int, dtype: str, check: MergeCheck, notes: list[str], vision: bool = False
) -> str:
    """README.md of a merged export: what it is, how it was checked, how to load it (a vision-language model:
    with its processor, answering about an image)."""
    from jobs.models.registry import base_reference
    from jobs.train.artifacts import provenance_note
    from jobs.train.vision_card import vision_load_snippet

    rows = "\n".join(
        f"| {p} | {a!r} | {'same' if a == b else repr(b)} |"
        for p, a, b in zip(check.prompts, check.unmerged, check.merged)
    )
    note_text = "".join(f"\n{n}\n" for n in notes)
    load = (
        vision_load_snippet(spec, whole=True)
        if vision
        else "Run this from the folder this file is in:\n\n```python\nfrom transformers import "
        'AutoModelForCausalLM, AutoTokenizer\n\nmodel = AutoModelForCausalLM.from_pretrained(".")\n'
        'tokenizer = AutoTokenizer.from_pretrained(".")\n```\n'
    )
    return (
        f"# {spec.display_name} (merged, {dtype})\n\nRun {run_id}'s {spec.method.value} adapter merged into "
        f"`{base_reference(spec.model)}` by tunedeck. A plain transformers model: no peft needed.\n{note_text}\n"
        f"## Check: merged vs adapter, greedy decoding\nRule: {check.rule}. Token agreement "
        f"{check.token_agreement:.1%}; largest logit difference {check.max_logit_diff:.3g}.\n\n"
        f"| prompt | adapter | merged |\n|---|---|---|\n{rows}\n\n## How to load\n" + load + provenance_note(spec)
    )
