"""Exports of a vision-language run: GGUF refused before queueing (with llama.cpp's --mmproj way out), and a
tiny LLaVA LoRA run's merged export, checked on an image prompt, saved with its processor and reloaded with
AutoModelForImageTextToText + AutoProcessor answering about an image as the adapter does."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from test_vision import parts_rows, write_rows

from jobs.spec.job import JobSpec


def vlm_spec(model: Path, data: Path, **changes) -> JobSpec:
    settings = {"model": str(model), "dataset": str(data), "max_steps": 2, "per_device_train_batch_size": 2,
                "learning_rate": 1e-2, "sample_count": 0, **changes}  # fmt: skip
    return JobSpec.from_dict(settings)


def finished_run(store, spec: JobSpec) -> int:
    """A run record marked succeeded without training (the refusals read only its spec)."""
    run_id = store.create_run(spec)
    assert store.claim_next_on_device("test-worker", "fake") is not None
    store.mark_succeeded(run_id, {})
    return run_id


# ---------------------------------------------------------------------- GGUF: refused before queueing
def test_gguf_of_a_vision_family_without_a_projector_writer_is_refused_before_queueing(
    store, tmp_path: Path, tiny_vlm: Path
) -> None:
    """The tiny LLaVA has LLaVA 1.5's CLIP tower: llama.cpp's converter registers LlavaForConditionalGeneration
    for Pixtral's tower only (its LlavaVisionModel raises "Unsupported model type" for CLIP's)."""
    from test_gguf_export import _converter

    from jobs.export.gguf import export_gguf
    from jobs.export.merged import ExportError
    from jobs.worker.tasks import request_export

    _converter()
    run_id = finished_run(store, vlm_spec(tiny_vlm, write_rows(tmp_path / "d.jsonl", parts_rows(tmp_path, 2))))
    with pytest.raises(ExportError) as caught:
        request_export(store, run_id, merged=True, dtype="fp32", gguf=["f16"])
    [problem] = caught.value.problems
    assert problem.field == "gguf" and f"run {run_id} is a vision-language model" in problem.problem
    assert "writes no vision projector (mmproj)" in problem.problem
    assert "llava (LlavaForConditionalGeneration) with a clip_vision_model vision tower" in problem.problem
    assert "--merged" in problem.fix
    assert store.run_tasks(run_id) == []  # nothing reached a worker
    with pytest.raises(ExportError) as direct:  # `tunedeck export RUN --gguf f16` says the same
        export_gguf(store, run_id, "f16")
    assert direct.value.problems == [problem]
    assert len(request_export(store, run_id, merged=True, dtype="fp32", gguf=[])) == 1  # merged is fine


def test_gguf_of_a_text_run_is_not_refused_for_images(store, tiny_model: Path) -> None:
    from training_helpers import tiny_spec

    from jobs.export.vision import gguf_problems, vision_run

    run_id = finished_run(store, tiny_spec(tiny_model))
    assert not vision_run(store, run_id) and gguf_problems(store, run_id, ["f16"]) == []


# ---------------------------------------------------------------------- merged: checked on an image
@pytest.fixture(scope="module")
def vlm_run(tmp_path_factory: pytest.TempPathFactory, tiny_vlm: Path):
    """(Store, run id): a finished 2-step LoRA run of the tiny LLaVA on 4 image rows, trained by the worker."""
    from jobs.worker.loop import Worker
    from storage.models import RunStatus
    from storage.store import Store

    folder = tmp_path_factory.mktemp("vlm-export")
    data = write_rows(folder / "train.jsonl", parts_rows(folder, 4))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TUNEDECK_HOME", str(folder / "home"))
        mp.delenv("TUNEDECK_DATABASE_URL", raising=False)
        store = Store()
        run_id = store.create_run(vlm_spec(tiny_vlm, data))
        Worker(store, poll_interval=0.1).work(burst=True)
        run = store.get_run(run_id)
        assert run.status is RunStatus.SUCCEEDED, run.error_detail
        yield store, run_id
        store.dispose()


@pytest.mark.integration
def test_merged_export_of_a_vision_run_reloads_and_answers_about_an_image(vlm_run, tiny_vlm: Path) -> None:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from jobs.export.image_check import IMAGE_QUESTION, check_image, image_inputs
    from jobs.export.merged import CHECK_NEW_TOKENS, CHECK_PROMPTS, export_merged
    from jobs.export.vision import image_greedy

    store, run_id = vlm_run
    result = export_merged(store, run_id, "fp32")
    check = result.check
    assert check.passed and check.equal, check
    assert check.prompts == [*CHECK_PROMPTS, f"[image] {IMAGE_QUESTION}"]
    folder = result.folder
    assert json.loads((folder / "export-check.json").read_text())["prompts"][-1] == f"[image] {IMAGE_QUESTION}"
    assert (folder / "processor_config.json").is_file() and not (folder / "adapter_config.json").exists()
    # Reloaded with plain transformers (no peft), it answers the image prompt as the adapter does.
    merged = AutoModelForImageTextToText.from_pretrained(folder).eval()
    processor = AutoProcessor.from_pretrained(folder)
    adapter = next(Path(a.path) for a in store.artifacts(run_id) if a.kind == "adapter")
    tuned = PeftModel.from_pretrained(AutoModelForImageTextToText.from_pretrained(tiny_vlm), adapter).eval()
    inputs = image_inputs(processor, check_image())
    assert inputs["pixel_values"].shape == (1, 3, 32, 32)
    with torch.no_grad():
        assert torch.allclose(merged(**inputs).logits, tuned(**inputs).logits, atol=1e-4)
    assert image_greedy(merged, processor, CHECK_NEW_TOKENS)[0] == image_greedy(tuned, processor, CHECK_NEW_TOKENS)[0]
    # The card's snippet runs as written from the folder.
    card = (folder / "README.md").read_text()
    snippet = card.split("```python\n", 1)[1].split("```", 1)[0]
    assert "AutoProcessor" in snippet and "AutoModelForImageTextToText" in snippet and "peft" not in snippet
    ran = subprocess.run([sys.executable, "-c", snippet], cwd=folder, capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr[-2000:]


# ---------------------------------------------------------------------- the form: thumbnails, image support
def test_the_forms_preview_shows_thumbnails_and_whether_the_model_takes_images(
    data_home: Path, tmp_path: Path, tiny_vlm: Path, tiny_model: Path
) -> None:
    import base64
    import io

    from PIL import Image

    from app.ui.data import preview_for_form, preview_with_lengths
    from app.ui.thumbnails import THUMBNAIL_PX

    data = str(write_rows(tmp_path / "train.jsonl", parts_rows(tmp_path, 3)))
    text, rows = preview_with_lengths(data, "sft", str(tiny_vlm), 1024)
    assert f"model `{tiny_vlm}`: a vision-language model, takes images" in text, text
    cell = rows.iloc[1]["images"]
    assert cell.startswith('<img src="data:image/png;base64,') and str(tmp_path / "pics" / "1.png") in cell
    picture = Image.open(io.BytesIO(base64.b64decode(cell.split(",", 1)[1].split('"', 1)[0])))
    assert picture.size == (THUMBNAIL_PX, THUMBNAIL_PX) and picture.getpixel((40, 40)) == (30, 30, 220)  # blue
    _, table = preview_for_form(data, "sft", str(tiny_vlm), 1024, None)
    assert dict(zip(rows.columns, table.datatype)) == {"messages": "str", "images": "html"}
    text, _ = preview_with_lengths(data, "sft", str(tiny_model), 1024)
    assert f"model `{tiny_model}`: text-only, does not take images" in text, text
    other = tmp_path / "more"
    other.mkdir()
    mixed = f"{data}, {write_rows(other / 'more.jsonl', parts_rows(other, 2))}"  # a mixture: thumbnails too
    _, rows = preview_with_lengths(mixed, "sft", str(tiny_vlm), 1024)
    assert all(cell.startswith('<img src="data:image/png;base64,') for cell in rows["images"]), rows["images"]
    text, rows = preview_with_lengths(str(tmp_path / "none.jsonl"), "sft", str(tiny_vlm), 1024)
    assert "takes images" not in text and rows.empty  # no data: only the data's problem
