"""A GRPO run's completions at its logged steps (`jobs.train.completions`): kept every N steps and bounded, read
back as the run page's inspector shows them; the per-reward curves of the trainer chart."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobs.spec.job import JobSpec, SpecError
from jobs.spec.rewards import reward_series
from jobs.train.completions import completion_steps, prune, read_step


def write_step(folder: Path, step: int, rewards: dict[str, list[float]] | None = None) -> None:
    """A completions file as trl's GRPOTrainer writes it (chat prompts and completions, one column per reward)."""
    import pandas as pd

    rewards = rewards or {"short": [1.0, 0.0]}
    folder.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(
        {
            "step": [step, step],
            "prompt": [[{"role": "user", "content": "What is 2+2?"}]] * 2,
            "completion": [
                [{"role": "assistant", "content": f"Answer: 4 (step {step})"}],
                [{"role": "assistant", "content": "It is four, I think, after a long while"}],
            ],
            **rewards,
            "advantage": [0.707, -0.707],
        }
    ).to_parquet(folder / f"completions_{step:05d}.parquet")


def test_steps_are_kept_every_n_and_thinned_to_the_bound(tmp_path: Path) -> None:
    folder = tmp_path / "output" / "completions"
    for step in range(1, 11):
        write_step(folder, step)
    assert prune(folder, every=2, kept=100) == [2, 4, 6, 8, 10]
    assert prune(folder, every=2, kept=3) == [2, 6, 10]  # every other one goes, the first kept
    assert completion_steps(tmp_path) == [2, 6, 10]
    assert sorted(p.name for p in folder.iterdir()) == [f"completions_{s:05d}.parquet" for s in (2, 6, 10)]


def test_the_last_step_survives_when_the_run_ends_between_multiples(tmp_path: Path) -> None:
    folder = tmp_path / "output" / "completions"
    for step in (1, 2, 3):
        write_step(folder, step)
    assert prune(folder, every=2, newest=3) == [2, 3]
    assert prune(folder, every=2) == [2]  # without newest, 3 is not a multiple of 2


def test_a_step_reads_back_with_every_score_and_advantage(tmp_path: Path) -> None:
    write_step(tmp_path / "output" / "completions", 4, {"short": [1.0, 0.0], "answer": [1.0, float("nan")]})
    data = read_step(tmp_path, 4)
    assert data["rewards"] == ["short", "answer"]
    first, second = data["rows"]
    assert first == {
        "prompt": "What is 2+2?",
        "completion": "Answer: 4 (step 4)",
        "scores": {"short": 1.0, "answer": 1.0},
        "advantage": 0.707,
    }
    assert second["scores"] == {"short": 0.0, "answer": None}  # a reward that skipped it (trl: NaN)
    assert read_step(tmp_path, 5) == {"rewards": [], "rows": []}


def test_completions_every_is_a_grpo_option() -> None:
    spec = JobSpec.from_dict({"trainer": "grpo", "dataset": "sample:prompt-format", "rewards": "repetition"})
    assert spec.completions_every == 1
    with pytest.raises(SpecError) as err:
        JobSpec.from_dict({"trainer": "sft", "completions_every": 5})
    assert "completions_every: is a grpo option" in str(err.value)
    with pytest.raises(SpecError) as err:
        JobSpec.from_dict({"trainer": "grpo", "rewards": "repetition", "completions_every": 0})
    assert "completions_every" in str(err.value)


def test_each_declared_reward_gets_its_curve() -> None:
    spec = JobSpec.from_dict(
        {"trainer": "grpo", "rewards": '[{kind: regex, pattern: "Answer", name: format}, repetition]'}
    )
    assert reward_series(spec.declared_rewards) == {
        "reward format": "rewards/format/mean",
        "reward repetition_penalty_reward": "rewards/repetition_penalty_reward/mean",
    }


def test_the_inspector_shows_the_nearest_kept_step(data_home, store) -> None:
    from app.ui.completions import kept_steps, nearest, step_view

    run_id = store.create_run(JobSpec.from_dict({"trainer": "grpo", "rewards": "repetition", "model": "tiny-llama"}))
    folder = store.run_path(run_id) / "output" / "completions"
    for step in (2, 4, 8):
        write_step(folder, step)
    assert kept_steps(store, run_id) == [2, 4, 8] and nearest([2, 4, 8], 7) == 8 and nearest([2, 4, 8], 3) == 4
    text, table = step_view(store, run_id, 3)
    assert text.startswith("**Step 4**: 2 completions, 0 with advantage 0")
    assert table["headers"] == ["prompt", "completion", "short", "advantage"]
    assert table["data"][0] == ["What is 2+2?", "Answer: 4 (step 4)", "1.000", "0.707"]


def test_a_refresh_keeps_the_step_the_user_moved_back_to_and_follows_the_newest(data_home, store) -> None:
    """The run page's poll redraws the inspector: it reset the slider to the newest step, undoing the user's move
    (seen in Chromium under load). A slider moved back stays; one at the newest follows the next kept step."""
    from app.ui.completions import opened

    run_id = store.create_run(JobSpec.from_dict({"trainer": "grpo", "rewards": "repetition", "model": "tiny-llama"}))
    folder = store.run_path(run_id) / "output" / "completions"
    for step in (2, 4):
        write_step(folder, step)
    assert opened(store, run_id)[1]["value"] == 4 and opened(store, run_id)[4] == 4  # opened: the newest
    assert opened(store, run_id, 2, 4)[1]["value"] == 2  # moved back to 2: a refresh keeps it
    write_step(folder, 8)
    kept, followed = opened(store, run_id, 2, 4), opened(store, run_id, 4, 4)
    assert kept[1]["value"] == 2 and "Step 2" in kept[2] and kept[4] == 8
    assert followed[1]["value"] == 8 and "Step 8" in followed[2]
