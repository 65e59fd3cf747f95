"""Model and data helpers behind the launch form: choices, uploads, preview.

Everything here is read-only towards the training side: it lists built-in and cached models,
saves uploads under `storage.settings.uploads_dir()`, and calls `jobs.data.inspection.check_dataset` for
the preview and its row-numbered errors (`jobs.checks.datasets.length_warnings_for` for the rows
max_length would cut). Nothing here reaches the network; the launch checks are `jobs.checks.pipeline`'s.
"""

from __future__ import annotations

import functools
import json
import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gradio as gr
import pandas as pd

from app.ui.thumbnails import model_images_line, preview_table, with_thumbnails
from jobs.checks.access import AccessPolicy
from jobs.spec.enums import Trainer
from jobs.spec.job import JobSpec, SpecError
from storage.settings import uploads_dir

if TYPE_CHECKING:
    from jobs.data.inspection import DatasetInfo  # imports `datasets` (seconds): for the type only

log = logging.getLogger(__name__)

# The preview reads only this many rows of each source (a big file is never read whole); the launch checks all.
PREVIEW_ROWS = 2000
PARTLY_READ = (
    f"\n- the preview read only the first {PREVIEW_ROWS} rows of a bigger data set; launching checks every row "
    "(and measures row lengths against max_length)"
)
# longest first; a .zip holds one data file and its images (jobs.data.archive)
UPLOAD_SUFFIXES = (".jsonl.gz", ".json.gz", ".jsonl", ".json", ".csv", ".parquet", ".zip")


def builtin_models() -> list[str]:
    from jobs.models.registry import BUILTIN_MODELS

    return list(BUILTIN_MODELS)


@functools.lru_cache(maxsize=1)
def cached_hub_models() -> tuple[str, ...]:
    """Model repos in the local Hugging Face cache (no network); empty when there is no cache."""
    from huggingface_hub import CacheNotFound, scan_cache_dir

    try:
        info = scan_cache_dir()
    # scan_cache_dir's own refusals: no cache folder (CacheNotFound), a file where the folder should be
    # (ValueError), one it cannot read (OSError). The list is a convenience: the model field takes any id.
    except (CacheNotFound, ValueError, OSError) as exc:
        log.info("no cached hub models listed: %s", exc)
        return ()
    return tuple(sorted(r.repo_id for r in info.repos if r.repo_type == "model"))


def model_choices() -> list[str]:
    return builtin_models() + [m for m in cached_hub_models() if m not in builtin_models()]


def uploaded_files() -> list[str]:
    return sorted(str(p) for p in uploads_dir().iterdir() if upload_suffix(p.name))


def upload_suffix(name: str) -> str | None:
    """The supported data suffix a file name ends with (`.jsonl.gz` counts as one), or None."""
    return next((s for s in UPLOAD_SUFFIXES if name.lower().endswith(s)), None)


def sample_refs() -> list[str]:
    try:
        from jobs.data.sources import list_samples

        return list_samples()
    except ImportError:
        return ["sample:chat-format", "sample:kto-format", "sample:preference-format"]


def dataset_choices(optional: bool = False) -> list[str]:
    """The bundled samples, the uploads and the preference sets made in the Chat tab (`jobs.data.preferences`)."""
    from jobs.data.preferences import files as preference_files

    return ([""] if optional else []) + sample_refs() + uploaded_files() + preference_files()


def safe_stem(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.")[:80] or "file"


def save_upload(path: str | None) -> Any:
    """Copy an uploaded file under uploads_dir() (content-addressed name) and select it as dataset."""
    if not path:
        return gr.skip()
    return gr.Dropdown(choices=dataset_choices(), value=str(store_upload(path)))


def store_upload(path: str) -> Path:
    """An uploaded data file copied under uploads_dir() (content-addressed name), streamed in chunks and capped
    at TUNEDECK_MAX_UPLOAD_MB (`storage.uploads`); gr.Error for a bad one, and then nothing is kept."""
    from storage.settings import max_upload_mb
    from storage.uploads import UploadRefused, keep_upload

    src = Path(path)
    suffix = upload_suffix(src.name)
    if suffix is None:
        raise gr.Error(f"{src.name}: expected one of {', '.join(UPLOAD_SUFFIXES)}")
    try:
        return keep_upload(src, uploads_dir(), safe_stem(src.name[: -len(suffix)]), suffix, max_upload_mb() * 2**20)
    except UploadRefused as exc:
        raise gr.Error(str(exc)) from exc


def preview_dataset(
    ref: str | None, trainer: str | None, columns: str | None = None, policy: AccessPolicy | None = None
) -> tuple[str, pd.DataFrame]:
    """(format + conversion + rows + warnings or the row errors, first converted rows) of the chosen data set;
    a file `policy` keeps users from reading is refused before it is opened."""
    from jobs.data.loading import check_sources
    from jobs.data.sources import DataError
    from jobs.spec.columns import parse_columns

    empty = pd.DataFrame()
    if not ref or not ref.strip():
        return "", empty
    policy = policy or AccessPolicy.open()
    refused = policy.data_problem(ref, "dataset")
    if refused is not None:
        return f"**{refused.field}**: {refused.problem}. Fix: {refused.fix}", empty
    column_map, bad = parse_columns(columns) if columns and columns.strip() else ({}, [])
    if bad:
        lines = "\n".join(f"- **dataset_columns**: {problem}. Fix: {fix}" for problem, fix in bad)
        return f"**Data problems**\n{lines}", empty
    try:
        with policy.reading():  # the images the rows name: from the data folders only, for a restricted user
            pairs = check_sources(ref.strip(), Trainer(trainer or "sft"), column_map, limit=PREVIEW_ROWS)
            text, rows = _previewed(pairs, ref.strip())
    except DataError as exc:
        lines = "\n".join(f"- **{p.field}**: {p.problem}. Fix: {p.fix}" for p in exc.problems)
        return f"**Data problems**\n{lines}", empty
    except ValueError as exc:
        return f"**Data problem**: {exc}", empty
    if any(info.n_rows == PREVIEW_ROWS for _, info in pairs):  # JSON lines and hub data stop there
        text += PARTLY_READ
    return text, rows


def _previewed(pairs: list[tuple[Any, DatasetInfo]], ref: str) -> tuple[str, pd.DataFrame]:
    """The preview's text and first rows (thumbnails read under the caller's restriction)."""
    from jobs.data.mixing import combined

    info = combined(pairs, ref)
    if len(pairs) > 1:  # the mixture in one line, then one line per source: what each holds and became
        text = f"Detected format: **{info.format.value}** · {len(pairs)} data sets mixed and shuffled with the seed · "
        text += f"{info.n_rows} rows in all" + "".join(f"\n- {_describe(part, s.max_rows)}" for s, part in pairs)
        text += "".join(f"\n- {w}" for w in info.warnings)
        rows = [{k: _cell(v) for k, v in r.items()} for r in with_thumbnails(info.preview)]
        return text, pd.DataFrame(rows)
    warn = "".join(f"\n- {w}" for w in info.warnings)
    text = f"Detected format: **{info.format.value}** · {info.n_rows} rows · columns {', '.join(info.columns)}{warn}"
    if info.conversion:
        text = (
            f"Detected format: **{info.source_format}**, converted to **{info.format.value}** · {info.n_rows} rows · "
            f"columns {', '.join(info.columns)}\n- {info.conversion}; the rows below are the converted ones{warn}"
        )
    if info.column_map:
        text += "\n- dataset_columns: " + ", ".join(f"`{c}` read as `{t}`" for t, c in info.column_map.items())
    rows = [{k: _cell(v) for k, v in r.items()} for r in with_thumbnails(info.preview)]
    return text, pd.DataFrame(rows)


def preview_with_lengths(
    ref: str | None,
    trainer: str | None,
    model: str | None,
    max_length: float | None,
    columns: str | None = None,
    policy: AccessPolicy | None = None,
) -> tuple[str, pd.DataFrame]:
    """The preview plus how many rows max_length would truncate (when the tokenizer is on disk) and whether the
    model takes images (when its config is on disk)."""
    policy = policy or AccessPolicy.open()
    text, rows = preview_dataset(ref, trainer, columns, policy)
    refused = policy.model_problem(model)
    if refused is not None:  # its folder is not read: no length or image line that would tell what it holds
        return text + f"\n- **model**: {refused.problem}. Fix: {refused.fix}", rows
    if not text.startswith("Detected format"):
        return text, rows
    with policy.reading():  # model files (and images) from the data folders only, for a restricted user
        if PARTLY_READ not in text:  # a big file's rows are measured at launch, not read whole here
            text += length_warning_text(ref, trainer, model, max_length, columns)
        text += model_images_line(model)
    return text, rows


def preview_for_form(
    ref: str | None,
    trainer: str | None,
    model: str | None,
    max_length: float | None,
    columns: str | None = None,
    policy: AccessPolicy | None = None,
) -> tuple[str, Any]:
    """`preview_with_lengths` for the launch form: its table's image column shows the thumbnails."""
    text, rows = preview_with_lengths(ref, trainer, model, max_length, columns, policy)
    return text, preview_table(rows)


def policed_specs(
    spec_from_values: Callable[[dict[str, Any]], JobSpec], policy: AccessPolicy | None
) -> Callable[[dict[str, Any]], JobSpec]:
    """`spec_from_values` refusing (SpecError) a `model:` folder that `policy` keeps users from naming, so that the
    form's memory panel never reads its config (its answer would tell whether the folder exists)."""
    if policy is None or not policy.restricted:
        return spec_from_values

    def read(values: dict[str, Any]) -> JobSpec:
        spec = spec_from_values(values)
        refused = policy.model_problem(spec.model)
        if refused is not None:
            raise SpecError([refused])
        return spec

    return read


def length_warning_text(
    ref: str | None, trainer: str | None, model: str | None, max_length: float | None, columns: str | None = None
) -> str:
    """'N of M rows are longer than max_length ...' for the preview; '' when none are or it cannot tell
    (`jobs.checks.datasets.length_warnings_for`: the model's tokenizer only when it is on disk)."""
    from jobs.checks.datasets import length_warnings_for

    if not ref or not model or not max_length:
        return ""
    try:
        chosen = Trainer(trainer or "sft")
    except ValueError:
        return ""
    warnings = length_warnings_for(ref, chosen, model, int(max_length), (columns or "").strip() or None)
    return "".join(f"\n- {w}" for w in warnings)


def _describe(info: DatasetInfo, max_rows: int | None) -> str:
    """One source of a mixture in one line: its format (and what was converted), rows used, columns and mapping."""
    rows = (
        f"{max_rows} of its {info.n_rows} rows (max_rows)"
        if max_rows and max_rows < info.n_rows
        else f"{info.n_rows} rows"
    )
    text = f"`{info.ref}`: **{info.format.value}** · {rows} · columns {', '.join(info.columns)}"
    if info.conversion:
        text += f" · {info.source_format} converted ({info.conversion}; the rows below are the converted ones)"
    if info.column_map:
        text += " · dataset_columns: " + ", ".join(f"`{c}` read as `{t}`" for t, c in info.column_map.items())
    return text


def _cell(v: Any) -> str:
    text = v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)
    if text.startswith("<img "):  # thumbnails (`app.ui.thumbnails`): whole, or the picture breaks
        return text
    return text if len(text) <= 300 else text[:300] + "…"
