"""`tunedeck import`: LLaMA-Factory, axolotl and trl configs (real examples in tests/fixtures/imports) into specs.

The fixtures are copies of LLaMA-Factory's examples/train_lora and examples/train_full configs (with its
data/dataset_info.json) and axolotl's examples/llama-3 LoRA configs. Each imports into a spec that passes
the check `tunedeck submit` runs once its model is the tiny test model and its data sets are small local
files (LLaMA-Factory names resolve through a dataset_info.json written here; axolotl's hub data sets are
replaced with --set dataset=...). No training.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.cli.main import main
from jobs.checks.pipeline import check
from jobs.devices.facts import DeviceFacts
from jobs.spec.imports import ImportConfigError, build_spec, detect_tool, import_config, spec_values
from jobs.spec.imports.base import Imported
from jobs.spec.job import JobSpec, SpecError
from jobs.spec.trackers import Tracker

FIXTURES = Path(__file__).parent / "fixtures" / "imports"
# Configs with no tunedeck equivalent: (the key named, what the problem says).
REFUSED = {"axolotl_qlora-1b-gdpo": ("rl", "`gdpo` has no tunedeck trainer")}
CONFIGS = sorted(p for p in FIXTURES.iterdir() if p.suffix in (".yaml", ".yml") and p.stem not in REFUSED)
GPU = DeviceFacts(
    kind="cuda", name="24 GiB GPU", total_bytes=24 * 1024**3, compute_capability="8.9", bf16=True, fp16=True
)

ALPACA = [{"instruction": f"Say the number {i}", "input": "", "output": f"The number is {i}."} for i in range(12)]
RANKED = [{"instruction": f"Greet person {i}", "chosen": f"Hello, person {i}!", "rejected": "no"} for i in range(12)]
KTO = [{"prompt": f"Is {i} even?", "completion": "yes" if i % 2 == 0 else "no", "good": True} for i in range(6)] + [
    {"prompt": f"Is {i} even?", "completion": "no" if i % 2 == 0 else "yes", "good": False} for i in range(6)
]
TEXT = [{"text": f"Plain text row number {i} for continued pre-training."} for i in range(12)]


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    """A LLaMA-Factory data folder: the names the fixtures use, registered for small files tunedeck reads."""
    folder = tmp_path / "lf-data"
    folder.mkdir()
    _write_jsonl(folder / "identity.jsonl", ALPACA)
    _write_jsonl(folder / "alpaca.jsonl", ALPACA)
    _write_jsonl(folder / "ranked.jsonl", RANKED)
    _write_jsonl(folder / "kto.jsonl", KTO)
    _write_jsonl(folder / "c4.jsonl", TEXT)
    _write_image_data(folder)
    info = {
        "identity": {"file_name": "identity.jsonl"},
        "alpaca_en_demo": {"file_name": "alpaca.jsonl"},
        "dpo_en_demo": {"file_name": "ranked.jsonl", "ranking": True},
        "kto_en_demo": {"file_name": "kto.jsonl", "columns": {"kto_tag": "good"}},
        "c4_demo": {"file_name": "c4.jsonl", "columns": {"prompt": "text"}},
        "mllm_demo": {
            "file_name": "mllm.json",
            "formatting": "sharegpt",
            "columns": {"messages": "messages", "images": "images"},
            "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"},
        },
        "rlhf_v": {
            "file_name": "rlhf.jsonl",
            "ranking": True,
            "formatting": "sharegpt",
            "columns": {"messages": "conversations", "chosen": "chosen", "rejected": "rejected", "images": "images"},
        },
    }
    (folder / "dataset_info.json").write_text(json.dumps(info))
    return folder


def _write_image_data(folder: Path) -> None:
    """LLaMA-Factory's two image data sets as its demo files write them: mllm_demo (ShareGPT turns in OpenAI tags,
    `<image>` in the text, `images` next to the file) and rlhf_v (ShareGPT pairs with images)."""
    from PIL import Image

    (folder / "mllm_demo_data").mkdir()
    for i, colour in enumerate([(220, 30, 30), (30, 30, 220)]):
        Image.new("RGB", (48, 40), colour).save(folder / "mllm_demo_data" / f"{i}.png")
    chat = [{"messages": [{"role": "user", "content": "<image>What colour is it?"},
                          {"role": "assistant", "content": name}], "images": [f"mllm_demo_data/{i}.png"]}
            for i, name in enumerate(["red", "blue"])] * 3  # fmt: skip
    (folder / "mllm.json").write_text(json.dumps(chat))
    pairs = [{"conversations": [{"from": "human", "value": "<image>What colour is it?"}],
              "chosen": {"from": "gpt", "value": name}, "rejected": {"from": "gpt", "value": "green"},
              "images": [f"mllm_demo_data/{i}.png"]} for i, name in enumerate(["red", "blue"])] * 3  # fmt: skip
    _write_jsonl(folder / "rlhf.jsonl", pairs)


def _load(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text())
    assert isinstance(data, dict)
    return data


def _import(path: Path, data_dir: Path | None = None) -> Imported:
    info = json.loads((data_dir / "dataset_info.json").read_text()) if data_dir else None
    return import_config(_load(path), dataset_info=info, dataset_dir=str(data_dir or "data"))


def _local_data(imported: Imported, tmp_path: Path) -> dict[str, Any]:
    """axolotl's hub data sets replaced by a local file of the trainer's rows (tests run offline)."""
    if imported.tool == "llamafactory":
        return {}
    trainer = imported.fields.get("trainer")
    if trainer == "kto":
        return {"dataset": "sample:kto-format", "dataset_columns": None}
    rows = RANKED if trainer in ("dpo", "orpo", "reward") else ALPACA
    path = tmp_path / f"{trainer}.jsonl"
    _write_jsonl(path, rows)
    return {"dataset": str(path), "dataset_columns": None}


def _accounted(imported: Imported, key: str) -> bool:
    listed = {k.strip() for n in imported.not_carried for k in n.key.split(",")}
    return key in imported.carried or key in listed


@pytest.mark.parametrize("config", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_every_fixture_imports_into_a_spec_that_passes_the_checks(
    config: Path, data_dir: Path, tiny_model: Path, tmp_path: Path, data_home: Path, request: pytest.FixtureRequest
) -> None:
    imported = _import(config, data_dir)
    data = _load(config)
    assert imported.tool == config.name.split("_")[0]  # told by the keys
    unaccounted = [k for k in data if not _accounted(imported, k)]
    assert not unaccounted, f"keys neither mapped nor listed: {unaccounted}"
    model: dict[str, Any] = {"model": str(tiny_model)}
    if "image_max_pixels" in imported.fields:  # a vision-language config: the tiny LLaVA, whose processor
        model = {"model": str(request.getfixturevalue("tiny_vlm")), "image_max_pixels": None}  # has no pixel budget
        # LLaMA-Factory's examples add its Alpaca text sets to the image chat: a job trains one row format, so
        # the check refuses that mix (test_import_of_llamafactorys_image_and_alpaca_mix_is_refused_before_queueing)
        model["dataset"] = imported.fields["dataset"].split(", ")[0]
    spec = build_spec(imported, {**model, **_local_data(imported, tmp_path)})
    checked = check(spec, device=GPU)
    assert checked.problems == [], [str(p) for p in checked.problems]


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_fixtures_without_equivalent_are_refused_naming_the_key(name: str) -> None:
    config = next(p for p in FIXTURES.iterdir() if p.stem == name)
    with pytest.raises(ImportConfigError) as err:
        _import(config, FIXTURES)
    field, says = REFUSED[name]
    assert [(p.field, p.problem) for p in err.value.problems] == [(field, says)]


def test_llamafactory_names_resolve_through_its_dataset_info() -> None:
    """LLaMA-Factory's own dataset_info.json: files in the data folder, each text data set a source, multimodal
    ones named."""
    sft = _import(FIXTURES / "llamafactory_qwen3_lora_sft.yaml", FIXTURES)
    # `dataset: identity,alpaca_en_demo` with max_samples: 1000, which LLaMA-Factory applies to each data set
    assert sft.fields["dataset"] == (
        f"{FIXTURES}/identity.json [max_rows=1000], {FIXTURES}/alpaca_en_demo.json [max_rows=1000]"
    )
    assert "dataset_columns" not in sft.fields and "max_train_samples" not in sft.fields
    assert "max_samples" in sft.carried
    assert not any("dataset" in n.key for n in sft.not_carried)
    dpo = _import(FIXTURES / "llamafactory_qwen3_lora_dpo.yaml", FIXTURES)
    assert (dpo.fields["trainer"], dpo.fields["loss_type"], dpo.fields["beta"]) == ("dpo", "sigmoid", 0.1)
    assert dpo.fields["dataset"].endswith("/dpo_en_demo.json")
    kto = _import(FIXTURES / "llamafactory_qwen3_lora_kto.yaml", FIXTURES)
    assert kto.fields["trainer"] == "kto" and "dataset_columns" not in kto.fields  # kto_tag is already `label`
    pretrain = _import(FIXTURES / "llamafactory_qwen3_lora_pretrain.yaml", FIXTURES)
    assert pretrain.fields["dataset"].endswith("/c4_demo.jsonl")
    assert (pretrain.fields["trainer"], pretrain.fields["packing"]) == ("sft", True)  # pt packs by default
    vl = _import(FIXTURES / "llamafactory_qwen3vl_lora_sft.yaml", FIXTURES)
    assert vl.fields["dataset"] == f"{FIXTURES}/mllm_demo.json [max_rows=1000], " + sft.fields["dataset"]
    assert vl.fields["image_max_pixels"] == 262144 and "dataset_columns" not in vl.fields
    why = {n.key: n.why for n in vl.not_carried}
    assert why["video_max_pixels"] == "tunedeck trains on images, not videos or audio"
    vl_dpo = _import(FIXTURES / "llamafactory_qwen3vl_lora_dpo.yaml", FIXTURES)
    assert (vl_dpo.fields["trainer"], vl_dpo.fields["dataset"]) == ("dpo", "llamafactory/RLHF-V")


def test_import_of_llamafactorys_image_and_alpaca_mix_is_refused_before_queueing(
    data_dir: Path, tiny_vlm: Path, data_home: Path
) -> None:
    imported = _import(FIXTURES / "llamafactory_qwen3vl_lora_sft.yaml", data_dir)
    spec = build_spec(imported, {"model": str(tiny_vlm), "image_max_pixels": None})
    problems = check(spec, device=GPU).problems
    assert [p.field for p in problems] == ["dataset"], problems
    assert "the sources come out in different row formats" in problems[0].problem
    assert "write the prompt/completion source's rows as chat `messages`" in problems[0].fix


@pytest.mark.parametrize(
    "flags, vision_train",
    [
        ({}, None),  # LLaMA-Factory's defaults: tower and projector frozen, i.e. tunedeck's default `language`
        ({"freeze_multi_modal_projector": False}, "language+projector"),
        ({"freeze_vision_tower": False}, "language+projector+vision"),
        ({"freeze_vision_tower": False, "freeze_multi_modal_projector": False}, "language+projector+vision"),
    ],
)
def test_llamafactorys_freeze_flags_become_vision_train(flags: dict[str, bool], vision_train: str | None) -> None:
    config = {**_load(FIXTURES / "llamafactory_qwen3vl_full_sft.yaml"), **flags}
    config.pop("freeze_vision_tower") if "freeze_vision_tower" not in flags else None
    config.pop("freeze_multi_modal_projector") if "freeze_multi_modal_projector" not in flags else None
    imported = import_config(config, dataset_info=json.loads((FIXTURES / "dataset_info.json").read_text()))
    assert imported.fields.get("vision_train") == vision_train
    with pytest.raises(ImportConfigError) as err:
        import_config({**config, "freeze_language_model": True}, dataset_info=None)
    assert [(p.field, p.fix) for p in err.value.problems if p.field == "freeze_language_model"] == [
        ("freeze_language_model", "remove freeze_language_model: tunedeck always trains the language model of a "
         "vision-language run")
    ]  # fmt: skip


def test_llamafactory_keys_and_defaults_carry_over() -> None:
    sft = _import(FIXTURES / "llamafactory_qwen3_lora_sft.yaml", FIXTURES)
    f = sft.fields
    assert (f["model"], f["method"], f["lora_target_modules"]) == ("Qwen/Qwen3-4B-Instruct-2507", "lora", "all-linear")
    # LLaMA-Factory's defaults where the file says nothing: alpha = 2 x rank, no dropout, checkpointing on
    assert (f["lora_r"], f["lora_alpha"], f["lora_dropout"], f["gradient_checkpointing"]) == (8, 16, 0.0, True)
    assert (f["max_length"], f["precision"], f["lr_scheduler_type"]) == (2048, "bf16", "cosine")
    dpo = _import(FIXTURES / "llamafactory_qwen3_lora_dpo.yaml", FIXTURES)
    assert dpo.fields["max_train_samples"] == 1000  # one data set: max_samples caps the training rows
    why = {n.key: n.why for n in sft.not_carried}
    assert "warmup_steps" in why["warmup_ratio"] and "template" in why
    assert "report_to" not in why and "report_to" not in f  # report_to: none -> no tracker, nothing left behind
    full = _import(FIXTURES / "llamafactory_qwen3_full_sft.yaml", FIXTURES)
    assert full.fields["method"] == "full" and "one GPU" in {n.key: n.why for n in full.not_carried}["deepspeed"]
    qlora = import_config({"stage": "sft", "model_name_or_path": "m", "quantization_bit": 4, "lora_rank": 16})
    assert (qlora.fields["method"], qlora.fields["lora_alpha"]) == ("qlora", 32)


def test_kto_micro_batch_of_one_becomes_two_with_the_same_effective_batch() -> None:
    kto = _import(FIXTURES / "llamafactory_qwen3_lora_kto.yaml", FIXTURES)
    assert (kto.fields["per_device_train_batch_size"], kto.fields["gradient_accumulation_steps"]) == (2, 4)
    assert any(n.key == "per_device_train_batch_size" and "KTO" in n.why for n in kto.not_carried)


def test_axolotl_keys_and_dataset_entries_carry_over() -> None:
    dpo = import_config(_load(FIXTURES / "axolotl_instruct-dpo-lora-8b.yml"))
    f = dpo.fields
    assert (f["trainer"], f["method"], f["lora_r"], f["lora_alpha"]) == ("dpo", "lora_8bit", 32, 16)
    assert (f["dataset"], f["dataset_columns"]) == ("fozziethebeat/alpaca_messages_2k_dpo_test", "prompt=conversation")
    assert (f["per_device_train_batch_size"], f["max_length"], f["optim"], f["precision"]) == (
        2,
        4096,
        "adamw_bnb_8bit",
        "auto",
    )
    two = import_config(_load(FIXTURES / "axolotl_lora-1b-deduplicate-dpo.yml"))
    # the file lists one data set twice (to show deduplication): read once, and said so
    assert any(n.key == "datasets[1]" and "reads each data set once" in n.why for n in two.not_carried)
    several = import_config(
        {
            "base_model": "m",
            "datasets": [
                {"path": "a.jsonl", "type": "alpaca", "field_instruction": "q", "field_output": "a"},
                {"path": "b.jsonl", "type": "sharegpt"},
            ],
        }
    )
    assert several.fields["dataset"] == "a.jsonl [instruction=q, output=a], b.jsonl"  # each entry a source
    assert "dataset_columns" not in several.fields
    kto = import_config(_load(FIXTURES / "axolotl_qlora-1b-kto.yml"))
    assert (kto.fields["trainer"], kto.fields["method"], kto.fields["beta"], kto.fields["desirable_weight"]) == (
        "kto",
        "qlora",
        0.5,
        0.2,
    )
    assert any(n.key == "datasets[0].type" and "llama3.ultra" in n.why for n in kto.not_carried)
    lora = import_config(_load(FIXTURES / "axolotl_lora-1b.yml"))
    assert lora.fields["lora_target_modules"] == "gate_proj,down_proj,up_proj,q_proj,v_proj,k_proj,o_proj"
    assert lora.fields["packing"] is True and lora.fields["eval_split"] == 0.1
    custom = import_config(
        {
            "base_model": "m",
            "datasets": [{"path": "q.jsonl", "type": "alpaca", "field_instruction": "question", "shuffle_me": 1}],
        }
    )
    assert custom.fields["dataset_columns"] == "instruction=question"
    assert any(
        n.key == "datasets[0].shuffle_me" and "unknown to the axolotl importer" in n.why for n in custom.not_carried
    )


def test_trl_configs_import_and_pass_the_checks(tiny_model: Path, data_home: Path) -> None:
    sft = import_config(
        {
            "model_name_or_path": "Qwen/Qwen2-0.5B",
            "dataset_name": "trl-lib/Capybara",
            "learning_rate": 2.0e-4,
            "max_length": 256,
            "per_device_train_batch_size": 2,
            "use_peft": True,
            "lora_r": 32,
            "lora_alpha": 16,
            "lora_target_modules": ["q_proj", "v_proj"],
            "output_dir": "out",
            "report_to": "none",
        }
    )
    assert sft.tool == "trl"
    assert (sft.fields["trainer"], sft.fields["method"], sft.fields["lora_target_modules"]) == (
        "sft",
        "lora",
        "q_proj,v_proj",
    )
    spec = build_spec(
        sft, {"model": str(tiny_model), "dataset": "sample:chat-format", "lora_target_modules": "all-linear"}
    )
    assert check(spec, device=GPU).problems == []
    dpo = import_config(
        {"model_name_or_path": "m", "dataset_name": "d", "beta": 0.2, "load_in_4bit": True, "use_peft": True}
    )
    assert (dpo.fields["trainer"], dpo.fields["method"], dpo.fields["beta"], dpo.fields["learning_rate"]) == (
        "dpo",
        "qlora",
        0.2,
        1e-6,
    )
    spec = build_spec(dpo, {"model": str(tiny_model), "dataset": "sample:preference-format"})
    assert check(spec, device=GPU).problems == []


def test_an_unknown_key_is_listed_as_not_carried_over() -> None:
    data = _load(FIXTURES / "llamafactory_qwen3_lora_sft.yaml") | {"fancy_new_option": 3}
    imported = import_config(data, dataset_info=json.loads((FIXTURES / "dataset_info.json").read_text()))
    why = {n.key: n.why for n in imported.not_carried}
    assert why["fancy_new_option"] == "unknown to the llamafactory importer; nothing maps it"


@pytest.mark.parametrize(
    ("change", "field", "says"),
    [
        ({"stage": "ppo"}, "stage", "ppo has no tunedeck trainer"),
        ({"finetuning_type": "freeze"}, "finetuning_type", "freeze"),
        ({"pref_loss": "simpo"}, "pref_loss", "simpo has no tunedeck equivalent"),
        ({"quantization_bit": 3}, "quantization_bit", "is not 4 or 8"),
        ({"bf16": "maybe"}, "bf16", "expected true or false"),
        ({"do_train": False}, "do_train", "does not train"),
        ({"dataset": "no_such_set"}, "dataset", "is not in dataset_info.json"),
    ],
)
def test_a_value_without_equivalent_is_an_error_naming_the_key(change: dict[str, Any], field: str, says: str) -> None:
    data = _load(FIXTURES / "llamafactory_qwen3_lora_dpo.yaml") | change
    with pytest.raises(ImportConfigError) as err:
        import_config(data, dataset_info=json.loads((FIXTURES / "dataset_info.json").read_text()))
    assert [p.field for p in err.value.problems] == [field]
    assert says in err.value.problems[0].problem and err.value.problems[0].fix


def test_a_bad_value_names_the_spec_field_and_the_source_key() -> None:
    imported = import_config(_load(FIXTURES / "axolotl_lora-8b.yml") | {"sequence_len": "long", "micro_batch_size": 0})
    with pytest.raises(SpecError) as err:
        build_spec(imported)
    fields = {p.field for p in err.value.problems}
    assert fields == {"max_length (from sequence_len)", "per_device_train_batch_size (from micro_batch_size)"}


def test_detection_and_missing_dataset_info() -> None:
    assert detect_tool({"stage": "sft"}) == "llamafactory"
    assert detect_tool({"base_model": "m"}) == "axolotl"
    assert detect_tool({"model_name_or_path": "m", "dataset_name": "d"}) == "trl"
    with pytest.raises(ImportConfigError) as err:
        detect_tool({"learning_rate": 1e-4})
    assert err.value.problems[0].fix == "pass --from llamafactory, axolotl or trl"
    with pytest.raises(ImportConfigError) as err:
        import_config(_load(FIXTURES / "llamafactory_qwen3_lora_sft.yaml"))  # no dataset_info.json given
    assert [p.field for p in err.value.problems] == ["dataset"] and "--dataset-dir" in err.value.problems[0].fix


def test_cli_writes_the_spec_with_the_list_on_top_and_on_stderr(
    data_dir: Path, tiny_model: Path, tmp_path: Path, data_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "spec.yaml"
    config = FIXTURES / "llamafactory_qwen3_lora_sft_ds3.yaml"
    argv = ["import", str(config), "--dataset-dir", str(data_dir), "--set", f"model={tiny_model}", "-o", str(out)]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "not carried over: deepspeed: tunedeck trains each run on one GPU" in err
    text = out.read_text()
    assert text.startswith("# imported by `tunedeck import`") and "#   not carried over: deepspeed:" in text
    spec = JobSpec.from_yaml(text)
    assert (spec.model, spec.dataset, spec.gradient_accumulation_steps) == (
        str(tiny_model),
        f"{data_dir}/identity.jsonl [max_rows=1000], {data_dir}/alpaca.jsonl [max_rows=1000]",
        2,
    )
    assert spec_values(_import(config, data_dir), {"model": str(tiny_model)}) == yaml.safe_load(text)
    capsys.readouterr()
    assert main(["submit", str(out)]) == 0  # the written spec is queued as it is
    assert capsys.readouterr().out.strip().isdigit()


def test_cli_reports_problems_with_field_and_fix(data_dir: Path, tmp_path: Path, data_home: Path, capsys) -> None:
    config = FIXTURES / "llamafactory_qwen3_lora_sft.yaml"
    assert main(["import", str(config), "--dataset-dir", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err
    assert "dataset: names data sets of LLaMA-Factory's dataset_info.json (identity, alpaca_en_demo)" in err
    assert "Fix: pass --dataset-dir" in err
    # The spec is written, and the check submit runs names what it would refuse (the model is not here).
    spec = tmp_path / "spec.yaml"
    assert main(["import", str(config), "--dataset-dir", str(data_dir), "-o", str(spec)]) == 2
    err = capsys.readouterr().err
    assert spec.is_file() and "submit would refuse it as it is" in err and "\n  model: " in err
    assert main(["import", str(config), "--dataset-dir", str(data_dir), "--set", "nonsense"]) == 2
    assert "--set: `nonsense` is not key=value" in capsys.readouterr().err


# ---------------------------------------------------------------------- the form's Import config button
def test_form_import_fills_the_form_from_the_config_and_its_uploaded_data(data_dir: Path, data_home: Path) -> None:
    from app.ui.form_spec import NAMES
    from app.ui.form_yaml import import_files
    from storage.settings import uploads_dir

    config = FIXTURES / "llamafactory_qwen3_lora_sft.yaml"
    data = [str(data_dir / "identity.jsonl"), str(data_dir / "alpaca.jsonl")]
    out = import_files([str(config), str(data_dir / "dataset_info.json"), *data])
    values, note = dict(zip(NAMES, out[:-1])), out[-1]
    sources = JobSpec(dataset=values["dataset"]).dataset_sources  # both data sets, each capped by max_samples
    assert [(Path(s.ref).parent, s.max_rows) for s in sources] == [(uploads_dir(), 1000)] * 2  # the uploaded copies
    assert (values["trainer"], values["method"], values["lora_r"], values["max_length"]) == ("sft", "lora", 8, 2048)
    assert note.startswith("### Imported llamafactory config") and "dataset: alpaca_en_demo" not in note
    assert "- **report_to**" not in note  # `report_to: none` is carried over (as no tracker)


def test_form_import_reports_what_cannot_be_imported(data_home: Path) -> None:
    from app.ui.form_yaml import import_files

    out = import_files([str(FIXTURES / "llamafactory_qwen3_lora_sft.yaml")])  # no dataset_info.json with it
    assert all(v is not None for v in out)
    assert "problem(s)" in out[-1] and "**dataset**: names data sets of LLaMA-Factory's dataset_info.json" in out[-1]
    out = import_files([str(FIXTURES / "axolotl_qlora-1b-gdpo.yml")])
    assert "**rl**: `gdpo` has no tunedeck trainer" in out[-1]


LF_DEMO = Path(__file__).parent / "fixtures" / "llamafactory"  # slices of LLaMA-Factory's own data/ folder


@pytest.mark.parametrize(
    ("config", "trainer", "rows"),
    [("llamafactory_qwen3_lora_dpo.yaml", "dpo", 40), ("llamafactory_qwen3_lora_kto.yaml", "kto", 40)],
)
def test_llamafactory_demo_data_submit_whole_for_their_trainers(
    config: str, trainer: str, rows: int, tiny_model: Path, tmp_path: Path, data_home: Path, capsys
) -> None:
    """`tunedeck import` with --dataset-dir at LLaMA-Factory's data (its dataset_info.json names the demo files):
    the spec passes the checks, and every row of the demo slice is accepted."""
    out = tmp_path / "spec.yaml"
    argv = ["import", str(FIXTURES / config), "--dataset-dir", str(LF_DEMO), "--set", f"model={tiny_model}"]
    assert main([*argv, "-o", str(out)]) == 0, capsys.readouterr().err
    spec = JobSpec.from_yaml(out.read_text())
    assert spec.trainer.value == trainer and spec.dataset == f"{LF_DEMO}/{trainer}_en_demo.json"
    checked = check(spec, device=GPU)
    assert checked.problems == [], [str(p) for p in checked.problems]
    info = checked.data["dataset"]
    assert info.n_rows == rows == len(json.loads((LF_DEMO / f"{trainer}_en_demo.json").read_text()))


def test_llamafactory_several_data_sets_become_sources_and_pass_the_checks(
    tiny_model: Path, tmp_path: Path, data_home: Path
) -> None:
    """`dataset: identity,dpo_en_demo`-style lists: each a source, converted on its own, capped by max_samples."""
    info = json.loads((LF_DEMO / "dataset_info.json").read_text())
    config = {"stage": "sft", "model_name_or_path": "m", "finetuning_type": "lora", "max_samples": 10}
    config |= {"dataset": "identity, identity_two", "eval_dataset": "identity,identity_two"}
    config |= {"mix_strategy": "interleave_under", "interleave_probs": "0.5,0.5"}
    lines = (LF_DEMO / "identity.json").read_text()
    (tmp_path / "identity.json").write_text(lines)
    two = [{"instruction": r["instruction"], "output": r["output"]} for r in json.loads(lines)[:5]]
    (tmp_path / "two.jsonl").write_text("".join(json.dumps(r) + "\n" for r in two))
    info = {"identity": info["identity"], "identity_two": {"file_name": "two.jsonl"}}
    imported = import_config(config, dataset_info=info, dataset_dir=str(tmp_path))
    assert imported.fields["dataset"] == f"{tmp_path}/identity.json [max_rows=10], {tmp_path}/two.jsonl [max_rows=10]"
    assert imported.fields["eval_dataset"] == imported.fields["dataset"]  # the same lists and caps
    why = {n.key: n.why for n in imported.not_carried}
    assert "concatenates" in why["mix_strategy"] and "concatenates" in why["interleave_probs"]
    checked = check(build_spec(imported, {"model": str(tiny_model)}), device=GPU)
    assert [str(p) for p in checked.problems] == []
    assert [p.n_rows for p in checked.data["dataset"].parts] == [10, 5]
    assert checked.data["eval_dataset"].n_rows == 15


def test_axolotl_shuffle_of_merged_datasets_is_what_tunedeck_does() -> None:
    entries = [{"path": "a.jsonl"}, {"path": "b.jsonl"}]
    shuffled = import_config({"base_model": "m", "datasets": entries, "shuffle_merged_datasets": True})
    assert shuffled.fields["dataset"] == "a.jsonl, b.jsonl" and "shuffle_merged_datasets" in shuffled.carried
    kept = import_config({"base_model": "m", "datasets": entries, "shuffle_merged_datasets": False})
    assert "always shuffles" in {n.key: n.why for n in kept.not_carried}["shuffle_merged_datasets"]


def test_report_to_carries_over_from_each_tool() -> None:
    """report_to reaches the spec: the trackers tunedeck mirrors to kept, the others listed as not carried over."""
    base = {"model_name_or_path": "m", "stage": "sft", "finetuning_type": "lora", "dataset": "d"}
    lf = import_config(
        {**base, "report_to": ["wandb", "swanlab", "mlflow"]}, dataset_info={"d": {"file_name": "d.jsonl"}}
    )
    assert lf.fields["report_to"] == "wandb,mlflow" and lf.origins["report_to"] == "report_to"
    assert (
        "swanlab: tunedeck mirrors metrics to wandb, mlflow, tensorboard, trackio only"
        in {n.key: n.why for n in lf.not_carried}["report_to"]
    )
    trl = import_config({"model_name_or_path": "m", "dataset_name": "d", "use_peft": True, "report_to": "tensorboard"})
    assert trl.fields["report_to"] == "tensorboard"
    axolotl = import_config(
        {
            "base_model": "m",
            "adapter": "lora",
            "micro_batch_size": 1,
            "wandb_project": "p",
            "wandb_entity": "e",
            "use_tensorboard": True,
            "datasets": [{"path": "d.jsonl", "type": "alpaca"}],
        }
    )
    assert axolotl.fields["report_to"] == "wandb,tensorboard"
    why = {n.key: n.why for n in axolotl.not_carried}
    assert "WANDB_ENTITY" in why["wandb_entity"] and "wandb_project" not in why
    assert JobSpec.from_dict(axolotl.fields | {"dataset": "sample:chat-format"}).tracker_list == [
        Tracker.WANDB,
        Tracker.TENSORBOARD,
    ]
