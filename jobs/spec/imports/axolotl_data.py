"""axolotl's `datasets:` / `test_datasets:` entries as the spec's `dataset` / `eval_dataset` and `dataset_columns`.

Several `datasets:` entries become several sources of `dataset` (`jobs.spec.mixture`), each with its
own column names (`test_datasets:` alike, for `eval_dataset`). An entry's `path` (a hub id or a
local file; `data_files` wins) becomes the data set; its `type` and `field_*` keys become column
names where tunedeck reads the same rows (alpaca, completion, chat_template, sharegpt); other prompt
strategies are named as not carried over.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from jobs.spec.columns import columns_text
from jobs.spec.imports.base import LOADING, Reader
from jobs.spec.mixture import DataSource

KNOWN_SPEAKERS = {"human", "user", "gpt", "assistant", "bot", "model", "system", "tool", "function", "observation"}
READ_AS_IS = "tunedeck reads the rows as they are (Alpaca, ShareGPT, chat messages, prompt/completion or prompt/chosen/rejected columns)"


def map_dataset_list(r: Reader, key: str, spec_field: str, trainer: str) -> None:
    entries = r.take(key)
    if entries is None:
        return
    if isinstance(entries, Mapping):
        entries = [entries]
    if not isinstance(entries, list) or not all(isinstance(e, Mapping) for e in entries):
        r.fail(key, "is not a list of data set entries", f"write {key}: as a list of `- path: ...` entries")
        return
    taken: list[tuple[str, dict[str, str], str]] = []  # (file or hub id, dataset_columns, the key it came from)
    for i, entry in enumerate(entries):
        sub = Reader(entry, r.tool, prefix=f"{key}[{i}].")
        found = _entry(sub, spec_field, trainer)
        sub.finish_keys()
        r.merge(sub)
        if found is not None and any(found[0] == t[0] for t in taken):
            r.note(f"{key}[{i}]", f"`{found[0]}` is listed before: tunedeck reads each data set once per job")
        elif found is not None:
            taken.append((found[0], found[1], f"{key}[{i}].{found[2]}"))
    if len(taken) == 1:
        source, mapping, origin = taken[0]
        r.fields[spec_field], r.origins[spec_field] = source, origin
        if mapping and spec_field == "dataset":
            r.fields["dataset_columns"], r.origins["dataset_columns"] = columns_text(mapping), f"{key}[0].type"
        elif mapping:
            r.note(f"{key}[0].type", f"its column names ({columns_text(mapping)}) apply to the training data only")
    elif taken:  # several data sets: one source each, with its own columns
        r.fields[spec_field] = ", ".join(DataSource(s, None, columns_text(m) or None).text() for s, m, _ in taken)
        r.origins[spec_field] = key


def _entry(r: Reader, spec_field: str, trainer: str) -> tuple[str, dict[str, str], str] | None:
    """(file or hub id, dataset_columns, the key naming it) of one entry; None when it names no data."""
    path = r.take("path")
    files = r.take("data_files")
    if isinstance(files, list):
        if len(files) > 1:
            r.note("data_files", f"tunedeck reads one file per data set; took `{files[0]}`")
        files = files[0] if files else None
    source = files or path
    if source is None:
        r.fail("path", "is missing", "give the data set's hub id or local file as path:")
        return None
    if files and path:
        r.note("path", f"data_files (`{files}`) is the file read")
    split = r.take("split")
    if split is not None and str(split) != "train":
        r.note("split", f"tunedeck reads the train split, not `{split}`")
    r.drop("name", "tunedeck reads the hub data set's default configuration")
    r.drop("ds_type", "tunedeck tells the file type by its extension")
    r.drop("trust_remote_code", "tunedeck loads data sets without their loading scripts")
    r.drop("shards", LOADING)
    r.drop("roles_to_train", "tunedeck trains on the assistant turns (or whole rows, by the loss options)")
    r.drop("train_on_eos", "tunedeck trains on the end-of-turn tokens of the answers")
    r.drop("drop_system_message", "tunedeck keeps the rows' system turns")
    return str(source), _columns(r, trainer), "data_files" if files else "path"


def _columns(r: Reader, trainer: str) -> dict[str, str]:
    """dataset_columns (target -> the file's column) for the entry's type and field_* keys."""
    kind = r.take("type")
    name = str(kind).strip().lower() if isinstance(kind, str) else ""
    targets: dict[str, Any] = {}
    if kind is None:
        pass
    elif not isinstance(kind, str):
        r.note("type", f"a custom prompt format has no tunedeck equivalent; {READ_AS_IS}")
    elif name == "alpaca":
        for src, target in (
            ("field_instruction", "instruction"),
            ("field_input", "input"),
            ("field_output", "output"),
            ("field_system", "system"),
        ):
            if r.has(src):
                targets[target] = r.take(src)
    elif name == "completion":
        targets["text"] = r.take("field") or "text"
    elif name.startswith("chat_template") or name.startswith("sharegpt"):
        targets.update(_chat(r, trainer))
    else:
        r.note("type", f"`{kind}` is an axolotl prompt strategy with no tunedeck equivalent; {READ_AS_IS}")
    return {t: str(s) for t, s in targets.items() if str(s) != t}


def _chat(r: Reader, trainer: str) -> dict[str, Any]:
    """chat_template / sharegpt entries: the messages column, its turn keys, and for preferences chosen/rejected."""
    mappings = dict(r.take("message_property_mappings") or {})
    role = mappings.get("role") or r.take("message_field_role") or "role"
    content = mappings.get("content") or r.take("message_field_content") or "content"
    messages = (
        r.take("field_messages")
        or r.take("field")
        or ("conversations" if (role, content) == ("from", "value") else "messages")
    )
    _roles(r)
    targets: dict[str, Any] = {}
    if trainer in ("dpo", "orpo", "reward"):
        targets = {
            "prompt": messages,
            "chosen": r.take("field_chosen") or "chosen",
            "rejected": r.take("field_rejected") or "rejected",
        }
    elif (role, content) == ("from", "value"):
        targets["conversations"] = messages
    elif (role, content) == ("role", "content"):
        targets["messages"] = messages
    else:
        r.note(
            "message_property_mappings",
            f"turns keyed {role}/{content} are not read: write them as role/content or from/value",
        )
    if r.has("field_system"):
        targets["system"] = r.take("field_system")
    return targets


def _roles(r: Reader) -> None:
    roles = r.take("roles")
    if not isinstance(roles, Mapping):
        return
    names = {str(n) for values in roles.values() for n in (values if isinstance(values, list) else [values])}
    unknown = sorted(names - KNOWN_SPEAKERS)
    if unknown:
        r.note(
            "roles",
            f"speakers {', '.join(unknown)} are not read: tunedeck reads human/user, gpt/assistant, system and tool",
        )
