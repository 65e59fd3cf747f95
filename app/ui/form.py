"""The launch form, generated from `jobs.spec.field_info.field_infos()`: one typed component per spec field.

Layout: presets across the top (`jobs.spec.presets`); the fields in sections by group, each field
labelled with its words and its spec name ("LoRA rank (lora_r)"), the rarely changed ones in a
closed "More" part of their section; a sticky side column with the memory slot, the Launch
button, the problems and the spec YAML. A field shows only when it applies to the chosen trainer
and method (`FieldInfo.when`, declared next to the field), and a field that does not apply takes
its default in the spec, so the YAML says only what the run uses.

Components are kept in a dict name -> component (never looked up by string id at run time);
their values become a `JobSpec` only at the edge, `app.ui.form_spec`. Launch hands them to
`jobs.queue.submit.submit`, which runs the one check (`jobs.checks.pipeline.check`). Model and data
helpers (choices, uploads, preview) live in `app.ui.data`; the spec YAML buttons in
`app.ui.form_yaml`; the memory prediction panel in `app.ui.memory`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import gradio as gr

from app.ui import data as ui_data
from app.ui import memory as ui_memory
from app.ui.data_panels import DataPanels, build_panels, wire_panels
from app.ui.form_spec import (  # noqa: F401 - the form's edge, used here and by the dashboard
    CONDITIONAL,
    DECIDING,
    INFOS,
    NAMES,
    form_data,
    form_values,
    info,
    problems_markdown,
    spec_from_form,
    values_of,
    visibility,
)
from app.ui.form_yaml import import_files, load_yaml, preview_spec
from jobs.checks.access import AccessPolicy
from jobs.spec.enums import METHOD_DESCRIPTIONS, Method
from jobs.spec.field import Group
from jobs.spec.field_info import FieldInfo
from jobs.spec.job import SpecError
from jobs.spec.presets import PRESET_FIELDS, PRESETS, apply_preset, describe, preset
from jobs.spec.trackers import Tracker, trackers
from jobs.spec.tricks import checkpointing
from storage.roles_dashboard import FormDevice
from storage.roles_queue import Submitting

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
    *checkpointing.FIELDS,
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
UNCHECKED: dict[str, Any] = {"preprocess": False}
FieldComponent = ui_memory.FieldComponent
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


# ---------------------------------------------------------------------- pure helpers
def bounds_text(f: FieldInfo) -> str:
    parts = [
        f">= {f.ge:g}" if f.ge is not None else "",
        f"> {f.gt:g}" if f.gt is not None else "",
        f"<= {f.le:g}" if f.le is not None else "",
    ]
    rng = ", ".join(p for p in parts if p)
    return f" Range: {rng}." if rng else ""


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


# ---------------------------------------------------------------------- components
def make_component(f: FieldInfo, visible: bool = True) -> FieldComponent:
    """The typed component for one field; help text as `info`, label = words + spec name."""
    default, label = f.default, f.title
    common: dict[str, Any] = {"label": label, "visible": visible, "min_width": FIELD_MIN_WIDTH}
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
    if f.name == "report_to":  # several trackers at once; stored as one comma-separated text
        return gr.CheckboxGroup([t.value for t in Tracker], value=trackers(default)[0], info=f.help, **common)
    if f.kind == "enum":
        return gr.Dropdown(list(f.choices), value=default, info=f.help, **common)
    if f.kind == "bool":
        return gr.Checkbox(value=bool(default), info=f.help, **common)
    low = f.ge if f.ge is not None else f.gt
    if is_slider(f):
        assert low is not None and f.le is not None  # what makes it a slider
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

    fields: dict[str, FieldComponent]
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
    config_upload: gr.UploadButton | None = None  # Import config: a LLaMA-Factory/axolotl/trl config (+ its data)
    panels: DataPanels | None = None  # tokens the model learns from, data audit (app.ui.data_panels)
    trial: Any = None  # what `build_form(method_panel=...)` laid out under the Method section (Try rewards)

    @property
    def inputs(self) -> list[gr.Component]:
        return [self.fields[n] for n in NAMES]


def _sections() -> list[tuple[str, list[FieldInfo]]]:
    listed = {g for _, groups in SECTIONS for g in groups}
    out = [(title, [f for f in INFOS if f.group in groups]) for title, groups in SECTIONS]
    out += [(g.value, [f for f in INFOS if f.group is g]) for g in Group if g not in listed]
    return [(title, members) for title, members in out if members]


def _fields(members: list[FieldInfo], comps: dict[str, FieldComponent], shown: dict[str, bool]) -> None:
    with gr.Row(equal_height=False):
        for f in members:
            comps[f.name] = make_component(f, visible=shown.get(f.name, True))


def _memory_slot() -> gr.Markdown:
    """Today's pre-launch budget text; the memory panel (bar, verdict, Fit to GPU) takes this slot."""
    return gr.Markdown(elem_id="budget")


def _presets_row() -> tuple[dict[str, gr.Button], gr.Markdown]:
    """The presets' buttons in a row, and the line that says what each does."""
    with gr.Row(elem_id="presets"):
        presets = {
            p.name: gr.Button(p.name, size="sm", elem_id=f"preset-{p.name.lower().replace(' ', '-')}") for p in PRESETS
        }
    return presets, gr.Markdown(" · ".join(f"**{p.name}**: {p.summary}" for p in PRESETS), elem_id="preset-note")


def build_form(method_panel: Callable[[], Any] | None = None) -> LaunchForm:
    """Lay out the generated form; call inside a gr.Blocks context. `method_panel` lays out a panel under the
    Method section (the dashboard's Try rewards, `app.ui.reward_trial`; wired by the dashboard)."""
    comps: dict[str, FieldComponent] = {}
    shown = visibility({f.name: f.default for f in INFOS})
    presets, preset_note = _presets_row()
    trial = None
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
                        panels = build_panels()
                    advanced = [f for f in members if f.advanced]
                    if advanced:
                        with gr.Accordion(f"More: {title.lower()}", open=False):
                            _fields(advanced, comps, shown)
                    if method_panel is not None and any(f.group is Group.METHOD for f in members):
                        trial = method_panel()
        with gr.Column(scale=3, elem_id="launch-side"):
            with gr.Column(elem_id="memory-slot") as memory_slot:
                budget_md = _memory_slot()
                memory = ui_memory.build_panel()
            with gr.Row():
                yaml_upload = gr.UploadButton(
                    "Load YAML", file_types=[".yaml", ".yml"], type="filepath", size="sm", min_width=80
                )
                config_upload = gr.UploadButton(
                    "Import config",
                    file_types=[".yaml", ".yml", *ui_data.UPLOAD_SUFFIXES],
                    file_count="multiple",
                    type="filepath",
                    size="sm",
                    min_width=80,
                    elem_id="import-config",
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
        config_upload,
        panels,
        trial,
    )


# ---------------------------------------------------------------------- handlers
def launch(store: Submitting, *args: Any, policy: AccessPolicy | None = None) -> tuple[str, int | None]:
    """Check everything once (`jobs.checks.pipeline`, through submit) and queue; (error markdown, new run id or None)."""
    from jobs.queue.submit import submit

    policy = policy or AccessPolicy.dashboard()  # the form never queues a custom reward function
    try:
        run_id = submit(store, form_data(values_of(args)), policy)
    except SpecError as exc:
        return problems_markdown(exc.problems), None
    return "", run_id


def choose_preset(name: str, *args: Any, device: ui_memory.DeviceSource | None = None) -> list[Any]:
    """The preset's fields as component values, plus the line saying what changed; the device tricks it
    turns on are those the workers' `device` can run (unknown without one: left off)."""
    try:
        spec = spec_from_form(values_of(args))
    except SpecError as exc:  # set the preset's fields anyway; the rest keeps its problems
        values = preset(name).plain_values()
        note = f"{name} set {', '.join(info(n).title for n in PRESET_FIELDS)}; {len(exc.problems)} problem(s) remain."
        return [values[n] for n in PRESET_FIELDS] + [note]
    from jobs.checks.trick_packages import installed_modules

    new, changes = apply_preset(spec, name, device().kind == "cuda" if device else None, installed_modules())
    d = new.to_dict()
    return [d[n] for n in PRESET_FIELDS] + [describe(name, changes)]


def show_applicable(*deciding: Any) -> list[Any]:
    """Visibility of every conditional field for the chosen trainer and method."""
    shown = visibility(dict(zip(DECIDING, deciding)))
    return [gr.update(visible=shown[n]) for n in CONDITIONAL]


def memory_views(*args: Any, device: ui_memory.DeviceSource | None = None) -> tuple[str, str]:
    """(trainable parameters, the verdict and its reason and the cheapest change that fits; the memory
    bar) of the form's values, from one prediction."""
    return ui_memory.memory_views(spec_from_form, NAMES, *args, device=device)


def budget_text(*args: Any, device: ui_memory.DeviceSource | None = None) -> str:
    """The verdict text alone (`memory_views`)."""
    return memory_views(*args, device=device)[0]


def wire(form: LaunchForm, store: FormDevice, policy: AccessPolicy | None = None) -> None:
    """Connect the form's own events (launch and clone are wired by app.ui.dashboard); none is a public API."""
    ins = form.inputs
    device = ui_memory.worker_device(store)  # predictions are for the workers' device, not this machine
    private: dict[str, Any] = {"api_visibility": "private"}
    raw: dict[str, Any] = {**private, **UNCHECKED}
    form.preview_btn.click(preview_spec, ins, [form.yaml_code, form.yaml_download, form.errors, form.yaml_box], **raw)
    form.yaml_upload.upload(load_yaml, form.yaml_upload, ins + [form.errors], **private)
    if form.config_upload is not None:
        form.config_upload.upload(import_files, form.config_upload, ins + [form.errors], **private)
    preset_outs = [form.fields[n] for n in PRESET_FIELDS] + [form.preset_note]
    for name, button in form.presets.items():
        button.click(partial(choose_preset, name, device=device), ins, preset_outs, **raw)
    deciding = [form.fields[n] for n in DECIDING]
    conditional = [form.fields[n] for n in CONDITIONAL]
    for comp in deciding:
        comp.change(show_applicable, deciding, conditional, show_progress="hidden", **raw)
    read_spec = ui_data.policed_specs(spec_from_form, policy)  # a model folder the policy refuses is never read
    if form.memory is not None:  # the verdict text and the bar redraw together, from one prediction
        ui_memory.wire(
            form.memory,
            form.budget,
            ins,
            NAMES,
            [form.fields[n] for n in BUDGET_FIELDS],
            read_spec,
            form_values,
            device,
            store,
            **raw,
        )
    else:
        for name in BUDGET_FIELDS:
            form.fields[name].change(
                partial(budget_text, device=device), ins, form.budget, show_progress="hidden", **raw
            )
    data_in = [form.fields[name] for name in ("dataset", "trainer", "model", "max_length", "dataset_columns")]
    data_out = [form.data_info, form.data_preview]
    for name in ("dataset", "trainer", "model", "max_length", "dataset_columns"):
        form.fields[name].change(partial(ui_data.preview_for_form, policy=policy), data_in, data_out, **raw)
    form.upload.upload(ui_data.save_upload, form.upload, form.fields["dataset"], **private)
    if form.panels is not None:
        wire_panels(form.panels, ins, policy, **raw)
