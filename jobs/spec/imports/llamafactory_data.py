"""LLaMA-Factory data set names (`dataset: identity,alpaca_en_demo`) resolved through its `dataset_info.json`.

Each name's entry gives a file (`file_name`, in the data set folder) or a hub data set (`hf_hub_url`),
its formatting (alpaca or sharegpt), its column names and, for ShareGPT, its turn tags. They become
the spec's `dataset` (or `eval_dataset`) and `dataset_columns`. Several text data sets become several
sources of `dataset` (`jobs.spec.mixture`), each with its own column names and, from `max_samples`
(which LLaMA-Factory applies to each data set), its own row cap; `eval_dataset` alike. Multimodal
data sets with images are read like the others (an `images` column); videos and audio are listed as not carried
over.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from typing import Any

from jobs.spec.columns import columns_text
from jobs.spec.imports.base import Reader
from jobs.spec.mixture import DataSource
from jobs.spec.parse import closest

MEDIA_COLUMNS = ("videos", "audios")  # images are read (jobs.data.images); these are not
# LLaMA-Factory's column names -> tunedeck's (dataset_columns targets), per formatting.
ALPACA_COLUMNS = {
    "prompt": "instruction",
    "query": "input",
    "response": "output",
    "system": "system",
    "history": "history",
    "chosen": "chosen",
    "rejected": "rejected",
    "kto_tag": "label",
    "images": "images",
}
SHAREGPT_COLUMNS = {
    "system": "system",
    "chosen": "chosen",
    "rejected": "rejected",
    "kto_tag": "label",
    "images": "images",
}
SHAREGPT_TAGS = {"role_tag": "from", "content_tag": "value", "user_tag": "human", "assistant_tag": "gpt"}
OPENAI_TAGS = {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}
KNOWN_SPEAKERS = {"human", "user", "gpt", "assistant", "bot", "model", "system", "observation", "function_call", "tool"}


def map_datasets(r: Reader, stage: str, info: Mapping[str, Any] | None, folder: str) -> bool:
    """`dataset` / `eval_dataset` (and `dataset_dir`, which --dataset-dir overrides) as spec fields; True when
    `max_samples` became each training source's row cap (several data sets)."""
    capped = False
    r.take("dataset_dir")  # the folder was chosen by the caller (--dataset-dir, else this key, else data/)
    for key, spec_field in (("dataset", "dataset"), ("eval_dataset", "eval_dataset")):
        names = r.take(key)
        if names is None:
            continue
        listed = names if isinstance(names, list) else str(names).split(",")
        listed = [str(n).strip() for n in listed if str(n).strip()]
        if info is None:
            r.fail(
                key,
                f"names data sets of LLaMA-Factory's dataset_info.json ({', '.join(listed)}), and no dataset_info.json was found",
                "pass --dataset-dir with the folder that holds dataset_info.json (LLaMA-Factory's data/); "
                "in the dashboard, upload dataset_info.json and the data files together with the config",
            )
            continue
        taken: list[tuple[str, str, dict[str, str]]] = []  # (name, file or hub id, dataset_columns)
        for name in listed:
            found = _resolve(r, key, name, stage, info, folder)
            if found is not None and any(found[0] == t[1] for t in taken):
                r.note(f"{key}: {name}", f"`{found[0]}` is listed before: tunedeck reads each data set once per job")
            elif found is not None:
                taken.append((name, *found))
        if not taken and not any(p.field == key for p in r.problems):
            r.fail(
                key,
                f"names only video or audio data sets ({', '.join(listed)})",
                "tunedeck trains on text and images: name a data set of dataset_info.json without videos or audio",
            )
        elif len(taken) == 1:
            _put_one(r, key, spec_field, *taken[0])
        elif taken:
            several = _put_several(r, key, spec_field, [(source, mapping) for _, source, mapping in taken])
            capped = capped or (several and spec_field == "dataset")
    return capped


def _put_one(r: Reader, key: str, spec_field: str, name: str, source: str, mapping: dict[str, str]) -> None:
    r.put(spec_field, source, key)
    if spec_field == "dataset" and mapping:
        r.put("dataset_columns", columns_text(mapping), key)
    elif mapping:
        r.note(f"{key}: {name}", f"its column names ({columns_text(mapping)}) apply to the training data only")


def _put_several(r: Reader, key: str, spec_field: str, taken: list[tuple[str, dict[str, str]]]) -> bool:
    """Several data sets as the sources of `spec_field`, each with its own columns and max_samples cap; True when
    max_samples capped them."""
    cap = r.data.get("max_samples")
    per_source = cap if isinstance(cap, int) and not isinstance(cap, bool) and cap > 0 else None
    if per_source is not None:
        r.take("max_samples")  # LLaMA-Factory caps each data set: a per-source max_rows, not max_train_samples
    sources = [DataSource(source, per_source, columns_text(mapping) or None) for source, mapping in taken]
    r.put(spec_field, ", ".join(s.text() for s in sources), key)
    return per_source is not None


def _resolve(
    r: Reader, key: str, name: str, stage: str, info: Mapping[str, Any], folder: str
) -> tuple[str, dict[str, str]] | None:
    """(file or hub id, dataset_columns) of data set `name`; None when it cannot be taken (multimodal, a problem)."""
    entry = info.get(name)
    if not isinstance(entry, Mapping):
        close = closest(name, [str(k) for k in info])
        r.fail(
            key,
            f"`{name}` is not in dataset_info.json",
            f"did you mean `{close}`?" if close else "add it to dataset_info.json, or fix the name",
        )
        return None
    columns = entry.get("columns") or {}
    media = [c for c in MEDIA_COLUMNS if c in columns]
    if media:
        r.note(f"{key}: {name}", f"{' and '.join(media)}: tunedeck trains on text and images, not videos or audio")
        return None
    source = _source(r, key, name, entry, folder)
    if source is None:
        return None
    mapping = _columns(r, key, name, entry, stage)
    return None if mapping is None else (source, mapping)


def _source(r: Reader, key: str, name: str, entry: Mapping[str, Any], folder: str) -> str | None:
    """The file path or hub id of one dataset_info entry."""
    if entry.get("file_name"):
        return posixpath.join(folder, str(entry["file_name"]))
    hub = entry.get("hf_hub_url")
    if not hub:
        r.fail(
            key,
            f"`{name}` is neither a file (file_name) nor a Hugging Face hub data set (hf_hub_url)",
            "download it into a file and give dataset_info.json a file_name for it",
        )
        return None
    for part, default in (("subset", None), ("split", "train"), ("folder", None)):
        value = entry.get(part)
        if value and value != default:
            r.note(
                f"{key}: {name}.{part}",
                f"tunedeck reads the hub data set's default configuration and train split, not `{value}`",
            )
    return str(hub)


def _columns(r: Reader, key: str, name: str, entry: Mapping[str, Any], stage: str) -> dict[str, str] | None:
    """dataset_columns for the entry (target -> the file's column), {} when the names already fit."""
    formatting = str(entry.get("formatting") or "alpaca").strip().lower()
    columns: dict[str, Any] = {str(k): v for k, v in (entry.get("columns") or {}).items()}
    targets: dict[str, Any]
    tools = columns.pop("tools", None)
    if tools and tools != "tools":  # tunedeck reads tool schemas from a column named `tools` (jobs.data.tool_turns)
        r.note(f"{key}: {name}.columns.tools", f"tool schemas are read from a `tools` column: rename `{tools}` to it")
    if formatting == "alpaca":
        names = dict(ALPACA_COLUMNS, prompt="text") if stage == "pt" else ALPACA_COLUMNS
        targets = {names.get(k, k): v for k, v in columns.items()}
        unknown = [k for k in columns if k not in names]
    elif formatting == "sharegpt":
        tags = {**SHAREGPT_TAGS, **(entry.get("tags") or {})}
        style = _tag_style(r, key, name, tags)
        if style is None:
            return None
        messages = columns.pop("messages", "conversations")
        targets = {SHAREGPT_COLUMNS.get(k, k): v for k, v in columns.items()}
        targets[style] = messages
        unknown = [k for k in columns if k not in SHAREGPT_COLUMNS]
    else:
        r.fail(key, f"`{name}` has formatting `{formatting}`", "tunedeck reads alpaca and sharegpt data sets")
        return None
    if unknown:
        r.note(f"{key}: {name}.columns", f"{', '.join(unknown)} have no tunedeck column")
    return {target: str(source) for target, source in targets.items() if target != source and target not in unknown}


def _tag_style(r: Reader, key: str, name: str, tags: Mapping[str, Any]) -> str | None:
    """ "conversations" for {from, value} turns, "messages" for {role, content} turns; None (a problem) else."""
    pair = (tags.get("role_tag"), tags.get("content_tag"))
    speakers = {str(tags.get(t)) for t in ("user_tag", "assistant_tag", "system_tag", "observation_tag") if tags.get(t)}
    unknown = sorted(speakers - KNOWN_SPEAKERS)
    if unknown:
        r.fail(
            key,
            f"`{name}` names its speakers {', '.join(unknown)} (dataset_info.json tags)",
            "rename them in the rows to human/gpt (ShareGPT) or user/assistant",
        )
        return None
    if pair == ("from", "value"):
        return "conversations"
    if pair == ("role", "content"):
        return "messages"
    r.fail(
        key,
        f"`{name}` keeps its turns under the keys {pair[0]}/{pair[1]} (dataset_info.json tags)",
        "write the turns as {from, value} (ShareGPT) or {role, content}",
    )
    return None
