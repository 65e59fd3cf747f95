"""The launch form's memory panel: predicted peak as a stacked bar against the device, the verdict
in plain words, the cheapest change that makes it fit, and a "Fit to GPU" button.

Display only: the prediction is the checks' memory step (`jobs.checks.memory.predict_memory`, the
one submit makes), the pick is `jobs.memory.planner.fit`.
`app.ui.form` creates the panel with `build_panel()` and connects it with `wire(...)`.
"""

from __future__ import annotations

import functools
import html
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gradio as gr

from jobs.checks.memory import Memory
from jobs.devices.facts import DeviceFacts
from jobs.spec.job import JobSpec, SpecError
from storage.roles import RunLister, WorkerDirectory

# What a spec field becomes in the launch form: each has the change event the panel listens to.
FieldComponent = gr.Dropdown | gr.CheckboxGroup | gr.Checkbox | gr.Slider | gr.Number | gr.Textbox

COLORS = {
    "weights": "#4e79a7",
    "adapter": "#59a14f",
    "gradients": "#f28e2b",
    "optimizer": "#e15759",
    "activations": "#76b7b2",
    "logits": "#edc948",
    "generation": "#9c755f",
    "reward_model": "#ff9da7",
    "vllm": "#b07aa1",
    "overhead": "#bab0ac",
    "runtime": "#d4a6c8",
}
VERDICT_COLORS = {"fits": "#2e7d32", "tight": "#b26a00", "will not fit": "#c62828"}


@dataclass
class MemoryPanel:
    bar: gr.HTML
    fit_btn: gr.Button


DeviceSource = Callable[[], DeviceFacts]
NO_SPEC = "*Memory: fix the problems in the form to see the prediction.*"


def ui_device() -> DeviceFacts:
    """This machine's device: what the panel predicts against when it has no store to ask."""
    from jobs.devices.probe import local_facts

    return local_facts()


def worker_device(store: WorkerDirectory) -> DeviceSource:
    """The device a run from this form will meet: the workers' published facts (`jobs.devices.target`),
    not the dashboard's own machine (in a deployment the dashboard may have no GPU)."""
    from jobs.devices.target import target

    return lambda: target(store).facts


def bar_html(prediction: Any) -> str:
    """A horizontal bar: one segment per part, scaled to max(device memory, total); a line at the device's size."""
    from jobs.units import human_bytes

    total, cap = prediction.total_bytes, prediction.device.total_bytes
    scale = max(total, cap, 1)
    segments = "".join(
        f'<div title="{p.name}: {human_bytes(p.bytes)}" style="width:{100 * p.bytes / scale:.2f}%;'
        f'background:{COLORS[p.name]};height:100%"></div>'
        for p in prediction.parts
        if p.bytes > 0
    )
    legend = " ".join(
        f'<span style="white-space:nowrap"><span style="display:inline-block;width:10px;height:10px;'
        f'background:{COLORS[p.name]}"></span> {p.name} {human_bytes(p.bytes)}</span>'
        for p in prediction.parts
        if p.bytes > 0
    )
    verdict = prediction.verdict.value
    bound = ""
    if prediction.from_data and prediction.worst_case_bytes is not None:
        bound = (
            f'<div id="memory-bound" style="font-size:0.85em">this data: {human_bytes(total)} '
            f"({html.escape(prediction.lengths.summary())}); any data up to max_length "
            f"{prediction.lengths.max_length}: {human_bytes(prediction.worst_case_bytes)}</div>"
        )
    device_line = f'<div style="position:absolute;left:{100 * cap / scale:.2f}%;top:-4px;bottom:-4px;border-left:2px dashed #000"></div>'
    return (
        f'<div id="memory-bar" data-verdict="{verdict}" data-total="{total}">'
        f'<div style="font-weight:600;color:{VERDICT_COLORS[verdict]}">Predicted peak {human_bytes(total)} '
        f"of {html.escape(prediction.device.name)} {human_bytes(cap)}: {verdict}</div>{bound}"
        f'<div style="position:relative;display:flex;height:18px;background:#eee;border-radius:3px;margin:4px 0">'
        f'{segments}{device_line}</div><div style="font-size:0.85em">{legend}</div></div>'
    )


def predict_for(spec: JobSpec, device: DeviceSource | None = None) -> Memory:
    """The memory step of the checks (`jobs.checks.memory.predict_memory`) on `device()` (default: this machine),
    for the data's measured token lengths (cached after the first time) when its tokenizer is here."""
    from jobs.checks.memory import measured_lengths, predict_memory

    return predict_memory(spec, (device or ui_device)(), lengths=measured_lengths(spec))


def verdict_markdown(spec: JobSpec, memory: Memory) -> str:
    """Trainable parameters, the verdict and its reason, and the cheapest change when it does not fit."""
    from jobs.memory.breakdown import Verdict, explain
    from jobs.memory.planner import cheapest_change

    prediction = memory.prediction
    if prediction is None:
        return (
            f"**Before launch**: effective batch size **{spec.effective_batch_size}**; no config.json found for "
            f"`{spec.model}` here, so no memory prediction."
        )
    pct = 100 * prediction.trainable_params / max(prediction.total_params, 1)
    lines = [
        f"**Before launch** (architecture from {memory.source}): effective batch size "
        f"**{spec.effective_batch_size}**, trainable parameters **{prediction.trainable_params:,}** of "
        f"{prediction.total_params:,} ({pct:.2f}%)"
        + (
            f"; mixture of experts: **{prediction.active_params:,}** parameters active per token"
            if prediction.active_params is not None
            else ""
        ),
        "",
        explain(prediction),
        "",
        _figures(prediction, spec),
        *_trick_lines(prediction),
    ]
    if prediction.not_modelled:
        lines.append(f"\nNot modelled: {', '.join(prediction.not_modelled)} (their activations are not counted).")
    if prediction.verdict is not Verdict.FITS:
        assert memory.arch is not None  # a prediction comes with the architecture it was made from
        change = cheapest_change(spec, memory.arch, prediction.device, memory.lengths)
        lines.append(
            f"\nCheapest change that fits: **{change}** (or press *Fit to GPU*)."
            if change
            else "\nNo combination of the memory tricks fits: shorten max_length or pick a smaller model."
        )
    return "\n".join(lines)


def _trick_lines(prediction: Any) -> list[str]:
    """The host figure of offloaded activations and what the prediction leaves unmodelled (jobs.memory.trick_effects)."""
    from jobs.units import human_bytes

    lines = []
    if prediction.host_bytes:
        lines.append(
            f"\nHost RAM: **{human_bytes(prediction.host_bytes)}** of offloaded activations, not in the device's "
            "figure: the worker's RAM must hold them."
        )
    lines += [f"\n*{n}*" for n in prediction.notes if "not modelled" in n]
    return lines


def _figures(prediction: Any, spec: JobSpec) -> str:
    """'This data: 3.1 GiB (longest row 57 tokens; ...); any data up to max_length 512: 12.7 GiB.'"""
    from jobs.units import human_bytes

    if not prediction.from_data:
        return (
            f"The figure takes every row at max_length {spec.max_length} (the data's lengths could not be measured "
            "here: its tokenizer is not on this machine or the data does not load): the real peak is lower for "
            "shorter rows."
        )
    return (
        f"This data: **{human_bytes(prediction.total_bytes)}** ({prediction.lengths.summary()}; "
        f"{prediction.batch.basis}). Any data up to max_length {spec.max_length}: "
        f"{human_bytes(prediction.worst_case_bytes)} (the bound)."
    )


def memory_views(
    spec_from_values: Callable[[dict[str, Any]], JobSpec],
    names: list[str],
    *args: Any,
    device: DeviceSource | None = None,
) -> tuple[str, str]:
    """(the verdict text, the bar) of the form's values, from one prediction."""
    try:
        spec = spec_from_values(dict(zip(names, args)))
    except SpecError:
        return NO_SPEC, ""
    memory = predict_for(spec, device)
    bar = bar_html(memory.prediction) if memory.prediction is not None else ""
    return verdict_markdown(spec, memory), bar


def fit_values(
    spec_from_values: Callable[[dict[str, Any]], JobSpec],
    to_values: Callable[[JobSpec], list[Any]],
    names: list[str],
    *args: Any,
    device: DeviceSource | None = None,
    store: RunLister | None = None,
) -> list[Any]:
    """The form values of the planner's pick for this device (a gr.Error when nothing fits)."""
    from jobs.checks.memory import measured_lengths, model_arch
    from jobs.memory.planner import fit, measured_history

    try:
        spec = spec_from_values(dict(zip(names, args)))
    except SpecError as exc:
        raise gr.Error("fix the form's problems first: " + "; ".join(str(p) for p in exc.problems)) from None
    arch, _ = model_arch(spec.model)
    if arch is None:
        raise gr.Error(f"no config.json for {spec.model} here: cannot predict its memory")
    facts = (device or ui_device)()
    history = measured_history(store, spec.model, facts) if store is not None else ()
    plan = fit(
        spec, arch, facts, history=history, lengths=measured_lengths(spec)
    )  # measured runs of this setup rank by what they did
    if not plan:
        raise gr.Error(
            "nothing fits this device by changing the memory tricks: shorten max_length or pick a smaller model"
        )
    gr.Info("Fit to GPU: " + ("; ".join(plan[0].changes) or "the form already fits"))
    return to_values(plan[0].spec)


def build_panel() -> MemoryPanel:
    """Create the panel's components (inside the form's layout)."""
    return MemoryPanel(
        bar=gr.HTML(elem_id="memory-panel"), fit_btn=gr.Button("Fit to GPU", elem_id="fit-btn", size="sm")
    )


def wire(
    panel: MemoryPanel,
    budget: gr.Markdown,
    inputs: list[gr.Component],
    names: list[str],
    watch: list[FieldComponent],
    spec_from_values: Callable[[dict[str, Any]], JobSpec],
    to_values: Callable[[JobSpec], list[Any]],
    device: DeviceSource | None = None,
    store: RunLister | None = None,
    **event: Any,
) -> None:
    """Redraw the verdict text and the bar (one prediction) when a memory-relevant field changes; Fit to GPU
    fills the form. `event`: options for every event (the form passes api_visibility and preprocessing)."""
    draw = functools.partial(memory_views, spec_from_values, names, device=device)
    for comp in watch:
        comp.change(draw, inputs, [budget, panel.bar], show_progress="hidden", **event)
    panel.fit_btn.click(
        functools.partial(fit_values, spec_from_values, to_values, names, device=device, store=store),
        inputs,
        inputs,
        **event,
    )


PREDICTED_SERIES = "predicted peak"


def with_predicted_line(rows: list[Any], predicted: dict[str, Any] | None) -> list[Any]:
    """The run page's memory rows (seconds, GiB, series) plus a flat 'predicted peak' series across them."""
    if not predicted or not rows:
        return rows
    gib = int(predicted.get("total_bytes", 0)) / 1024**3
    xs = [r[0] for r in rows]
    return rows + [(t, gib, PREDICTED_SERIES) for t in (min(xs), max(xs))]
