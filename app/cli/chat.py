"""`tunedeck chat` and `tunedeck generate`: talk to a finished run (or its base) in the terminal.

    tunedeck chat RUN_ID [--base] [--image PICTURE] [--system TEXT] [--temperature T] [--top-p P] [--max-new-tokens N]
    tunedeck generate RUN_ID "prompt" [--base] [--image PICTURE] [--max-new-tokens N] [--json]

`chat` reads one prompt per line on stdin and streams each answer to stdout; `/exit` or end of
input ends it. Each prompt is answered on its own (no history; the dashboard's Chat tab holds a
conversation, answered by a worker).
`generate` prints one answer (--json: {"run", "model", "prompt", "answer"}) for scripts. Both
answer with the run's result, or with its base model (--base), through the same generation
process and device rules as a worker's chat service (`jobs.chat.process`), started here on this
machine (the run's weights must be reachable from it); greedy unless --temperature > 0.
`--image` goes with the prompt (with each prompt, for `chat`) to a vision-language run: the picture is
checked and kept in the run's chat folder first (`jobs.chat.images`), as the dashboard's Chat tab does; a
text-only run, a missing file or one that is not a picture is refused before any model loads.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from storage.roles import TerminalChat

if TYPE_CHECKING:
    from jobs.chat.generate import Conversation, RunResult

EXIT_COMMAND = "/exit"


def _sampling(args: argparse.Namespace) -> Any:
    from jobs.chat.generate import Sampling

    return Sampling(args.temperature, args.top_p, args.max_new_tokens, args.seed).checked()


def _picture(store: TerminalChat, args: argparse.Namespace, result: RunResult) -> str | None:
    """The --image picture checked and kept in the run's chat folder (its path), or None without one."""
    from jobs.chat.generate import ChatError
    from jobs.chat.images import image_problem, keep_image

    if not args.image:
        return None
    problem = image_problem(args.image)
    if problem is not None:
        raise ChatError([problem])
    if not result.vision:
        raise result.image_refusal()
    return keep_image(store.run_dir(result.run_id), args.image)


def _prompt(text: str, picture: str | None) -> Conversation:
    """The text alone, or one user turn of the kept picture and the text."""
    from jobs.chat.images import user_turn

    return [user_turn(text, picture)] if picture else text


def cmd_generate(store: TerminalChat, args: argparse.Namespace) -> int:
    from jobs.chat.generate import locate
    from jobs.chat.process import ChatProcess

    sampling = _sampling(args)
    result = locate(store, args.run_id)
    prompt = _prompt(args.prompt, _picture(store, args, result))
    which = "base" if args.base else "run"
    chat = ChatProcess(store)
    try:
        if args.json:
            answer = chat.answer(args.run_id, which, prompt, args.system, sampling)
            print(
                json.dumps(
                    {
                        "run": args.run_id,
                        "model": "base" if args.base else "run",
                        "name": result.name,
                        "base_model": result.base,
                        "prompt": args.prompt,
                        **({"image": args.image} if args.image else {}),
                        "answer": answer,
                    }
                )
            )
        else:
            for piece in chat.stream(args.run_id, which, prompt, args.system, sampling):
                sys.stdout.write(piece)
                sys.stdout.flush()
            sys.stdout.write("\n")
    finally:
        chat.close()
    return 0


def cmd_chat(store: TerminalChat, args: argparse.Namespace) -> int:
    from jobs.chat.generate import locate
    from jobs.chat.process import ChatProcess

    sampling = _sampling(args)
    result = locate(store, args.run_id)
    picture = _picture(store, args, result)
    which = "base" if args.base else "run"
    interactive = sys.stdin.isatty()
    print(
        f"chatting with {'the base model of ' if args.base else ''}run {result.run_id} ({result.name})"
        + (f" about {args.image}" if picture else "")
        + f"; {EXIT_COMMAND} or Ctrl-D ends",
        file=sys.stderr,
    )
    chat = ChatProcess(store)
    try:
        while True:
            if interactive:
                print("> ", end="", file=sys.stderr, flush=True)
            line = sys.stdin.readline()
            if not line or line.strip() == EXIT_COMMAND:
                return 0
            prompt = line.strip()
            if not prompt:
                continue
            for piece in chat.stream(args.run_id, which, _prompt(prompt, picture), args.system, sampling):
                sys.stdout.write(piece)
                sys.stdout.flush()
            sys.stdout.write("\n")
            sys.stdout.flush()
    except KeyboardInterrupt:
        return 0
    finally:
        chat.close()


def _common(s: argparse.ArgumentParser) -> None:
    s.add_argument("run_id", type=int, metavar="RUN_ID")
    s.add_argument("--base", action="store_true", help="answer with the run's base model instead of its result")
    s.add_argument(
        "--image",
        metavar="PICTURE",
        help="a PNG, JPEG or WebP picture sent with the prompt (each prompt, for chat): vision-language runs only",
    )
    s.add_argument("--system", default="", metavar="TEXT", help="a system prompt (the chat template's system role)")
    s.add_argument(
        "--temperature", type=float, default=0.0, metavar="T", help="0 (default): greedy, reproducible answers"
    )
    s.add_argument(
        "--top-p", type=float, default=1.0, dest="top_p", metavar="P", help="nucleus sampling (with --temperature > 0)"
    )
    s.add_argument(
        "--max-new-tokens", type=int, default=256, dest="max_new_tokens", metavar="N", help="answer length limit"
    )
    s.add_argument("--seed", type=int, default=0, metavar="N", help="sampling seed (with --temperature > 0)")


def add_parser(sub: Any) -> None:
    """Register `chat` and `generate` on the CLI's subparsers."""
    s = sub.add_parser(
        "chat", help="talk to a finished run (or its base with --base): prompts on stdin, answers streamed; /exit ends"
    )
    _common(s)
    s.set_defaults(func=cmd_chat)
    s = sub.add_parser("generate", help="print a finished run's answer to one prompt (--json for scripts)")
    _common(s)
    s.add_argument("prompt", metavar="PROMPT")
    s.add_argument("--json", action="store_true", help='print {"run", "model", "prompt", "answer", ...}')
    s.set_defaults(func=cmd_generate)
