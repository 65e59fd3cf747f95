"""Benchmark tasks (lm-evaluation-harness) on a run and its base: task files checked like data, hub tasks refused
offline, scores with standard errors stored and shown base beside run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from jobs.data.bench_tasks import TaskKind, task_problems, task_refs, write_tasks
from jobs.spec.job import JobSpec


def questions(path: Path, rows: list[Any]) -> str:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


def choice_rows(n: int = 10) -> list[dict[str, Any]]:
    """Questions whose right answer is the "[tag]" format the session's tag runs were taught, or plain words."""
    return [
        {"question": f"What is {i} plus {i}?", "choices": [str(2 * i), str(2 * i + 1), "no idea"], "answer": 0}
        for i in range(n)
    ]


def test_references_are_read_in_order() -> None:
    refs = task_refs("qa.jsonl, my.yaml\nhellaswag, qa.jsonl")
    assert [(r.kind, r.ref, r.name) for r in refs] == [
        (TaskKind.QUESTIONS, "qa.jsonl", "qa"),
        (TaskKind.YAML, "my.yaml", "my"),
        (TaskKind.HUB, "hellaswag", "hellaswag"),
    ]


@pytest.mark.parametrize(
    "row,words",
    [
        ("{not json", "row 2 is not JSON"),
        ({"choices": ["a", "b"], "answer": 0}, "row 2: has no `question`"),
        ({"question": "q", "choices": ["a"], "answer": 0}, "row 2: `choices` is not a list of two or more"),
        ({"question": "q", "choices": ["a", "b"], "answer": 2}, "row 2: `answer` 2 is neither an index below 2"),
        ({"question": "q", "choices": ["a", "b"], "answer": "c"}, "nor one of the choices"),
        ({"question": "q", "answer": "a"}, "row 2: is generate until but the file's first row is multiple choice"),
    ],
)
def test_bad_rows_are_named(tmp_path: Path, row: Any, words: str) -> None:
    ref = questions(tmp_path / "qa.jsonl", [choice_rows(1)[0], row])
    problems = task_problems(ref)
    assert len(problems) == 1 and problems[0].field == "eval_tasks", problems
    assert words in problems[0].problem and str(tmp_path / "qa.jsonl") in problems[0].problem and problems[0].fix


@pytest.mark.parametrize(
    "row,words",
    [
        ({"question": "q"}, "row 2: has no `answer` (nor a `regex`)"),
        ({"question": "q", "regex": "(unclosed"}, "row 2: `regex` '(unclosed' is not a regular expression (missing )"),
        ({"question": "q", "answer": "4", "regex": 4}, "row 2: `regex` is not a pattern text"),
    ],
)
def test_bad_generation_rows_are_named(tmp_path: Path, row: Any, words: str) -> None:
    ref = questions(tmp_path / "gen.jsonl", [{"question": "Capital of France?", "regex": "(?i)paris"}, row])
    problems = task_problems(ref)
    assert len(problems) == 1 and words in problems[0].problem and problems[0].fix, problems


@pytest.mark.parametrize(
    "doc,reply,scores",
    [
        ({"answer": "4", "regex": ""}, " 4.", {"exact_match": 1.0}),
        ({"answer": "New York", "regex": ""}, "new  york!", {"exact_match": 1.0}),
        ({"answer": "4", "regex": ""}, "It is 4", {"exact_match": 0.0}),
        ({"answer": "", "regex": "(?i)paris"}, "It is Paris.", {"regex_match": 1.0}),
        ({"answer": "", "regex": "paris"}, "It is Paris.", {"regex_match": 0.0}),  # case-sensitive unless (?i)
        ({"answer": "4", "regex": r"\b4\b"}, "It is 4", {"exact_match": 0.0, "regex_match": 1.0}),
    ],
)
def test_generated_answers_are_scored_by_exact_match_and_regex(doc: Any, reply: str, scores: Any) -> None:
    from jobs.data.bench_tasks import answer_scores

    assert answer_scores(doc, [reply]) == scores


def test_a_missing_file_and_a_yaml_without_task_are_refused(tmp_path: Path) -> None:
    (tmp_path / "t.yaml").write_text("dataset_path: json\n")
    problems = task_problems(f"{tmp_path / 'none.jsonl'}, {tmp_path / 't.yaml'}")
    assert ["does not exist" in problems[0].problem, "no `task:` name" in problems[1].problem] == [True, True]


def test_a_hub_task_is_refused_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    (problem,) = task_problems("hellaswag")
    assert problem.field == "eval_tasks" and "`hellaswag`" in problem.problem
    assert "HF_HUB_OFFLINE=1" in problem.problem and ".jsonl" in problem.fix


def test_the_submit_check_refuses_bad_task_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from jobs.checks.pipeline import check

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    bad = questions(tmp_path / "qa.jsonl", [{"question": "q"}])
    problems = check(JobSpec(model="tiny-llama", eval_tasks=f"{bad}, arc_easy")).problems
    words = [p.problem for p in problems if p.field == "eval_tasks"]
    assert any("row 1: has no `answer`" in w for w in words) and any("`arc_easy`" in w for w in words), problems


def test_question_files_become_lm_eval_tasks(tmp_path: Path) -> None:
    import yaml

    mc = questions(tmp_path / "mc.jsonl", [{"question": "q", "choices": ["a", "b"], "answer": "b"}])
    gen = questions(tmp_path / "gen.jsonl", [{"question": "2+2?", "answer": 4}])
    include, names = write_tasks(task_refs(f"{mc}, {gen}"), tmp_path / "out")
    assert include == [str(tmp_path / "out")] and list(names.values()) == ["mc", "gen"]
    first, second = (yaml.safe_load((tmp_path / "out" / f"{n}.yaml").read_text()) for n in names)
    assert first["output_type"] == "multiple_choice" and first["metric_list"][0]["metric"] == "acc"
    assert second["output_type"] == "generate_until" and second["metric_list"][0]["metric"] == "exact_match"
    assert [m["metric"] for m in second["metric_list"]] == ["exact_match"]  # regex_match only where rows give one
    rows = [json.loads(x) for x in (tmp_path / "out" / f"{next(iter(names))}.jsonl").read_text().splitlines()]
    assert rows == [{"question": "q", "choices": ["a", "b"], "answer": 1}]  # the answer's text became its index


def test_an_evaluate_task_runs_the_evaluate_command() -> None:
    from jobs.worker.tasks import TaskKind as Kind
    from jobs.worker.tasks import cli_args, describe
    from storage.store import TaskRecord

    task = TaskRecord(3, 7, "evaluate", {"tasks": "qa.jsonl"}, *[None] * 5, False, [], 0, None, None)  # type: ignore[arg-type]
    assert Kind(task.kind).uses_gpu and cli_args(task) == ["evaluate", "7", "--tasks", "qa.jsonl"]
    assert describe(task) == "benchmarks qa.jsonl"


@pytest.mark.integration
def test_the_harness_scores_a_run_and_its_base(tag_store: Any, tmp_path: Path) -> None:
    """lm-eval on the session's LoRA run and its base: multiple choice and generation, each with its stderr."""
    import zipfile

    from app.cli.show import show_text
    from app.ui.run_text import scores_markdown
    from jobs.evaluate.harness import evaluate_run
    from jobs.train.artifacts import bundle_of

    _folder, store, ids = tag_store
    run_id = ids["lora"]
    mc = questions(tmp_path / "sums.jsonl", choice_rows(10))
    said = [{"question": f"Say {w}.", "answer": w} for w in ("yes", "red", "one")]
    # A pattern every reply matches and one none does: regex_match must be exactly one half for either model.
    patterns = [{"question": "Say anything.", "regex": ".*"}, {"question": "Say nothing.", "regex": "^NEVER SAID$"}]
    gen = questions(tmp_path / "echo.jsonl", said + patterns)
    scores = evaluate_run(store, run_id, f"{mc}, {gen}")
    assert set(scores) == {"sums", "echo"}
    stored = store.scores(run_id)
    by = {(s.task, s.metric, s.model): s for s in stored}
    for model in ("base", "run"):
        acc = by[("sums", "acc", model)]
        assert acc.samples == 10 and 0.0 <= acc.value <= 1.0 and acc.stderr is not None
        assert 0.0 <= by[("echo", "exact_match", model)].value <= 1.0
        assert by[("echo", "regex_match", model)].value == 0.5, by  # 2 of the 5 rows give a regex
    text = show_text(store, store.get_run(run_id))
    assert "benchmarks (base vs run, ± standard error):" in text and "sums" in text and "exact_match" in text
    page = scores_markdown(store, store.get_run(run_id))
    assert "| task | metric | base | this run | change |" in page and "| sums | acc |" in page
    with zipfile.ZipFile(bundle_of(store, run_id)) as zf:  # the bundle's card lines them up too
        card = zf.read("README.md").decode()
    assert "| task | metric | base | fine-tuned | change |" in card and "| sums | acc |" in card


@pytest.mark.integration
def test_tunedeck_run_ends_with_the_benchmark_table_and_the_judges_win_rate(
    tag_store: Any, tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With no other worker, `tunedeck run`'s own worker carries out the run's evaluate task with its judge (the
    child command a worker runs; the judge is the run's base, reused) and the command ends with the table, base
    beside run, then the judge's wins, ties, losses and win rate."""
    from app.cli.evaluate import evaluations_after_run
    from jobs.spec.evaluation import evaluate_args
    from jobs.worker.loop import Worker
    from storage.models import TaskStatus

    _folder, store, ids = tag_store
    run_id = ids["lora"]
    mc = questions(tmp_path / "after_run.jsonl", choice_rows(4))
    # What the training child queues for eval_tasks and judge (the tiny run's base judges).
    task_id = store.create_task(run_id, "evaluate", evaluate_args(mc, str(tiny_model)))
    code = evaluations_after_run(store, run_id, Worker(store, poll_interval=0.2, sample=False))
    (task,) = store.tasks_of([task_id])
    assert code == 0 and task.status is TaskStatus.SUCCEEDED, (task.error, task.log[-5:])
    out = capsys.readouterr().out
    table = out[out.rindex("task" + " " * 20) :].splitlines()  # the end: the table, after the task's progress lines
    (row,) = [line for line in table if line.strip().startswith("after_run")]
    assert " acc " in row and row.count("±") == 2, out  # base and run, each with its standard error
    judged = table[-1]  # the last line: 3 samples judged in both orders
    assert judged.startswith(f"judge: judge {tiny_model}: the run won ") and "of 6 judgments" in judged, out
    assert "win rate" in judged and {s.metric for s in store.scores(run_id) if s.task == "judge"} >= {"win_rate"}


@pytest.mark.integration
@pytest.mark.slow  # a training run, then `tunedeck evaluate` in a child (lm-eval's import alone takes seconds)
def test_eval_tasks_run_when_training_ends_through_a_worker(store: Any, tiny_model: Path, tmp_path: Path) -> None:
    """A run with eval_tasks queues an evaluate task; the burst worker carries it out as `tunedeck evaluate`."""
    from jobs.worker.loop import Worker
    from jobs.worker.task_service import task_service
    from storage.models import RunStatus, TaskStatus
    from tests.training_helpers import tiny_spec

    mc = questions(tmp_path / "sums.jsonl", choice_rows(6))
    run_id = store.create_run(tiny_spec(tiny_model, max_steps=4, sample_count=0, eval_tasks=mc))
    Worker(store, poll_interval=0.2, sample=False, services=[task_service]).work(burst=True)
    assert store.get_run(run_id).status is RunStatus.SUCCEEDED, store.get_run(run_id).error_summary
    (task,) = store.run_tasks(run_id)
    assert task.kind == "evaluate" and task.status is TaskStatus.SUCCEEDED, (task.error, task.log[-5:])
    assert {(s.task, s.model) for s in store.scores(run_id) if s.metric == "acc"} == {("sums", "base"), ("sums", "run")}


def test_scores_are_stored_per_task_and_lined_up_in_compare(store: Any) -> None:
    from app.ui.compare import compare_table, summarize_run
    from storage.store import Score

    a, b = store.create_run(JobSpec(run_name="a")), store.create_run(JobSpec(run_name="b"))
    store.set_scores(a, "qa", [Score("base", "acc", 0.3, 0.1, 10), Score("run", "acc", 0.8, 0.1, 10)])
    store.set_scores(a, "qa", [Score("base", "acc", 0.3, 0.1, 10), Score("run", "acc", 0.9, 0.1, 10)])  # replaces
    store.set_scores(b, "qa", [Score("run", "acc", 0.6, 0.15, 10), Score("run", "exact_match", float("nan"), None, 4)])
    assert [(s.model, s.value) for s in store.scores(a)] == [("base", 0.3), ("run", 0.9)]
    assert [(s.metric, s.value) for s in store.scores(b)] == [("acc", 0.6), ("exact_match", None)]  # NaN kept as none
    runs = [store.get_run(a), store.get_run(b)]
    table = compare_table(runs, [summarize_run(store, r) for r in runs])
    row = table[table["field"] == "qa: acc"].iloc[0].tolist()
    assert row[1:] == ["0.900 ± 0.100 (base 0.300 ± 0.100)", "0.600 ± 0.150"]
    assert table[table["field"] == "qa: exact_match"].iloc[0].tolist()[1:] == ["", "-"]


def test_a_shared_dashboard_reads_task_files_only_from_its_data_folders_and_runs_no_task_code(
    data_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from jobs.checks.access import REMOTE_CODE_ENV, AccessPolicy
    from jobs.checks.pipeline import check
    from storage.settings import uploads_dir

    monkeypatch.delenv(REMOTE_CODE_ENV, raising=False)
    outside = questions(tmp_path / "secret.jsonl", ["not json"])
    uploads_dir().mkdir(parents=True, exist_ok=True)
    inside = questions(uploads_dir() / "qa.jsonl", choice_rows(2))
    (uploads_dir() / "task.yaml").write_text("task: mine\n")
    policy = AccessPolicy.for_server(login=True)
    problems = [p for p in check(JobSpec(model="tiny-llama", eval_tasks=outside), policy=policy).problems]
    mine = [p.problem for p in problems if p.field == "eval_tasks"]
    assert len(mine) == 1 and "data folders" in mine[0], problems  # refused unread: no row problem shown
    assert policy.problems(JobSpec(eval_tasks=inside)) == []
    (code,) = policy.problems(JobSpec(eval_tasks=str(uploads_dir() / "task.yaml")))
    assert code.field == "eval_tasks" and "!function" in code.problem and "--allow-remote-code" in code.fix
    assert AccessPolicy.open().problems(JobSpec(eval_tasks=outside)) == []


def test_scores_and_the_judge_reach_the_run_page_show_and_the_bundle_card(store: Any) -> None:
    """Scores stored after the bundle was written reach its card (the zip remade) once, however often they land."""
    import zipfile

    from app.cli.show import show_text
    from app.ui.run_text import samples_markdown, scores_markdown
    from jobs.evaluate.card import BEGIN, refresh_card
    from jobs.evaluate.judge import judge_file, judge_run
    from jobs.train.artifacts import bundle_of, sha256_of, zip_bundle
    from storage.store import Score

    run_id = store.create_run(JobSpec(run_name="carded", model="tiny-llama"))
    store.claim_next_on_device("test", "0")
    folder = store.run_dir(run_id) / "bundle"
    folder.mkdir()
    (folder / "README.md").write_text("# carded\n\n## How to load\nwith peft\n")
    first = zip_bundle(folder, store.run_dir(run_id) / "carded-adapter.zip")
    store.add_artifact(run_id, "bundle", str(first), first.stat().st_size, "0" * 64)
    samples = {"prompts": [{"text": "Hi?"}, {"text": "Sky?"}], "before": ["hey", "blue"], "after": ["[tag] hi", "x"]}
    (store.run_dir(run_id) / "samples.json").write_text(json.dumps(samples))
    store.mark_succeeded(run_id, {})
    store.set_scores(run_id, "qa", [Score("base", "acc", 0.3, 0.1, 10), Score("run", "acc", 0.8, 0.1, 10)])
    judge_run(
        store, run_id, "always-A", ask_all=lambda prompts: ["A, it reads better"] * len(prompts)
    )  # refreshes the card
    refresh_card(store, run_id, judge_file(store.run_dir(run_id)))  # again: the section is replaced, not added
    (recorded,) = [a for a in store.artifacts(run_id) if a.kind == "bundle"]  # the same record, rewritten
    assert recorded.sha256 == sha256_of(Path(recorded.path)) and recorded.size == Path(recorded.path).stat().st_size
    with zipfile.ZipFile(bundle_of(store, run_id)) as zf:
        card = zf.read("README.md").decode()
    assert card.startswith("# carded") and "with peft" in card and card.count(BEGIN) == 1, card
    assert "| qa | acc | 0.300 ± 0.100 | 0.800 ± 0.100 | +0.500 |" in card
    assert "judge always-A: the run won 2, tied 0 and lost 2 of 4 judgments" in card and "| judge |" not in card
    run = store.get_run(run_id)
    text = show_text(store, run)
    assert "  qa                       acc" in text and "judge: judge always-A: the run won 2" in text
    page = samples_markdown(store, run)
    assert "| prompt | base | this run | judge (run shown first, then second) |" in page
    assert "| Hi? | hey | \\[tag\\] hi | run better · base better |" in page and "**Judge**: judge always-A" in page
    assert "| qa | acc |" in scores_markdown(store, run) and "win_rate" not in scores_markdown(store, run)
