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
   deleted and the export refused with the measured figures;
5. a vision-language run's file goes with its vision tower and projector: `<name>-mmproj-f16.gguf`, written by
   llama.cpp's converter (`--mmproj`) once the language model's check passes, read back (gguf-py, and llama.cpp's
   llama-mtmd-cli with the language model file: `jobs.export.mtmd`) and recorded beside it
   (`jobs.export.projector`), named by its Modelfile and card; a family whose projector the converter cannot
   write is refused before queueing (`jobs.export.vision.gguf_problems`).
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
from jobs.export.gguf_card import gguf_card, write_modelfile
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
from jobs.export.projector import PAIR_STRICT, mmproj_name, write_projector
from jobs.export.vision import GGUF_WAY_OUT, gguf_problems, vision_run
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
    if vision := gguf_problems(store, run_id, [gguf_type]):  # a vision-language family without llama.cpp's mmproj
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
        if check.passed and vision_run(store, run_id):  # its vision tower and projector: llama.cpp's --mmproj
            check.mmproj = _projector(store, run_id, source, folder, spec.display_name, partial, gguf_type)
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
    write_modelfile(source, folder / f"{stem}.Modelfile", final.name, (check.mmproj or {}).get("file"))
    digest = sha256_of(final)
    store.add_artifact(run_id, "gguf", str(final), final.stat().st_size, digest)
    (folder / "README.md").write_text(gguf_card(spec, run_id, folder))
    log.info("export run %s: wrote %s (%s)", run_id, final, digest)
    return GgufExport(final, digest, gguf_type, source, check)


def _projector(
    store: RunArtifacts, run_id: int, source: Path, folder: Path, name: str, model: Path, gguf_type: str
) -> dict[str, Any]:
    """Write, check (with the `gguf_type` language model file `model`, by llama.cpp where it can: its first token to
    the check image must be the merged model's for f16 and q8_0) and record the vision tower and projector of a
    vision-language model as its mmproj file."""
    dest = folder / mmproj_name(safe_name(name))
    log.info("export run %s: writing the vision projector (mmproj) with llama.cpp's converter", run_id)
    projector = write_projector(source, dest, name, model, strict=gguf_type in PAIR_STRICT)
    if not projector.passed:
        raise _refuse(
            f"the vision projector (mmproj) written by llama.cpp's converter failed its read-back "
            f"({'; '.join(projector.problems)}); the files were deleted",
            GGUF_WAY_OUT,
            "gguf",
        )
    store.rewrite_artifact(run_id, "gguf", str(dest), dest.stat().st_size, sha256_of(dest))
    return asdict(projector)


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
