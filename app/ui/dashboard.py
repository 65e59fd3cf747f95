"""The tunedeck dashboard: `build_ui(store)` returns the Gradio Blocks app (launched by app.server).

Views live in their own modules: the launch form (app.ui.form, app.ui.data), the GPU panel
(app.ui.gpu), the runs table (app.ui.runs), the run page (app.ui.run; its text app.ui.run_text,
its files app.ui.served_files) with its tags/note/delete panel (app.ui.manage), the compare view
(app.ui.compare), trick sweeps (app.ui.sweep), hyperparameter searches (app.ui.search), the Chat tab (app.ui.chat) and the scripting API
(app.api). This module lays them out and wires the events that cross views: launch or select ->
run page, clone -> form, `?run=N` in the URL -> that run's page after a reload. The UI only reads
and writes the store. No view runs on a timer: what changes is pushed by the live stream
(`app.ui.live`, `app.ui.live_route`), which the page opens only for the views on screen.

    app.server.serve(host="127.0.0.1", port=7860)   # build_ui(store) + safe file-serving options

Launch it through `app.server` (or pass `app.server.launch_options(store)` to `launch`): those
options restrict downloads to the recorded bundles; a bare `launch()` would not.
"""

from __future__ import annotations

from typing import Any

import gradio as gr

from app import api
from app.api_search import SearchEndpoints
from app.ui import charts as ui_charts
from app.ui import chat as ui_chat
from app.ui import chat_preferences as ui_chat_preferences
from app.ui import compare as ui_compare
from app.ui import completions as ui_completions
from app.ui import evaluate as ui_evaluate
from app.ui import export as ui_export
from app.ui import form as ui_form
from app.ui import gpu as ui_gpu
from app.ui import manage as ui_manage
from app.ui import memory as ui_memory
from app.ui import reward_trial as ui_trial
from app.ui import run as ui_run
from app.ui import runs as ui_runs
from app.ui import search as ui_search
from app.ui import sweep as ui_sweep
from jobs.checks.access import AccessPolicy
from jobs.queue import run_actions as run_commands
from storage.roles import WorkerDirectory
from storage.roles_queue import RunActing, SearchPages, Submitting
from storage.store import Store

RUN_PAGE = "run-page"  # the concurrency group of every event that draws the run page's text

# Runs the URL update in the browser: ?run=N, so a reload reopens the same run.
_SET_URL_JS = """(id) => { if (id !== null && id !== undefined && id !== '') {
  const u = new URL(window.location.href); u.searchParams.set('run', String(id));
  window.history.replaceState(null, '', u.toString()); } return []; }"""


def build_ui(store: Store, policy: AccessPolicy | None = None) -> gr.Blocks:
    """The whole dashboard, wired to `store` (the whole `Store` the server made: each tab is handed its role, and
    together they use nearly all of it); `policy`: what its users may reach on the server
    (`jobs.checks.access`: a dashboard behind a login reads data only from its data folders)."""
    policy = policy or AccessPolicy.dashboard()  # no custom reward function from any dashboard
    page_data = ui_run.RunPageData(store)
    with gr.Blocks(title="tunedeck", analytics_enabled=False, fill_width=True) as demo:
        gr.Markdown("# tunedeck · fine-tune a language model on one GPU")
        searches = SearchEndpoints(store, policy).functions()  # the searches' endpoints (app.api_search)
        endpoints = api.wire(store, policy, searches)  # before any UI event, so the API's names are not taken
        gpu = ui_gpu.build_panel()
        with gr.Tabs(selected="launch") as tabs:
            with gr.Tab("Launch", id="launch"):
                form = ui_form.build_form(method_panel=ui_trial.build_panel)
            with gr.Tab("Runs", id="runs"):
                runs = ui_runs.build()
            with gr.Tab("Run", id="run"):
                page = ui_run.build()
                completions_panel = ui_completions.build()
                sweep_controls = ui_sweep.build_controls()
                export_panel = ui_export.build()
                evaluate_panel = ui_evaluate.build()
                manage_panel = ui_manage.build()
            with gr.Tab("Compare", id="compare") as compare_tab:
                compare = ui_compare.build()
                sweep_section = ui_sweep.build_section()
            with gr.Tab("Search", id="search") as search_tab:
                search_page = ui_search.build()
            with gr.Tab("Chat", id="chat") as chat_tab:
                chat = ui_chat.build()
                chat_preferences = ui_chat_preferences.build()
        ui_form.wire(form, store, policy)
        ui_trial.wire(form.trial, form.inputs, form.fields["trainer"], _form_values, store, policy)
        ui_gpu.wire(gpu, store)
        ui_runs.wire(runs, store)
        compare_data = ui_compare.wire(compare, store, compare_tab)
        ui_sweep.wire(sweep_controls, sweep_section, store, page.run_id, compare_tab)
        ui_search.wire(search_page, store, policy, search_tab)
        ui_manage.wire(manage_panel, store, page.run_id)
        ui_completions.wire(completions_panel, store, page.run_id, page.poll)
        ui_export.wire(export_panel, store, page.run_id, policy)
        ui_evaluate.wire(evaluate_panel, store, page.run_id, policy)
        ui_chat.wire(chat, store, chat_tab, policy)
        ui_chat_preferences.wire(chat_preferences, chat.run, store)

        _wire_search_compare(store, search_page, compare, compare_data, tabs)
        _wire_launch(store, policy, form, page, tabs)
        _wire_select(runs, page, tabs)
        _wire_run_page(page_data, page)
        _wire_scores_redraw(page_data, page, evaluate_panel)
        _wire_clone(store, form, page, tabs)
        _wire_load(demo, store, policy, form, page, tabs)
    api.publish(demo, endpoints)  # the named endpoints are the whole API; UI events stay private
    return demo


def _form_values(args: Any) -> Any:
    """The form's values as the checks read them (what Launch hands to submit)."""
    return ui_form.form_data(ui_form.values_of(tuple(args)))


def _wire_launch(
    store: Submitting, policy: AccessPolicy, form: ui_form.LaunchForm, page: ui_run.RunPage, tabs: gr.Tabs
) -> None:
    """Launch: the form's problems, or the new run's page."""

    def launch(*args: Any) -> tuple[str, Any, Any]:
        errors, run_id = ui_form.launch(store, *args, policy=policy)
        if run_id is None:
            return errors, gr.skip(), gr.skip()
        return "", run_id, gr.Tabs(selected="run")

    form.launch_btn.click(launch, form.inputs, [form.errors, page.run_id, tabs], api_name="launch", **ui_form.UNCHECKED)


def _wire_search_compare(
    store: SearchPages, search_page: ui_search.SearchPage, view: ui_compare.CompareView, data: Any, tabs: gr.Tabs
) -> None:
    """ "Compare the trials": the search's trial runs picked in the Compare tab, which opens and draws them."""

    def pick(search_id: Any) -> tuple[Any, Any]:
        ids = ui_search.trial_runs(store, search_id)
        if not ids:
            return gr.skip(), gr.skip()
        choices = [ui_compare.run_choice(r) for r in store.list_runs(limit=200)]
        known = {value for _, value in choices}
        choices += [ui_compare.run_choice(r) for r in (store.get_run(i) for i in ids if i not in known) if r]
        return gr.Dropdown(choices=choices, value=ids), gr.Tabs(selected="compare")

    hidden: dict[str, Any] = {"show_progress": "hidden", "api_visibility": "private"}
    shown = search_page.compare.click(pick, search_page.search, [view.runs, tabs], **hidden).then(
        data.compare, view.runs, view.outputs, concurrency_id=ui_compare.GRAPHS, concurrency_limit=1, **hidden
    )
    ui_charts.redraw_after(shown, view.plots, view.styles, ui_compare.GRAPHS)


def _wire_select(runs: ui_runs.RunsView, page: ui_run.RunPage, tabs: gr.Tabs) -> None:
    """A row of the runs table opens that run's page."""

    def select(evt: gr.SelectData) -> tuple[Any, Any]:
        row = evt.row_value or []
        return (int(row[0]), gr.Tabs(selected="run")) if row else (gr.skip(), gr.skip())

    runs.table.select(select, None, [page.run_id, tabs], api_visibility="private")


def _wire_run_page(page_data: ui_run.RunPageData, page: ui_run.RunPage) -> None:
    """The run page's text, its URL, and its cancel and resume buttons."""
    # The run page's text: drawn when a run is opened, and again when the page's live stream says
    # the run moved (app.ui.live); its graphs come from that stream, never from here.
    for trigger in (page.run_id.change, page.poll.click):
        trigger(
            page_data.refresh,
            [page.run_id, page.drawn],
            page.outputs,
            show_progress="hidden",
            api_visibility="private",
            concurrency_id=RUN_PAGE,
            concurrency_limit=1,
            trigger_mode="always_last",
        )
    page.run_id.change(None, page.run_id, None, js=_SET_URL_JS)
    page.cancel.click(page_data.cancel, page.run_id, None, api_visibility="private")
    page.resume.click(page_data.resume, page.run_id, None, api_visibility="private")


def _wire_scores_redraw(
    page_data: ui_run.RunPageData, page: ui_run.RunPage, evaluate_panel: ui_evaluate.EvaluatePanel
) -> None:
    """An evaluation the page followed ended: the page redraws its text (scores, the judge's column)."""
    evaluate_panel.ended.change(
        lambda rid: page_data.refresh(rid, None),
        page.run_id,
        page.outputs,
        show_progress="hidden",
        api_visibility="private",
        concurrency_id=RUN_PAGE,
        concurrency_limit=1,
    )


def _wire_clone(store: RunActing, form: ui_form.LaunchForm, page: ui_run.RunPage, tabs: gr.Tabs) -> None:
    """Clone: the run's spec back into the Launch form."""

    def clone(run_id: float | None) -> list[Any]:
        if run_id is None:
            raise gr.Error("Open a run first.")
        try:
            spec = run_commands.clone(store, run_id, "run")
        except run_commands.RunCommandError as exc:
            raise gr.Error(str(exc)) from None
        return ui_form.form_values(spec) + [gr.Tabs(selected="launch")]

    page.clone.click(clone, page.run_id, form.inputs + [tabs], api_visibility="private")

    def clone_with_fix(run_id: float | None, fix: Any) -> list[Any]:
        """The form filled as Clone does, with the chosen finding's spec change applied (`tunedeck clone ID --fix N`)."""
        if run_id is None or fix is None:
            raise gr.Error("Open a run with a finding of the training doctor first.")
        try:
            spec = run_commands.clone(store, run_id, "run", fix=int(fix))
        except run_commands.RunCommandError as exc:
            raise gr.Error(str(exc)) from None
        return ui_form.form_values(spec) + [gr.Tabs(selected="launch")]

    page.clone_fix.click(clone_with_fix, [page.run_id, page.fix], form.inputs + [tabs], api_visibility="private")


def _wire_load(
    demo: gr.Blocks,
    store: WorkerDirectory,
    policy: AccessPolicy,
    form: ui_form.LaunchForm,
    page: ui_run.RunPage,
    tabs: gr.Tabs,
) -> None:
    """What a page load does: open `?run=N`, and fill the Launch form's prediction and preview."""

    # Two load events, not one: `?run=N` opens that run's page at once, while the Launch form's
    # first memory prediction and data preview (cold imports: tens of seconds on a loaded machine)
    # fill the form on their own, instead of holding the run page back until they are done.
    def open_run(request: gr.Request) -> list[Any]:
        raw = dict(request.query_params).get("run", "") if request else ""
        return [int(raw), gr.Tabs(selected="run")] if raw.isdigit() else [gr.skip(), gr.skip()]

    def fill_form() -> list[Any]:
        values = [c.value for c in form.inputs]
        budget, bar = ui_form.memory_views(*values, device=device)  # one prediction for both
        preview = ui_data_preview(form, policy)
        # gr.Number renders a missing initial value as 0; an explicit None empties the box.
        return [budget, bar, *preview, *([None] * len(optional_numbers))]

    optional_numbers = [form.fields[f.name] for f in ui_form.INFOS if f.optional and f.kind in ("int", "float")]
    device = ui_memory.worker_device(store)
    assert form.memory is not None  # the dashboard's form always has its panel
    demo.load(open_run, None, [page.run_id, tabs], api_visibility="private")
    demo.load(
        fill_form,
        None,
        [form.budget, form.memory.bar, form.data_info, form.data_preview, *optional_numbers],
        api_visibility="private",
    )


def ui_data_preview(form: ui_form.LaunchForm, policy: AccessPolicy | None = None) -> tuple[str, Any]:
    from app.ui.data import preview_dataset

    return preview_dataset(form.fields["dataset"].value, form.fields["trainer"].value, policy=policy)
