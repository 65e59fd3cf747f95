"""`tunedeck export RUN_ID --gguf f16|q8_0`: GGUF files written, loaded back and checked, recorded, served."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from engines import engine_missing, import_or_missing
from training_helpers import claim_run, tiny_spec

from jobs.export.gguf import K_FORCED_AGREEMENT, Q8_0_FORCED_AGREEMENT, TOKENIZER_TEXTS, export_gguf
from jobs.export.gguf_writer import GgufUnsupported, gguf_plan, write_gguf
from jobs.export.merged import CHECK_PROMPTS, ExportError
from jobs.train.artifacts import sha256_of
from storage.models import RunStatus

pytestmark = pytest.mark.integration


def _llama_cpp() -> None:
    """K-quants need llama.cpp's binding: `./dev.sh test` builds it (a trimmed build, minutes); CI fails without."""
    import_or_missing("llama_cpp", fix="./dev.sh gguf")


def _tiny_variant(tiny_model: Path, dest: Path, config_class: str, **extra) -> Path:
    """A random-weight model of another architecture with the tiny model's tokenizer."""
    import torch
    import transformers
    from transformers import AutoTokenizer

    shape = dict(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )
    config = getattr(transformers, config_class)(**(shape | extra))
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model))
    config.bos_token_id, config.eos_token_id, config.pad_token_id = (
        tokenizer.bos_token_id,
        tokenizer.eos_token_id,
        tokenizer.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(7)
        model = transformers.AutoModelForCausalLM.from_config(config)
    model.save_pretrained(str(dest))
    tokenizer.save_pretrained(str(dest))
    return dest


def _converter() -> None:
    """llama.cpp's converter: `./dev.sh gguf` keeps it in the venv (CI has it; a venv without it fails under CI)."""
    from jobs.export.converter import CONVERTER_FIX, converter_installed

    if not converter_installed():
        engine_missing(f"llama.cpp's converter is not in this venv: {CONVERTER_FIX}")


def _finished_by_hand(store, folder: Path) -> int:
    """A run recorded as a finished full fine-tune whose model folder is `folder` (no training needed)."""
    run_id = store.create_run(tiny_spec(folder, method="full", run_name="tiny export"))
    claim_run(store, run_id, "test-worker", f"fake-{run_id}")
    store.mark_succeeded(run_id, {})
    store.add_artifact(run_id, "model", str(folder), 1, "0" * 64)
    return run_id


@pytest.fixture(scope="module")
def trained(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory):
    """One store with finished runs, trained once for the module: LoRA and full on the tiny Llama, LoRA on a
    tiny PhiMoE recorded as finished by hand (a family neither tunedeck's GGUF writer nor llama.cpp's converter
    knows)."""
    from jobs.models.zoo import build_zoo_model
    from jobs.worker.loop import Worker
    from storage.store import Store

    home = tmp_path_factory.mktemp("gguf-home")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TUNEDECK_HOME", str(home))
        patch.delenv("TUNEDECK_DATABASE_URL", raising=False)
        store = Store()
        ids = {
            "lora": store.create_run(tiny_spec(tiny_model, max_steps=6)),
            "full": store.create_run(tiny_spec(tiny_model, method="full", learning_rate=1e-3, max_steps=2)),
        }
        Worker(store, poll_interval=0.1).work(burst=True)
        ids["phimoe"] = _finished_by_hand(store, build_zoo_model(home / "tiny-phimoe", "phimoe"))
        for name, run_id in ids.items():
            assert store.get_run(run_id).status is RunStatus.SUCCEEDED, (name, store.get_run(run_id).error_detail)
        yield store, ids, home
        store.dispose()


@pytest.fixture
def runs(trained, monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """The trained runs' ids, with this test's environment pointing at their data directory."""
    monkeypatch.setenv("TUNEDECK_HOME", str(trained[2]))
    monkeypatch.delenv("TUNEDECK_DATABASE_URL", raising=False)
    return trained[1]


@pytest.fixture
def tstore(trained):
    return trained[0]


@pytest.mark.slow
def test_f16_and_q8_0_load_back_and_answer_like_the_merged_model(tstore, runs: dict[str, int]) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from app.server import bundle_files

    f16 = export_gguf(tstore, runs["lora"], "f16")
    q8 = export_gguf(tstore, runs["lora"], "q8_0")
    # f16: the same greedy answers as the merged model; q8_0: measured, above its threshold.
    assert f16.check.passed and f16.check.source_answers == f16.check.gguf_answers
    assert f16.check.token_agreement == 1.0 and len(f16.check.prompts) == len(CHECK_PROMPTS)
    assert q8.check.passed and q8.check.forced_agreement >= Q8_0_FORCED_AGREEMENT and "next-token" in q8.check.rule
    assert not f16.check.tokenizer_mismatches and f16.check.chat_template_equal
    # Built on the merged export (made on the way), written under the run's folder, q8_0 smaller.
    merged = [a for a in tstore.artifacts(runs["lora"]) if a.kind == "merged"]
    assert merged and f16.source == Path(merged[-1].path) == q8.source
    assert f16.path.name.endswith("-f16.gguf") and q8.path.name.endswith("-q8_0.gguf")
    assert f16.path.parent == tstore.run_dir(runs["lora"]) / "gguf"
    assert q8.path.stat().st_size < 0.7 * f16.path.stat().st_size
    assert not list(f16.path.parent.glob(".*partial*"))
    # Recorded with their sha256, served by the dashboard; the check beside each file and in the card.
    # (Other tests of the module export the same run to other types: only these two are this test's.)
    recorded = {Path(a.path).name: a.sha256 for a in tstore.artifacts(runs["lora"]) if a.kind == "gguf"}
    ours = {f16.path.name: sha256_of(f16.path), q8.path.name: sha256_of(q8.path)}
    assert {name: recorded.get(name) for name in ours} == ours
    assert {str(f16.path.resolve()), str(q8.path.resolve())} <= set(bundle_files(tstore))
    saved = json.loads(f16.path.with_name(f16.path.name.replace(".gguf", ".check.json")).read_text())
    assert saved["passed"] is True and saved["gguf_type"] == "f16"
    card = (f16.path.parent / "README.md").read_text()
    assert f16.path.name in card and q8.path.name in card and "transformers' GGUF loader" in card
    # Independently: the file's tokenizer gives the run's ids, its model the merged model's logits.
    import torch

    run_tok = AutoTokenizer.from_pretrained(str(f16.source))
    gguf_tok = AutoTokenizer.from_pretrained(str(f16.path.parent), gguf_file=f16.path.name)
    for text in TOKENIZER_TEXTS:
        assert gguf_tok(text)["input_ids"] == run_tok(text)["input_ids"], text
    reference = AutoModelForCausalLM.from_pretrained(str(f16.source), dtype=torch.float32).eval()
    loaded = AutoModelForCausalLM.from_pretrained(
        str(f16.path.parent), gguf_file=f16.path.name, dtype=torch.float32
    ).eval()
    ids = run_tok(CHECK_PROMPTS[0], return_tensors="pt")["input_ids"]
    with torch.no_grad():
        assert torch.allclose(reference(ids).logits, loaded(ids).logits, atol=1e-2)


def test_full_fine_tune_is_written_from_its_model_folder(tstore, runs: dict[str, int]) -> None:
    result = export_gguf(tstore, runs["full"], "f16")
    model_dir = next(Path(a.path) for a in tstore.artifacts(runs["full"]) if a.kind == "model")
    assert result.check.passed and result.source == model_dir
    assert not [a for a in tstore.artifacts(runs["full"]) if a.kind == "merged"]
    # The Ollama Modelfile beside it: the file, the run's chat template as TEMPLATE, its stop token, greedy.
    text = result.path.with_name(result.path.name.replace(".gguf", ".Modelfile")).read_text()
    assert text.startswith(f"FROM ./{result.path.name}\n") and 'TEMPLATE """{{- range .Messages }}' in text
    assert 'PARAMETER stop """<|im_end|>"""' in text and "PARAMETER temperature 0\n" in text
    assert "FILE.Modelfile" in (result.path.parent / "README.md").read_text()


def test_unsupported_architecture_is_refused_naming_it_and_the_way_out(tstore, runs: dict[str, int]) -> None:
    _converter()
    with pytest.raises(ExportError) as err:
        export_gguf(tstore, runs["phimoe"], "f16")
    problem = err.value.problems[0]
    assert "phimoe (PhimoeForCausalLM)" in problem.problem and "not one llama.cpp's converter knows" in problem.problem
    assert "--merged" in problem.fix
    assert not [a for a in tstore.artifacts(runs["phimoe"]) if a.kind == "gguf"]
    assert not list((tstore.run_dir(runs["phimoe"]) / "gguf").glob("*.gguf"))


def test_a_failed_round_trip_deletes_the_file_and_records_nothing(
    tstore, runs: dict[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    import jobs.export.gguf

    folder = tstore.run_dir(runs["lora"]) / "gguf"

    def state() -> tuple[set, list]:  # the files (with their hashes) and the recorded artifacts
        files = {(p.name, sha256_of(p)) for p in folder.glob("*")} if folder.is_dir() else set()
        return files, [(a.path, a.sha256) for a in tstore.artifacts(runs["lora"]) if a.kind == "gguf"]

    before = state()
    monkeypatch.setattr(jobs.export.gguf, "Q8_0_FORCED_AGREEMENT", 1.01)  # unreachable: the check must fail
    with pytest.raises(ExportError) as err:
        export_gguf(tstore, runs["lora"], "q8_0")
    assert "file was deleted" in str(err.value) and "next-token agreement" in str(err.value)
    assert state() == before  # nothing new on disk (an earlier good export stays as it was), nothing recorded


@pytest.mark.slow
def test_cli_export_gguf(tstore, runs: dict[str, int], capsys: pytest.CaptureFixture) -> None:
    from app.cli.main import main

    assert main(["export", str(runs["lora"]), "--gguf", "f16", "q8_0"]) == 0
    out = capsys.readouterr().out
    assert "f16 GGUF" in out and "q8_0 GGUF" in out and out.count("sha256") == 2
    assert "greedy answers equal" in out and "next-token agreement on the source's answers >= 90%" in out
    assert main(["export", str(runs["phimoe"]), "--gguf", "f16"]) == 2
    assert "phimoe" in capsys.readouterr().err


def test_qwen2_round_trips_and_other_shapes_are_refused(tiny_model: Path, tmp_path: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    qwen = _tiny_variant(tiny_model, tmp_path / "tiny-qwen2", "Qwen2Config")
    write_gguf(qwen, tmp_path / "q.gguf", "f16", "tiny qwen2")
    reference = AutoModelForCausalLM.from_pretrained(str(qwen), dtype=torch.float32).eval()
    loaded = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file="q.gguf", dtype=torch.float32).eval()
    ids = torch.tensor([[1, 20, 30, 40, 50]])
    with torch.no_grad():
        assert torch.allclose(reference(ids).logits, loaded(ids).logits, atol=1e-2)
    assert any(k.endswith("q_proj.bias") for k in loaded.state_dict())  # Qwen2's attention biases came through
    config = json.loads((qwen / "config.json").read_text())
    tok = json.loads((qwen / "tokenizer.json").read_text())
    with pytest.raises(GgufUnsupported, match="'gpt_neox'.*convert_hf_to_gguf"):
        gguf_plan({**config, "model_type": "gpt_neox"}, tok)
    with pytest.raises(GgufUnsupported, match="yarn rope scaling"):
        gguf_plan({**config, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, tok)
    with pytest.raises(GgufUnsupported, match="pre-tokenizer"):
        gguf_plan(config, {**tok, "pre_tokenizer": {"type": "Whitespace"}})


def test_k_quants_without_llama_cpp_are_refused_before_queueing(
    tstore, runs: dict[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where llama-cpp-python is not installed (a worker set up without `./dev.sh gguf`), a K-quant is refused
    when asked for, naming the fix; the types tunedeck writes itself are still queued."""
    import jobs.export.llamacpp
    from jobs.worker.tasks import request_export

    monkeypatch.setattr(jobs.export.llamacpp, "llama_cpp_installed", lambda: False)
    before = len(tstore.run_tasks(runs["lora"]))
    with pytest.raises(ExportError) as err:
        request_export(tstore, runs["lora"], merged=False, dtype="fp32", gguf=["f16", "q4_k_m"])
    (problem,) = err.value.problems
    assert problem.field == "gguf" and "q4_k_m" in problem.problem and "./dev.sh gguf" in problem.fix
    assert len(tstore.run_tasks(runs["lora"])) == before  # nothing queued, f16 included: the request is one
    with pytest.raises(ExportError, match="llama-cpp-python is not installed"):
        export_gguf(tstore, runs["lora"], "q5_k_m")
    with pytest.raises(ExportError, match="not one of f16, q8_0, q4_k_m, q5_k_m, q6_k"):
        request_export(tstore, runs["lora"], merged=False, dtype="fp32", gguf=["q3_k_s"])


@pytest.mark.slow
def test_q4_k_m_is_made_and_read_back_by_llama_cpp(tstore, runs: dict[str, int]) -> None:
    _llama_cpp()
    result = export_gguf(tstore, runs["lora"], "q4_k_m")
    check = result.check
    assert check.passed and result.path.name.endswith("-q4_k_m.gguf") and check.llama_cpp is not None, check
    assert check.llama_cpp["forced_agreement"] >= K_FORCED_AGREEMENT and not check.llama_cpp["tokenizer_mismatches"]
    # The tiny model's rows (64 values) are shorter than a K-quant block (256): llama.cpp fell back, and says so.
    assert "Q4_K" not in check.tensor_types and check.tensor_types.get("Q8_0", 0) > 0
    assert not list(result.path.parent.glob("*.f16"))  # the intermediate f16 file is gone
    card = (result.path.parent / "README.md").read_text()
    assert result.path.name in card and "Read back by llama.cpp" in card and "Q8_0" in card


def test_llama_cpp_quantizes_256_wide_rows_to_k_quants(tiny_model: Path, tmp_path: Path) -> None:
    _llama_cpp()
    from transformers import AutoTokenizer

    from jobs.export.llamacpp import llama_read_back, quantize, tensor_types

    wide = _tiny_variant(tiny_model, tmp_path / "wide", "LlamaConfig", hidden_size=256, intermediate_size=512)
    write_gguf(wide, tmp_path / "wide-f16.gguf", "f16", "wide")
    quantize(tmp_path / "wide-f16.gguf", tmp_path / "wide-q4_k_m.gguf", "q4_k_m")
    quantize(tmp_path / "wide-f16.gguf", tmp_path / "wide-q6_k.gguf", "q6_k")
    q4, q6 = tensor_types(tmp_path / "wide-q4_k_m.gguf"), tensor_types(tmp_path / "wide-q6_k.gguf")
    assert q4.get("Q4_K", 0) > 0 and q4.get("Q6_K", 0) > 0, q4  # Q4_K_M: most matrices 4-bit, some 6-bit
    assert q6.get("Q6_K", 0) > 0 and "Q4_K" not in q6, q6
    assert (tmp_path / "wide-q4_k_m.gguf").stat().st_size < 0.45 * (tmp_path / "wide-f16.gguf").stat().st_size
    tokenizer = AutoTokenizer.from_pretrained(str(wide))
    prompt = tokenizer("The moon is")["input_ids"]
    read = llama_read_back(tmp_path / "wide-q6_k.gguf", tokenizer, list(TOKENIZER_TEXTS), [prompt], [[5, 6, 7]])
    assert not read.tokenizer_mismatches and 0.0 <= read.forced_agreement <= 1.0 and read.version


@pytest.mark.smollm2
@pytest.mark.slow
def test_smollm2_run_exports_q8_0(
    smollm2_run: tuple[Path, int], smollm2_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The session's short SmolLM2 LoRA run (conftest `smollm2_run`), exported to GGUF q8_0: the file users take
    to llama.cpp, on a real architecture (a tensor laid out wrong answers differently and fails the check).
    f16's exact answers are checked on the tiny model above; on SmolLM2 it would add ~80 s of CI for the same code."""
    from storage.store import Store

    folder, run_id = smollm2_run
    monkeypatch.setenv("TUNEDECK_HOME", str(folder))
    monkeypatch.setenv("TUNEDECK_MODELS_DIR", str(smollm2_cache))
    monkeypatch.delenv("TUNEDECK_DATABASE_URL", raising=False)
    store = Store()
    assert store.get_run(run_id).status is RunStatus.SUCCEEDED, store.get_run(run_id).error_detail
    result = export_gguf(store, run_id, "q8_0")
    assert result.check.passed and not result.check.tokenizer_mismatches, result.check
    assert result.path.stat().st_size > 100 * 2**20
    store.dispose()


@pytest.mark.smollm2
@pytest.mark.slow
def test_smollm2_run_exports_q4_k_m_that_llama_cpp_reads_like_transformers(
    smollm2_run: tuple[Path, int], smollm2_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same run as Q4_K_M, made by llama.cpp's quantizer: llama.cpp's next tokens on the check prompts agree
    with the merged model's answers as often as transformers' reading of the same file does (within 5 points)."""
    _llama_cpp()
    from storage.store import Store

    folder, run_id = smollm2_run
    monkeypatch.setenv("TUNEDECK_HOME", str(folder))
    monkeypatch.setenv("TUNEDECK_MODELS_DIR", str(smollm2_cache))
    monkeypatch.delenv("TUNEDECK_DATABASE_URL", raising=False)
    store = Store()
    result = export_gguf(store, run_id, "q4_k_m")
    check = result.check
    assert check.passed and check.llama_cpp is not None and not check.llama_cpp["tokenizer_mismatches"], check
    assert check.tensor_types.get("Q4_K", 0) > 0  # SmolLM2's 1536-wide down projections take the 4-bit type
    assert abs(check.llama_cpp["forced_agreement"] - check.forced_agreement) <= 0.05, check
    print(f"q4_k_m: transformers {check.forced_agreement:.3f}, llama.cpp {check.llama_cpp['forced_agreement']:.3f}")
    store.dispose()
