"""`tunedeck data show SPEC [--row N]`: the tokens training builds from rows of the spec's data, each marked.

    tunedeck data show examples/smollm2-tag-format.yaml            # the first 3 training rows
    tunedeck data show my.yaml --row 12 --row 40 --set max_length=256

Each token as the trainer builds it (`jobs.data.tokens.view`): in a terminal, trained tokens green, masked
ones grey, special tokens bold, tokens past max_length red and struck through after a `✂`; piped (not a
tty) or with --color never, plain marks: `[masked]...[/masked]` and `[cut]...[/cut]` spans around the
tokens not in the loss, everything else trained. Exit 2 with the problem when the data, a row or the
tokenizer is missing.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable

from app.cli.usage import EXIT_OK, StoreUse, UsageError

GREEN, GREY, RED_STRUCK, BOLD, RESET = "\x1b[32m", "\x1b[90m", "\x1b[9;31m", "\x1b[1m", "\x1b[0m"


def cmd_data_show(_store: None, args: argparse.Namespace) -> int:
    from app.cli.usage import load_spec
    from jobs.data.tokens.streamed_rows import views_of

    spec = load_spec(args.spec, args.set)
    viewed = views_of(spec, _tokenizer(spec), numbers=args.row or None, first=args.rows)
    colour = args.color == "always" or (args.color == "auto" and sys.stdout.isatty())
    refs = [s.ref for s in spec.dataset_sources] or [spec.dataset]
    out = [legend(colour)]
    for view, (source, number) in zip(viewed.views, viewed.origins):
        where = f"row {number}" + (f" of {refs[source]}" if source < len(refs) else "")
        out.append(header(where, view, spec.max_length))
        for seq in view.sequences:
            if len(view.sequences) > 1:
                out.append(f"-- {seq.name}:")
            out.append(render_tokens(seq.tokens, colour, seq.image_blocks))
        out.append("")
    print("\n".join(out))
    return EXIT_OK


def _tokenizer(spec):  # -> the model's tokenizer, or UsageError
    from jobs.errors import Problem
    from jobs.models.vision import local_processing_class

    found = local_processing_class(spec.model, spec.trust_remote_code, spec.image_min_pixels, spec.image_max_pixels)
    if found is None:
        fix = f"fetch it once (`tunedeck setup --model {spec.model}` for a built-in, or download the model), then retry"
        raise UsageError([Problem("model", f"the tokenizer of {spec.model} is not on this machine", fix)])
    return found


def legend(colour: bool) -> str:
    if colour:
        return (
            f"tokens: {GREEN}trained{RESET} {GREY}masked{RESET} {BOLD}special{RESET} "
            f"✂{RED_STRUCK}cut at max_length{RESET}\n"
        )
    return "tokens: plain = trained, [masked]...[/masked] = not in the loss, [cut]...[/cut] = past max_length\n"


def header(where: str, view, max_length: int | None) -> str:  # view: jobs.data.tokens.view.RowView
    kept = sum(len(s.kept) for s in view.sequences)
    cut = sum(s.cut_count for s in view.sequences)
    text = f"== {where}: {kept} tokens, {view.trained_count} trained"
    if cut:
        text += f", {cut} cut at max_length {max_length}"
    if view.dropped:
        text += " (trl drops this row: none of its tokens is left in the loss)"
    return text + "".join(f" ({note})" for note in view.notes)


def render_tokens(tokens: Iterable, colour: bool, image_blocks: Iterable[tuple[int, int]] = ()) -> str:
    """The tokens' text (jobs.data.tokens.view.Token), marked: ANSI colours (`colour`) or bracketed spans of masked
    and cut tokens; each of `image_blocks` (first position, length) one `[image × N]` piece, as the form shows it,
    marked as its first token."""
    blocks = dict(image_blocks)
    parts: list[str] = []
    state = ""  # "", "masked" or "cut": the open plain span
    skip = 0
    for n, token in enumerate(tokens):
        if skip:
            skip -= 1
            continue
        text = token.text
        if n in blocks:
            text, skip = f"[image × {blocks[n]}]", blocks[n] - 1
        kind = "cut" if token.cut else "" if token.trained else "masked"
        if colour:
            if kind == "cut" and state != "cut":
                parts.append(f"{RESET}✂")
            style = RED_STRUCK if kind == "cut" else GREEN if kind == "" else GREY
            parts.append(f"{style}{BOLD if token.special else ''}{text}{RESET}")
        else:
            if kind != state:
                parts.append((f"[/{state}]" if state else "") + (f"[{kind}]" if kind else ""))
            parts.append(text)
        state = kind
    if not colour and state:
        parts.append(f"[/{state}]")
    return "".join(parts)


def add_parsers(data_sub: argparse._SubParsersAction) -> None:
    """`show` under the `data` command group (`app.cli.main` makes the group)."""
    s = data_sub.add_parser("show", help="the tokens training builds from rows of the spec's data, trained or masked")
    s.add_argument("spec", metavar="SPEC.yaml")
    s.add_argument("--row", type=int, action="append", default=[], metavar="N",
                   help="row N of the (first) data set, as its file numbers it (repeatable); default: the first rows")  # fmt: skip
    s.add_argument("--rows", type=int, default=3, metavar="K", help="how many first rows without --row (default 3)")
    s.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a spec field")
    s.add_argument("--color", choices=("auto", "always", "never"), default="auto",
                   help="colour the tokens (auto: when printing to a terminal)")  # fmt: skip
    s.set_defaults(func=cmd_data_show, store_use=StoreUse.NONE)
