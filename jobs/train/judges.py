"""A judge asked for its replies: an OpenAI-compatible endpoint (one prompt at a time) or a loaded model (greedy, in
batches). The evaluation's judge (`jobs.evaluate.judge`) and GRPO's judge reward (`jobs.config.rewards`, kind `judge`)
both ask through these.

    ask_all = one_by_one(endpoint_asker("https://api.example.com/v1#gpt-4o-mini"))   # key only if trusted
    ask_all = in_batches(lambda: contextlib.nullcontext(model), tokenizer)
    replies = ask_all(["Score this ...", "Score that ..."])
    judge_for = reward_judges(store)      # the training process's judges: each loaded once, on first use, and held

An endpoint is written `URL#MODEL`; the worker's OPENAI_API_KEY goes only to an endpoint its operator trusts
(TUNEDECK_TRUSTED_ENDPOINTS, `jobs.checks.egress`), redirects included; any other endpoint is called without it.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from jobs.errors import Problem
from jobs.spec.job import SpecError
from jobs.spec.rewards import JUDGE_BATCH, JUDGE_REPLY_TOKENS
from storage.roles import RunArtifacts

log = logging.getLogger(__name__)
KEY_ENV = "OPENAI_API_KEY"
MAX_VERDICT_TOKENS = 48

Ask = Callable[[str], str]  # one prompt -> the judge's reply (an endpoint)
AskAll = Callable[[list[str]], list[str]]  # every prompt at once -> their replies (a model, in batches)


def one_by_one(ask: Ask) -> AskAll:
    """A one-prompt judge asked about each prompt in turn."""
    return lambda prompts: [ask(p) for p in prompts]


def is_endpoint(ref: str) -> bool:
    return ref.strip().startswith(("http://", "https://"))


def endpoint_asker(ref: str, field: str = "judge") -> Ask:
    """An OpenAI-compatible chat-completions endpoint, `URL#MODEL`; the worker's OPENAI_API_KEY is sent only when
    the operator trusts the endpoint (`jobs.checks.egress`), redirects included."""
    import urllib.error
    import urllib.request

    from jobs.checks.egress import key_headers, opener, unkeyed_refusal

    url, _, model = ref.partition("#")
    if not model:
        raise SpecError([Problem(field, f"{ref!r} names no model", "write the endpoint as URL#MODEL")])
    address = url.rstrip("/") + "/chat/completions"
    headers = {"Content-Type": "application/json", **key_headers(address, KEY_ENV)}
    client = opener()

    def ask(prompt: str) -> str:
        body = {"model": model, "messages": [{"role": "user", "content": prompt}], "temperature": 0}
        request = urllib.request.Request(address, data=json.dumps(body).encode(), headers=headers)
        try:
            with client.open(request, timeout=120) as response:
                reply = json.load(response)
        except urllib.error.HTTPError as exc:
            if exc.code in (401, 403) and "Authorization" not in headers:
                raise SpecError([unkeyed_refusal(address, exc.code, field)]) from exc
            raise
        return str(reply["choices"][0]["message"]["content"])

    return ask


def in_batches(model: Callable[[], AbstractContextManager[Any]], tokenizer: Any, max_new_tokens: int = 0) -> AskAll:
    """A loaded judge model asked JUDGE_BATCH prompts at a time (`model()`: a context giving the model to ask;
    `max_new_tokens`: each reply's bound, MAX_VERDICT_TOKENS when 0)."""

    def ask_all(prompts: list[str]) -> list[str]:
        with model() as judge:
            return [
                r
                for i in range(0, len(prompts), JUDGE_BATCH)
                for r in batch_replies(
                    judge, tokenizer, prompts[i : i + JUDGE_BATCH], max_new_tokens or MAX_VERDICT_TOKENS
                )
            ]

    return ask_all


def batch_replies(
    model: Any, tokenizer: Any, prompts: list[str], max_new_tokens: int = MAX_VERDICT_TOKENS
) -> list[str]:
    """Greedy replies to typed prompts (through the chat template), generated together: left-padded, masked."""
    import torch
    from transformers import ProcessorMixin

    from jobs.train.prompt_ids import encode

    tokenizer = tokenizer.tokenizer if isinstance(tokenizer, ProcessorMixin) else tokenizer
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    rows = [encode(tokenizer, p)["input_ids"][0].tolist() for p in prompts]
    width = max(len(r) for r in rows)
    device = next(model.parameters()).device
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows], device=device)
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=device)
    training = model.training
    model.eval()
    try:
        with torch.no_grad():
            out = model.generate(
                input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=pad
            )
    finally:
        model.train(training)
    return [tokenizer.decode(row[width:], skip_special_tokens=True).strip() for row in out.tolist()]


def reward_judges(
    store: RunArtifacts | None, device: Callable[[], Any] | None = None, dtype: Any = None
) -> Callable[[str], AskAll]:
    """The judges of a training process's judge rewards, by reference: each made on first use and held for the run
    (a model loaded once in `dtype`, onto `device()`, the policy's; an endpoint asked one prompt at a time)."""
    made: dict[str, AskAll] = {}

    def judge_for(ref: str) -> AskAll:
        if ref not in made:
            if is_endpoint(ref):
                made[ref] = one_by_one(endpoint_asker(ref, "rewards.judge"))
            else:
                model, tokenizer = _load_judge(ref, store, dtype)
                if device is not None:
                    model.to(device())
                model.eval()
                log.info("reward judge %s loaded", ref)
                made[ref] = in_batches(lambda: contextlib.nullcontext(model), tokenizer, JUDGE_REPLY_TOKENS)
        return made[ref]

    return judge_for


def _load_judge(ref: str, store: RunArtifacts | None, dtype: Any = None) -> tuple[Any, Any]:
    """(model, tokenizer) of a judge reward's local model: a built-in name, a folder, or `run:N` (a finished run's
    model: its full weights, or its base with its adapter)."""
    from jobs.models.loading import load_model_and_tokenizer
    from jobs.models.references import resolve_model
    from jobs.models.registry import ModelError

    field = "rewards.judge"
    try:
        if not ref.lower().startswith("run:"):
            return load_model_and_tokenizer(resolve_model(ref), torch_dtype=dtype)
        from jobs.models.judge_run import run_judge

        folder, base = run_judge(store, int(ref[4:]))
        if base is None:
            return load_model_and_tokenizer(resolve_model(folder), torch_dtype=dtype)
        from peft import PeftModel

        model, tokenizer = load_model_and_tokenizer(resolve_model(base), torch_dtype=dtype)
        return PeftModel.from_pretrained(model, folder).merge_and_unload(), tokenizer
    except ModelError as exc:
        raise SpecError([Problem(field, p.problem, p.fix) for p in exc.problems]) from exc
