"""The launch form's pure parts: field labels and applicability, presets, components, the YAML preview."""

from __future__ import annotations

import tempfile
from enum import Enum

import gradio as gr
import pytest

from app.ui import form as ui_form
from app.ui import form_yaml
from jobs.spec import presets
from jobs.spec.enums import RANKED_METHODS, Method, Trainer
from jobs.spec.field_info import deciding_fields, field_infos
from jobs.spec.job import JobSpec
from jobs.spec.presets import PRESET_FIELDS, PRESETS, apply_preset, describe

INFOS = {f.name: f for f in field_infos()}
QLORA_FIELDS = {"bnb_4bit_quant_type", "bnb_4bit_use_double_quant", "bnb_4bit_compute_dtype"}


def _form(spec: JobSpec) -> dict:
    return dict(zip(ui_form.NAMES, ui_form.form_values(spec)))


# ---------------------------------------------------------------------- labels and applicability
def test_every_field_declares_a_label_shown_with_its_spec_name():
    from dataclasses import fields

    missing = [f.name for f in fields(JobSpec) if not f.metadata.get("label")]
    assert not missing, f"declare label=... in spec_field(...) for: {missing}"
    assert INFOS["lora_r"].title == "LoRA rank (lora_r)"
    assert len({f.label for f in INFOS.values()}) == len(INFOS), "two fields share a label"


def test_applicability_names_enum_fields_and_their_values():
    for info in INFOS.values():
        for name, allowed in info.when:
            assert name != info.name and INFOS[name].kind == "enum", (info.name, name)
            assert allowed and allowed <= set(INFOS[name].choices), (info.name, allowed)
    assert deciding_fields() == ["method", "optim", "trainer"]  # optim: the low-rank fields of GaLore/APOLLO


@pytest.mark.parametrize("method", list(Method))
def test_qlora_fields_apply_only_to_qlora(method):
    shown = ui_form.visibility({"trainer": "sft", "method": method.value})
    assert all(shown[n] is (method is Method.QLORA) for n in QLORA_FIELDS), shown
    # The rank applies to every ranked adapter (LoRA family, MoRA, LoKr, LoHa, VeRA, MiSS, HiRA), never to the rest.
    assert shown["lora_r"] is (method in RANKED_METHODS)
    assert shown["lora_r"] is not (
        method
        in {Method.FULL, Method.IA3, Method.OFT, Method.ADAPTION_PROMPT}
        | {Method.PROMPT_TUNING, Method.PREFIX_TUNING, Method.P_TUNING}
    )
    assert shown["num_virtual_tokens"] is (method in {Method.PROMPT_TUNING, Method.PREFIX_TUNING, Method.P_TUNING})


def test_trainer_decides_beta_and_the_sft_only_fields():
    sft, dpo = (
        ui_form.visibility({"trainer": "sft", "method": "lora"}),
        ui_form.visibility({"trainer": "dpo", "method": "lora"}),
    )
    assert not sft["beta"] and dpo["beta"]
    assert sft["packing"] and not dpo["packing"] and sft["completion_only_loss"] and not dpo["completion_only_loss"]


def test_an_unknown_deciding_value_keeps_the_field_in_view():
    assert INFOS["lora_r"].applies({"method": "not-a-method"})
    assert INFOS["lora_r"].applies({})


def test_a_field_that_does_not_apply_takes_its_default_in_the_spec():
    values = {
        **_form(JobSpec()),
        "trainer": "dpo",
        "dataset": "sample:preference-format",
        "packing": True,
        "method": "full",
        "lora_r": 64,
        "bnb_4bit_quant_type": "fp4",
        "learning_rate": 1e-5,
    }
    spec = ui_form.spec_from_form(values)  # packing would be a DPO problem if it were kept
    assert spec.packing is False and spec.lora_r == 16 and spec.bnb_4bit_quant_type.value == "nf4"
    assert "lora_r: 16" in spec.to_yaml()


def test_fields_that_apply_keep_their_values():
    spec = JobSpec(method=Method.QLORA, lora_r=8, trainer=Trainer.DPO, beta=0.3, dataset="sample:preference-format")
    assert ui_form.spec_from_form(_form(spec)) == spec


# ---------------------------------------------------------------------- presets
def test_every_preset_sets_the_same_fields_and_gives_a_valid_spec():
    for p in PRESETS:
        assert tuple(p.values) == PRESET_FIELDS, p.name
        for trainer, data in ((Trainer.SFT, "sample:chat-format"), (Trainer.DPO, "sample:preference-format")):
            spec, _ = apply_preset(JobSpec(trainer=trainer, dataset=data), p.name)
            assert spec.problems() == [], (p.name, trainer)
    assert [p.name for p in PRESETS] == ["Quick test", "Low memory", "Fast", "Balanced", "Best quality"]


def test_balanced_is_the_defaults():
    spec, changes = apply_preset(JobSpec(), "Balanced")
    assert spec == JobSpec() and changes == []
    assert describe("Balanced", changes) == "Balanced: already set, nothing changed."


@pytest.mark.parametrize("first", [p.name for p in PRESETS])
@pytest.mark.parametrize("then", [p.name for p in PRESETS])
def test_a_preset_leaves_nothing_of_the_one_before(first, then):
    start = JobSpec(trainer=Trainer.DPO, dataset="sample:preference-format", run_name="mine", seed=7)
    after_first, _ = apply_preset(start, first)
    assert apply_preset(after_first, then)[0] == apply_preset(start, then)[0]


def test_a_preset_says_what_it_changed():
    spec, changes = apply_preset(JobSpec(), "Low memory")
    assert spec.method is Method.QLORA and spec.gradient_checkpointing and spec.effective_batch_size == 8
    assert {c.field for c in changes} == {
        "method",
        "lora_r",
        "lora_alpha",
        "per_device_train_batch_size",
        "gradient_accumulation_steps",
        "gradient_checkpointing",
        "optim",
    }
    text = describe("Low memory", changes)
    assert text.startswith("Low memory changed 7 field(s): Method (method) lora → qlora;")
    assert "Gradient checkpointing (gradient_checkpointing) off → on" in text


@pytest.mark.parametrize(
    "name, cuda, modules, on",
    [
        ("Low memory", None, frozenset(), set()),  # no worker known: the device tricks stay off
        ("Low memory", True, frozenset(), {"activation_offloading"}),  # offloaded checkpointing on a GPU
        ("Low memory", False, frozenset(), {"cpu_return_freed_memory"}),
        ("Fast", True, frozenset(), set()),  # Liger is not installed there
        ("Fast", True, frozenset({"liger_kernel"}), {"use_liger_kernel"}),
        ("Fast", False, frozenset({"liger_kernel"}), set()),  # Triton needs CUDA
        ("Balanced", True, frozenset({"liger_kernel"}), set()),
    ],
)
def test_presets_use_the_device_tricks_where_the_workers_device_can(name, cuda, modules, on):
    from jobs.config.mapping import capability_problems
    from jobs.devices.facts import CPU, Device

    spec, _ = apply_preset(JobSpec(), name, cuda, modules)
    tricks = ("activation_offloading", "use_liger_kernel", "cpu_return_freed_memory")
    assert {t for t in tricks if getattr(spec, t)} == on
    device = Device(cuda=True, bf16=True, name="GPU") if cuda else CPU
    assert capability_problems(spec, device) == []
    grpo, _ = apply_preset(JobSpec(trainer=Trainer.GRPO, rewards="repetition"), name, cuda, modules)
    assert not grpo.activation_offloading  # trl's GRPO has no offloading: the preset leaves it off


def test_an_unknown_preset_names_the_choices():
    with pytest.raises(KeyError, match="Quick test, Low memory, Fast, Balanced, Best quality"):
        presets.preset("Fastest")


def test_the_form_applies_a_preset_to_its_own_fields():
    out = ui_form.choose_preset("Quick test", *ui_form.form_values(JobSpec()))
    values, note = dict(zip(PRESET_FIELDS, out[:-1])), out[-1]
    assert values["max_steps"] == 10 and values["method"] == "lora" and values["max_train_samples"] == 64
    assert note.startswith("Quick test changed")


def test_a_preset_still_applies_when_the_form_has_problems():
    bad = {**_form(JobSpec()), "learning_rate": 0}
    out = ui_form.choose_preset("Low memory", *[bad[n] for n in ui_form.NAMES])
    assert dict(zip(PRESET_FIELDS, out[:-1]))["method"] == "qlora" and "1 problem(s) remain" in out[-1]


# ---------------------------------------------------------------------- components
def test_numbers_carry_their_range_and_short_float_ranges_are_sliders():
    with gr.Blocks():
        rank = ui_form.make_component(INFOS["lora_r"])
        dropout = ui_form.make_component(INFOS["lora_dropout"])
        lr = ui_form.make_component(INFOS["learning_rate"])
    assert isinstance(rank, gr.Number) and (rank.minimum, rank.maximum, rank.step) == (1, 4096, 1)
    assert rank.label == "LoRA rank (lora_r)"
    assert isinstance(dropout, gr.Slider) and (dropout.minimum, dropout.maximum) == (0.0, 0.9)
    assert isinstance(lr, gr.Number) and lr.step == pytest.approx(1e-5)


def test_events_reading_the_form_leave_range_checks_to_the_spec(store):
    """Gradio's Number/Slider preprocessing raises on the first out-of-range box without naming it."""
    from app.ui.dashboard import build_ui

    demo = build_ui(store)
    titles = {f.title for f in INFOS.values()}  # the launch form's fields, by their labels
    bounded = {
        c._id
        for c in demo.blocks.values()
        if isinstance(c, (gr.Number, gr.Slider))
        and c.label in titles
        and (c.minimum is not None or c.maximum is not None)
    }
    readers = [fn for fn in demo.fns.values() if bounded & {c._id for c in fn.inputs}]
    assert len(readers) >= 5 and all(not fn.preprocess for fn in readers), [fn.name for fn in readers if fn.preprocess]


def test_form_events_stay_off_the_api_page(store):
    from app.ui.dashboard import build_ui

    named = build_ui(store).get_api_info()["named_endpoints"]
    internal = {
        "/budget_text",
        "/preview_spec",
        "/choose_preset",
        "/show_applicable",
        "/load_yaml",
        "/import_files",
        "/save_upload",
        "/preview_with_lengths",
        "/preview_for_form",
    }
    assert not internal & set(named), sorted(named)


# ---------------------------------------------------------------------- YAML preview (issue 14)
def test_preview_spec_leaves_no_folder_per_click(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    for i in range(form_yaml.PREVIEWS_KEPT + 5):
        out = ui_form.preview_spec(*ui_form.form_values(JobSpec(run_name=f"run-{i}")))
        assert f"run_name: run-{i}" in out[0]
    ours = [p.name for p in tmp_path.iterdir() if p.name != "gradio"]  # gradio: Gradio's own file cache
    assert ours == [form_yaml.PREVIEW_DIR_NAME]
    assert len(list((tmp_path / form_yaml.PREVIEW_DIR_NAME).iterdir())) == form_yaml.PREVIEWS_KEPT
    ui_form.preview_spec(*ui_form.form_values(JobSpec(run_name="run-0")))
    ui_form.preview_spec(*ui_form.form_values(JobSpec(run_name="run-0")))
    assert len(list((tmp_path / form_yaml.PREVIEW_DIR_NAME).iterdir())) == form_yaml.PREVIEWS_KEPT


def test_preview_of_a_bad_form_shows_the_problems_and_no_file(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    bad = {**_form(JobSpec()), "lora_r": 0}
    text, _, errors, _ = ui_form.preview_spec(*[bad[n] for n in ui_form.NAMES])
    assert text == "" and "**lora_r**" in errors and not list(tmp_path.iterdir())


def test_enum_values_in_presets_are_spec_enums():
    for p in PRESETS:
        for name, value in p.values.items():
            if INFOS[name].kind == "enum":
                assert isinstance(value, Enum) and value.value in INFOS[name].choices
