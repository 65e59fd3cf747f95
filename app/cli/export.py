"""The commands about results and models: export a finished run, set up a built-in model.

    tunedeck export RUN_ID --merged [--dtype bf16|fp16|fp32]   # adapter merged into its base, checked
    tunedeck export RUN_ID --gguf f16 [q8_0]                   # GGUF files for llama.cpp/Ollama, checked
    tunedeck export RUN_ID --merged --gguf f16 --on-worker    # carried out by a worker (app.cli.tasks)
    tunedeck setup [--model NAME]                              # fetch/convert a built-in model once

`jobs.export` does the work; this module prints. `cmd_setup` needs no store.
"""

from __future__ import annotations

import argparse
import logging

from app.cli.usage import EXIT_OK, UsageError
from jobs.errors import Problem
from storage.roles_tasks import Exporting, ExportOnWorker


def cmd_export(store: Exporting, args: argparse.Namespace) -> int:
    from jobs.export.merged import export_merged

    if not args.merged and not args.gguf:
        raise UsageError(
            [
                Problem(
                    "--merged",
                    "no export format chosen",
                    "add --merged (the adapter merged into "
                    "its base model) or --gguf f16|q8_0; the adapter alone is the run's bundle",
                )
            ]
        )
    if getattr(args, "on_worker", False):
        return export_on_worker(store, args)
    logging.getLogger("jobs.export.merged").setLevel(logging.INFO)  # progress: loading, answering, merging, saving
    if args.merged:
        result = export_merged(store, args.run_id, args.dtype)
        check = result.check
        print(f"run {args.run_id}: merged model ({result.dtype}) in {result.folder}")
        print(
            f"check: {check.rule}: passed; token agreement {check.token_agreement:.1%}, "
            f"largest logit difference {check.max_logit_diff:.3g}"
        )
        for note in result.notes:
            print(f"note: {note}")
        print(f"download: {result.archive}  sha256 {result.sha256}")
    if args.gguf:
        from jobs.export.gguf import export_gguf
        from jobs.export.projector import pair_command

        for gguf_type in dict.fromkeys(args.gguf):
            gguf = export_gguf(store, args.run_id, gguf_type, args.imatrix, args.calibration)
            print(f"run {args.run_id}: {gguf_type} GGUF from {gguf.source}")
            print(
                f"check ({gguf.check.rule}): passed; answer token agreement {gguf.check.token_agreement:.1%}, "
                f"next-token agreement {gguf.check.forced_agreement:.1%}, "
                f"largest logit difference {gguf.check.max_logit_diff:.3g}"
            )
            if gguf.check.imatrix:
                print(f"importance matrix: {gguf.check.imatrix}")
            print(f"download: {gguf.path}  sha256 {gguf.sha256}")
            if projector := gguf.check.mmproj:  # a vision-language run: the pair llama.cpp loads
                print(f"vision projector: {gguf.path.with_name(projector['file'])} ({projector['read_by']})")
                if pair := projector.get("llama_cpp"):
                    print(f"llama.cpp's first token to the check image: {pair['llama_cpp']!r} (transformers:"
                          f" {pair['transformers']!r})")  # fmt: skip
                for note in projector.get("notes") or []:
                    print(f"note: {note}")
                print(f"llama.cpp: {pair_command(gguf.path.name, projector['file'])}")
    return EXIT_OK


def export_on_worker(store: ExportOnWorker, args: argparse.Namespace) -> int:
    """`--on-worker`: the tasks of this export queued for a worker that can reach the run, followed here."""
    from app.cli.tasks import check_reachable, follow
    from jobs.export.merged import finished_spec
    from jobs.worker.tasks import request_export

    finished_spec(store, args.run_id)  # a run that cannot be exported is refused here, not on the worker
    check_reachable(store, args.run_id)
    ids = request_export(
        store, args.run_id, bool(args.merged), args.dtype, args.gguf or [], args.imatrix, args.calibration
    )
    print(f"run {args.run_id}: asked a worker for task(s) {', '.join(map(str, ids))}; following")
    return follow(store, ids)


def cmd_setup(_store: object, args: argparse.Namespace) -> int:
    from jobs.models import references as models

    print(f"preparing built-in model {args.model} (first time: download and convert, may take a minute)...")
    ensure = getattr(models, "ensure_builtin", None)
    path = ensure(args.model) if ensure else models.resolve_model(args.model).path
    print(f"model {args.model} ready at {path}")
    return EXIT_OK
