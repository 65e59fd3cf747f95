"""GGUF of the families tunedeck's own writer refuses: written by llama.cpp's converter (kept in the venv by
`./dev.sh gguf`), read back by llama.cpp, agreeing with the model they were written from.

Each family is a tiny random-weight model of `jobs.models.zoo` (hidden 64, 2 layers, the tiny 512-token tokenizer)
recorded as a finished full fine-tune (its model folder is the merged model the export starts from: no training
needed), exported to f16 and Q4_K_M through `export_gguf`, the path the export task runs.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
from engines import import_or_missing
from test_gguf_export import _converter as _converter_installed
from test_gguf_export import _finished_by_hand

from jobs.export.gguf import K_FORCED_AGREEMENT, export_gguf
from jobs.export.gguf_checks import F16_FORCED_AGREEMENT
from jobs.export.merged import ExportError

pytestmark = pytest.mark.integration

# family -> what its tiny model changes to be like the family's released models (llama.cpp reads those)
FAMILIES: dict[str, dict[str, Any]] = {
    "mistral": {"config": {"sliding_window": None}},  # Mistral 7B v0.2 on: no sliding window
    "qwen3": {},
    "gemma3_text": {"config": {"query_pre_attn_scalar": 16}},  # released Gemma 3: the head width (llama.cpp assumes it)
    "phi3": {"tokenizer_class": "GPT2Tokenizer"},  # Phi-4-mini: a Phi3ForCausalLM with a byte-level BPE tokenizer
    "olmo2": {},
    "granite": {},
    "stablelm": {},
    "qwen3_moe": {},  # a mixture of experts
}


def _converter() -> None:
    """The binding and the converter: `./dev.sh gguf` (CI's `./dev.sh test` too) installs both."""
    import_or_missing("llama_cpp", fix="./dev.sh gguf")
    _converter_installed()


def family_folder(dest: Path, family: str) -> Path:
    """The zoo's tiny model of `family`, copied to `dest` with the family's changes."""
    from jobs.models.zoo import build_zoo_model

    built = build_zoo_model(dest.parent / f"zoo-{family}", family)
    shutil.copytree(built, dest)
    changes = FAMILIES.get(family, {})
    if changes.get("config"):
        config = json.loads((dest / "config.json").read_text())
        (dest / "config.json").write_text(json.dumps({**config, **changes["config"]}, indent=2))
    if changes.get("tokenizer_class"):
        tok = json.loads((dest / "tokenizer_config.json").read_text())
        (dest / "tokenizer_config.json").write_text(json.dumps({**tok, "tokenizer_class": changes["tokenizer_class"]}))
    return dest


def finished_full_run(store: Any, folder: Path) -> int:
    """A run recorded as a finished full fine-tune of `folder`, its model folder `folder` itself."""
    return _finished_by_hand(store, folder)


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from storage.store import Store

    monkeypatch.setenv("TUNEDECK_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("TUNEDECK_DATABASE_URL", raising=False)
    store = Store()
    yield store
    store.dispose()


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_family_exports_f16_and_q4_k_m_that_llama_cpp_reads_like_the_model(
    family: str, store: Any, tmp_path: Path
) -> None:
    _converter()
    run_id = finished_full_run(store, family_folder(tmp_path / family, family))
    f16 = export_gguf(store, run_id, "f16")
    q4 = export_gguf(store, run_id, "q4_k_m")
    for result, least in ((f16, F16_FORCED_AGREEMENT), (q4, K_FORCED_AGREEMENT)):
        check = result.check
        assert check.passed and check.rule.startswith("read by llama.cpp"), check
        assert check.llama_cpp is not None and check.llama_cpp["forced_agreement"] >= least, check
        assert not check.tokenizer_mismatches and check.chat_template_equal, check
        assert result.path.is_file() and result.path.parent == store.run_dir(run_id) / "gguf"
    # f16: llama.cpp's logits are the model's (free-running answers of a random model part at near ties: recorded)
    assert f16.check.max_logit_diff < 0.05, f16.check
    assert "F16" not in q4.check.tensor_types and {"Q5_0", "Q8_0"} & set(
        q4.check.tensor_types
    )  # 64-wide rows fall back
    recorded = {Path(a.path).name for a in store.artifacts(run_id) if a.kind == "gguf"}
    assert recorded == {f16.path.name, q4.path.name}
    assert "convert_hf_to_gguf.py" in (f16.path.parent / "README.md").read_text()


def test_a_family_the_converter_does_not_know_is_refused_before_queueing_naming_it(store: Any, tmp_path: Path) -> None:
    _converter()
    from jobs.worker.tasks import request_export

    run_id = finished_full_run(store, family_folder(tmp_path / "phimoe", "phimoe"))
    with pytest.raises(ExportError) as err:
        request_export(store, run_id, merged=False, dtype="fp32", gguf=["f16"])
    (problem,) = err.value.problems
    assert problem.field == "gguf" and "phimoe (PhimoeForCausalLM)" in problem.problem, problem
    assert "not one llama.cpp's converter knows" in problem.problem and "--merged" in problem.fix
    assert store.run_tasks(run_id) == []  # nothing queued
    with pytest.raises(ExportError, match="phimoe"):
        export_gguf(store, run_id, "f16")
    assert not (store.run_dir(run_id) / "gguf").exists() or not list((store.run_dir(run_id) / "gguf").iterdir())


def test_docs_models_md_lists_each_familys_gguf_writer_as_the_converter_says() -> None:
    _converter()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    import gguf_families

    doc = (Path(__file__).resolve().parents[1] / "docs" / "models.md").read_text()
    assert gguf_families.section() in doc, (
        "docs/models.md's GGUF section is stale: python bench/gguf_families.py --write"
    )
    assert "| phimoe | refused before queueing" in doc and "| qwen3_moe | llama.cpp's converter" in doc


def test_a_family_the_converter_fails_on_is_refused_naming_it_and_nothing_is_kept(store: Any, tmp_path: Path) -> None:
    """GPT-NeoX as transformers 5 saves it: its config has partial_rotary_factor, the converter reads rotary_pct."""
    _converter()
    run_id = finished_full_run(store, family_folder(tmp_path / "gpt_neox", "gpt_neox"))
    with pytest.raises(ExportError) as err:
        export_gguf(store, run_id, "f16")
    (problem,) = err.value.problems
    assert "llama.cpp's converter failed on this gpt_neox (GPTNeoXForCausalLM) model" in problem.problem, problem
    assert "rotary_pct" in problem.problem and "--merged" in problem.fix
    assert not [a for a in store.artifacts(run_id) if a.kind == "gguf"]
    assert not list((store.run_dir(run_id) / "gguf").glob("*.gguf")) and not list(
        (store.run_dir(run_id) / "gguf").glob(".*")
    )


def test_a_converted_family_that_does_not_agree_is_refused_with_its_figures(store: Any, tmp_path: Path) -> None:
    """A Mistral with a 32-token sliding window: llama.cpp's llama ignores the window, so past 32 tokens its next
    tokens are not the model's; the file is deleted and the export refused with the measured agreement."""
    _converter()
    folder = family_folder(tmp_path / "mistral", "mistral")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "sliding_window": 8}))
    run_id = finished_full_run(store, folder)
    with pytest.raises(ExportError) as err:
        export_gguf(store, run_id, "f16")
    assert "does not answer like the model" in str(err.value) and "next-token agreement" in str(err.value)
    assert "file was deleted" in str(err.value)
    assert not [a for a in store.artifacts(run_id) if a.kind == "gguf"]


def test_a_converted_family_is_exported_by_the_worker_task(store: Any, tmp_path: Path) -> None:
    """The export task (`tunedeck export ID --gguf f16` in a child process, as a worker carries it out) converts a
    family tunedeck's writer does not describe, checks it and records the file."""
    _converter()
    import socket

    from jobs.worker.services import Place
    from jobs.worker.task_service import TaskService
    from jobs.worker.tasks import request_export
    from storage.models import TaskStatus

    run_id = finished_full_run(store, family_folder(tmp_path / "qwen3", "qwen3"))
    (task_id,) = request_export(store, run_id, merged=False, dtype="fp32", gguf=["f16"])
    host = socket.gethostname()
    place = Place(store=store, worker_id=f"{host}:99", host=host, device="cpu", on_cpu=True, shared_data=True)
    tasks = TaskService(place, poll_interval=0.05)
    task = tasks.take()
    assert task is not None and task.id == task_id
    assert tasks.carry_out(task) is TaskStatus.SUCCEEDED, store.get_task(task_id).error
    ((kind, path),) = [(f["kind"], f["path"]) for f in store.get_task(task_id).result["files"]]
    assert kind == "gguf" and Path(path).is_file() and path.endswith("-f16.gguf")
    check = json.loads(Path(path.replace(".gguf", ".check.json")).read_text())
    assert check["passed"] and check["rule"].startswith("read by llama.cpp"), check
