"""bench/memory_runs.py's grid is what it says: enough jobs, each a valid spec, the lengths they claim.

No training here: the bench itself trains (minutes); these check its grid in well under a second.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def test_list_prints_at_least_16_distinct_jobs(capsys) -> None:
    from bench.memory_runs import main

    assert main(["--list"]) == 0
    names = [line.split()[0] for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert len(names) >= 16
    assert len(set(names)) == len(names)
    assert "default" in names
    assert {f"ex:{p.stem}" for p in (ROOT / "examples").glob("*.yaml")} <= set(names)


def test_every_job_parses_as_a_spec_with_the_bench_settings() -> None:
    from bench.memory_runs import FAST, grid
    from jobs.spec.job import JobSpec

    for job in grid():
        spec = JobSpec.from_dict({**job.fields, **FAST, "max_steps": 2, "max_train_samples": job.rows(2)})
        assert spec.max_train_samples == 2 * spec.per_device_train_batch_size * spec.gradient_accumulation_steps * (
            job.rows_per_sequence
        ), job.name


def test_the_grid_separates_the_data_length_from_max_length() -> None:
    from bench.memory_runs import DATA, grid

    jobs = {j.name: j for j in grid()}
    longest = {key: max(lengths.values()) for key, lengths in DATA.items()}
    short, cut = jobs["short-2048"], jobs["truncated-256"]
    assert longest[short.data] * 10 < short.fields["max_length"]  # rows far shorter than the bound
    assert longest[cut.data] > cut.fields["max_length"]  # every row cut at the bound
    assert jobs["packing-on"].fields["packing"] and not jobs["packing-off"].fields.get("packing", False)
    assert (
        longest[jobs["packing-on"].data] * jobs["packing-on"].rows_per_sequence
        > jobs["packing-on"].fields["max_length"]
    )


def test_an_example_job_finds_its_data_file_beside_the_example(monkeypatch, tmp_path: Path) -> None:
    """examples/smollm2-grpo-arithmetic.yaml names `arithmetic-questions.jsonl`, beside it, as `tunedeck run` finds it."""
    from bench.memory_runs import examples

    monkeypatch.chdir(tmp_path)
    job = next(j for j in examples() if j.name == "ex:smollm2-grpo-arithmetic")
    assert Path(str(job.fields["dataset"])).is_file()


def test_grpo_steps_lifts_the_one_step_cap_of_the_grpo_examples() -> None:
    """One GRPO step leaves out the heap a second step keeps (`--grpo-steps 2` measures it); other jobs keep theirs."""
    from bench.memory_runs import grid

    capped = {j.name: j.max_steps for j in grid()}
    lifted = {j.name: j.max_steps for j in grid(2)}
    grpo = {name for name in capped if name.startswith("ex:smollm2-grpo")}
    assert grpo and all(capped[name] == 1 and lifted[name] == 2 for name in grpo)
    assert {n: s for n, s in capped.items() if n not in grpo} == {n: s for n, s in lifted.items() if n not in grpo}
