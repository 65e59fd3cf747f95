"""Queue a job after checking everything that can be checked before training starts.

    from jobs.submit import submit
    run_id = submit(store, JobSpec.from_yaml(text))   # raises SpecError with every problem

Checks, all run before anything is queued, their problems reported together: the spec on its
own (`JobSpec.problems`), the model (`jobs.models.check_model`, no weights loaded), the train
and eval data (`jobs.data.check_dataset`), and what this machine can do with the spec
(`jobs.mapping`'s capability check, e.g. fp16 without CUDA), and whether the predicted peak
memory fits the device (`jobs.memory`; `ignore_memory_prediction: true` overrides it). The
prediction is saved with the run as `prediction.json` in its run folder.
"""

from __future__ import annotations

from jobs.spec import JobSpec, Problem, SpecError
from storage.store import Store


def model_problems(spec: JobSpec) -> list[Problem]:
    from jobs.models import ModelError, check_model

    try:
        return list(check_model(spec.model, trust_remote_code=spec.trust_remote_code))
    except ModelError as exc:
        return list(exc.problems)


def dataset_problems(spec: JobSpec) -> list[Problem]:
    # Imported here: datasets costs seconds to import and the CLI's other commands never need it.
    from jobs.data import DataError, check_dataset

    out: list[Problem] = []
    for field, ref in (("dataset", spec.dataset), ("eval_dataset", spec.eval_dataset)):
        if not ref or not ref.strip():
            continue  # no eval_dataset: the sample's own eval split, or none
        try:
            info = check_dataset(ref, spec.trainer, field=field)
        except DataError as exc:
            out.extend(exc.problems)
            continue
        if _is_chat(info) and has_chat_template(spec.model) is False:
            out.append(Problem("model", f"{spec.model!r} has a tokenizer without a chat template, but `{ref}` holds "
                               "chat conversations (messages), which are rendered with the chat template",
                               "pick an instruct/chat model (e.g. smollm2-135m-instruct), add a chat_template to the "
                               "model's tokenizer_config.json, or use a text or prompt/completion data set"))
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
    from pathlib import Path

    from jobs.models import BUILTIN_MODELS

    ref = (model or "").strip()
    if ref in BUILTIN_MODELS:
        return True
    folder = Path(ref).expanduser()
    files: dict[str, Path | None] = {}
    if folder.is_dir():
        files = {name: folder / name if (folder / name).is_file() else None
                 for name in ("tokenizer_config.json", "chat_template.jinja", "chat_template.json")}
    else:
        try:
            from huggingface_hub import try_to_load_from_cache
            for name in ("tokenizer_config.json", "chat_template.jinja", "chat_template.json"):
                hit = try_to_load_from_cache(ref, name)
                files[name] = Path(hit) if isinstance(hit, str) else None
        except Exception:  # not a valid repo id, no cache: the model check reports what matters
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


def capability_problems(spec: JobSpec) -> list[Problem]:
    """What this machine cannot do with the spec (fp16 without CUDA, bf16 on an old GPU)."""
    from jobs import mapping

    return list(mapping.capability_problems(spec))


def memory_problems(spec: JobSpec, device: object | None = None) -> list[Problem]:
    """A problem when the predicted peak will not fit the device (none when overridden or unpredictable)."""
    prediction = predict_memory(spec, device)
    if spec.ignore_memory_prediction or prediction is None:
        return []
    from jobs.memory import Verdict, explain

    if prediction.verdict is not Verdict.WILL_NOT_FIT:
        return []
    from jobs.memory_config import arch_for
    from jobs.planner import cheapest_change

    change = cheapest_change(spec, arch_for(spec.model), prediction.device)
    fix = (f"{change} (`tunedeck plan SPEC.yaml --fit` lists more)" if change else
           "shorten max_length or pick a smaller model")
    return [Problem("memory", explain(prediction).rstrip("."), fix + "; or set ignore_memory_prediction: true to queue it anyway")]


def predict_memory(spec: JobSpec, device: object | None = None):  # -> jobs.memory.Prediction | None
    """The spec's predicted peak on `device` (default: this machine's first GPU, else the CPU)."""
    from jobs.memory import predict
    from jobs.memory_config import arch_for

    arch = arch_for(spec.model)
    if arch is None:
        return None
    if device is None:
        from jobs.devices import local_facts

        device = local_facts()
    return predict(spec, arch, device)  # type: ignore[arg-type]


def check(spec: JobSpec) -> list[Problem]:
    """Every problem with the spec, its model, its data and this machine (empty: good to go)."""
    problems = list(spec.problems())
    # Field-level problems first; the model and data checks still run so one pass shows all.
    if not any(p.field == "model" for p in problems):
        problems.extend(model_problems(spec))
    if not any(p.field in ("dataset", "eval_dataset") for p in problems):
        problems.extend(dataset_problems(spec))
    problems.extend(capability_problems(spec))
    if not problems:
        problems.extend(memory_problems(spec))
    seen: set[tuple[str, str]] = set()
    unique = []
    for p in problems:
        if (p.field, p.problem) not in seen:
            seen.add((p.field, p.problem))
            unique.append(p)
    return unique


def submit(store: Store, spec: JobSpec) -> int:
    """Check the spec (model, data, device) and queue it; raises SpecError with every problem."""
    problems = check(spec)
    if problems:
        raise SpecError(problems)
    run_id = store.create_run(spec)
    save_prediction(run_id, spec)
    return run_id


PREDICTION_FILE = "prediction.json"


def save_prediction(run_id: int, spec: JobSpec) -> None:
    """Keep the prediction made at submit next to the run (the run page compares it with the peak)."""
    from storage.settings import run_dir

    prediction = predict_memory(spec)
    if prediction is not None:
        (run_dir(run_id) / PREDICTION_FILE).write_text(prediction.to_json())


def load_prediction(run_id: int) -> dict | None:
    """The prediction saved at submit, or None."""
    import json

    from storage.settings import run_dir

    path = run_dir(run_id) / PREDICTION_FILE
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None
