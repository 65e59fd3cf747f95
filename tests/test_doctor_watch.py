"""The training doctor inside the worker: incremental checks over a real store, each finding stored once,
and `doctor_stop_on` cancelling a run through the worker's watch (`jobs.doctor.watch`, `jobs.worker.loop`)."""

from __future__ import annotations

import math
import time

from test_worker import make_worker

from jobs.doctor.findings import findings_of
from jobs.doctor.watch import Doctor
from jobs.spec.doctor_codes import RuleCode
from jobs.spec.job import JobSpec
from storage.models import MemorySource, RunStatus
from storage.records import MemoryPoint, MetricPoint
from storage.store import Store

BACKENDS = ("sqlite", "postgresql")  # each `store` test runs on both databases (tests/conftest.py)


def losses(first: int, last: int, spike_at: int | None = None) -> list[MetricPoint]:
    """A falling loss with a little noise (and grad_norm beside it), one row per step; a spike where asked."""
    rows = []
    for s in range(first, last + 1):
        value = 9.0 if s == spike_at else 2.0 * math.exp(-s / 100) + 0.5 + 0.03 * math.sin(s * 1.7)
        rows += [
            MetricPoint(s, "loss", value, 1000.0 + s),
            MetricPoint(s, "grad_norm", 1.0 + 0.1 * math.cos(s), 1000.0 + s),
        ]
    return rows


def running_run(store: Store, spec: JobSpec) -> int:
    run_id = store.create_run(spec)
    assert store.claim_next_on_device("test", "0").id == run_id
    return run_id


def test_rows_arriving_in_steps_give_each_finding_once_at_its_step(store: Store) -> None:
    run_id = running_run(store, JobSpec(model="tiny-llama", max_steps=100))
    doctor = Doctor(store, run_id, JobSpec(model="tiny-llama", max_steps=100), interval_s=0.0)
    stored = []
    for first in range(1, 100, 9):  # flushes of 9 steps, as the training child writes them
        store.add_metrics(run_id, losses(first, min(first + 8, 100), spike_at=40))
        stored += doctor.check()
    assert [(f.code, f.step) for f in stored] == [(RuleCode.LOSS_SPIKE, 40)]
    events = [e for e in store.run_events(run_id) if e["kind"] == "finding"]
    assert len(events) == 1 and events[0]["step"] == 40 and "loss_spike at step 40" in events[0]["message"]
    (found,) = findings_of(events)
    assert found.evidence["value"] == 9.0 and [40, 9.0] in found.evidence["curve"]
    assert store.get_run(run_id).cancel_requested is False  # doctor_stop_on is empty: it only warns
    # A fresh doctor (a restarted worker, a recovered child) reads everything again and stores nothing twice.
    assert Doctor(store, run_id, JobSpec(), interval_s=0.0).check() == []
    assert len(findings_of(store.run_events(run_id))) == 1


def test_a_bug_in_a_rule_stops_the_doctor_for_the_run_not_the_training(store: Store, monkeypatch, caplog) -> None:
    """A diagnosis must never end a run: a rule that raises is logged with its traceback and the doctor rests."""
    import jobs.doctor.watch as watch

    def broken(*args, **kwargs):
        raise ZeroDivisionError("a rule's bug")

    monkeypatch.setattr(watch, "examine", broken)
    run_id = running_run(store, JobSpec(model="tiny-llama", max_steps=100))
    doctor = Doctor(store, run_id, JobSpec(model="tiny-llama", max_steps=100), interval_s=0.0)
    store.add_metrics(run_id, losses(1, 50, spike_at=40))
    assert doctor.check() == [] and not doctor.due()
    assert "the training doctor failed" in caplog.text and "ZeroDivisionError" in caplog.text
    assert store.get_run(run_id).status is RunStatus.RUNNING


def test_an_eval_row_of_the_last_step_seen_arrives_in_a_later_flush_and_is_read(store: Store) -> None:
    run_id = running_run(store, JobSpec(model="tiny-llama"))
    doctor = Doctor(store, run_id, JobSpec(), interval_s=0.0)
    evals = {40: 1.8, 80: 1.5, 120: 1.6, 160: 1.75}
    for first in range(1, 161, 40):
        store.add_metrics(run_id, losses(first, first + 39))
        assert doctor.check() == []
        # the evaluation of that last step is written after the check read the step's loss
        store.add_metrics(run_id, [MetricPoint(first + 39, "eval_loss", evals[first + 39], 2000.0)])
    (found,) = doctor.check()
    assert found.code is RuleCode.OVERFITTING and found.step == 160 and found.evidence["best_step"] == 80


def test_memory_samples_are_put_on_the_step_logged_with_them(store: Store) -> None:
    run_id = running_run(store, JobSpec(model="tiny-llama"))
    doctor = Doctor(store, run_id, JobSpec(), interval_s=0.0)
    found = []
    for first in range(1, 60, 10):
        rows = losses(first, first + 9)
        store.add_metrics(run_id, rows)
        store.add_memory_samples(
            MemoryPoint(
                time=p.time, source=MemorySource.TORCH.value, run_id=run_id, torch_allocated=int(1e9 + p.step * 1e7)
            )
            for p in rows
            if p.name == "loss"
        )
        found += doctor.check()
    # found at the first check with MEMORY_MIN_POINTS samples, on the step of the 30th
    assert [(f.code, f.step) for f in found] == [(RuleCode.MEMORY_CREEP, 30)]


def test_a_tiny_run_gets_no_finding(store: Store) -> None:
    run_id = running_run(store, JobSpec(model="tiny-llama", max_steps=12))
    wild = [MetricPoint(s, "loss", [2.0, 9.0, 0.0][s % 3], 1000.0 + s) for s in range(1, 13)]
    store.add_metrics(run_id, wild)
    assert Doctor(store, run_id, JobSpec(max_steps=12), interval_s=0.0).check(final=True) == []


SPIKING_CHILD = """
import math
from storage.records import MetricPoint
from storage.store import Store
store = Store()
def on_term(signum, frame):
    store.mark_cancelled(run_id, exit_code=0)   # what jobs.train.child does on SIGTERM
    sys.exit(0)
signal.signal(signal.SIGTERM, on_term)
rows = []
for s in range(1, 61):
    value = 9.0 if s == 40 else 2.0 * math.exp(-s / 100) + 0.5 + 0.03 * math.sin(s * 1.7)
    rows.append(MetricPoint(s, "loss", value, time.time()))
store.add_metrics(run_id, rows)
if {stop_by_itself}:
    store.mark_succeeded(run_id, {{}})
    sys.exit(0)
print("up", flush=True)
time.sleep(120)  # ends the test (failed) should no cancel come
"""


def test_doctor_stop_on_cancels_the_run_through_the_worker(store: Store) -> None:
    run_id = store.create_run(JobSpec(model="tiny-llama", max_steps=60, doctor_stop_on="loss_spike"))
    started = time.monotonic()
    make_worker(store, SPIKING_CHILD.format(stop_by_itself=False), grace_period=60.0).work(burst=True)
    run = store.get_run(run_id)
    assert run.status is RunStatus.CANCELLED, (run.error_summary, time.monotonic() - started)
    (event,) = [e for e in store.run_events(run_id) if e["kind"] == "finding"]
    assert event["step"] == 40 and event["data"]["stops_run"] is True and "doctor_stop_on" in event["message"]


def test_without_doctor_stop_on_the_finding_is_stored_and_the_run_goes_on(store: Store) -> None:
    run_id = store.create_run(JobSpec(model="tiny-llama", max_steps=60))
    make_worker(store, SPIKING_CHILD.format(stop_by_itself=True)).work(burst=True)
    run = store.get_run(run_id)
    assert run.status is RunStatus.SUCCEEDED, run.error_summary
    (found,) = findings_of(store.run_events(run_id))  # found by the check after the child exited
    assert found.code is RuleCode.LOSS_SPIKE and found.step == 40


def test_tunedeck_show_and_the_api_list_the_findings(store: Store) -> None:
    from app.api import Endpoints
    from app.cli.show import show_text

    run_id = running_run(store, JobSpec(model="tiny-llama", max_steps=60))
    store.add_metrics(run_id, losses(1, 60, spike_at=40))
    store.add_run_event(run_id, "note", "an event of another kind", step=3)
    Doctor(store, run_id, JobSpec(max_steps=60), interval_s=0.0).check()
    text = show_text(store, store.get_run(run_id))
    findings = text[text.index("findings (training doctor):") :].splitlines()
    assert findings[1].startswith("  1. step 40  warning  loss_spike: the training loss jumped to 9 at step 40")
    assert (
        findings[2].startswith("     fix: lower learning_rate")
        and f"(spec change: learning_rate: 0.0001, max_grad_norm: 1; `tunedeck clone {run_id} --fix 1`)" in findings[2]
    )
    events = text[text.index("\nevents:") :]
    assert "an event of another kind" in events and "loss_spike" not in events  # shown once, under findings
    (found,) = Endpoints(store).run(run_id)["findings"]
    assert found["code"] == "loss_spike" and found["step"] == 40 and found["severity"] == "warning"
    assert found["spec_change"]["learning_rate"] == 1e-4 and [40, 9.0] in found["evidence"]["curve"]


def test_the_run_page_events_show_a_finding_with_its_fix(store: Store) -> None:
    from app.ui.run_text import events_markdown

    run_id = running_run(store, JobSpec(model="tiny-llama", max_steps=60))
    store.add_metrics(run_id, losses(1, 60, spike_at=40))
    Doctor(store, run_id, JobSpec(max_steps=60), interval_s=0.0).check()
    text = events_markdown(store.get_run(run_id), store.run_events(run_id))
    assert "doctor: loss_spike at step 40 (warning)" in text and "**Fix:** lower learning_rate (to 0.0001)" in text


def test_tunedeck_clone_fix_queues_the_spec_with_the_findings_change(store: Store, capsys) -> None:
    from app.cli.main import main
    from jobs.spec.stored import spec_of

    spec = JobSpec(model="tiny-llama", dataset="sample:chat-format", max_steps=60, max_length=64, learning_rate=2e-4)
    run_id = running_run(store, spec)
    store.add_metrics(run_id, losses(1, 60, spike_at=40))
    Doctor(store, run_id, spec, interval_s=0.0).check()
    assert main(["clone", str(run_id), "--fix", "1"]) == 0
    new = store.get_run(int(capsys.readouterr().out.strip()))
    assert new.id != run_id and new.status is RunStatus.QUEUED
    cloned = spec_of(new)
    assert cloned.learning_rate == 1e-4 and cloned.max_grad_norm == 1.0 and cloned.max_steps == 60
    assert main(["clone", str(run_id), "--fix", "2"]) == 2
    assert f"--fix: run {run_id} has findings 1 to 1, not 2" in capsys.readouterr().err
    assert main(["clone", str(run_id)]) == 0  # without --fix: the spec as it was
    assert spec_of(store.get_run(int(capsys.readouterr().out.strip()))).learning_rate == 2e-4


def test_doctor_stop_on_a_severity_cancels_on_every_finding_of_it(store: Store) -> None:
    spec = JobSpec(model="tiny-llama", doctor_stop_on="fatal")
    run_id = running_run(store, spec)
    doctor = Doctor(store, run_id, spec, interval_s=0.0)
    store.add_metrics(run_id, losses(1, 60, spike_at=40))  # a warning: it only warns
    assert [f.code for f in doctor.check()] == [RuleCode.LOSS_SPIKE] and not store.get_run(run_id).cancel_requested
    store.add_metrics(run_id, [MetricPoint(61, "loss", math.nan, 2000.0)])  # a fatal one: it stops the run
    assert [f.code for f in doctor.check()] == [RuleCode.NONFINITE_LOSS] and store.get_run(run_id).cancel_requested


def test_findings_of_one_check_are_stored_in_step_order(store: Store) -> None:
    run_id = running_run(store, JobSpec(model="tiny-llama"))
    store.add_metrics(run_id, [*losses(1, 79, spike_at=40), MetricPoint(80, "loss", math.nan, 2000.0)])
    Doctor(store, run_id, JobSpec(), interval_s=0.0).check()
    assert [(f.code, f.step) for f in findings_of(store.run_events(run_id))] == [
        (RuleCode.LOSS_SPIKE, 40),
        (RuleCode.NONFINITE_LOSS, 80),
    ]
