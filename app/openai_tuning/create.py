"""A `POST /v1/fine_tuning/jobs` body read into tunedeck's spec values, every field typed and bounded.

    values, extras = job_values(store, body)     # ApiError (400) naming the parameter at fault
    run_id = submit(store, values, policy)        # the form's and the CLI's one check; SpecError ...
    raise refusal(exc)                            # ... as an ApiError naming OpenAI's parameter

The mapping (OpenAI -> tunedeck): `model` -> `model` (a built-in name, a local folder, a hub id, or a finished
run whose result is a whole model, a full fine-tune or an adapter exported merged: its folder); `training_file`/`validation_file` (ids from `/v1/files`) ->
`dataset`/`eval_dataset` (the kept files' paths); `suffix` -> `run_name`; `seed` -> `seed`; `method.type`
`supervised` -> trainer sft, `dpo` -> trainer dpo (`beta` -> `beta`); `n_epochs` -> `num_train_epochs`,
`batch_size` -> `per_device_train_batch_size`, `learning_rate_multiplier` -> `learning_rate` (times
tunedeck's default); "auto" (or leaving one out) keeps tunedeck's default. `metadata` is kept with the run.
"""

from __future__ import annotations

import math
from typing import Any

from app.openai_fields import ApiError
from jobs.errors import ProblemError
from jobs.models.served_names import served_model
from jobs.spec.job import JobSpec
from jobs.spec.stored import result_folder, spec_of
from storage.api_files import api_file
from storage.roles_api import TuningModels

FIELDS = {"model", "training_file", "validation_file", "suffix", "seed", "method", "hyperparameters", "metadata"}
FIELDS_OFF = {"integrations": "tunedeck reports to trackers with the spec's `report_to` (set in the form or CLI)"}
TRAINERS = {"supervised": "sft", "dpo": "dpo"}  # OpenAI's method type -> tunedeck's trainer
HYPERPARAMETERS = {  # OpenAI's name -> (tunedeck's field, low, high, whole number)
    "n_epochs": ("num_train_epochs", 1, 1000, True),
    "batch_size": ("per_device_train_batch_size", 1, 4096, True),
    "learning_rate_multiplier": ("learning_rate", 1e-6, 1e4, False),
    "beta": ("beta", 0.0, 10.0, False),
}
SUFFIX_MAX = 64
METADATA_PAIRS, METADATA_KEY, METADATA_VALUE = 16, 64, 512
# tunedeck's field a check names -> OpenAI's parameter
PARAMS = {
    "dataset": "training_file",
    "eval_dataset": "validation_file",
    "run_name": "suffix",
    "trainer": "method",
    "num_train_epochs": "hyperparameters.n_epochs",
    "per_device_train_batch_size": "hyperparameters.batch_size",
    "learning_rate": "hyperparameters.learning_rate_multiplier",
    "beta": "method.dpo.hyperparameters.beta",
}


def _file(body: dict[str, Any], name: str) -> str | None:
    """The kept path of the file `body[name]` names (None when absent and allowed)."""
    ident = body.get(name)
    if ident is None and name == "validation_file":
        return None
    if not isinstance(ident, str) or not ident:
        raise ApiError(400, f"`{name}` must be the id of a file uploaded to /v1/files (file-...)", name)
    found = api_file(ident)
    if found is None:
        raise ApiError(
            400, f"`{name}` {ident[:80]!r} is no file here: upload it with POST /v1/files first", name, "file_not_found"
        )
    if found.purpose != "fine-tune":
        raise ApiError(400, f"`{name}` {ident} was uploaded for {found.purpose!r}, not 'fine-tune'", name)
    return str(found.path)


def _model(store: TuningModels, body: dict[str, Any]) -> str:
    """The spec's `model`: the name as given, or a finished run's whole-model folder."""
    name = body.get("model")
    if not isinstance(name, str) or not name.strip() or len(name) > 4096:
        raise ApiError(400, "`model` must name a built-in model, a model folder, a hub id or a finished run", "model")
    found = served_model(store, name, lambda _run_id: True)
    if found is None or found[1] == "base":
        return name.strip()  # a built-in, a folder or a hub id: the submit check reads it
    run = store.get_run(found[0])
    assert run is not None
    folder = result_folder(store, run.id, "model", "config.json")  # a full fine-tune
    folder = folder or result_folder(store, run.id, "merged", "config.json")  # an adapter exported merged
    if folder is None:
        base = spec_of(run).model
        raise ApiError(
            400,
            f"`model` {name!r} is run {run.id}, whose result is an adapter on {base!r}, not a whole model to train "
            f"further. Fix: export it merged (`tunedeck export {run.id} --merged`) and name the merged folder, or "
            f"train from its base `{base}`",
            "model",
            "model_not_available",
        )
    return str(folder)


def _number(value: Any, where: str, low: float, high: float, whole: bool) -> float | int | None:
    if value is None or value == "auto":
        return None
    kind = "a whole number" if whole else "a number"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (whole and not isinstance(value, int)):
        raise ApiError(400, f'`{where}` must be "auto" or {kind} from {low:g} to {high:g}, not {value!r}', where)
    if not math.isfinite(value) or not low <= value <= high:
        raise ApiError(400, f"`{where}` must be from {low:g} to {high:g}, not {value!r}", where)
    return value


def _hyperparameters(given: Any, where: str, trainer: str) -> dict[str, Any]:
    """tunedeck's field values from OpenAI's hyperparameters (those left "auto" are left out)."""
    if given is None:
        return {}
    if not isinstance(given, dict):
        raise ApiError(400, f"`{where}` must be an object of hyperparameters", where)
    allowed = [k for k in HYPERPARAMETERS if k != "beta" or trainer == "dpo"]
    out: dict[str, Any] = {}
    for key, value in given.items():
        if key not in allowed:
            raise ApiError(
                400, f"`{where}.{key}` is not a hyperparameter tunedeck reads: use {', '.join(allowed)}", where
            )
        field, low, high, whole = HYPERPARAMETERS[key]
        number = _number(value, f"{where}.{key}", low, high, whole)
        if number is None:
            continue
        if key == "learning_rate_multiplier":
            number = float(JobSpec.__dataclass_fields__["learning_rate"].default) * number  # type: ignore[arg-type]
        out[field] = number
    return out


def _method(body: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """(tunedeck's trainer, the values the method's and the top-level hyperparameters give)."""
    method = body.get("method")
    if method is None:
        method = {"type": "supervised"}
    if not isinstance(method, dict) or not isinstance(method.get("type"), str):
        raise ApiError(400, '`method` must be {"type": "supervised"} or {"type": "dpo", "dpo": {...}}', "method")
    kind = method["type"]
    if kind not in TRAINERS:
        raise ApiError(
            400,
            f"`method.type` {kind[:40]!r} is not served by tunedeck's fine-tuning API: use `supervised` or `dpo` "
            "(other trainers, grpo for reinforcement, are submitted through tunedeck's form, API or CLI)",
            "method",
            "unsupported_method",
        )
    extra = [k for k in method if k not in ("type", kind)]
    if extra:
        raise ApiError(400, f"`method.{extra[0]}` does not go with method type {kind!r}", "method")
    inner = method.get(kind) or {}
    if not isinstance(inner, dict) or [k for k in inner if k != "hyperparameters"]:
        raise ApiError(400, f'`method.{kind}` must be {{"hyperparameters": {{...}}}}', "method")
    trainer = TRAINERS[kind]
    values = _hyperparameters(body.get("hyperparameters"), "hyperparameters", trainer)
    values |= _hyperparameters(inner.get("hyperparameters"), f"method.{kind}.hyperparameters", trainer)
    return trainer, values


def _metadata(value: Any) -> dict[str, str] | None:
    if value is None:
        return None
    ok = (
        isinstance(value, dict)
        and len(value) <= METADATA_PAIRS
        and all(isinstance(k, str) and len(k) <= METADATA_KEY for k in value)
        and all(isinstance(v, str) and len(v) <= METADATA_VALUE for v in value.values())
    )
    if not ok:
        raise ApiError(
            400,
            f"`metadata` must be up to {METADATA_PAIRS} pairs of strings (keys up to {METADATA_KEY} characters, "
            f"values up to {METADATA_VALUE})",
            "metadata",
        )
    return dict(value)


def job_values(store: TuningModels, body: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the spec's values, what is kept beside the run: the model as named, suffix, metadata)."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    for key in body:
        if key in FIELDS_OFF and body[key]:
            raise ApiError(400, f"`{key}` is not served: {FIELDS_OFF[key]}", key)
        if key not in FIELDS and key not in FIELDS_OFF:
            raise ApiError(400, f"`{str(key)[:40]}` is not a field of a fine-tuning job", str(key)[:40])
    suffix = body.get("suffix")
    if suffix is not None and (not isinstance(suffix, str) or not suffix.strip() or len(suffix) > SUFFIX_MAX):
        raise ApiError(400, f"`suffix` must be a non-empty string of up to {SUFFIX_MAX} characters", "suffix")
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= 2**31 - 1):
        raise ApiError(400, f"`seed` must be a whole number from 0 to {2**31 - 1}, not {seed!r}", "seed")
    trainer, values = _method(body)
    metadata = _metadata(body.get("metadata"))
    values |= {"model": _model(store, body), "trainer": trainer, "dataset": _file(body, "training_file")}
    validation = _file(body, "validation_file")
    values |= {"eval_dataset": validation} if validation else {}
    values |= {"seed": seed} if seed is not None else {}
    values |= {"run_name": suffix.strip()} if suffix is not None else {}
    return values, {"model": body["model"].strip(), "suffix": suffix, "metadata": metadata}


def refusal(exc: ProblemError, names: dict[str, str] | None = None) -> ApiError:
    """Every problem the submit check found, as one 400 naming OpenAI's parameter of the first; `names`: the kept
    files' paths -> their ids, so the answer names the client's file, never a path on the server."""
    first = exc.problems[0]
    param = PARAMS.get(first.field, first.field)
    code = "invalid_" + param.split(".")[0] if param in ("training_file", "validation_file", "model") else None
    text = "; ".join(f"{PARAMS.get(p.field, p.field)}: {p.problem}. Fix: {p.fix}" for p in exc.problems)
    for path, ident in (names or {}).items():
        text = text.replace(path, ident)
    return ApiError(400, text, param, code or "invalid_value")
