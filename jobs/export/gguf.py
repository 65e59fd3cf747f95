"""A finished run as GGUF files for llama.cpp and Ollama, each checked by loading it back.

    tunedeck export RUN_ID --gguf f16 [q8_0]
    result = export_gguf(store, run_id, "q8_0")      # GgufExport: path, sha256, check

In order, logging each step (no fixed timeout: a large model takes minutes):
1. the source: a full fine-tune's model folder, or the run's latest merged export (made now in
   fp32 when there is none, with its own check against the adapter: a bf16 merge of SmolLM2
   already fails that check on the CPU, and f16 is written from fp32 at least as well);
2. the GGUF file, written by `jobs.export.gguf_writer` into `runs/<id>/gguf/` under a temporary name;
3. the round trip: the file is loaded back through transformers' GGUF loader (model and
   tokenizer) and must answer the check prompts greedily like the source model (both computed in
   fp32): equal answers for f16; for q8_0, fed the source model's answers, its own next-token
   choice must agree on at least `Q8_0_FORCED_AGREEMENT` of the positions (free-running answers
   of a quantized model drift apart after the first differing token, so their agreement is only
   recorded); the GGUF tokenizer must give the same ids as the run's on `TOKENIZER_TEXTS` and the
   chat prompts (and carry the same chat template);
4. on success the file takes its name `<name>-<type>.gguf`, the check goes beside it
   (`<name>-<type>.check.json`) and into the folder's README.md, and the file is recorded as
   an artifact (kind "gguf", with its sha256) that the dashboard serves; on failure the file is
   deleted and the export refused with the measured figures.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from jobs.errors import Problem
from jobs.export.converter import ConvertFailed, architecture, convert
from jobs.export.gguf_checks import (
    K_FORCED_AGREEMENT,
    Q8_0_FORCED_AGREEMENT,
    TOKENIZER_TEXTS,
    GgufCheck,
    check_with_llama_cpp,
)
from jobs.export.gguf_route import Route, gguf_route, run_config
from jobs.export.gguf_writer import GgufUnsupported, write_gguf
from jobs.export.imatrix import TOOLS_FIX, ImatrixFailed, ImatrixPlan, imatrix_plan, request_problems, uses_imatrix
from jobs.export.llamacpp import (
    EXPORT_TYPES,
    LLAMA_CPP_FIX,
    QUANTS,
    llama_cpp_installed,
    llama_cpp_problem,
    llama_read_back,
    quantize,
    tensor_types,
)
from jobs.export.merged import (
    CHECK_NEW_TOKENS,
    CHECK_PROMPTS,
    ExportError,
    _refuse,
    finished_spec,
    token_agreement,
)
from jobs.export.vision import gguf_problems
from jobs.spec.enums import Method
from jobs.spec.job import JobSpec
from jobs.train.artifacts import safe_name, sha256_of
from jobs.train.before_after import encode, greedy
from storage.roles import RunArtifacts

log = logging.getLogger("jobs.export.merged")


@dataclass
class GgufExport:
    path: Path
    sha256: str
    gguf_type: str
    source: Path
    check: GgufCheck


def source_folder(store: RunArtifacts, run_id: int, spec: JobSpec) -> Path:
    """The whole model to write: the full fine-tune's folder, or the latest merged export (made if missing)."""
    from jobs.export.merged import export_merged

    kind = "model" if spec.method is Method.FULL else "merged"
    folders = [
        Path(a.path) for a in store.artifacts(run_id) if a.kind == kind and Path(a.path, "config.json").is_file()
    ]
    if folders:
        return folders[-1]
    if spec.method is Method.FULL:
        raise _refuse(f"run {run_id} has no saved model folder", "train it again; its bundle was not written")
    log.info("export run %s: no merged export yet; merging the adapter in fp32 first", run_id)
    return export_merged(store, run_id, "fp32").folder


def check_round_trip(source: Path, gguf_path: Path, gguf_type: str) -> GgufCheck:
    """Load `gguf_path` back with transformers and compare it with the model in `source`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(source))
    gguf_tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    mismatches = [t for t in TOKENIZER_TEXTS if tokenizer(t)["input_ids"] != gguf_tokenizer(t)["input_ids"]]
    chat_same = tokenizer.chat_template == gguf_tokenizer.chat_template
    if tokenizer.chat_template:
        for prompt in CHECK_PROMPTS:
            chat = [{"role": "user", "content": prompt}]
            if tokenizer.apply_chat_template(chat, add_generation_prompt=True) != gguf_tokenizer.apply_chat_template(
                chat, add_generation_prompt=True
            ):
                mismatches.append(f"chat prompt: {prompt}")
    for tok in (tokenizer, gguf_tokenizer):
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(str(source), dtype=torch.float32).eval()
    ids_a, logits_a = greedy(model, tokenizer, CHECK_PROMPTS, CHECK_NEW_TOKENS, with_logits=True)
    del model
    loaded = AutoModelForCausalLM.from_pretrained(
        str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32
    ).eval()
    ids_b, logits_b = greedy(loaded, gguf_tokenizer, CHECK_PROMPTS, CHECK_NEW_TOKENS, with_logits=True)
    forced = forced_agreement(loaded, tokenizer, ids_a)
    del loaded
    llama = None
    if llama_cpp_installed():
        prompts = [encode(tokenizer, p)["input_ids"][0].tolist() for p in CHECK_PROMPTS]
        llama = asdict(llama_read_back(gguf_path, tokenizer, list(TOKENIZER_TEXTS), prompts, ids_a))
    agreement = token_agreement(ids_a, ids_b)
    diff = max(float((x - y).abs().max()) for x, y in zip(logits_a, logits_b))
    texts_a = [str(tokenizer.decode(a, skip_special_tokens=True)).strip() for a in ids_a]
    texts_b = [str(gguf_tokenizer.decode(b, skip_special_tokens=True)).strip() for b in ids_b]
    least = K_FORCED_AGREEMENT if gguf_type in QUANTS else Q8_0_FORCED_AGREEMENT
    if gguf_type == "f16":
        rule, answers_ok = "greedy answers equal", ids_a == ids_b
    else:
        rule = f"next-token agreement on the source's answers >= {least:.0%}"
        answers_ok = forced >= least
    rule += "; tokenizer ids and chat template identical"
    if llama is not None:  # llama.cpp itself: the same agreement, its own tokenizer
        rule += f"; in llama.cpp too (next-token agreement >= {least:.0%}, tokenizer ids identical)"
        answers_ok = answers_ok and llama["forced_agreement"] >= least
        mismatches += [f"llama.cpp: {t}" for t in llama["tokenizer_mismatches"]]
    return GgufCheck(
        gguf_type,
        rule,
        list(CHECK_PROMPTS),
        texts_a,
        texts_b,
        agreement,
        forced,
        diff,
        list(TOKENIZER_TEXTS),
        mismatches,
        chat_same,
        answers_ok and not mismatches and chat_same,
        tensor_types(gguf_path),
        llama,
    )


def forced_agreement(model: Any, tokenizer: Any, answers: list[list[int]]) -> float:
    """Share of the given answers' tokens that `model` also predicts next, fed each check prompt and answer."""
    import torch

    agree = total = 0
    for prompt, answer in zip(CHECK_PROMPTS, answers):
        if not answer:
            continue
        ids = encode(tokenizer, prompt)["input_ids"]
        with torch.no_grad():
            logits = model(torch.cat([ids, torch.tensor([answer])], dim=1)).logits[0]
        start = ids.shape[1] - 1
        predicted = logits[start : start + len(answer)].argmax(-1).tolist()
        agree += sum(1 for x, y in zip(predicted, answer) if x == y)
        total += len(answer)
    return agree / total if total else 1.0


def export_gguf(
    store: RunArtifacts, run_id: int, gguf_type: str = "f16", imatrix: bool = False, calibration: str | None = None
) -> GgufExport:
    """Write run `run_id` as a `gguf_type` GGUF file, check its round trip, record it; with `imatrix` (always for an
    IQ type) quantized with an importance matrix of `calibration` (a text file; default: the run's training rows)."""
    _refuse_type(gguf_type, imatrix, calibration)
    weighted = uses_imatrix(gguf_type, imatrix)
    spec = finished_spec(store, run_id)
    if vision := gguf_problems(store, run_id, [gguf_type]):  # a vision-language model: llama.cpp's --mmproj
        raise ExportError(vision)
    try:
        gguf_route(*run_config(store, run_id))  # known before merging: the base's config, the run's tokenizer
        source = source_folder(store, run_id, spec)
        source_config = json.loads((source / "config.json").read_text())
        route = gguf_route(source_config, _tokenizer_or_none(source))
    except GgufUnsupported as exc:
        problem, _, fix = str(exc).partition("; ")
        raise ExportError([Problem("model", problem, fix)]) from exc
    try:
        plan = imatrix_plan(spec, source, calibration) if weighted else None
    except ValueError as exc:
        raise _refuse(str(exc), "give a calibration file (`--calibration FILE`)", "calibration") from exc
    folder = store.run_dir(run_id) / "gguf"
    folder.mkdir(parents=True, exist_ok=True)
    stem = f"{safe_name(spec.display_name)}-{gguf_type}{'-imatrix' * weighted}"
    final, partial = folder / f"{stem}.gguf", folder / f".{stem}.partial.gguf"
    log.info("export run %s: writing %s GGUF from %s", run_id, gguf_type, source)
    try:
        weights = write_file(source, partial, gguf_type, spec.display_name, route, plan)
        log.info(
            "export run %s: loading the GGUF back with %s and answering %d check prompts",
            run_id,
            "transformers" if route.writer == "writer" else "llama.cpp",
            len(CHECK_PROMPTS),
        )
        if route.writer == "writer":
            check = check_round_trip(source, partial, gguf_type)
        else:
            check = check_with_llama_cpp(source, partial, gguf_type)
    except ConvertFailed as exc:
        partial.unlink(missing_ok=True)
        family = f"{source_config.get('model_type', '?')} ({architecture(source_config)})"
        raise _refuse(
            f"llama.cpp's converter failed on this {family} model: {exc}",
            "export the merged safetensors (`--merged`) instead",
            "gguf",
        ) from exc
    except ImatrixFailed as exc:
        partial.unlink(missing_ok=True)
        raise _refuse(
            f"the importance-matrix quant failed: {exc}", f"export {gguf_type} without it, or {TOOLS_FIX}", "imatrix"
        ) from exc
    except BaseException:  # cleanup only, and re-raised: no half-written file is left, whatever stopped it (Ctrl-C too)
        partial.unlink(missing_ok=True)
        raise
    log.info(
        "export run %s: GGUF check %s (%s; next-token agreement %.3f, answer token agreement %.3f, max logit "
        "diff %.3g)",
        run_id,
        "passed" if check.passed else "FAILED",
        check.rule,
        check.forced_agreement,
        check.token_agreement,
        check.max_logit_diff,
    )
    if not check.passed:
        partial.unlink(missing_ok=True)
        raise _not_agreeing(check, gguf_type)
    check.imatrix = weights
    os.replace(partial, final)
    (folder / f"{stem}.check.json").write_text(json.dumps(asdict(check), indent=2, ensure_ascii=False))
    write_modelfile(source, folder / f"{stem}.Modelfile", final.name)
    digest = sha256_of(final)
    store.add_artifact(run_id, "gguf", str(final), final.stat().st_size, digest)
    (folder / "README.md").write_text(gguf_card(spec, run_id, folder))
    log.info("export run %s: wrote %s (%s)", run_id, final, digest)
    return GgufExport(final, digest, gguf_type, source, check)


def _refuse_type(gguf_type: str, imatrix: bool, calibration: str | None) -> None:
    """Refuse, before anything loads, a type that is unknown or cannot be made here."""
    if gguf_type not in EXPORT_TYPES:
        raise _refuse(f"GGUF type {gguf_type!r} is not one of {', '.join(EXPORT_TYPES)}", "pick one of them", "gguf")
    if problem := llama_cpp_problem(gguf_type):
        raise _refuse(problem, LLAMA_CPP_FIX, "gguf")
    if refused := request_problems([gguf_type], imatrix, calibration):
        raise ExportError([Problem(*p) for p in refused])


def _not_agreeing(check: GgufCheck, gguf_type: str) -> ExportError:
    """The refusal of a file whose check failed, with the measured figures."""
    what = (
        f"tokenizer differs on {check.tokenizer_mismatches}"
        if check.tokenizer_mismatches
        else "chat template differs"
        if not check.chat_template_equal
        else f"next-token agreement {check.forced_agreement:.1%}, answer token agreement "
        f"{check.token_agreement:.1%}, largest logit difference {check.max_logit_diff:.3g}"
    )
    return _refuse(
        f"the {gguf_type} GGUF loaded back does not answer like the model it was written from "
        f"({check.rule} not met: {what}); the file was deleted",
        "use the merged safetensors export, or try --gguf f16 (no quantization)",
        "gguf",
    )


def write_file(
    source: Path, dest: Path, gguf_type: str, name: str, route: Route | None = None, imatrix: ImatrixPlan | None = None
) -> dict[str, Any] | None:
    """f16 and q8_0 by tunedeck's writer or llama.cpp's converter (`route`); for a K-quant, the f16 file quantized
    by llama.cpp (then deleted), weighted by an importance matrix with `imatrix` (what it was made of: returned)."""
    route = route or Route("writer", None)

    def write(dest: Path, gguf_type: str) -> None:
        if route.writer == "writer":
            write_gguf(source, dest, gguf_type, name)
        else:
            convert(source, dest, gguf_type, route.pre_tokenizer, name=name)

    if gguf_type not in QUANTS:
        write(dest, gguf_type)
        return None
    f16 = dest.with_name(dest.name + ".f16")
    try:
        write(f16, "f16")
        if imatrix is not None:
            return imatrix.write_with(f16, dest, gguf_type)
        log.info("quantizing to %s with llama.cpp", gguf_type)
        quantize(f16, dest, gguf_type)
        return None
    finally:
        f16.unlink(missing_ok=True)


def _tokenizer_or_none(folder: Path) -> dict[str, Any] | None:
    path = folder / "tokenizer.json"
    return json.loads(path.read_text()) if path.is_file() else None


def write_modelfile(source: Path, path: Path, gguf_name: str) -> None:
    """The Ollama Modelfile beside the GGUF (`jobs.export.modelfile`): the run's template, stops, sampling defaults
    (the model's generation_config.json when it samples, else greedy like tunedeck's Chat)."""
    from transformers import AutoTokenizer, GenerationConfig

    from jobs.export.modelfile import modelfile

    generation: dict[str, float] = {}
    if (source / "generation_config.json").is_file():
        config = GenerationConfig.from_pretrained(str(source))
        if config.do_sample:
            names = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k"}
            names["repetition_penalty"] = "repeat_penalty"
            generation = {o: float(v) for n, o in names.items() if (v := getattr(config, n, None)) is not None}
    text, templated = modelfile(AutoTokenizer.from_pretrained(str(source)), gguf_name, generation)
    path.write_text(text)
    log.info("wrote %s (%s)", path, "with the chat template" if templated else "without a TEMPLATE")


def gguf_card(spec: JobSpec, run_id: int, folder: Path) -> str:
    """README.md of the run's GGUF folder: each file, its round-trip check, how to use it."""
    from jobs.train.artifacts import provenance_note

    parts = [
        f"# {spec.display_name} (GGUF)\n\nRun {run_id} of tunedeck ({spec.method.value} on `{spec.model}`) "
        "as GGUF files for llama.cpp, Ollama and other GGUF readers.\n"
    ]
    for check_file in sorted(folder.glob("*.check.json")):
        check = json.loads(check_file.read_text())
        gguf_file = check_file.name.replace(".check.json", ".gguf")
        if not (folder / gguf_file).is_file():
            continue
        rows = "\n".join(
            f"| {p} | {a!r} | {'same' if a == b else repr(b)} |"
            for p, a, b in zip(check["prompts"], check["source_answers"], check["gguf_answers"])
        )
        parts.append(
            f"## {gguf_file}\n{_checked_by(check)}: {check['rule']}: "
            f"passed. Answer token agreement {check['token_agreement']:.1%}; next-token agreement on the "
            f"source's answers {check['forced_agreement']:.1%}; largest logit difference "
            f"{check['max_logit_diff']:.3g}; tokenizer ids equal on {len(check['tokenizer_texts'])} texts "
            f"and the chat prompts.{_llama_line(check)}\n\n| prompt | source model | GGUF |\n|---|---|---|\n{rows}\n"
        )
    parts.append(
        "## How to use\n```bash\nllama-cli -m FILE.gguf -cnv            # llama.cpp, chat with the file's template\n"
        "ollama create my-model -f FILE.Modelfile && ollama run my-model   # Ollama: template, stops, sampling\n```\n"
        "Each `FILE.Modelfile` carries the run's chat template as Ollama's TEMPLATE (checked against the "
        "template's own rendering of a conversation), its stop tokens and greedy sampling like tunedeck's Chat.\n"
        "```python\nfrom transformers import AutoModelForCausalLM, AutoTokenizer\n\n"
        'model = AutoModelForCausalLM.from_pretrained(".", gguf_file="FILE.gguf")\n'
        'tokenizer = AutoTokenizer.from_pretrained(".", gguf_file="FILE.gguf")\n```\n'
        "The checks above are what tunedeck ran; Ollama itself was not run on these files.\n"
    )
    return "\n".join(parts) + provenance_note(spec)


def _checked_by(check: dict[str, Any]) -> str:
    if check["rule"].startswith("read by llama.cpp"):
        return "Written by llama.cpp's convert_hf_to_gguf.py and checked by loading it back with llama.cpp"
    return "Checked by loading it back with transformers' GGUF loader"


def _llama_line(check: dict[str, Any]) -> str:
    """The card's words on the file's tensor types and on llama.cpp's own reading of it."""
    types = ", ".join(f"{n} {t}" for t, n in check.get("tensor_types", {}).items())
    line = f" Tensors: {types}." if types else ""
    if weights := check.get("imatrix"):
        line += (
            f" Quantized with an importance matrix of {weights['calibration']} ({weights['chunks']} chunks of "
            f"{weights['context']} tokens, llama.cpp's llama-imatrix)."
        )
    llama = check.get("llama_cpp")
    if llama is None:
        return line + " llama.cpp itself was not run on it (llama-cpp-python is not installed where it was made)."
    return line + (
        f" Read back by llama.cpp {llama['version']}: next-token agreement on the source's answers "
        f"{llama['forced_agreement']:.1%}, its tokenizer's ids equal on the same texts."
    )
