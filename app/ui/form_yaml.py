"""The launch form's spec YAML: preview and download it, or fill the form from a YAML file.

`app.ui.form` wires these to its Preview YAML and Load YAML buttons.
"""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path
from typing import Any

import gradio as gr

from app.ui.data import safe_stem
from app.ui.form_spec import NAMES, form_values, problems_markdown, spec_from_form, values_of
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
