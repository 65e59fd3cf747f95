"""A second vision-language family, Gemma 3 (its processor builds offline without torchvision): the image-token
count the memory prediction uses equals the processor's real input_ids length, and a LoRA run trains it
through the same path as the tiny LLaVA (`jobs.models.tiny_gemma3`, images drawn with PIL)."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_vision import COLOURS, draw, parts_rows, write_rows

from jobs.spec.job import JobSpec


@pytest.fixture(scope="module")
def tiny_gemma3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from jobs.models.tiny_gemma3 import build_tiny_gemma3

    return build_tiny_gemma3(tmp_path_factory.mktemp("tiny-gemma3") / "tiny-gemma3")


def image_rows(folder: Path) -> Path:
    """3 image chat rows: a square, a tall picture, and a row with two images."""
    rows = parts_rows(folder, 3)
    draw(folder / "pics" / "1.png", COLOURS["blue"], size=(40, 90))
    rows[2]["messages"][0]["content"].insert(0, {"type": "image", "image": "pics/0.png"})
    return write_rows(folder / "train.jsonl", rows)


def test_gemma3_image_tokens_counted_as_its_processor_makes_them(
    data_home: Path, tmp_path: Path, tiny_gemma3: Path
) -> None:
    from transformers import AutoProcessor
    from trl.data_utils import prepare_multimodal_messages

    from jobs.checks.memory import measured_lengths
    from jobs.data.loading import load_data
    from jobs.models.vision import pixel_limit, vision_model

    assert vision_model(str(tiny_gemma3)) is True and pixel_limit(str(tiny_gemma3)) == 32 * 32
    spec = JobSpec(model=str(tiny_gemma3), dataset=str(image_rows(tmp_path)))
    processor = AutoProcessor.from_pretrained(tiny_gemma3)
    real = []
    for row in load_data(spec).train:
        messages = prepare_multimodal_messages(row["messages"], images=row["images"])
        real.append(len(processor.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"][0]))
    assert measured_lengths(spec).lengths[:, 0].tolist() == real


@pytest.mark.integration
def test_gemma3_lora_run_trains_the_language_model_only(tmp_path: Path, tiny_gemma3: Path) -> None:
    from jobs.train.training import train_spec

    spec = JobSpec.from_dict(
        {"model": str(tiny_gemma3), "dataset": str(image_rows(tmp_path)), "max_steps": 2, "learning_rate": 1e-2,
         "per_device_train_batch_size": 2, "sample_count": 0}
    )  # fmt: skip
    result = train_spec(spec, tmp_path / "out")
    assert result.metrics["global_step"] == 2
    trainable = [n for n, p in result.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert any("language_model" in n for n in trainable)
    assert not [n for n in trainable if "vision_tower" in n or "multi_modal_projector" in n]


@pytest.mark.integration
def test_gemma3_lora_run_exports_its_language_model_and_projector_as_gguf_that_llama_cpp_reads(
    store, tmp_path: Path, tiny_gemma3: Path, capsys: pytest.CaptureFixture
) -> None:
    """A 2-step LoRA run of the tiny Gemma 3, exported to f16 by `tunedeck export --gguf` and to Q4_K_M by the
    worker's export task: each language model file read back by llama.cpp agreeing with the merged model, the
    projector (mmproj) file beside them read back by gguf-py holding the model's vision tensors and, with each
    language model file, by llama.cpp's llama-mtmd-cli answering the check image with the merged model's first
    token, and each Modelfile, the card and the CLI naming the pair."""
    import json
    import socket

    from engines import import_or_missing
    from test_gguf_export import _converter

    from app.cli.main import main
    from jobs.export.gguf import K_FORCED_AGREEMENT
    from jobs.export.gguf_checks import F16_FORCED_AGREEMENT
    from jobs.worker.loop import Worker
    from jobs.worker.services import Place
    from jobs.worker.task_service import TaskService
    from jobs.worker.tasks import request_export
    from storage.models import RunStatus, TaskStatus

    import_or_missing("llama_cpp", fix="./dev.sh gguf")
    _converter()
    _mtmd()
    spec = JobSpec.from_dict(
        {"model": str(tiny_gemma3), "dataset": str(image_rows(tmp_path)), "max_steps": 2, "learning_rate": 1e-2,
         "per_device_train_batch_size": 2, "sample_count": 0, "run_name": "tiny gemma3"}
    )  # fmt: skip
    run_id = store.create_run(spec)
    Worker(store, poll_interval=0.1).work(burst=True)
    assert store.get_run(run_id).status is RunStatus.SUCCEEDED, store.get_run(run_id).error_detail
    folder = store.run_dir(run_id) / "gguf"
    mmproj = folder / "tiny-gemma3-mmproj-f16.gguf"
    capsys.readouterr()
    assert main(["export", str(run_id), "--gguf", "f16"]) == 0
    out = capsys.readouterr().out
    assert f"vision projector: {mmproj} (gguf-py's GGUFReader and llama.cpp's llama-mtmd-cli" in out, out
    assert f"llama.cpp: llama-mtmd-cli -m tiny-gemma3-f16.gguf --mmproj {mmproj.name}" in out, out
    host = socket.gethostname()
    place = Place(store=store, worker_id=f"{host}:99", host=host, device="cpu", on_cpu=True, shared_data=True)
    tasks = TaskService(place, poll_interval=0.05)
    (task_id,) = request_export(store, run_id, merged=False, dtype="fp32", gguf=["q4_k_m"])
    task = tasks.take()
    assert task is not None and task.id == task_id
    assert tasks.carry_out(task) is TaskStatus.SUCCEEDED, store.get_task(task_id).error
    for gguf_type, least in [("f16", F16_FORCED_AGREEMENT), ("q4_k_m", K_FORCED_AGREEMENT)]:
        check = json.loads((folder / f"tiny-gemma3-{gguf_type}.check.json").read_text())
        assert check["passed"] and check["rule"].startswith("read by llama.cpp"), check
        assert check["forced_agreement"] >= least and not check["tokenizer_mismatches"], check
        projector = check["mmproj"]
        assert projector["file"] == mmproj.name and projector["projector_type"] == "gemma3", projector
        assert projector["vision"] == {"clip.vision.image_size": 32, "clip.vision.patch_size": 8,
                                       "clip.vision.embedding_length": 32, "clip.vision.block_count": 2}  # fmt: skip
        assert projector["tensors_equal"] == projector["tensors"] - len(projector["corrected"]) > 30, projector
        assert projector["problems"] == [] and "GGUFReader" in projector["read_by"]
        pair = projector["llama_cpp"]  # llama.cpp's own image encoder read the pair and answered the check image
        assert pair["tool"] == "llama-mtmd-cli" and pair["llama_cpp"], projector
        assert pair["agrees"] or gguf_type != "f16", projector
        modelfile = (folder / f"tiny-gemma3-{gguf_type}.Modelfile").read_text().splitlines()
        assert modelfile[:2] == [f"FROM ./tiny-gemma3-{gguf_type}.gguf", f"FROM ./{mmproj.name}"]
    recorded = {Path(a.path).name: a for a in store.artifacts(run_id) if a.kind == "gguf"}
    assert set(recorded) == {"tiny-gemma3-f16.gguf", "tiny-gemma3-q4_k_m.gguf", mmproj.name}
    assert len([a for a in store.artifacts(run_id) if a.path == str(mmproj)]) == 1  # rewritten, not recorded twice
    assert recorded[mmproj.name].size == mmproj.stat().st_size
    card = (folder / "README.md").read_text()
    assert f"llama-mtmd-cli -m tiny-gemma3-q4_k_m.gguf --mmproj {mmproj.name}" in card
    assert not list(folder.glob(".*partial*"))


def _mtmd() -> None:
    """llama.cpp's llama-mtmd-cli: `./dev.sh gguf` builds it (CI has it; a venv without it fails under CI)."""
    from engines import engine_missing

    from jobs.export.mtmd import mtmd_problem

    if problem := mtmd_problem():
        engine_missing(problem)


@pytest.mark.integration
def test_gemma3_pair_read_by_llama_cpp_refuses_a_pair_it_cannot_load_and_notes_a_missing_tool(
    tmp_path: Path, tiny_gemma3: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pair's llama.cpp read-back is not vacuous: the projector given with a language model file it does not
    go with (here: itself) is refused with llama-mtmd-cli's words and leaves no file; the right pair answers the
    check image as transformers does; where llama-mtmd-cli is not built, the check says so and keeps gguf-py's."""
    import json

    from test_gguf_export import _converter

    from jobs.export.converter import CONVERTER_ENV, convert, converter_dir
    from jobs.export.gguf_route import _pre_name
    from jobs.export.projector import READ_BY, write_projector

    _converter()
    _mtmd()
    lm = tmp_path / "tiny-f16.gguf"
    convert(tiny_gemma3, lm, "f16", _pre_name(json.loads((tiny_gemma3 / "tokenizer.json").read_text())))
    out = tmp_path / "out"
    out.mkdir()
    check = write_projector(tiny_gemma3, out / "tiny-mmproj-f16.gguf", model=lm)
    assert check.passed and check.llama_cpp is not None and check.llama_cpp["agrees"], check
    wrong = write_projector(tiny_gemma3, out / "wrong-mmproj-f16.gguf", model=out / "tiny-mmproj-f16.gguf")
    assert not wrong.passed and wrong.problems[0].startswith("llama.cpp did not read the pair: llama-mtmd-cli exited")
    assert sorted(p.name for p in out.iterdir()) == ["tiny-mmproj-f16.gguf"]
    bare = tmp_path / "converter"  # the converter without its bin/ (no llama-mtmd-cli): gguf-py's check only, said so
    bare.mkdir()
    for item in converter_dir().iterdir():
        if item.name != "bin":
            (bare / item.name).symlink_to(item)
    monkeypatch.setenv(CONVERTER_ENV, str(bare))
    alone = write_projector(tiny_gemma3, out / "alone-mmproj-f16.gguf", model=lm)
    assert alone.passed and alone.read_by == READ_BY and alone.llama_cpp is None, alone
    assert alone.notes and "llama-mtmd-cli is not built here" in alone.notes[0], alone.notes


@pytest.mark.integration
def test_gemma3_projector_read_back_fails_on_a_model_it_was_not_written_from(tmp_path: Path, tiny_gemma3: Path) -> None:
    """The projector's check is not vacuous: the file written from the tiny Gemma 3 passes against it, and fails
    against a copy whose vision tower's weights and depth differ (and a failed write leaves no file)."""
    import json
    import shutil

    from safetensors.torch import load_file, save_file
    from test_gguf_export import _converter

    from jobs.export import projector as projector_module
    from jobs.export.projector import read_back, write_projector

    _converter()
    dest = tmp_path / "out" / "tiny-mmproj-f16.gguf"
    dest.parent.mkdir()
    check = write_projector(tiny_gemma3, dest)
    assert check.passed and dest.is_file() and check.file == dest.name, check
    other = tmp_path / "other"
    shutil.copytree(tiny_gemma3, other)
    weights = load_file(str(other / "model.safetensors"))
    save_file(
        {k: v * 2 if "vision_tower.encoder" in k else v for k, v in weights.items()}, str(other / "model.safetensors")
    )
    config = json.loads((other / "config.json").read_text())
    config["vision_config"]["num_hidden_layers"] = 3
    (other / "config.json").write_text(json.dumps(config))
    failed = read_back(other, dest)
    assert not failed.passed and failed.tensors_equal < check.tensors_equal, failed
    assert "clip.vision.block_count is 2, the model's vision_config.num_hidden_layers 3" in failed.problems
    assert any("tensors differ from the model's vision tensors" in p for p in failed.problems), failed.problems
    with pytest.MonkeyPatch.context() as mp:  # a check that fails keeps no file, not even the partial one
        mp.setattr(projector_module, "read_back", lambda source, path: failed)
        assert not write_projector(tiny_gemma3, tmp_path / "out" / "again.gguf").passed
    assert sorted(p.name for p in dest.parent.iterdir()) == [dest.name]


def test_llama_mtmd_cli_answer_is_read_from_its_output() -> None:
    """llama-mtmd-cli prints its marker, a blank line, the answer token's text, a blank line (seen from the real
    binary on the tiny Gemma 3); an end-of-generation token prints as a lone newline: an empty answer."""
    from jobs.export.mtmd import MARK, answer_of

    assert answer_of(f"log line\n{MARK}\n\nkeep\n\n") == "keep"
    assert answer_of(f"{MARK}\n\n the\n\n") == " the"
    assert answer_of(f"{MARK}\n\n\n\n\n") == ""
