"""Importance-matrix GGUF quants (`--gguf q4_k_m --imatrix`, `iq4_xs`): llama.cpp's llama-imatrix over calibration
text (the run's training rows, or a file), then llama-quantize with it; refused before queueing where the tools
are not built (`./dev.sh gguf` builds them), and checked like every other file."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
from engines import engine_missing, import_or_missing
from test_gguf_export import _finished_by_hand as finished_run

import jobs.export.llamacpp
from jobs.export.converter import CONVERTER_ENV
from jobs.export.merged import ExportError
from jobs.worker.tasks import cli_args, describe, request_export

BACKENDS = ("sqlite",)  # requests only read and write the store; its backends are tested elsewhere


@pytest.fixture
def no_tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A llama.cpp folder without llama-imatrix and llama-quantize (a worker set up without `./dev.sh gguf`)."""
    folder = tmp_path / "llama.cpp"
    folder.mkdir()
    monkeypatch.setenv(CONVERTER_ENV, str(folder))
    monkeypatch.setattr(jobs.export.llamacpp, "llama_cpp_installed", lambda: True)  # the binding is not the point
    return folder


def test_imatrix_quants_without_the_tools_are_refused_before_queueing(store, tiny_model: Path, no_tools: Path) -> None:
    from jobs.export.gguf import export_gguf

    run_id = finished_run(store, tiny_model)  # a full fine-tune whose model folder is the tiny model
    for gguf, imatrix in ((["f16", "q4_k_m"], True), (["iq4_xs"], False)):  # an IQ type always takes one
        with pytest.raises(ExportError) as err:
            request_export(store, run_id, merged=True, dtype="fp32", gguf=gguf, imatrix=imatrix)
        (problem,) = err.value.problems
        assert problem.field == "imatrix", problem
        assert "llama-imatrix and llama-quantize" in problem.problem and "not built here" in problem.problem
        assert "./dev.sh gguf" in problem.fix, problem
    assert store.run_tasks(run_id) == []  # nothing queued: not the merged model, not the f16
    with pytest.raises(ExportError, match="llama-imatrix and llama-quantize"):
        export_gguf(store, run_id, "q4_k_m", imatrix=True)  # the command itself refuses before loading anything


def test_imatrix_requests_name_what_is_wrong_and_queue_the_tools_arguments(
    store, tiny_model: Path, no_tools: Path, tmp_path: Path
) -> None:
    (no_tools / "bin").mkdir()
    for tool in ("llama-imatrix", "llama-quantize"):  # present (never run here)
        (no_tools / "bin" / tool).write_text("#!/bin/sh\nexit 1\n")
        (no_tools / "bin" / tool).chmod(stat.S_IRWXU)
    run_id = finished_run(store, tiny_model)
    with pytest.raises(ExportError) as err:
        request_export(store, run_id, merged=False, dtype="fp32", gguf=["f16"], imatrix=True)
    assert [p.field for p in err.value.problems] == ["imatrix"] and "q4_k_m" in err.value.problems[0].fix
    with pytest.raises(ExportError) as err:
        request_export(store, run_id, False, "fp32", ["q4_k_m"], imatrix=True, calibration=str(tmp_path / "no.txt"))
    ((field, problem),) = [(p.field, p.problem) for p in err.value.problems]
    assert field == "calibration" and "no.txt does not exist" in problem
    with pytest.raises(ExportError, match="used only with an importance matrix"):
        request_export(store, run_id, False, "fp32", ["q4_k_m"], calibration=str(tmp_path / "no.txt"))
    assert store.run_tasks(run_id) == []
    text = tmp_path / "calibration.txt"
    text.write_text("The moon is a rock.\n" * 50)
    ids = request_export(store, run_id, False, "fp32", ["f16", "q4_k_m"], imatrix=True, calibration=str(text))
    plain, weighted = store.tasks_of(ids)
    assert plain.args == {"gguf_type": "f16"} and cli_args(plain)[-2:] == ["--gguf", "f16"]
    assert weighted.args == {"gguf_type": "q4_k_m", "imatrix": True, "calibration": str(text)}
    assert cli_args(weighted)[2:] == ["--gguf", "q4_k_m", "--imatrix", "--calibration", str(text)]
    assert describe(weighted) == "GGUF q4_k_m (importance matrix)"


def test_training_rows_become_calibration_text_as_training_renders_them(tiny_model: Path) -> None:
    from transformers import AutoTokenizer

    from jobs.export.imatrix import context_for, row_text

    tok = AutoTokenizer.from_pretrained(str(tiny_model))
    chat = {"messages": [{"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Hello."}]}
    rendered = row_text(chat, tok)
    assert rendered == tok.apply_chat_template(chat["messages"], tokenize=False) and "Hi there" in rendered
    assert row_text({"prompt": "Q: 2+2?", "completion": " 4"}, tok) == "Q: 2+2?\n 4"
    assert row_text({"text": "plain text"}, tok) == "plain text"
    assert context_for(10_000, {"max_position_embeddings": 256}) == 256  # never past what the model was made for
    assert context_for(300, {"max_position_embeddings": 8192}) == 149  # two chunks of the text at least
    with pytest.raises(RuntimeError, match="calibration text is 20 tokens"):
        context_for(20, {})


@pytest.mark.integration
def test_an_imatrix_q4_k_m_is_calibrated_on_the_training_rows_and_checked(store, tiny_model: Path) -> None:
    """The tiny model as a finished run, exported as Q4_K_M with an importance matrix of its spec's training rows:
    llama-imatrix and llama-quantize ran (the file names its matrix), and the file passed llama.cpp's read-back."""
    import_or_missing("llama_cpp", fix="./dev.sh gguf")
    from gguf import GGUFReader

    from jobs.export.gguf import K_FORCED_AGREEMENT, export_gguf
    from jobs.export.imatrix import imatrix_problem

    if problem := imatrix_problem():
        engine_missing(f"{problem}: ./dev.sh gguf")
    run_id = finished_run(store, tiny_model)
    result = export_gguf(store, run_id, "q4_k_m", imatrix=True)
    check = result.check
    assert check.passed and result.path.name.endswith("-q4_k_m-imatrix.gguf"), check
    assert check.llama_cpp is not None and check.llama_cpp["forced_agreement"] >= K_FORCED_AGREEMENT, check
    assert check.imatrix is not None and check.imatrix["calibration"] == "the run's 16 training rows", check.imatrix
    assert check.imatrix["chunks"] >= 2, check.imatrix
    fields = GGUFReader(str(result.path)).fields
    assert fields["quantize.imatrix.chunks_count"].contents() == check.imatrix["chunks"]
    saved = json.loads(result.path.with_name(result.path.name.replace(".gguf", ".check.json")).read_text())
    assert saved["imatrix"] == check.imatrix
    assert "importance matrix of the run's 16 training rows" in (result.path.parent / "README.md").read_text()
    assert [Path(a.path).name for a in store.artifacts(run_id) if a.kind == "gguf"] == [result.path.name]
    assert not [p.name for p in result.path.parent.iterdir() if p.name.startswith((".", "imatrix-"))]


def test_a_tool_still_running_when_the_export_stops_is_killed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C (or any exception) while llama-imatrix runs ends it too; a cancelled task's SIGTERM reaches it
    anyway, in the task's process group."""
    import subprocess

    from jobs.export import imatrix

    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "llama-imatrix").write_text("#!/bin/sh\nexec sleep 600\n")
    (tmp_path / "bin" / "llama-imatrix").chmod(stat.S_IRWXU)
    monkeypatch.setenv(CONVERTER_ENV, str(tmp_path))
    children: list[subprocess.Popen[bytes]] = []
    real_wait = subprocess.Popen.wait

    def interrupted(self: subprocess.Popen[bytes], timeout: float | None = None) -> int:
        children.append(self)
        if len(children) == 1:
            raise KeyboardInterrupt  # while the tool runs
        return real_wait(self, timeout)

    monkeypatch.setattr(subprocess.Popen, "wait", interrupted)
    with pytest.raises(KeyboardInterrupt):
        imatrix._run(["llama-imatrix", "-m", "model.gguf"])
    assert children[0].returncode is not None and children[0].returncode < 0  # killed by a signal, and reaped


def test_remote_agents_ask_for_an_importance_matrix_but_never_name_a_file_of_the_worker() -> None:
    """The MCP tool (and the dashboard's checkbox) calibrate on the run's own rows; a calibration file is a path on
    the worker's machine, named only on its command line."""
    import inspect

    from app.mcp_tools import export_tasks

    params = inspect.signature(export_tasks).parameters
    assert "imatrix" in params and "calibration" not in params
