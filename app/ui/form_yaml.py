"""The launch form's spec YAML: preview and download it, fill the form from a YAML file or another tool's config.

`app.ui.form` wires these to its Preview YAML, Load YAML and Import config buttons. Import config is
`tunedeck import` (`jobs.spec.imports`) on the uploaded files: the config, and for LLaMA-Factory its
dataset_info.json and the data files it names (stored like the form's data uploads).
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from pathlib import Path
from typing import Any

import gradio as gr
import yaml

from app.ui import data as ui_data
from app.ui.data import safe_stem
from app.ui.form_spec import NAMES, form_values, problems_markdown, spec_from_form, values_of
from jobs.errors import Problem, ProblemError
from jobs.spec.imports import ImportConfigError, Imported
from jobs.spec.job import JobSpec, SpecError

PREVIEW_DIR_NAME = "tunedeck-spec-previews"
PREVIEWS_KEPT = 20


def preview_dir() -> Path:
    """One folder for every preview file (in the system temp dir, where Gradio serves from)."""
    path = Path(tempfile.gettempdir()) / PREVIEW_DIR_NAME
    path.mkdir(parents=True, exist_ok=True)
    return path


def write_preview(spec: JobSpec) -> Path:
    """The spec's YAML as a file named after the run and its content; only the newest few are kept."""
    text = spec.to_yaml()
    digest = hashlib.sha256(text.encode()).hexdigest()[:10]
    folder = preview_dir()
    out = folder / f"{safe_stem(spec.display_name)}-{digest}.yaml"
    out.write_text(text)
    old = sorted(folder.glob("*.yaml"), key=lambda p: p.stat().st_mtime, reverse=True)[PREVIEWS_KEPT:]
    for path in old:
        path.unlink(missing_ok=True)
    return out


def preview_spec(*args: Any) -> tuple[str, Any, str, Any]:
    """(YAML, download button update, error box, YAML section) for the current form values."""
    try:
        spec = spec_from_form(values_of(args))
    except SpecError as exc:
        return "", gr.DownloadButton(visible=False), problems_markdown(exc.problems), gr.skip()
    out = write_preview(spec)
    return spec.to_yaml(), gr.DownloadButton(value=str(out), visible=True), "", gr.Accordion(open=True)


def load_yaml(path: str | None) -> list[Any]:
    """Fill the form from an uploaded YAML file (and clear or fill the error box)."""
    if not path:
        return [gr.skip()] * len(NAMES) + [gr.skip()]
    try:
        spec = JobSpec.from_yaml(Path(path).read_text())
    except SpecError as exc:
        return [gr.skip()] * len(NAMES) + [problems_markdown(exc.problems)]
    except (OSError, UnicodeDecodeError) as exc:
        raise gr.Error(f"could not read {Path(path).name}: {exc}") from exc
    return form_values(spec) + [""]


def import_files(paths: list[str] | None) -> list[Any]:
    """Fill the form from another tool's config (`tunedeck import`), uploaded with, for LLaMA-Factory, its
    dataset_info.json and the data files it names; the box beside the buttons lists what was not carried over."""
    if not paths:
        return [gr.skip()] * len(NAMES) + [gr.skip()]
    try:
        spec, imported = _import(paths)
    except ProblemError as exc:  # ImportConfigError (the config's keys) or SpecError (the spec fields)
        return [gr.skip()] * len(NAMES) + [problems_markdown(exc.problems)]
    lines = [f"### Imported {imported.tool} config: check the model and the data, then launch"]
    if imported.not_carried:
        lines.append(f"{len(imported.not_carried)} key(s) not carried over:")
        lines += [f"- **{n.key}**: {n.why}" for n in imported.not_carried]
    return form_values(spec) + ["\n".join(lines)]


def _import(paths: list[str]) -> tuple[JobSpec, Imported]:
    """The config among the uploads imported, dataset_info.json's files pointed at the uploaded copies."""
    from jobs.spec.imports import build_spec, import_config

    files = [Path(p) for p in paths]
    configs = [f for f in files if f.suffix.lower() in (".yaml", ".yml")]
    if len(configs) != 1:
        raise ImportConfigError(
            [
                Problem(
                    "config",
                    f"{len(configs)} YAML files were uploaded",
                    "upload one config (.yaml/.yml), with its data files",
                )
            ]
        )
    info_file = next((f for f in files if f.name == "dataset_info.json"), None)
    stored = {f.name: ui_data.store_upload(str(f)) for f in files if f not in configs and f != info_file}
    try:
        data = yaml.safe_load(configs[0].read_text())
        info = json.loads(info_file.read_text()) if info_file else None
    except (yaml.YAMLError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ImportConfigError(
            [Problem("config", f"could not be read ({exc})", "upload a YAML config (and a JSON dataset_info.json)")]
        ) from exc
    if isinstance(info, dict):  # the names resolve to the uploaded copies; other files are not on this server
        info = {name: _pointed(entry, stored) for name, entry in info.items()}
    imported = import_config(data, dataset_info=info, dataset_dir=str(ui_data.uploads_dir()))
    return build_spec(imported), imported


def _pointed(entry: Any, stored: dict[str, Path]) -> Any:
    """A dataset_info entry whose file was uploaded, with file_name the stored copy's absolute path."""
    if not isinstance(entry, dict) or not isinstance(entry.get("file_name"), str):
        return entry
    copy = stored.get(Path(entry["file_name"]).name)
    return {**entry, "file_name": str(copy)} if copy is not None else entry
