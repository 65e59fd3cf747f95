"""The model zoo: tiny random-weight models of transformers families (`jobs.models.zoo`) go through the one
check and train two steps with LoRA through tunedeck's trainer path, in this process, with the prediction
close to the counted peak; `docs/models.md` lists every family (`bench/zoo_table.py --write`).

Each family costs seconds: its model is built once per session into a shared folder, trained in-process."""

from __future__ import annotations

from pathlib import Path

import pytest

from jobs.models.zoo import FAMILIES

REPO = Path(__file__).resolve().parents[1]
# A spread of the structures: experts (fused, shared, MLA, hybrid linear attention), fused qkv, soft-capping.
TRAINED = ["mixtral", "qwen3_moe", "deepseek_v3", "gpt_oss", "qwen3_next", "gpt_neox", "gemma2"]


@pytest.fixture(scope="session")
def zoo_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("zoo")


def test_the_zoo_covers_24_families_and_every_moe_shape() -> None:
    assert len(FAMILIES) >= 24
    moe = {f for f, fam in FAMILIES.items() if fam.moe}
    assert {"mixtral", "qwen2_moe", "qwen3_moe", "olmoe", "deepseek_v3", "gpt_oss", "llama4_text", "granitemoe"} <= moe


def test_docs_list_every_family() -> None:
    doc = (REPO / "docs" / "models.md").read_text()
    missing = [f for f in FAMILIES if f"| {f} | lora |" not in doc]
    assert not missing, f"docs/models.md lacks {missing}: run python bench/zoo_table.py --write"


def test_docs_list_the_shape_grid() -> None:
    """docs/models.md's "Shapes" section holds every family of the grid at both sizes, with its summary lines
    (`python bench/zoo_table.py --shapes --write`)."""
    from bench.zoo_shapes import HEADING, SIZES, all_families

    doc = (REPO / "docs" / "models.md").read_text()
    section = doc.partition(HEADING)[2].partition("\n## ")[0]
    missing = [(f, size) for f in all_families() for size in SIZES if f"| {f} | {size} |" not in section]
    assert not missing, f"docs/models.md lacks {missing}: run python bench/zoo_table.py --shapes --write"
    assert "Checkpointing at 768-2,048 tokens, dense" in section


@pytest.mark.integration
@pytest.mark.parametrize("family", TRAINED)
def test_family_trains_with_lora_and_is_predicted(family: str, zoo_home: Path, data_home: Path) -> None:
    from bench.memory_truth import build_data
    from bench.zoo_table import try_one
    from jobs.models.zoo import build_zoo_model

    model = build_zoo_model(zoo_home / family, family)
    data = build_data(zoo_home, model, "sft", 64)
    outcome = try_one(family, "lora", model, data, data_home / "out")
    assert outcome.status == "works", outcome.detail
    assert outcome.error is not None and -0.25 <= outcome.error <= 0.25, (family, outcome)


@pytest.mark.integration
def test_dora_on_experts_is_refused_at_submit_with_the_fix(zoo_home: Path, data_home: Path) -> None:
    from bench.memory_truth import build_data
    from bench.zoo_table import try_one
    from jobs.models.zoo import build_zoo_model

    model = build_zoo_model(zoo_home / "mixtral", "mixtral")
    outcome = try_one("mixtral", "dora", model, build_data(zoo_home, model, "sft", 64), data_home / "out")
    assert outcome.status == "refused" and "moe_targets: attention" in outcome.detail


@pytest.mark.integration
def test_submit_refuses_dora_on_experts_and_says_the_dropout(zoo_home: Path, data_home: Path) -> None:
    """What a user sees from `tunedeck submit` on a tiny Mixtral: a refusal naming the field and the fix (never
    peft's traceback), and, for lora, the dropout tunedeck sets to 0 said before queueing."""
    from jobs.checks.pipeline import check
    from jobs.devices.probe import cpu_facts
    from jobs.models.zoo import build_zoo_model
    from jobs.spec.job import JobSpec

    model = build_zoo_model(zoo_home / "mixtral", "mixtral")
    base = {"model": str(model), "dataset": "sample:chat-format", "max_length": 64, "max_steps": 2}
    refused = check(JobSpec.from_dict({**base, "method": "dora"}), device=cpu_facts())
    assert [p.field for p in refused.problems] == ["moe_targets"]
    assert "moe_targets: attention" in refused.problems[0].fix
    accepted = check(JobSpec.from_dict({**base, "method": "lora", "lora_dropout": 0.1}), device=cpu_facts())
    assert accepted.problems == []
    assert any("lora_dropout 0.1 -> 0" in w for w in accepted.warnings)
    assert accepted.prediction is not None and accepted.prediction.active_params is not None


@pytest.mark.integration
@pytest.mark.parametrize("family", ["llama", "mixtral", "bamba"])  # dense, mixture of experts, Mamba-2 hybrid
def test_checkpointing_on_long_rows_is_predicted_within_15_percent(
    family: str, zoo_home: Path, data_home: Path
) -> None:
    """768-token rows with gradient checkpointing. A Mamba-2 layer's chunked scan is recomputed with its block after
    the head's backward, inside the head's transient (it was counted beside it: bamba +31%)."""
    from bench.memory_truth import build_data
    from bench.zoo_table import try_one
    from jobs.models.zoo import build_zoo_model

    model = build_zoo_model(zoo_home / family, family)
    data = build_data(zoo_home, model, "sft", 768)
    outcome = try_one(family, "lora", model, data, data_home / "out", length=768, checkpointing=True)
    assert outcome.status == "works", outcome.detail
    assert outcome.error is not None and abs(outcome.error) <= 0.15, (family, outcome)
