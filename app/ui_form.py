"""The launch form, generated from `jobs.spec.field_infos()`: one typed component per spec field.

Components are kept in a dict name -> component (never looked up by string id at run time);
their values become a `JobSpec` only at the edge, in `spec_from_form`. Model and data helpers
(choices, uploads, preview) live in `app.ui_data`; the memory prediction panel in `app.ui_memory`.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gradio as gr

from app import ui_data, ui_memory
from jobs.spec import FieldInfo, Group, JobSpec, Problem, SpecError, Trainer, field_infos
from storage.store import Store

INFOS: list[FieldInfo] = field_infos()
NAMES: list[str] = [f.name for f in INFOS]
OPEN_GROUPS = set(Group)
BUDGET_FIELDS = ("model", "method", "lora_r", "lora_target_modules", "num_virtual_tokens", "precision", "optim",
                 "per_device_train_batch_size", "gradient_accumulation_steps", "gradient_checkpointing", "max_length",
                 "trainer", "bnb_4bit_use_double_quant")


# ---------------------------------------------------------------------- pure edge
def spec_from_form(values: dict[str, Any]) -> JobSpec:
    """Form values -> JobSpec; empty optional inputs mean None. Raises SpecError with every problem."""
    optional = {f.name for f in INFOS if f.optional}
    data: dict[str, Any] = {}
    for name, value in values.items():
        if isinstance(value, str):
            value = value.strip()
        if name in optional and (value is None or value == ""):
            value = None
        data[name] = value
    return JobSpec.from_dict(data)


def form_values(spec: JobSpec) -> list[Any]:
    """A spec as the list of component values, in NAMES order (for Clone and Load YAML)."""
    d = spec.to_dict()
    return [("" if d[n] is None and _info(n).kind == "str" else d[n]) for n in NAMES]


def problems_markdown(problems: list[Problem]) -> str:
    """Every problem as one bullet: field: problem. Fix: ..."""
    if not problems:
        return ""
    lines = "\n".join(f"- **{p.field}**: {p.problem}. Fix: {p.fix}" for p in problems)
    return f"### ⚠ {len(problems)} problem(s): nothing was queued\n{lines}"


def bounds_text(f: FieldInfo) -> str:
    parts = [f">= {f.ge:g}" if f.ge is not None else "", f"> {f.gt:g}" if f.gt is not None else "",
             f"<= {f.le:g}" if f.le is not None else ""]
    rng = ", ".join(p for p in parts if p)
    return f" Range: {rng}." if rng else ""


def _info(name: str) -> FieldInfo:
    return next(f for f in INFOS if f.name == name)


# ---------------------------------------------------------------------- components
def make_component(f: FieldInfo) -> gr.Component:
    """The typed component for one field; help text as `info`, label = the field's one name."""
    default = f.default
    if f.name == "model":
        return gr.Dropdown(ui_data.model_choices(), value=default, label=f.name, info=f.help,
                           allow_custom_value=True, filterable=True)
    if f.name in ("dataset", "eval_dataset"):
        choices = ui_data.dataset_choices(optional=f.optional)
        return gr.Dropdown(choices, value=default or "", label=f.name, info=f.help, allow_custom_value=True)
    if f.kind == "enum":
        return gr.Dropdown(list(f.choices), value=default, label=f.name, info=f.help)
    if f.kind == "bool":
        return gr.Checkbox(value=bool(default), label=f.name, info=f.help)
    if f.kind in ("int", "float"):
        # Bounds are shown, not enforced by gr.Number: Gradio would raise on the first bad field
        # alone, and the form reports every problem at once (JobSpec.from_dict does the checking).
        return gr.Number(value=default, label=f.name, info=f.help + bounds_text(f),
                         precision=0 if f.kind == "int" else None,
                         placeholder="empty: none" if f.optional else None)
    return gr.Textbox(value=default or "", label=f.name, info=f.help, max_lines=1)


@dataclass
class LaunchForm:
    """The launch tab's components, by name."""

    fields: dict[str, gr.Component]
    upload: gr.File
    data_info: gr.Markdown
    data_preview: gr.Dataframe
    budget: gr.Markdown
    errors: gr.Markdown
    preview_btn: gr.Button
    launch_btn: gr.Button
    yaml_code: gr.Code
    yaml_download: gr.DownloadButton
    yaml_upload: gr.File
    memory: ui_memory.MemoryPanel | None = None

    @property
    def inputs(self) -> list[gr.Component]:
        return [self.fields[n] for n in NAMES]


def build_form() -> LaunchForm:
    """Lay out the generated form; call inside a gr.Blocks context."""
    comps: dict[str, gr.Component] = {}
    with gr.Row():
        with gr.Column(scale=3):
            for group in Group:
                members = [f for f in INFOS if f.group is group]
                with gr.Accordion(group.value, open=group in OPEN_GROUPS):
                    for f in members:
                        comps[f.name] = make_component(f)
                    if group is Group.DATA:
                        upload = gr.File(label="Upload a data file (.jsonl, .json, .csv, .parquet)",
                                         file_types=list(ui_data.UPLOAD_SUFFIXES), type="filepath", height=90)
                        data_info = gr.Markdown()
                        data_preview = gr.Dataframe(label="First rows", interactive=False, max_height=240,
                                                    wrap=True)
        with gr.Column(scale=2):
            budget_md = gr.Markdown(elem_id="budget")
            memory = ui_memory.build_panel()
            with gr.Row():
                preview_btn = gr.Button("Preview spec")
                launch_btn = gr.Button("Launch", variant="primary", elem_id="launch-btn")
            errors = gr.Markdown(elem_id="form-errors")
            yaml_code = gr.Code(label="Spec (YAML)", language="yaml", interactive=False, elem_id="spec-yaml")
            yaml_download = gr.DownloadButton("Download spec YAML", visible=False)
            yaml_upload = gr.File(label="Load a spec YAML into the form", file_types=[".yaml", ".yml"],
                                  type="filepath", height=90)
    return LaunchForm(comps, upload, data_info, data_preview, budget_md, errors, preview_btn, launch_btn,
                      yaml_code, yaml_download, yaml_upload, memory)


# ---------------------------------------------------------------------- handlers
def _values(args: tuple[Any, ...]) -> dict[str, Any]:
    return dict(zip(NAMES, args))


def preview_spec(*args: Any) -> tuple[str, Any, str]:
    """(YAML, download button update, error box) for the current form values."""
    try:
        spec = spec_from_form(_values(args))
    except SpecError as exc:
        return "", gr.DownloadButton(visible=False), problems_markdown(exc.problems)
    text = spec.to_yaml()
    out = Path(tempfile.mkdtemp(prefix="tunedeck-spec-")) / f"{ui_data.safe_stem(spec.display_name)}.yaml"
    out.write_text(text)
    return text, gr.DownloadButton(value=str(out), visible=True), ""


def all_problems(values: dict[str, Any]) -> tuple[JobSpec | None, list[Problem]]:
    """The spec, or every problem: field problems plus the data check of a parseable dataset."""
    try:
        return spec_from_form(values), []
    except SpecError as exc:
        problems = list(exc.problems)
    fields_bad = {p.field for p in problems}
    trainer = values.get("trainer") if "trainer" not in fields_bad else None
    for name in ("dataset", "eval_dataset"):
        ref = (values.get(name) or "").strip()
        if ref and name not in fields_bad and trainer:
            problems.extend(ui_data.dataset_problems(ref, Trainer(trainer), name))
    return None, problems


def launch(store: Store, *args: Any) -> tuple[str, int | None]:
    """Validate everything and queue; (error markdown, new run id or None)."""
    from jobs.submit import submit

    spec, problems = all_problems(_values(args))
    if spec is None:
        return problems_markdown(problems), None
    try:
        run_id = submit(store, spec)
    except SpecError as exc:
        return problems_markdown(exc.problems), None
    return "", run_id


def load_yaml(path: str | None) -> list[Any]:
    """Fill the form from an uploaded YAML file (and clear or fill the error box)."""
    if not path:
        return [gr.skip()] * len(NAMES) + [gr.skip()]
    try:
        spec = JobSpec.from_yaml(Path(path).read_text())
    except SpecError as exc:
        return [gr.skip()] * len(NAMES) + [problems_markdown(exc.problems)]
    except (OSError, UnicodeDecodeError) as exc:
        raise gr.Error(f"could not read {Path(path).name}: {exc}")
    return form_values(spec) + [""]


def budget_text(*args: Any) -> str:
    """Trainable parameters, the predicted peak's verdict and reason, and the cheapest change that fits."""
    try:
        spec = spec_from_form(_values(args))
    except SpecError:
        return "*Memory: fix the problems in the form to see the prediction.*"
    return ui_memory.verdict_markdown(spec)


def wire(form: LaunchForm, store: Store) -> None:
    """Connect the form's own events (launch and clone are wired by app.ui)."""
    ins = form.inputs
    form.preview_btn.click(preview_spec, ins, [form.yaml_code, form.yaml_download, form.errors])
    form.yaml_upload.upload(load_yaml, form.yaml_upload, ins + [form.errors])
    for name in BUDGET_FIELDS:
        form.fields[name].change(budget_text, ins, form.budget, show_progress="hidden")
    if form.memory is not None:
        ui_memory.wire(form.memory, ins, NAMES, [form.fields[n] for n in BUDGET_FIELDS], spec_from_form, form_values)
    data_in = [form.fields[name] for name in ("dataset", "trainer", "model", "max_length")]
    data_out = [form.data_info, form.data_preview]
    for name in ("dataset", "trainer", "max_length"):
        form.fields[name].change(ui_data.preview_with_lengths, data_in, data_out)
    form.upload.upload(ui_data.save_upload, form.upload, form.fields["dataset"])
