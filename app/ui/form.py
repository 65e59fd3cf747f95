"""The launch form, generated from `jobs.spec.field_info.field_infos()`: one typed component per spec field.

Layout: presets across the top (`jobs.spec.presets`); the fields in sections by group, each field
labelled with its words and its spec name ("LoRA rank (lora_r)"), the rarely changed ones in a
closed "More" part of their section; a sticky side column with the memory slot, the Launch
button, the problems and the spec YAML. A field shows only when it applies to the chosen trainer
and method (`FieldInfo.when`, declared next to the field), and a field that does not apply takes
its default in the spec, so the YAML says only what the run uses.

Components are kept in a dict name -> component (never looked up by string id at run time);
their values become a `JobSpec` only at the edge, in `spec_from_form`. Model and data helpers
(choices, uploads, preview) live in `app.ui.data`; the memory prediction panel in `app.ui.memory`.
"""

from __future__ import annotations

import hashlib
import math
import tempfile
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import gradio as gr

from app.ui import data as ui_data
from app.ui import memory as ui_memory
from jobs.checks.access import AccessPolicy
from jobs.errors import Problem
from jobs.spec.enums import METHOD_DESCRIPTIONS, Method, Trainer
from jobs.spec.field import Group
from jobs.spec.field_info import FieldInfo, deciding_fields, field_infos
from jobs.spec.job import JobSpec, SpecError
from jobs.spec.presets import PRESET_FIELDS, PRESETS, apply_preset, describe, preset
from storage.store import Store

INFOS: list[FieldInfo] = field_infos()
NAMES: list[str] = [f.name for f in INFOS]
DECIDING: list[str] = deciding_fields()
CONDITIONAL: list[str] = [f.name for f in INFOS if f.when]
BUDGET_FIELDS = (
    "model",
    "method",
    "lora_r",
    "lora_target_modules",
    "num_virtual_tokens",
    "precision",
    "optim",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "gradient_checkpointing",
    "max_length",
    "trainer",
    "bnb_4bit_use_double_quant",
)
# Sections of the page, in order; a group not listed gets a section of its own at the end.
SECTIONS: tuple[tuple[str, tuple[Group, ...]], ...] = (
    ("Model and data", (Group.RUN, Group.MODEL, Group.DATA)),
    ("Method", (Group.METHOD,)),
    ("Memory tricks", (Group.MEMORY,)),
    ("Training", (Group.TRAINING,)),
)
# Events that read the form's fields skip Gradio's preprocessing: it would stop at the first number
# out of its range, without naming the field, where JobSpec reports every problem at once. The
# browser's number boxes still carry the ranges. The values arrive as the browser sent them.
UNCHECKED = {"preprocess": False}
PREVIEW_DIR_NAME = "tunedeck-spec-previews"
PREVIEWS_KEPT = 20
FIELD_MIN_WIDTH = 160  # five fields to a row beside the side column at 1400 px
SLIDER_STEP = 0.01
# The side column sticks to the top of the window, so the memory verdict and Launch stay in view;
# Gradio's container hides its overflow, which would pin a sticky element to the container instead
# (clip cuts the same overflow without that). Help texts show two lines; the field being edited
# shows all of its help. Long labels wrap, and a checkbox shown later keeps a field's width
# (Gradio drops its min-width to 0 and cuts the label).
FORM_CSS = """
.gradio-container { overflow: clip !important; }
#launch-side { position: sticky; top: 8px; align-self: flex-start; }
#preset-note p { margin: 0; }
#form-fields .info-text { display: -webkit-box; -webkit-box-orient: vertical;
  -webkit-line-clamp: 2; overflow: hidden; }
#form-fields .block:focus-within .info-text { -webkit-line-clamp: unset; }
#form-fields [data-testid="block-info"], #form-fields .label-text { overflow-wrap: anywhere; white-space: normal; }
#form-fields .form > .block { min-width: min(160px, 100%) !important; }
"""


# ---------------------------------------------------------------------- pure edge
def spec_from_form(values: dict[str, Any]) -> JobSpec:
    """Form values -> JobSpec; empty optional inputs mean None, fields that do not apply take their
    defaults. Raises SpecError with every problem."""
    optional = {f.name for f in INFOS if f.optional}
    data: dict[str, Any] = {}
    for name, value in values.items():
        if isinstance(value, str):
            value = value.strip()
        if name in optional and (value is None or value == ""):
            value = None
        data[name] = value
    for f in INFOS:
        if f.name in data and not f.applies(data):
            data[f.name] = f.default
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
    parts = [
        f">= {f.ge:g}" if f.ge is not None else "",
        f"> {f.gt:g}" if f.gt is not None else "",
        f"<= {f.le:g}" if f.le is not None else "",
    ]
    rng = ", ".join(p for p in parts if p)
    return f" Range: {rng}." if rng else ""


def visibility(values: dict[str, Any]) -> dict[str, bool]:
    """Which conditional fields show under these trainer/method (deciding) values."""
    return {name: _info(name).applies(values) for name in CONDITIONAL}


def number_step(f: FieldInfo) -> float:
    """The arrow-key step of a number box: 1 for whole numbers, a tenth of the default's magnitude otherwise."""
    if f.kind == "int":
        return 1
    size = abs(f.default or 0.0)
    return 10.0 ** (math.floor(math.log10(size)) - 1) if size else 0.01


def is_slider(f: FieldInfo) -> bool:
    """Floats with a short closed range and a default on the slider's 0.01 grid read best as sliders
    (dropout, beta, weight decay); a learning rate of 2e-4 in 0..1 does not."""
    low = f.ge if f.ge is not None else f.gt
    if f.kind != "float" or f.optional or low is None or f.le is None or f.le - low > 10:
        return False
    return abs(f.default / SLIDER_STEP - round(f.default / SLIDER_STEP)) < 1e-9


def _info(name: str) -> FieldInfo:
    return next(f for f in INFOS if f.name == name)


# ---------------------------------------------------------------------- components
def make_component(f: FieldInfo, visible: bool = True) -> gr.Component:
    """The typed component for one field; help text as `info`, label = words + spec name."""
    default, label = f.default, f.title
    common = {"label": label, "visible": visible, "min_width": FIELD_MIN_WIDTH}
    if f.name == "model":
        return gr.Dropdown(
            ui_data.model_choices(), value=default, info=f.help, allow_custom_value=True, filterable=True, **common
        )
    if f.name in ("dataset", "eval_dataset"):
        choices = ui_data.dataset_choices(optional=f.optional)
        return gr.Dropdown(choices, value=default or "", info=f.help, allow_custom_value=True, **common)
    if f.name == "method":  # each method with its one-line description; the value stays the enum's
        return gr.Dropdown(
            [(f"{m.value}: {METHOD_DESCRIPTIONS[m]}", m.value) for m in Method], value=default, info=f.help, **common
        )
    if f.kind == "enum":
        return gr.Dropdown(list(f.choices), value=default, info=f.help, **common)
    if f.kind == "bool":
        return gr.Checkbox(value=bool(default), info=f.help, **common)
    low = f.ge if f.ge is not None else f.gt
    if is_slider(f):
        return gr.Slider(
            minimum=low, maximum=f.le, step=SLIDER_STEP, value=default, info=f.help + bounds_text(f), **common
        )
    if f.kind in ("int", "float"):
        return gr.Number(
            value=default,
            info=f.help + bounds_text(f),
            precision=0 if f.kind == "int" else None,
            minimum=low,
            maximum=f.le,
            step=number_step(f),
            placeholder="empty: none" if f.optional else None,
            **common,
        )
    if f.name == "sample_prompts":  # one prompt per line
        return gr.Textbox(value=default or "", info=f.help, lines=3, max_lines=10, **common)
    return gr.Textbox(value=default or "", info=f.help, max_lines=1, **common)


@dataclass
class LaunchForm:
    """The launch tab's components, by name."""

    fields: dict[str, gr.Component]
    presets: dict[str, gr.Button]
    preset_note: gr.Markdown
    upload: gr.UploadButton
    data_info: gr.Markdown
    data_preview: gr.Dataframe
    memory_slot: gr.Column
    budget: gr.Markdown
    errors: gr.Markdown
    preview_btn: gr.Button
    launch_btn: gr.Button
    yaml_box: gr.Accordion
    yaml_code: gr.Code
    yaml_download: gr.DownloadButton
    yaml_upload: gr.UploadButton
    memory: ui_memory.MemoryPanel | None = None

    @property
    def inputs(self) -> list[gr.Component]:
        return [self.fields[n] for n in NAMES]


def _sections() -> list[tuple[str, list[FieldInfo]]]:
    listed = {g for _, groups in SECTIONS for g in groups}
    out = [(title, [f for f in INFOS if f.group in groups]) for title, groups in SECTIONS]
    out += [(g.value, [f for f in INFOS if f.group is g]) for g in Group if g not in listed]
    return [(title, members) for title, members in out if members]


def _fields(members: list[FieldInfo], comps: dict[str, gr.Component], shown: dict[str, bool]) -> None:
    with gr.Row(equal_height=False):
        for f in members:
            comps[f.name] = make_component(f, visible=shown.get(f.name, True))


def _memory_slot() -> gr.Markdown:
    """Today's pre-launch budget text; the memory panel (bar, verdict, Fit to GPU) takes this slot."""
    return gr.Markdown(elem_id="budget")


def build_form() -> LaunchForm:
    """Lay out the generated form; call inside a gr.Blocks context."""
    comps: dict[str, gr.Component] = {}
    shown = visibility({f.name: f.default for f in INFOS})
    with gr.Row(elem_id="presets"):
        presets = {
            p.name: gr.Button(p.name, size="sm", elem_id=f"preset-{p.name.lower().replace(' ', '-')}") for p in PRESETS
        }
    preset_note = gr.Markdown(" · ".join(f"**{p.name}**: {p.summary}" for p in PRESETS), elem_id="preset-note")
    with gr.Row(equal_height=False):
        with gr.Column(scale=7, elem_id="form-fields"):
            for title, members in _sections():
                with gr.Accordion(title, open=True):
                    _fields([f for f in members if not f.advanced], comps, shown)
                    if any(f.group is Group.DATA for f in members):
                        with gr.Row(equal_height=False):
                            upload = gr.UploadButton(
                                "Upload data (.jsonl .json .csv .parquet)",
                                file_types=list(ui_data.UPLOAD_SUFFIXES),
                                type="filepath",
                                size="sm",
                                scale=0,
                                min_width=FIELD_MIN_WIDTH,
                            )
                            data_info = gr.Markdown(elem_id="data-info")
                        with gr.Accordion("First rows of the data", open=False):
                            data_preview = gr.Dataframe(interactive=False, max_height=240, wrap=True, show_label=False)
                    advanced = [f for f in members if f.advanced]
                    if advanced:
                        with gr.Accordion(f"More: {title.lower()}", open=False):
                            _fields(advanced, comps, shown)
        with gr.Column(scale=3, elem_id="launch-side"):
            with gr.Column(elem_id="memory-slot") as memory_slot:
                budget_md = _memory_slot()
                memory = ui_memory.build_panel()
            with gr.Row():
                yaml_upload = gr.UploadButton(
                    "Load YAML", file_types=[".yaml", ".yml"], type="filepath", size="sm", min_width=80
                )
                preview_btn = gr.Button("Preview YAML", size="sm", min_width=80)
                launch_btn = gr.Button("Launch", variant="primary", elem_id="launch-btn", min_width=80)
            errors = gr.Markdown(elem_id="form-errors")
            with gr.Accordion("Spec YAML", open=False) as yaml_box:
                yaml_code = gr.Code(
                    label="Spec (YAML)", language="yaml", interactive=False, elem_id="spec-yaml", max_lines=24
                )
                yaml_download = gr.DownloadButton("Download spec YAML", visible=False, size="sm")
    return LaunchForm(
        comps,
        presets,
        preset_note,
        upload,
        data_info,
        data_preview,
        memory_slot,
        budget_md,
        errors,
        preview_btn,
        launch_btn,
        yaml_box,
        yaml_code,
        yaml_download,
        yaml_upload,
        memory,
    )


# ---------------------------------------------------------------------- handlers
def _values(args: tuple[Any, ...]) -> dict[str, Any]:
    return dict(zip(NAMES, args))


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
    out = folder / f"{ui_data.safe_stem(spec.display_name)}-{digest}.yaml"
    out.write_text(text)
    old = sorted(folder.glob("*.yaml"), key=lambda p: p.stat().st_mtime, reverse=True)[PREVIEWS_KEPT:]
    for path in old:
        path.unlink(missing_ok=True)
    return out


def preview_spec(*args: Any) -> tuple[str, Any, str, Any]:
    """(YAML, download button update, error box, YAML section) for the current form values."""
    try:
        spec = spec_from_form(_values(args))
    except SpecError as exc:
        return "", gr.DownloadButton(visible=False), problems_markdown(exc.problems), gr.skip()
    out = write_preview(spec)
    return spec.to_yaml(), gr.DownloadButton(value=str(out), visible=True), "", gr.Accordion(open=True)


def all_problems(values: dict[str, Any], policy: AccessPolicy | None = None) -> tuple[JobSpec | None, list[Problem]]:
    """The spec, or every problem: field problems plus the data check of a parseable dataset (never of
    a file `policy` keeps users from reading)."""
    try:
        return spec_from_form(values), []
    except SpecError as exc:
        problems = list(exc.problems)
    fields_bad = {p.field for p in problems}
    trainer = values.get("trainer") if "trainer" not in fields_bad else None
    for name in ("dataset", "eval_dataset"):
        ref = (values.get(name) or "").strip()
        if ref and name not in fields_bad and trainer:
            refused = (policy or AccessPolicy.open()).data_problem(ref, name)
            problems.extend([refused] if refused else ui_data.dataset_problems(ref, Trainer(trainer), name))
    return None, problems


def launch(store: Store, *args: Any, policy: AccessPolicy | None = None) -> tuple[str, int | None]:
    """Validate everything and queue; (error markdown, new run id or None)."""
    from jobs.queue.submit import submit

    policy = policy or AccessPolicy.dashboard()  # the form never queues a custom reward function
    spec, problems = all_problems(_values(args), policy)
    if spec is None:
        return problems_markdown(problems), None
    try:
        run_id = submit(store, spec, policy)
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


def choose_preset(name: str, *args: Any) -> list[Any]:
    """The preset's fields as component values, plus the line saying what changed."""
    try:
        spec = spec_from_form(_values(args))
    except SpecError as exc:  # set the preset's fields anyway; the rest keeps its problems
        values = preset(name).plain_values()
        note = f"{name} set {', '.join(_info(n).title for n in PRESET_FIELDS)}; {len(exc.problems)} problem(s) remain."
        return [values[n] for n in PRESET_FIELDS] + [note]
    new, changes = apply_preset(spec, name)
    d = new.to_dict()
    return [d[n] for n in PRESET_FIELDS] + [describe(name, changes)]


def show_applicable(*deciding: Any) -> list[Any]:
    """Visibility of every conditional field for the chosen trainer and method."""
    shown = visibility(dict(zip(DECIDING, deciding)))
    return [gr.update(visible=shown[n]) for n in CONDITIONAL]


def budget_text(*args: Any, device: ui_memory.DeviceSource | None = None) -> str:
    """Trainable parameters, the predicted peak's verdict and reason, and the cheapest change that fits."""
    try:
        spec = spec_from_form(_values(args))
    except SpecError:
        return "*Memory: fix the problems in the form to see the prediction.*"
    return ui_memory.verdict_markdown(spec, device)


def wire(form: LaunchForm, store: Store, policy: AccessPolicy | None = None) -> None:
    """Connect the form's own events (launch and clone are wired by app.ui.dashboard); none is a public API."""
    ins = form.inputs
    device = ui_memory.worker_device(store)  # predictions are for the workers' device, not this machine
    private = {"api_visibility": "private"}
    raw = {**private, **UNCHECKED}
    form.preview_btn.click(preview_spec, ins, [form.yaml_code, form.yaml_download, form.errors, form.yaml_box], **raw)
    form.yaml_upload.upload(load_yaml, form.yaml_upload, ins + [form.errors], **private)
    preset_outs = [form.fields[n] for n in PRESET_FIELDS] + [form.preset_note]
    for name, button in form.presets.items():
        button.click(partial(choose_preset, name), ins, preset_outs, **raw)
    deciding = [form.fields[n] for n in DECIDING]
    conditional = [form.fields[n] for n in CONDITIONAL]
    for comp in deciding:
        comp.change(show_applicable, deciding, conditional, show_progress="hidden", **raw)
    for name in BUDGET_FIELDS:
        form.fields[name].change(partial(budget_text, device=device), ins, form.budget, show_progress="hidden", **raw)
    if form.memory is not None:
        ui_memory.wire(
            form.memory,
            ins,
            NAMES,
            [form.fields[n] for n in BUDGET_FIELDS],
            spec_from_form,
            form_values,
            device,
            store,
            **raw,
        )
    data_in = [form.fields[name] for name in ("dataset", "trainer", "model", "max_length", "dataset_columns")]
    data_out = [form.data_info, form.data_preview]
    for name in ("dataset", "trainer", "max_length", "dataset_columns"):
        form.fields[name].change(partial(ui_data.preview_with_lengths, policy=policy), data_in, data_out, **raw)
    form.upload.upload(ui_data.save_upload, form.upload, form.fields["dataset"], **private)
