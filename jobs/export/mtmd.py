"""A vision-language GGUF pair read back by llama.cpp itself: `llama-mtmd-cli` answers the check image.

    problem = mtmd_problem()                              # None, or why llama-mtmd-cli is not here
    pair = pair_check(source, model_gguf, mmproj_gguf)    # PairCheck: llama.cpp's first token and transformers'

llama-mtmd-cli (llama.cpp's multimodal command line, built by `./dev.sh gguf` beside llama-imatrix, see
`jobs.export.imatrix`) loads the language model file and the projector file together, encodes the export's
check image (`jobs.export.image_check`) with llama.cpp's own image encoder and answers the check question
greedily, one token. The merged model answers the same image and question in transformers; the two first tokens
must be the same.

The prompt is the same text on both sides: the processor's chat template over the image and the question, given
to llama-mtmd-cli through a pass-through template (`--jinja --chat-template`, so llama.cpp's rendering of the
model's template does not differ by a newline), with llama.cpp's media marker where the processor puts the image
(for Gemma 3 the begin-of-image token, which llama.cpp writes itself, with the processor's blank lines around it).
llama-mtmd-cli prints the answer's text, not its id: the comparison is of the first token's text (the
transformers token decoded with its special tokens; an end-of-generation token prints as an empty answer).

It runs as a child process of the export: in the task's process group (a cancelled task ends it), killed when the
export stops for any other reason, and after `TIMEOUT_S`.
"""

from __future__ import annotations

import logging
import os
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("jobs.export.merged")

TOOL = "llama-mtmd-cli"
TIMEOUT_S = 900
MARK = "<<<tunedeck-answer>>>"  # printed by llama-mtmd-cli just before its answer (MTMD_TEST_RESPONSE_MARKER)
PASS_THROUGH = "{% for message in messages %}{{ message['content'] }}{% endfor %}"
MEDIA_MARKER = "<__media__>"  # llama.cpp's mtmd_default_marker()


class PairFailed(RuntimeError):
    """llama-mtmd-cli did not load the pair or answer (its last lines say why)."""


@dataclass
class PairCheck:
    """The pair answered the check image in llama.cpp, against the merged model in transformers."""

    tool: str
    transformers: str  # the first answer token's text
    llama_cpp: str
    agrees: bool
    prompt_tokens: int

    def record(self) -> dict[str, Any]:
        return asdict(self)


def tool_path() -> Path:
    """Beside llama-imatrix (`jobs.export.imatrix.tools_dir`): the converter's bin/."""
    from jobs.export.converter import converter_dir

    return converter_dir() / "bin" / TOOL


def mtmd_problem() -> str | None:
    """Why llama.cpp cannot read a GGUF pair here (None: it can)."""
    if not os.access(tool_path(), os.X_OK):
        return (
            f"llama.cpp's {TOOL} is not built here (looked in {tool_path().parent}; `./dev.sh gguf` builds it), "
            "so the projector was read back by gguf-py only"
        )
    return None


def pair_check(source: Path, model: Path, mmproj: Path) -> PairCheck:
    """llama-mtmd-cli's first answer token to the check image, from the GGUF pair `model` + `mmproj`, and the
    merged model folder `source`'s in transformers (PairFailed: llama.cpp did not load or answer)."""
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from jobs.export.image_check import IMAGE_QUESTION, check_image, image_inputs

    processor = AutoProcessor.from_pretrained(str(source))
    model_hf = AutoModelForImageTextToText.from_pretrained(str(source), dtype=torch.float32).eval()
    inputs = image_inputs(processor, check_image())
    with torch.no_grad():
        ids = int(model_hf(**inputs).logits[0, -1].argmax())
    del model_hf
    tokenizer = processor.tokenizer
    theirs = "" if ids in end_ids(source, tokenizer) else tokenizer.decode([ids], skip_special_tokens=False)
    prompt_tokens = int(inputs["input_ids"].shape[1])
    with tempfile.TemporaryDirectory(prefix="mtmd-check-") as tmp:
        picture = Path(tmp, "check.png")
        check_image().save(picture)
        mine = run_mtmd(model, mmproj, picture, llama_prompt(processor, IMAGE_QUESTION), prompt_tokens)
    pair = PairCheck(TOOL, theirs, mine, mine == theirs, prompt_tokens)
    log.info("GGUF pair read by %s: first token %r, transformers %r", TOOL, mine, theirs)
    return pair


def end_ids(source: Path, tokenizer: Any) -> set[int]:
    """The model's end-of-generation ids: the tokenizer's, and its generation config's (one id or a list)."""
    import json

    path = source / "generation_config.json"
    eos = json.loads(path.read_text()).get("eos_token_id") if path.is_file() else None
    ids = {tokenizer.eos_token_id, *(eos if isinstance(eos, list) else [eos])}
    return {i for i in ids if isinstance(i, int)}


def llama_prompt(processor: Any, question: str) -> str:
    """The processor's chat text over one image and `question`, with llama.cpp's media marker for the image (a
    leading begin-of-sequence token is kept: llama.cpp drops it from a template's output where it adds its own)."""
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question}]}]
    text = str(processor.apply_chat_template(messages, add_generation_prompt=True))
    if boi := getattr(processor, "boi_token", None):  # Gemma 3: llama.cpp writes <start_of_image> and its end itself
        return text.replace(boi, f"\n\n{MEDIA_MARKER}\n\n", 1)
    return text.replace(str(getattr(processor, "image_token", "<image>")), MEDIA_MARKER, 1)


def run_mtmd(model: Path, mmproj: Path, picture: Path, prompt: str, prompt_tokens: int) -> str:
    """llama-mtmd-cli's greedy first answer token's text (PairFailed: it exited with an error or printed none)."""
    context = max(256, prompt_tokens + 64)
    argv = [str(tool_path()), "-m", str(model), "--mmproj", str(mmproj), "--image", str(picture), "-p", prompt]
    argv += ["-n", "1", "--temp", "0", "--seed", "0", "-ngl", "0", "--no-mmproj-offload", "-c", str(context)]
    argv += ["--no-warmup", "--jinja", "--chat-template", PASS_THROUGH]
    env = {**os.environ, "MTMD_TEST_RESPONSE_MARKER": MARK}
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        child = subprocess.Popen(argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env)
        try:
            code = child.wait(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired as exc:
            raise PairFailed(f"{TOOL} did not answer in {TIMEOUT_S} s") from exc
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
        out.seek(0)
        err.seek(0)
        stdout = out.read().decode(errors="replace")
        stderr = err.read().decode(errors="replace")
    if code != 0 or MARK not in stdout:
        lines = [line.strip() for line in (stderr + stdout).strip().splitlines() if line.strip()][-3:]
        raise PairFailed(f"{TOOL} exited with {code} without an answer: {' / '.join(lines)}")
    return answer_of(stdout)


def answer_of(stdout: str) -> str:
    """The answer llama-mtmd-cli printed after the marker: a blank line, the token's text, a blank line (an
    end-of-generation token prints as a lone newline)."""
    answer = stdout.split(MARK, 1)[1]
    answer = answer.removeprefix("\n").removeprefix("\n").removesuffix("\n").removesuffix("\n")
    return "" if answer == "\n" else answer
