"""The run page's completions inspector (grpo): a step slider over the steps whose completions the run kept, and
that step's prompts, completions, each reward's score and the advantages (`jobs.train.completions`).

    panel = build()                          # under the run page's graphs; hidden for a run with no completions
    wire(panel, store, page.run_id, page.poll)

The slider spans the kept steps; a value between two shows the nearest kept step (the run keeps every
`completions_every`-th logged step, at most 100, thinned evenly). Each group of `num_generations` rows
is one prompt's group: a group whose scores are all equal (advantages 0) taught nothing at that step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gradio as gr

from storage.roles_pages import RunText


@dataclass
class CompletionsPanel:
    box: gr.Accordion
    slider: gr.Slider
    summary: gr.Markdown
    table: gr.Dataframe
    latest: gr.State  # the newest kept step when the view was last drawn: a slider there follows new steps


def build() -> CompletionsPanel:
    """Lay out the inspector (hidden until a run with kept completions is shown)."""
    with gr.Accordion("Completions at a step (grpo)", open=True, visible=False, elem_id="run-completions") as box:
        slider = gr.Slider(0, 1, value=0, step=1, label="Step", elem_id="completions-step")
        summary = gr.Markdown(elem_id="completions-summary")
        table = gr.Dataframe(
            interactive=False, wrap=True, max_height=480, show_label=False, elem_id="completions-table"
        )
    return CompletionsPanel(box, slider, summary, table, gr.State(None))


def kept_steps(store: RunText, run_id: Any) -> list[int]:
    """The steps whose completions run `run_id` kept ([] for none or no such run)."""
    from jobs.train.completions import completion_steps

    if run_id is None or store.get_run(int(run_id)) is None:
        return []
    return completion_steps(store.run_path(int(run_id)))


def nearest(steps: list[int], value: Any) -> int | None:
    """The kept step nearest to the slider's value (the later one on a tie)."""
    if not steps:
        return None
    wanted = float(value) if value is not None else steps[-1]
    return min(reversed(steps), key=lambda s: abs(s - wanted))


def step_view(store: RunText, run_id: Any, value: Any) -> tuple[str, dict[str, Any]]:
    """(summary markdown, table) of the kept step nearest `value`."""
    from jobs.train.completions import read_step

    steps = kept_steps(store, run_id)
    step = nearest(steps, value)
    if step is None:
        return "No completions kept yet.", {"headers": ["completion"], "data": []}
    data = read_step(store.run_path(int(run_id)), step)
    names = data["rewards"]
    rows = [
        [r["prompt"], r["completion"], *(_num(r["scores"].get(n)) for n in names), _num(r["advantage"])]
        for r in data["rows"]
    ]
    flat = sum(1 for r in data["rows"] if r["advantage"] == 0.0)
    text = (
        f"**Step {step}**: {len(rows)} completions, {flat} with advantage 0 "
        f"(kept steps: {len(steps)}, {steps[0]} to {steps[-1]})."
    )
    return text, {"headers": ["prompt", "completion", *names, "advantage"], "data": rows}


def _num(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


def opened(store: RunText, run_id: Any, shown: Any = None, latest: Any = None) -> tuple[Any, Any, str, Any, Any]:
    """(accordion, slider, summary, table, newest step) for a run: hidden without kept completions, else at its
    last step; on a refresh (`latest`: the newest step when last drawn) a slider the user moved back to an earlier
    step stays there, while one at the newest follows the run to its next kept step."""
    steps = kept_steps(store, run_id)
    if not steps:
        return gr.update(visible=False), gr.update(), "", gr.update(), None
    stays = latest is not None and shown is not None and float(shown) < float(latest)
    step = nearest(steps, shown) if stays else steps[-1]
    text, table = step_view(store, run_id, step)
    low, high = steps[0], steps[-1]
    slider = gr.update(minimum=low, maximum=max(high, low + 1), value=step, step=1, interactive=len(steps) > 1)
    return gr.update(visible=True), slider, text, gr.update(value=table), high


def wire(panel: CompletionsPanel, store: RunText, run_id: gr.Number, poll: gr.Button) -> None:
    """Open a run (or see it move) -> the slider and the last kept step; the slider -> that step."""
    private: dict[str, Any] = {"api_visibility": "private"}
    outs = [panel.box, panel.slider, panel.summary, panel.table, panel.latest]
    run_id.change(lambda rid: opened(store, rid), run_id, outs, show_progress="hidden", **private)
    poll.click(
        lambda rid, shown, latest: opened(store, rid, shown, latest),
        [run_id, panel.slider, panel.latest],
        outs,
        show_progress="hidden",
        **private,
    )

    def moved(rid: Any, value: Any) -> tuple[str, Any]:
        text, table = step_view(store, rid, value)
        return text, gr.update(value=table)

    panel.slider.change(moved, [run_id, panel.slider], [panel.summary, panel.table], show_progress="hidden", **private)
