"""Answer prompts with a finished run's result and with its base model, side by side.

    result = locate(store, run_id)          # RunResult: where the run's adapter or model is (no torch)
    pair = load(result)                     # LoadedPair: base + result, the run's tokenizer
    for piece in pair.stream("run", "Hi", system="", sampling=Sampling()):   # text as it is generated
        print(piece, end="")
    pair.answer("base", "Hi")               # the whole answer at once (the same text, greedy)

A peft run (LoRA, DoRA, QLoRA, IA3, prompt/prefix/P-tuning, MoRA, ...) is its base with the
adapter from the run's bundle folder; the base answers come from the same weights with the
adapter switched off (`PeftModel.disable_adapter`), so one copy of the base is in memory. A full
fine-tune's bundle is a whole model: base and result are then two models. The chat template is
the run's saved tokenizer's (what it trained with). Greedy decoding (temperature 0) is the
default, so answers are reproducible; with sampling, `seed` makes them reproducible too.

QLoRA and 8-bit runs answer on the unquantized base (16-bit on a GPU, fp32 on the CPU): the
adapter trained on a quantized base, so their answers can differ a little from the training setup.
Reward models score answers instead of writing them and are refused.

A vision-language run (its bundle holds the processor) loads with `AutoProcessor`: a turn may carry an
image part (`jobs.chat.images`), which the processor's chat template places and turns into the pixels the
model reads (`pixel_values`); an image given to a text-only run is refused with the fix.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

from jobs.chat.images import has_images, images_of, text_of
from jobs.errors import Problem
from jobs.spec.enums import Method
from jobs.spec.job import SpecError
from jobs.spec.trainer_records import record_for
from storage.roles import ArtifactReader

log = logging.getLogger(__name__)

WHICH = ("base", "run")
MAX_NEW_TOKENS = 4096


class ChatError(SpecError):
    """A run that cannot answer, or sampling settings out of range: the problem and the fix."""

    def __str__(self) -> str:
        return "; ".join(str(p) for p in self.problems)


def refuse(problem: str, fix: str, field: str = "run") -> ChatError:
    return ChatError([Problem(field, problem, fix)])


@dataclass(frozen=True)
class Sampling:
    """How answers are drawn: greedy when temperature is 0 (the default)."""

    temperature: float = 0.0
    top_p: float = 1.0
    max_new_tokens: int = 256
    seed: int = 0
    raw: bool = False  # continue the prompt text as it is, without the chat template (/v1/completions)

    def problems(self) -> list[Problem]:
        out = []
        if not 0.0 <= self.temperature <= 5.0:
            out.append(
                Problem(
                    "temperature",
                    f"{self.temperature} is outside 0..5",
                    "use 0 for greedy answers, or e.g. 0.7 to sample",
                )
            )
        if not 0.0 < self.top_p <= 1.0:
            out.append(Problem("top_p", f"{self.top_p} is outside (0, 1]", "use 1.0 (off) or e.g. 0.9"))
        if not 1 <= self.max_new_tokens <= MAX_NEW_TOKENS:
            out.append(
                Problem("max_new_tokens", f"{self.max_new_tokens} is outside 1..{MAX_NEW_TOKENS}", "use e.g. 256")
            )
        return out

    def checked(self) -> Sampling:
        problems = self.problems()
        if problems:
            raise ChatError(problems)
        return self

    def generate_kwargs(self) -> dict[str, Any]:
        """transformers `generate` arguments: do_sample only when temperature > 0."""
        if self.temperature <= 0:
            return {
                "max_new_tokens": self.max_new_tokens,
                "do_sample": False,
                "temperature": None,
                "top_p": None,
                "top_k": None,
            }
        return {
            "max_new_tokens": self.max_new_tokens,
            "do_sample": True,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": None,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Sampling:
        return cls(
            float(data.get("temperature", 0.0)),
            float(data.get("top_p", 1.0)),
            int(data.get("max_new_tokens", 256)),
            int(data.get("seed", 0)),
            bool(data.get("raw", False)),
        )


@dataclass(frozen=True)
class RunResult:
    """What a finished run left to answer with: plain data, sent to the generation process as JSON."""

    run_id: int
    name: str
    base: str  # the spec's model reference (built-in name, folder or hub id)
    folder: str  # the bundle folder: an adapter (peft) or a whole model (full)
    method: str
    full: bool
    trust_remote_code: bool = False
    vision: bool = False  # a vision-language run: loaded with its processor, takes image parts

    def image_refusal(self) -> ChatError:
        """An image sent to this text-only run: what is wrong and what to do instead."""
        return refuse(
            f"run {self.run_id} ({self.name}) fine-tuned {self.base}, a text-only model: it cannot read images",
            "send the message without the image, or chat with a run of a vision-language model "
            "(e.g. LLaVA, Qwen2.5-VL, SmolVLM)",
            "image",
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunResult:
        return cls(**data)


def locate(store: ArtifactReader, run_id: int) -> RunResult:
    """The run's result folder; refuses missing, unfinished or reward-model runs with the fix."""
    from jobs.spec.stored import finished_problem, result_folder, spec_of

    run = store.get_run(run_id)
    problem = finished_problem(run, run_id, "chat with")
    if problem is not None:
        raise refuse(*problem)
    assert run is not None  # finished_problem names a missing run
    spec = spec_of(run)
    if record_for(spec.trainer).score_head:
        raise refuse(
            f"run {run_id} trained a reward model: it scores answers and does not write them",
            "chat with an SFT, DPO, KTO, ORPO or CPO run",
        )
    full = spec.method is Method.FULL
    kind, marker = ("model", "config.json") if full else ("adapter", "adapter_config.json")
    folder = result_folder(store, run_id, kind, marker)
    if folder is None:
        raise refuse(
            f"run {run_id} has no saved {kind} folder (its result was not written or was deleted)",
            "train the run again (`tunedeck resume` does not apply to a finished run: submit its spec)",
        )
    from jobs.models.vision import PROCESSOR_FILES

    vision = any((folder / name).is_file() for name in PROCESSOR_FILES)  # the bundle of a vision run holds it
    return RunResult(
        run_id, spec.display_name, spec.model, str(folder), spec.method.value, full, spec.trust_remote_code, vision
    )


# One prompt, or the turns so far ({"role", "content"}), a user's last; a content is text, or parts
# (`jobs.chat.images.user_turn`: an image part and a text part) for a vision-language run.
Conversation = str | list[dict[str, Any]]


def messages_of(prompt: Conversation, system: str = "") -> list[dict[str, Any]]:
    """The conversation sent to the chat template: an optional system message, then the prompt (or turns)."""
    head = [{"role": "system", "content": system}] if system.strip() else []
    turns = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
    return head + turns


def plain_text(prompt: Conversation, system: str = "") -> str:
    """A conversation as plain text, for a tokenizer without a chat template: the turns one after another."""
    if isinstance(prompt, str):
        turns = prompt
    else:
        turns = "\n\n".join(text_of(t["content"]) for t in prompt)
    return (system.strip() + "\n\n" if system.strip() else "") + turns


class LoadedPair:
    """A run's result and its base, loaded once; answers with either, streaming or whole."""

    def __init__(self, result: RunResult, tokenizer: Any, tuned: Any, base: Any | None, processor: Any = None):
        self.result = result
        self.tokenizer = tokenizer
        self.processor = processor  # a vision-language run's (its tokenizer is the processor's)
        self.tuned = tuned
        self._base = base  # full fine-tunes only: peft runs switch their adapter off instead

    @property
    def device(self) -> Any:
        return next(self.tuned.parameters()).device

    def inputs(self, prompt: Conversation, system: str = "", raw: bool = False) -> dict[str, Any]:
        """Token ids of the prompt with the run's chat template (plain text when it has none, or when `raw`);
        with the images' pixels for a vision-language run (its processor's template and image processor)."""
        tok = self.tokenizer
        if has_images(prompt) and self.processor is None:
            raise self.result.image_refusal()
        if self.processor is not None and not raw:
            enc = self._vision_inputs(prompt, system)
        elif getattr(tok, "chat_template", None) and not raw:
            import torch
            from jinja2 import TemplateError

            from jobs.chat.template import chat_ids

            try:
                ids = torch.tensor([chat_ids(tok, messages_of(prompt, system), add_generation_prompt=True)])
                enc = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
            # the template's raise_exception (jinja2's TemplateError), e.g. for a system role it does not know;
            # anything else is a bug of ours and propagates with its traceback
            except TemplateError as exc:
                raise refuse(
                    f"the run's chat template rejected the conversation: {exc}",
                    "leave the system prompt empty (some templates have no system role)",
                    "system",
                ) from exc
        else:
            enc = tok(plain_text(prompt, system), return_tensors="pt")
        self._check_length(int(enc["input_ids"].shape[1]))
        return {k: v.to(self.device) for k, v in enc.items()}

    def _check_length(self, tokens: int) -> None:
        """Refuse a templated prompt with no room left in the model's context (`jobs.chat.limits`)."""
        from jobs.chat.limits import context_length, too_long

        limit = context_length(self.result)
        if limit is not None and tokens >= limit:
            raise ChatError([too_long(self.result.run_id, f"{tokens:,} tokens", limit, "the model's context")])

    def _vision_inputs(self, prompt: Conversation, system: str) -> Any:
        """The processor's inputs: its chat template's text, and `pixel_values` when the turns have images."""
        from jinja2 import TemplateError

        from jobs.chat.template import escaped, special_texts

        messages = escaped(messages_of(prompt, system), special_texts(self.processor.tokenizer))
        try:
            text = self.processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        except TemplateError as exc:
            raise refuse(
                f"the run's chat template rejected the conversation: {exc}",
                "leave the system prompt empty (some templates have no system role)",
                "system",
            ) from exc
        images = images_of(messages)
        return self.processor(images=images or None, text=text, return_tensors="pt")

    def _generate(self, which: str, inputs: dict[str, Any], sampling: Sampling, **extra: Any) -> Any:
        import torch

        if which not in WHICH:
            raise refuse(f"{which!r} is neither 'base' nor 'run'", "ask for 'base' or 'run'", "which")
        kwargs = {**inputs, **sampling.generate_kwargs(), "pad_token_id": self.tokenizer.pad_token_id, **extra}
        torch.manual_seed(sampling.seed)
        with torch.no_grad():
            if which == "run":
                return self.tuned.generate(**kwargs)
            if self._base is not None:
                return self._base.generate(**kwargs)
            with self.tuned.disable_adapter():  # the same weights without the adapter: the base model
                return self.tuned.get_base_model().generate(**kwargs)

    def answer(self, which: str, prompt: Conversation, system: str = "", sampling: Sampling | None = None) -> str:
        """The whole answer of `which` ("base" or "run"), decoded without special tokens."""
        inputs = self.inputs(prompt, system)
        out = self._generate(which, inputs, (sampling or Sampling()).checked())
        return self.tokenizer.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)

    def stream(
        self, which: str, prompt: Conversation, system: str = "", sampling: Sampling | None = None
    ) -> Iterator[str]:
        """The answer of `which` in pieces as they are generated (transformers' TextIteratorStreamer)."""
        from transformers import TextIteratorStreamer

        sampling = (sampling or Sampling()).checked()
        inputs = self.inputs(prompt, system, sampling.raw)
        streamer = TextIteratorStreamer(self.tokenizer, skip_prompt=True, skip_special_tokens=True)
        failure: list[BaseException] = []

        def work() -> None:
            try:
                self._generate(which, inputs, sampling, streamer=streamer)
            # a thread boundary: whatever generate raises (KeyboardInterrupt included) is re-raised in the
            # caller's thread below, so it is neither lost nor printed by the thread machinery instead
            except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread below
                failure.append(exc)
                streamer.end()

        thread = threading.Thread(target=work, name=f"generate-{which}", daemon=True)
        thread.start()
        for piece in streamer:
            if piece:
                yield piece
        thread.join()
        if failure:
            raise failure[0]


def _dtype(device: str) -> Any:
    import torch

    if device.startswith("cuda"):
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.float32


def load(result: RunResult, device: str | None = None) -> LoadedPair:
    """Load the run's result and its base onto `device` (default: the first visible GPU, else the CPU)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText, AutoProcessor, AutoTokenizer

    from jobs.models.loading import load_model_and_tokenizer
    from jobs.models.references import resolve_model
    from jobs.models.registry import ModelError

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    remote = result.trust_remote_code
    tuned: torch.nn.Module  # a full model, or the base with the run's adapter (peft's or MoRA's)
    processor = None
    try:
        if result.vision:
            processor = AutoProcessor.from_pretrained(result.folder, trust_remote_code=remote)
            tokenizer = processor.tokenizer
        else:
            tokenizer = AutoTokenizer.from_pretrained(result.folder, trust_remote_code=remote)
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        base, _ = load_model_and_tokenizer(
            resolve_model(result.base, trust_remote_code=remote), torch_dtype=_dtype(device), trust_remote_code=remote
        )
        if result.full:
            auto = AutoModelForImageTextToText if result.vision else AutoModelForCausalLM
            tuned = auto.from_pretrained(
                result.folder, dtype=_dtype(device), use_safetensors=True, trust_remote_code=remote
            )
        elif result.method == Method.MORA.value:
            from jobs.config.mora import load_mora

            tuned, base = load_mora(base, result.folder), None
        else:
            from peft import PeftModel

            tuned, base = PeftModel.from_pretrained(base, result.folder), None
    except ModelError:
        raise
    # Broad: from_pretrained on a user's folder fails in many ways (OSError, ValueError, RuntimeError on a
    # size mismatch, ImportError of remote code, ...). The user gets the first line with the run's name;
    # the traceback goes to the log, since the ProblemError carrying the message does not print its cause.
    except Exception as exc:
        log.exception("run %s's model failed to load from %s", result.run_id, result.folder)
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise refuse(
            f"run {result.run_id}'s model failed to load: {type(exc).__name__}: {first}",
            "check that its base model is still available here (`tunedeck show "
            f"{result.run_id}` names it) and that the run's bundle folder is intact",
        ) from exc
    tuned = tuned.to(device).eval()
    if base is not None:
        base = base.to(device).eval()
    return LoadedPair(result, tokenizer, tuned, base, processor)
