"""The run page's export panel: the adapter merged into its base model, and GGUF files, with live progress.

"Export" runs `tunedeck export RUN --merged --dtype D [--gguf f16 q8_0]` as a child process, so
the models load there and not in the dashboard's server; its output (loading, answering the
check prompts, merging, writing, checking) streams into the panel line by line, with no fixed
timeout. When it ends, the run's export files (merged-model zips and GGUF files, each recorded
with its sha256 by `jobs.export.merged` / `jobs.export.gguf`) are listed for download. The checks are
the command's: a merged model whose answers differ from the adapter's, or a GGUF file that does
not load back with the same answers, is refused and not kept. One export at a time per dashboard.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gradio as gr

from jobs.checks.access import AccessPolicy, loading_problem
from jobs.export.merged import DTYPES
from jobs.spec.stored import spec_of
from storage.models import RunStatus
from storage.store import Store

GGUF_TYPES = ("f16", "q8_0")
EXPORT_KINDS = ("export", "gguf")  # what the server serves of an export (app.server.SERVED_ARTIFACTS)
LOG_LINES = 30
CLI = [sys.executable, "-c", "import sys; from app.cli.main import main; sys.exit(main(sys.argv[1:]))"]
REPO = Path(__file__).resolve().parents[2]


@dataclass
class ExportPanel:
    merged: gr.Checkbox
    dtype: gr.Radio
    gguf: gr.CheckboxGroup
    start: gr.Button
    log: gr.Textbox
    files: gr.File


def build() -> ExportPanel:
    """Lay out the panel; call inside the run tab."""
    with gr.Accordion("Export: merged model and GGUF", open=False, elem_id="export-panel"):
        gr.Markdown(
            "Merge the run's adapter into its base model (safetensors, for transformers and vLLM) and/or "
            "write GGUF files (llama.cpp, Ollama, LM Studio). Each is checked against the run's own answers "
            "before it is kept. Prompt, prefix and P-tuning runs cannot merge; a full fine-tune is already "
            "a whole model (GGUF still works)."
        )
        with gr.Row():
            merged = gr.Checkbox(label="Merged model (--merged)", value=True, elem_id="export-merged")
            dtype = gr.Radio(list(DTYPES), value="bf16", label="Merged dtype (--dtype)", elem_id="export-dtype")
            gguf = gr.CheckboxGroup(list(GGUF_TYPES), value=[], label="GGUF (--gguf)", elem_id="export-gguf")
            start = gr.Button("Export", variant="primary", scale=0, elem_id="export-start")
        log = gr.Textbox(label="progress", lines=8, max_lines=LOG_LINES, interactive=False, elem_id="export-log")
        files = gr.File(
            label="export files", file_count="multiple", interactive=False, visible=False, elem_id="export-files"
        )
    return ExportPanel(merged, dtype, gguf, start, log, files)


def export_files(store: Store, run_id: int) -> list[str]:
    """The run's recorded export files that exist inside the data folder (the ones the server serves)."""
    from app.ui.served_files import inside_data_dir

    found = [inside_data_dir(a.path) for a in store.artifacts(run_id) if a.kind in EXPORT_KINDS]
    return list(dict.fromkeys(str(p) for p in found if p is not None))


def files_update(store: Store, run_id: Any) -> Any:
    paths = export_files(store, int(run_id)) if run_id is not None else []
    return gr.File(value=paths or None, visible=bool(paths))


def command(run_id: int, merged: bool, dtype: str, gguf: list[str]) -> list[str]:
    """The `tunedeck export` arguments of the panel's choices."""
    argv = ["export", str(run_id)]
    if merged:
        argv += ["--merged", "--dtype", dtype]
    if gguf:
        argv += ["--gguf", *[t for t in GGUF_TYPES if t in gguf]]
    return argv


def refusal(store: Store, run_id: Any, merged: bool, gguf: list[str], policy: AccessPolicy | None) -> str | None:
    """Why the export cannot start (in words, with the fix), or None."""
    if run_id is None:
        return "Pick a run first (Runs tab, or type its id above)."
    run = store.get_run(int(run_id))
    if run is None:
        return f"No run {int(run_id)}."
    if run.status is not RunStatus.SUCCEEDED:
        return f"Run {run.id} is {run.status.value}: only a finished run has a result to export. Fix: wait for it to succeed."
    if not merged and not gguf:
        return "Nothing chosen. Fix: tick 'Merged model' and/or a GGUF type."
    problem = loading_problem(spec_of(run), run.id, policy, "export it")
    return f"{problem.problem}. Fix: {problem.fix}" if problem else None


def export(
    store: Store, policy: AccessPolicy | None, run_id: Any, merged: bool, dtype: str, gguf: list[str]
) -> Iterator[tuple[str, Any]]:
    """Run the export child and stream its output; (log text, files) after every line."""
    refused = refusal(store, run_id, merged, gguf or [], policy)
    if refused:
        yield refused, files_update(store, run_id)
        return
    rid = int(run_id)
    argv = CLI + command(rid, merged, dtype, gguf or [])
    lines = [f"$ tunedeck {' '.join(argv[len(CLI) :])}"]
    yield "\n".join(lines), gr.skip()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        argv,
        cwd=REPO,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines = (lines + [line.rstrip()])[-LOG_LINES:]
            yield "\n".join(lines), gr.skip()
        code = proc.wait()
    finally:
        if proc.poll() is None:  # the page went away mid-export: stop the child
            proc.kill()
            proc.wait()
    lines.append(
        "export finished: the files are listed below"
        if code == 0
        else f"export failed (exit code {code}): the reason and the fix are in the lines above; nothing failing "
        "its check was kept"
    )
    yield "\n".join(lines[-LOG_LINES:]), files_update(store, rid)


def wire(panel: ExportPanel, store: Store, run_id: gr.Number, policy: AccessPolicy | None = None) -> None:
    run_id.change(
        lambda rid: files_update(store, rid), run_id, panel.files, show_progress="hidden", api_visibility="private"
    )
    panel.start.click(
        lambda rid, merged, dtype, gguf: (yield from export(store, policy, rid, merged, dtype, gguf)),
        [run_id, panel.merged, panel.dtype, panel.gguf],
        [panel.log, panel.files],
        api_visibility="private",
        concurrency_id="export",
        concurrency_limit=1,
    )
