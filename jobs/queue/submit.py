"""Queue a job after checking everything that can be checked before training starts.

    from jobs.queue.submit import submit
    run_id = submit(store, JobSpec.from_yaml(text))   # raises SpecError with every problem

Checks, all run before anything is queued, their problems reported together: what a shared
dashboard's users may ask for (`jobs.checks.access.AccessPolicy`: data folders, remote code; checked
first, so a refused path is never read), the spec on its own (`JobSpec.problems`), the model
(`jobs.models.registry.check_model`, no weights loaded), the train and eval data
(`jobs.data.sources.check_dataset`), what the workers' device can do with the spec (`jobs.config.mapping`'s
capability check, e.g. fp16 without CUDA, against the facts the workers published:
`jobs.devices.target.target`; this machine's when none has), and whether the predicted peak memory fits
that device (`jobs.memory.predict`; `ignore_memory_prediction: true` overrides it), and that a grpo
`reward_model_run` is a finished reward run (`jobs.models.reward_model`). The prediction is
saved with the run as `prediction.json` in its run folder.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from jobs.checks.access import AccessPolicy
from jobs.errors import Problem
from jobs.spec.job import JobSpec, SpecError
from storage.store import Store

if TYPE_CHECKING:
    from jobs.devices.facts import Device, DeviceFacts


def model_problems(spec: JobSpec) -> list[Problem]:
    from jobs.models.registry import ModelError, check_model

    try:
        return list(check_model(spec.model, trust_remote_code=spec.trust_remote_code))
    except ModelError as exc:
        return list(exc.problems)


def dataset_problems(spec: JobSpec) -> list[Problem]:
    # Imported here: datasets costs seconds to import and the CLI's other commands never need it.
    from jobs.checks.template import template_refusal
    from jobs.data.sources import DataError, check_dataset

    out: list[Problem] = []
    for field, ref in (("dataset", spec.dataset), ("eval_dataset", spec.eval_dataset)):
        if not ref or not ref.strip():
            continue  # no eval_dataset: the sample's own eval split, or none
        try:
            info = check_dataset(ref, spec.trainer, field=field, column_map=spec.column_map)
        except DataError as exc:
            out.extend(exc.problems)
            continue
        if field == "dataset" and spec.eval_split is not None:
            from jobs.data.sources import eval_rows

            held_out = eval_rows(info.n_rows, spec.eval_split)
            if isinstance(held_out, Problem):
                out.append(held_out)
        refused = template_refusal(spec.model, field, info.repeated_turns, spec.trust_remote_code)
        if refused is not None:
            out.append(refused)
        if _is_chat(info) and has_chat_template(spec.model) is False:
            out.append(
                Problem(
                    "model",
                    f"{spec.model!r} has a tokenizer without a chat template, but `{ref}` holds "
                    "chat conversations (messages), which are rendered with the chat template",
                    "pick an instruct/chat model (e.g. smollm2-135m-instruct), add a chat_template to the "
                    "model's tokenizer_config.json, or use a text or prompt/completion data set",
                )
            )
    return out


def _is_chat(info: object) -> bool:
    """Whether a checked data set is conversational (rows rendered through the chat template)."""
    fmt = getattr(getattr(info, "format", None), "value", None)
    if fmt == "messages":
        return True
    return any(isinstance(row.get("prompt"), list) for row in getattr(info, "preview", []) or [])


def has_chat_template(model: str) -> bool | None:
    """True/False when the model's tokenizer files are on disk (folder or HF cache); None when unknown."""
    import json

    from jobs.checks.template import tokenizer_files
    from jobs.models.registry import BUILTIN_MODELS

    if (model or "").strip() in BUILTIN_MODELS:
        return True
    files = tokenizer_files(model)
    if files is None:
        return None
    if files.get("chat_template.jinja") or files.get("chat_template.json"):
        return True
    config = files.get("tokenizer_config.json")
    if config is None:
        return None
    try:
        return bool(json.loads(config.read_text(encoding="utf-8")).get("chat_template"))
    except (OSError, ValueError, AttributeError):
        return None


def capability_problems(spec: JobSpec, device: Device | None = None) -> list[Problem]:
    """What the device cannot do with the spec (fp16 without CUDA, bf16 on an old GPU); default: this machine."""
    from jobs.config import mapping

    return list(mapping.capability_problems(spec, device))


def memory_problems(spec: JobSpec, device: DeviceFacts | None = None) -> list[Problem]:
    """A problem when the predicted peak will not fit the device (none when overridden or unpredictable)."""
    if spec.ignore_memory_prediction:
        return []
    prediction = predict_memory(spec, device)
    if prediction is None:
        return []
    from jobs.memory.predict import Verdict, explain

    if prediction.verdict is not Verdict.WILL_NOT_FIT:
        return []
    from jobs.memory.model_config import arch_for
    from jobs.memory.planner import cheapest_change

    change = cheapest_change(spec, arch_for(spec.model), prediction.device)
    fix = (
        f"{change} (`tunedeck plan SPEC.yaml --fit` lists more)"
        if change
        else "shorten max_length or pick a smaller model"
    )
    return [
        Problem(
            "memory",
            explain(prediction).rstrip("."),
            fix + "; or set ignore_memory_prediction: true to queue it anyway",
        )
    ]


@functools.lru_cache(maxsize=32)
def predict_memory(spec: JobSpec, device: DeviceFacts | None = None):  # -> jobs.memory.predict.Prediction | None
    """The spec's predicted peak on `device` (default: this machine's device). Cached (spec and facts are
    frozen): submit checks the prediction and then saves it with the run, and builds it once."""
    from jobs.memory.model_config import arch_for
    from jobs.memory.predict import predict

    arch = arch_for(spec.model)
    if arch is None:
        return None
    if device is None:
        from jobs.devices.probe import local_facts

        device = local_facts()
    return predict(spec, arch, device)  # type: ignore[arg-type]


def check(
    spec: JobSpec, device: Device | None = None, policy: AccessPolicy | None = None, facts: DeviceFacts | None = None
) -> list[Problem]:
    """Every problem with the spec, its model, its data and the device (default: this machine's; empty: good to go).

    `device`: the capability view of the device; `facts`: its full facts, for the memory prediction."""
    problems = (policy or AccessPolicy.open()).problems(spec) + list(spec.problems())
    # Field-level problems first; the model and data checks still run so one pass shows all.
    if not any(p.field == "model" for p in problems):
        problems.extend(model_problems(spec))
    if not any(p.field in ("dataset", "eval_dataset") for p in problems):
        problems.extend(dataset_problems(spec))
    problems.extend(capability_problems(spec, device))
    if not problems:
        problems.extend(memory_problems(spec, facts))
    seen: set[tuple[str, str]] = set()
    unique = []
    for p in problems:
        if (p.field, p.problem) not in seen:
            seen.add((p.field, p.problem))
            unique.append(p)
    return unique


def submit(store: Store, spec: JobSpec, policy: AccessPolicy | None = None) -> int:
    """Check the spec (access, model, data, the workers' device) and queue it; raises SpecError with every problem."""
    from jobs.devices.target import target
    from jobs.models.reward_model import reward_run_problems

    chosen = target(store)
    problems = check(spec, chosen.facts.device(), policy, chosen.facts) + reward_run_problems(store, spec)
    if problems and chosen.worker_id is None:
        problems = _say_which_device(problems, spec, chosen.facts.device(), chosen.note)
    if problems:
        raise SpecError(problems)
    run_id = store.create_run(spec)
    save_prediction(store, run_id, spec, chosen.facts)
    return run_id


def _say_which_device(problems: list[Problem], spec: JobSpec, device: Device, note: str) -> list[Problem]:
    """Device problems found against this machine because no worker has published its device: say so."""
    from jobs.config import mapping
    from jobs.devices.facts import Device

    capable = Device(cuda=True, bf16=True, compute_capability=(9, 0), name="any GPU")
    anywhere = {(p.field, p.problem) for p in mapping.capability_problems(spec, capable, probe=False)}
    device_only = {(p.field, p.problem) for p in mapping.capability_problems(spec, device, probe=False)}
    return [
        Problem(p.field, p.problem, f"{p.fix} ({note}; start the worker first if it has a GPU)")
        if (p.field, p.problem) in device_only - anywhere
        else p
        for p in problems
    ]


PREDICTION_FILE = "prediction.json"


def save_prediction(store: Store, run_id: int, spec: JobSpec, facts: DeviceFacts | None = None) -> None:
    """Keep the prediction made at submit next to the run (the run page compares it with the peak)."""
    prediction = predict_memory(spec, facts)
    if prediction is not None:
        (store.run_dir(run_id) / PREDICTION_FILE).write_text(prediction.to_json())


def load_prediction(store: Store, run_id: int) -> dict | None:
    """The prediction saved at submit, or None."""
    import json

    try:
        return json.loads((store.run_path(run_id) / PREDICTION_FILE).read_text())
    except (OSError, ValueError):
        return None
