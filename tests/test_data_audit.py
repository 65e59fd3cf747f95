"""The data audit (issue 43, part 4): each finding from a small crafted JSONL, `dedupe: true`, the checks'
warnings and `tunedeck data audit` through its real command."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from jobs.data.audit.report import audit
from jobs.spec.job import JobSpec

ROOT = Path(__file__).resolve().parent.parent
LONG = (
    "the quick brown fox jumps over the lazy dog while the old cat sleeps on the warm mat near the red door "
    "of the small house by the river bank, and nobody in the village minds it at all this morning"
)


def jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def chat(question: str, answer: str) -> dict:
    return {"messages": [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]}


def distinct(n: int) -> list[dict]:
    """`n` chat rows with nothing in common: no finding among them."""
    return [chat(f"question number {i} about topic t{i}", f"answer {i}: " + " ".join(f"w{i}x{k}" for k in range(12))) for i in range(n)]  # fmt: skip


def found(spec: JobSpec) -> dict[str, object]:
    return {f.code: f for f in audit(spec).findings}


def test_exact_duplicates_name_the_later_copies(tmp_path: Path) -> None:
    rows = distinct(6)
    rows.insert(3, rows[1])  # line 4 repeats line 2
    rows.append(rows[0])  # line 8 repeats line 1
    got = found(JobSpec(dataset=jsonl(tmp_path / "d.jsonl", rows)))
    assert set(got) == {"duplicate-rows"}
    dup = got["duplicate-rows"]
    assert dup.count == 2 and [n for _, _, n in dup.rows] == [4, 8]
    assert "dedupe: true" in dup.fix


def test_near_duplicates_with_a_word_changed(tmp_path: Path) -> None:
    rows = distinct(4) + [chat("tell me a story", LONG), chat("tell me a story", LONG.replace("cat", "mouse"))]
    got = found(JobSpec(dataset=jsonl(tmp_path / "n.jsonl", rows)))
    assert set(got) == {"near-duplicate-rows"}
    near = got["near-duplicate-rows"]
    assert near.count == 1 and [n for _, _, n in near.rows] == [6] and "dedupe: true" in near.fix


def test_eval_rows_also_in_training(tmp_path: Path) -> None:
    train = distinct(5)
    evals = [chat("an eval question", "an eval answer of its own"), train[2]]
    spec = JobSpec(dataset=jsonl(tmp_path / "t.jsonl", train), eval_dataset=jsonl(tmp_path / "e.jsonl", evals))
    got = found(spec)
    assert set(got) == {"eval-overlap"}
    overlap = got["eval-overlap"]
    assert overlap.count == 1 and set(overlap.rows) == {("dataset", 0, 3), ("eval_dataset", 0, 2)}
    assert "eval data: row 2 of" in overlap.where(audit(spec).data.refs)


def test_empty_and_short_answers(tmp_path: Path) -> None:
    rows = [{"prompt": f"p{i} is a question", "completion": f"a full answer number {i}"} for i in range(4)]
    rows += [{"prompt": "what?", "completion": "..."}, {"prompt": "sum 2+2", "completion": "4"}]
    got = found(JobSpec(dataset=jsonl(tmp_path / "a.jsonl", rows)))
    assert set(got) == {"empty-answers", "short-answers"}
    assert [n for _, _, n in got["empty-answers"].rows] == [5] and [n for _, _, n in got["short-answers"].rows] == [6]
    assert got["empty-answers"].severity.value == "warning" and got["short-answers"].severity.value == "info"


def test_one_answer_to_many_prompts(tmp_path: Path) -> None:
    canned = "I am sorry, I cannot help with that request."
    rows = distinct(3) + [chat(f"different question {i}", canned) for i in range(5)]
    got = found(JobSpec(dataset=jsonl(tmp_path / "r.jsonl", rows)))
    assert set(got) == {"repeated-answers"} and got["repeated-answers"].count == 5


def test_chosen_identical_to_rejected(tmp_path: Path) -> None:
    rows = [{"prompt": f"q{i} asks", "chosen": f"good answer {i} here", "rejected": f"bad reply {i} there"} for i in range(4)]  # fmt: skip
    rows.append({"prompt": "same", "chosen": "one answer twice", "rejected": "one answer twice"})
    got = found(JobSpec(dataset=jsonl(tmp_path / "p.jsonl", rows), trainer="dpo"))
    assert set(got) == {"chosen-equals-rejected"} and [n for _, _, n in got["chosen-equals-rejected"].rows] == [5]


def test_kto_label_balance(tmp_path: Path) -> None:
    rows = [{"prompt": f"q{i} asks", "completion": f"answer number {i}", "label": i < 6} for i in range(8)]
    got = found(JobSpec(dataset=jsonl(tmp_path / "k.jsonl", rows), trainer="kto"))
    assert set(got) == {"kto-labels"} and "undesirable_weight: 3.0" in got["kto-labels"].fix
    even = JobSpec(dataset=str(tmp_path / "k.jsonl"), trainer="kto", undesirable_weight=3.0)
    assert found(even) == {}


def test_control_characters_and_broken_encoding(tmp_path: Path) -> None:
    rows = distinct(4) + [chat("bell \x07 here", "fine answer text"), chat("caf\ufffd au lait", "another fine text")]
    got = found(JobSpec(dataset=jsonl(tmp_path / "c.jsonl", rows)))
    assert set(got) == {"not-text"}
    assert [n for _, _, n in got["not-text"].rows] == [5, 6] and "1 with U+FFFD" in got["not-text"].problem


def test_mixture_shares(tmp_path: Path) -> None:
    a = jsonl(tmp_path / "a.jsonl", distinct(6))
    b = jsonl(tmp_path / "b.jsonl", [chat(f"other {i} q", f"other {i} a z{i}") for i in range(4)])
    got = found(JobSpec(dataset=f"{a} [max_rows=3], {b}"))
    assert set(got) == {"mixture-shares"} and "(43%)" in got["mixture-shares"].problem


def test_the_default_example_has_no_finding() -> None:
    from jobs.checks.duplicates import duplicate_warnings
    from jobs.data.inspection import check_dataset

    spec = JobSpec()
    assert audit(spec).findings == []
    assert duplicate_warnings(spec, {"dataset": check_dataset(spec.dataset, spec.trainer)}) == []


def test_dedupe_drops_what_the_audit_names(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from jobs.data.loading import load_data

    train = distinct(5) + [chat("tell me a story", LONG), chat("tell me a story", LONG.replace("cat", "mouse"))]
    train.insert(2, train[0])
    evals = [train[4], chat("an eval question", "an eval answer of its own")]
    spec = JobSpec(dataset=jsonl(tmp_path / "t.jsonl", train), eval_dataset=jsonl(tmp_path / "e.jsonl", evals))
    assert len(load_data(spec).train) == 8
    with caplog.at_level(logging.INFO, logger="jobs.data.audit.dedupe"):
        loaded = load_data(JobSpec(**{**spec.to_dict(), "dedupe": True}))
    kept = [row["messages"][1]["content"] for row in loaded.train]  # dropped: 2 (a copy of 0), 4 (eval), 7 (near 6)
    assert kept == [train[i]["messages"][1]["content"] for i in (0, 1, 3, 5, 6)]
    assert "dropped 3 of 8 training rows (1 exact copies, 1 near copies, 1 also in the eval data)" in caplog.text


def test_dedupe_before_eval_split(tmp_path: Path) -> None:
    from jobs.data.loading import load_data

    rows = distinct(8) + distinct(8)  # every row twice
    loaded = load_data(JobSpec(dataset=jsonl(tmp_path / "t.jsonl", rows), eval_split=2, dedupe=True))
    seen = [json.dumps(r["messages"]) for r in loaded.train] + [json.dumps(r["messages"]) for r in loaded.eval]
    assert len(seen) == 8 and len(set(seen)) == 8


def test_checks_warn_about_duplicates_and_eval_overlap(tmp_path: Path) -> None:
    from jobs.checks.duplicates import duplicate_warnings
    from jobs.data.inspection import check_dataset

    train = distinct(5)
    train.append(train[0])
    spec = JobSpec(
        dataset=jsonl(tmp_path / "t.jsonl", train),
        eval_dataset=jsonl(tmp_path / "e.jsonl", [train[1], chat("an eval question", "its own answer")]),
    )
    infos = {"dataset": check_dataset(spec.dataset, spec.trainer)}
    warned = duplicate_warnings(spec, infos)
    assert len(warned) == 2
    assert "1 of 6 training rows repeat" in warned[0] and "row 6 of" in warned[0] and "dedupe: true" in warned[0]
    assert "also in the eval data" in warned[1] and "eval data: row 1 of" in warned[1]
    assert duplicate_warnings(JobSpec(**{**spec.to_dict(), "dedupe": True}), infos) == []


def test_cli_data_audit(tmp_path: Path) -> None:
    rows = distinct(4)
    rows.append(rows[1])
    data = jsonl(tmp_path / "d.jsonl", rows)
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"dataset: {data}\n")
    env = {"PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TUNEDECK_HOME": str(tmp_path / "home"), "PATH": "/usr/bin:/bin"}  # fmt: skip
    cmd = [sys.executable, "-m", "app.cli.main", "data", "audit", str(spec)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "duplicate-rows: 1 of 5 training rows" in proc.stdout and "row 5 of" in proc.stdout
    assert "dedupe: true" in proc.stdout and "lengths of the training rows (characters)" in proc.stdout
    proc = subprocess.run([*cmd, "--json"], capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    record = json.loads(proc.stdout)
    assert record["train_rows"] == 5 and record["findings"][0]["rows"] == [
        {"field": "dataset", "source": data, "row": 5}
    ]
    bad = subprocess.run([*cmd[:-1], str(tmp_path / "none.yaml")], capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)  # fmt: skip
    assert bad.returncode == 2 and "not found" in bad.stderr


def test_the_one_check_warns_before_queueing(tmp_path: Path, tiny_model: Path) -> None:
    """Through `jobs.checks.pipeline.check`, the check every entry point runs: warnings, not problems."""
    import training_helpers

    from jobs.checks.pipeline import check
    from jobs.devices.probe import cpu_facts

    train = distinct(6)
    train.append(train[2])
    spec = training_helpers.tiny_spec(
        tiny_model,
        dataset=jsonl(tmp_path / "t.jsonl", train),
        eval_dataset=jsonl(tmp_path / "e.jsonl", [train[0], chat("an eval question", "its own answer")]),
    )
    checked = check(spec, device=cpu_facts())
    assert checked.problems == []
    ours = [w for w in checked.warnings if "dedupe: true" in w]
    assert len(ours) == 2 and "row 7 of" in ours[0] and "also in the eval data" in ours[1]
    default = check(training_helpers.tiny_spec(tiny_model), device=cpu_facts())
    assert not [w for w in default.warnings if "dedupe" in w]


def test_the_checks_warnings_follow_the_file(tmp_path: Path) -> None:
    """Remembered per spec and file state: a file fixed since the last check is read again."""
    from jobs.checks.duplicates import duplicate_warnings
    from jobs.data.inspection import check_dataset

    rows = distinct(4)
    path = tmp_path / "t.jsonl"
    spec = JobSpec(dataset=jsonl(path, [*rows, rows[0]]))
    infos = {"dataset": check_dataset(spec.dataset, spec.trainer)}
    assert len(duplicate_warnings(spec, infos)) == 1
    assert len(duplicate_warnings(spec, infos)) == 1  # remembered
    jsonl(path, rows)
    assert duplicate_warnings(spec, infos) == []


def test_near_groups_of_rows_without_words() -> None:
    from jobs.data.audit.near import near_groups

    assert (
        near_groups(["", " ", ""]) == []
        and near_groups(["", "...", ""]) == []
        and near_groups(["a b c", "a b c", ""]) == [[0, 1]]
    )


def test_dedupe_keeps_the_copy_the_audit_keeps_in_a_mixture(tmp_path: Path) -> None:
    """The sources are shuffled together; the copy kept is still the first in file order (source 1's)."""
    from jobs.data.loading import load_data

    shared = chat("a shared question", "a shared answer that both files hold")
    a = jsonl(tmp_path / "a.jsonl", [*distinct(4), shared])
    b = jsonl(tmp_path / "b.jsonl", [shared] + [chat(f"b question {i}", f"b answer {i} v{i}") for i in range(20)])
    spec = JobSpec(dataset=f"{a}, {b}", seed=2)
    mixed = [(int(s), int(n)) for s, n in load_data(spec).origins]
    assert mixed.index((1, 1)) < mixed.index((0, 5))  # the seed shuffles source 2's copy first
    assert [(f, s, n) for f, s, n in found(spec)["duplicate-rows"].rows] == [("dataset", 1, 1)]
    loaded = load_data(JobSpec(**{**spec.to_dict(), "dedupe": True}))
    origins = {(int(s), int(n)) for s, n in loaded.origins}
    assert len(loaded.train) == 25 and (0, 5) in origins and (1, 1) not in origins


def test_cli_histogram_in_tokens_once_measured(
    tmp_path: Path, tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After the checks measured the rows' tokens (cached), the histogram is in tokens, against max_length."""
    from jobs.checks.memory import measured_lengths

    monkeypatch.setenv("TUNEDECK_CACHE_DIR", str(tmp_path / "cache"))
    spec_file = tmp_path / "spec.yaml"
    spec_file.write_text(f"model: {tiny_model}\ndataset: sample:chat-format\nmax_length: 56\n")
    from app.cli.usage import load_spec

    lengths = measured_lengths(load_spec(str(spec_file)))
    assert lengths is not None
    longer = int((lengths.lengths.max(axis=1) > 56).sum())
    env = {"PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TUNEDECK_HOME": str(tmp_path / "home"), "PATH": "/usr/bin:/bin", "TUNEDECK_CACHE_DIR": str(tmp_path / "cache")}  # fmt: skip
    cmd = [sys.executable, "-m", "app.cli.main", "data", "audit", str(spec_file)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    assert f"lengths of the training rows (tokens; {longer} longer than max_length 56)" in proc.stdout
    assert "<- max_length" in proc.stdout


def test_the_audit_reads_no_data_the_server_refuses(data_home: Path, tmp_path: Path, tiny_model: Path) -> None:
    """On a shared dashboard a data file outside its data folders is refused, and the audit never reads it:
    no warning names its rows."""
    import training_helpers

    from jobs.checks.access import AccessPolicy
    from jobs.checks.pipeline import check
    from jobs.devices.probe import cpu_facts

    rows = distinct(4)
    outside = jsonl(tmp_path / "outside.jsonl", [*rows, rows[0]])
    spec = training_helpers.tiny_spec(tiny_model, dataset=outside)
    assert any("dedupe: true" in w for w in check(spec, device=cpu_facts()).warnings)  # the command line reads it
    refused = check(spec, policy=AccessPolicy.for_server(login=True), device=cpu_facts())
    assert any(p.field == "dataset" and "data folders" in p.problem for p in refused.problems)
    assert not any("dedupe" in w or "row 5" in w for w in refused.warnings)


def test_grpo_rows_differ_by_their_reward_columns(tmp_path: Path) -> None:
    """A grpo prompt asked twice with different reference answers is two rows; the same row twice is a copy."""
    from jobs.data.loading import load_data

    rows = [{"prompt": f"what is {i} + {i}?", "answer": str(2 * i)} for i in range(4)]
    rows += [{"prompt": "what is 0 + 0?", "answer": "zero"}, rows[1]]
    spec = JobSpec(dataset=jsonl(tmp_path / "g.jsonl", rows), trainer="grpo")
    got = found(spec)
    assert set(got) == {"duplicate-rows"} and [n for _, _, n in got["duplicate-rows"].rows] == [6]
    kept = load_data(JobSpec(**{**spec.to_dict(), "dedupe": True})).train
    assert [(r["prompt"], r["answer"]) for r in kept] == [(r["prompt"], r["answer"]) for r in rows[:5]]
