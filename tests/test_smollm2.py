"""A real run of the embedded default model (SmolLM2-135M-Instruct) through the worker.

Slow-ish (~3-4 min on 2 CPU cores, plus a one-time download and conversion of the model):
it is the proof that the default the README promises really trains.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from storage.models import RunStatus

pytestmark = [pytest.mark.smollm2, pytest.mark.integration, pytest.mark.slow]


@pytest.fixture
def store(smollm2_run: tuple[Path, int], smollm2_cache: Path, monkeypatch: pytest.MonkeyPatch):
    from storage.store import Store

    monkeypatch.setenv("TUNEDECK_HOME", str(smollm2_run[0]))
    monkeypatch.setenv("TUNEDECK_MODELS_DIR", str(smollm2_cache))
    monkeypatch.delenv("TUNEDECK_DATABASE_URL", raising=False)
    store = Store()
    yield store
    store.dispose()


def test_default_model_trains_through_the_worker(store, smollm2_run: tuple[Path, int]) -> None:
    """The session's SmolLM2 run (conftest `smollm2_run`: the default example), submitted and trained through the worker."""
    import torch
    from peft import PeftModel

    from jobs.models.loading import load_model_and_tokenizer
    from jobs.models.references import resolve_model
    from jobs.spec.stored import spec_of

    run_id = smollm2_run[1]
    run = store.get_run(run_id)
    assert run.status is RunStatus.SUCCEEDED, (run.error_summary, run.error_detail)
    steps = spec_of(run).max_steps
    assert steps and run.current_step == steps and run.total_steps == steps
    losses = [p.value for p in store.metrics(run_id, ["loss"])]
    assert len(losses) == steps and all(v == v for v in losses)
    assert losses[-1] < losses[0] / 4, losses  # the example's comment: from ~4.8 to ~0.2
    assert run.peak_memory_bytes and run.peak_memory_bytes > 300 * 2**20  # a 135M-param model in fp32 at least

    bundle = [a for a in store.artifacts(run_id) if a.kind == "bundle"]
    assert len(bundle) == 1
    with zipfile.ZipFile(bundle[0].path) as zf:
        names = set(zf.namelist())
        assert {"adapter_model.safetensors", "adapter_config.json", "spec.yaml", "README.md"} <= {
            Path(n).name for n in names
        }
        adapter_dir = Path(bundle[0].path).parent / "reloaded"
        zf.extractall(adapter_dir)
    adapter_cfg = next(adapter_dir.rglob("adapter_config.json")).parent

    base, tok = load_model_and_tokenizer(resolve_model("smollm2-135m-instruct"))
    ids = tok.apply_chat_template(
        [{"role": "user", "content": "Tell me about volcanoes."}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )["input_ids"]
    with torch.no_grad():
        before = base(ids).logits
        tuned = PeftModel.from_pretrained(base, str(adapter_cfg))
        after = tuned(ids).logits
    assert not torch.allclose(before, after, atol=1e-4), "the trained adapter did not change the model's output"

    # The card's snippet runs as written with plain transformers + peft, the hub id resolved to a
    # local copy (a hub cache holding tunedeck's converted folder under the upstream name).
    import json

    from training_helpers import greedy_answer, run_card_snippet

    from jobs.train.artifacts import LOAD_PROMPT

    assert (
        json.loads((adapter_cfg / "adapter_config.json").read_text())["base_model_name_or_path"]
        == "HuggingFaceTB/SmolLM2-135M-Instruct"
    )
    assert "dequantized from the Q4_1 GGUF" in (adapter_cfg / "README.md").read_text()
    hub = Path(bundle[0].path).parent / "hub-cache"
    snapshot = hub / "models--HuggingFaceTB--SmolLM2-135M-Instruct" / "snapshots" / "local"
    snapshot.mkdir(parents=True)
    (snapshot.parent.parent / "refs").mkdir()
    (snapshot.parent.parent / "refs" / "main").write_text("local")
    for f in Path(resolve_model("smollm2-135m-instruct").path).iterdir():
        (snapshot / f.name).symlink_to(f)
    printed = run_card_snippet(adapter_cfg, env={"HF_HUB_CACHE": str(hub)})
    tuned.eval()
    assert printed and printed == greedy_answer(tuned, tok, LOAD_PROMPT)


def test_default_example_ends_scored_against_its_base(store, smollm2_run: tuple[Path, int]) -> None:
    """Issue 35: the example's own questions, base beside run, and its judge's verdicts, as `tunedeck run` ends."""
    from app.cli.show import score_lines
    from storage.models import TaskStatus

    run_id = smollm2_run[1]
    (task,) = store.run_tasks(run_id)
    assert task.kind == "evaluate" and task.status is TaskStatus.SUCCEEDED, (task.error, task.log[-5:])
    scores = {(s.task, s.metric, s.model): s.value for s in store.scores(run_id)}
    taught = ("tag-format-questions", "regex_match")
    assert scores[(*taught, "run")] > scores[(*taught, "base")], scores  # the taught format, on unseen topics
    counts = [scores[("judge", m, "run")] for m in ("wins", "ties", "losses")]
    assert sum(counts) == 6, scores  # 3 held-out prompts, each judged in both orders
    lines = score_lines(store, store.get_run(run_id))
    assert any(ln.strip().startswith("tag-format-questions") and ln.count("±") == 2 for ln in lines), lines
    assert lines[-1].startswith("judge: judge smollm2-135m-instruct: the run won ") and "win rate" in lines[-1]


def test_default_example_shows_base_against_run_and_gets_no_doctor_warning(
    store, smollm2_run: tuple[Path, int]
) -> None:
    """The forgetting meter on the default example: the base and the result both read the general text (and the
    held-out rows), shown on the run page and in `tunedeck show`; the training doctor found nothing wrong."""
    from app.cli.show import show_text
    from app.ui.run_text import samples_markdown
    from jobs.doctor.findings import Severity, findings_of
    from jobs.train import forgetting

    run_id = smollm2_run[1]
    meter = forgetting.read(store, run_id)
    assert meter is not None and meter.task_change is not None and meter.task_change < 0  # it learned its task
    assert [p.step for p in store.metrics(run_id, [forgetting.GENERAL])] == [0, 30]
    run = store.get_run(run_id)
    assert run is not None and meter.text() in samples_markdown(store, run)
    assert any(ln.startswith("forgetting:") and meter.text() in ln for ln in show_text(store, run).splitlines())
    found = findings_of(store.run_events(run_id))
    assert [f.message for f in found if f.severity is not Severity.INFO] == []
