"""Try a GRPO spec's rewards before training: can they teach the base model anything?

GRPO only reinforces differences within a group: each prompt's `num_generations` completions are scored,
and a completion's advantage is its reward minus the group's mean (divided by the spread, as the spec's
`scale_rewards` says). A group whose completions all score the same has zero advantage everywhere: that
prompt teaches nothing ("no learning signal"). This samples a few prompts' groups from the base model
with the job's own generation settings (num_generations, temperature, max_completion_length), scores
each completion with every reward the run would use (`jobs.train.trainers.reward_sources`: declared
rewards, a reward run's model, a custom function) and computes the advantages as trl's GRPOTrainer does
(`advantages`, its default `sum_then_normalize` aggregation; trl's own `nanstd`).

    result = try_rewards(spec, prompts=4)       # plain data (JSON): groups, share_teaching, rewards
    print(trial_table(result))                  # what `tunedeck grpo try SPEC` prints

Run by `tunedeck grpo try SPEC` in-process, and by a worker as the task "try_rewards"
(`jobs.worker.tasks.request_try_rewards`: the dashboard's button and the API).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from jobs.spec.job import JobSpec

DEFAULT_PROMPTS = 4
SAME = 1e-6  # a group whose rewards spread less than this gives (numerically) no advantage


def advantages(
    totals: Sequence[float | None], num_generations: int, scale_rewards: str
) -> tuple[list[float], list[float], list[float]]:
    """(advantage per completion, mean per group, spread per group) as trl computes them: the group's mean is
    the baseline; `group` divides by the group's std, `batch` by the whole batch's, `none` not at all (+1e-4).
    A NaN total (a completion no reward could score) counts in no baseline and gets advantage 0."""
    import torch
    from trl.trainer.utils import nanstd

    rewards = torch.tensor([float("nan") if t is None else float(t) for t in totals], dtype=torch.float32)
    grouped = rewards.view(-1, num_generations)
    mean = torch.nanmean(grouped, dim=1)
    group_std = nanstd(grouped, dim=1) if num_generations > 1 else torch.zeros_like(mean)
    if scale_rewards == "batch":
        std = nanstd(rewards).expand_as(rewards) if rewards.numel() > 1 else torch.zeros_like(rewards)
    else:
        std = group_std.repeat_interleave(num_generations)
    adv = rewards - mean.repeat_interleave(num_generations)
    if scale_rewards != "none":
        adv = adv / (std + 1e-4)
    adv = torch.nan_to_num(adv, nan=0.0)
    return adv.tolist(), mean.tolist(), torch.nan_to_num(group_std, nan=0.0).tolist()


def weighted_totals(scores: dict[str, list[float | None]], weights: Sequence[float]) -> list[float | None]:
    """Each completion's reward: the weighted sum of its scores (None ones skipped, trl's nansum); None when
    no reward scored it."""
    columns = list(scores.values())
    out: list[float | None] = []
    for i in range(len(columns[0]) if columns else 0):
        parts = [(v, w) for c, w in zip(columns, weights) if (v := c[i]) is not None and not math.isnan(v)]
        out.append(sum((v * w for v, w in parts), 0.0) if parts else None)
    return out


def summarise(
    prompts: Sequence[Any],
    completions: Sequence[str],
    scores: dict[str, list[float | None]],
    weights: Sequence[float],
    num_generations: int,
    scale_rewards: str,
    truncated: Sequence[bool] = (),
) -> dict[str, Any]:
    """The trial as plain data: one group per prompt (its completions, scores, total, advantage), each
    group's mean and spread, whether it can teach, and the share of prompts that can."""
    totals = weighted_totals(scores, weights)
    adv, means, spreads = advantages(totals, num_generations, scale_rewards)
    groups = []
    for g, prompt in enumerate(prompts):
        rows = range(g * num_generations, (g + 1) * num_generations)
        groups.append(
            {
                "prompt": prompt,
                "completions": [
                    {
                        "text": completions[i],
                        "scores": {name: _finite(col[i]) for name, col in scores.items()},
                        "reward": _finite(totals[i]),
                        "advantage": adv[i],
                        "truncated": bool(truncated[i]) if truncated else None,
                    }
                    for i in rows
                ],
                "mean": _finite(means[g]),
                "spread": spreads[g],
                "teaches": spreads[g] > SAME,
            }
        )
    teaching = sum(g["teaches"] for g in groups)
    return {
        "rewards": list(scores),
        "weights": list(weights),
        "num_generations": num_generations,
        "scale_rewards": scale_rewards,
        "groups": groups,
        "teaching": teaching,
        "share_teaching": teaching / len(groups) if groups else 0.0,
    }


def _finite(value: float | None) -> float | None:
    return None if value is None or math.isnan(value) else float(value)


def reward_name(func: Any) -> str:
    """The name trl logs a reward under: a reward model's folder name, else the function's `__name__`."""
    config = getattr(func, "config", None)
    if config is not None:
        return str(config._name_or_path).rstrip("/").split("/")[-1]
    return str(getattr(func, "__name__", type(func).__name__))


def score(
    funcs: Sequence[Any],
    classes: Sequence[Any],
    prompts: Sequence[Any],
    completions: Sequence[Any],
    completion_ids: Sequence[Sequence[int]],
    columns: dict[str, list[Any]],
) -> dict[str, list[float | None]]:
    """Every reward's score of every completion (one entry per reward, in order), called as trl calls it."""
    out: dict[str, list[float | None]] = {}
    for func, processing in zip(funcs, classes):
        name = reward_name(func)
        if processing is not None:  # a reward model: prompt + completion as one text, the first logit
            out[name] = _model_scores(func, processing, prompts, completions)
            continue
        got = func(prompts=list(prompts), completions=list(completions), completion_ids=completion_ids, **columns)
        out[name] = [None if v is None else float(v) for v in got]
    return out


def _model_scores(model: Any, tokenizer: Any, prompts: Sequence[Any], completions: Sequence[Any]) -> list[float | None]:
    import torch
    from trl.data_utils import apply_chat_template, is_conversational

    if is_conversational({"prompt": prompts[0]}):
        texts = [apply_chat_template({"messages": p + c}, tokenizer)["text"] for p, c in zip(prompts, completions)]
    else:
        texts = [p + c for p, c in zip(prompts, completions)]
    batch = tokenizer(text=texts, return_tensors="pt", padding=True, padding_side="right", add_special_tokens=False)
    batch = batch.to(next(model.parameters()).device)
    with torch.inference_mode():
        return [float(v) for v in model(**batch).logits[:, 0].float().tolist()]


def sample(
    model: Any, tokenizer: Any, spec: JobSpec, prompts: Sequence[Any]
) -> tuple[list[Any], list[list[int]], list[bool]]:
    """num_generations completions per prompt (grouped, in prompt order), sampled as trl's GRPOTrainer samples
    them (temperature, max_completion_length, the tokenizer's chat template for chat prompts): (completions as
    trl hands them to rewards, their token ids up to the first eos, whether each ran out of room)."""
    import torch
    from transformers import GenerationConfig
    from trl.data_utils import is_conversational, maybe_apply_chat_template

    config = GenerationConfig(
        max_new_tokens=spec.max_completion_length,
        do_sample=True,
        temperature=spec.temperature,
        top_p=1.0,
        num_return_sequences=spec.num_generations,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    chat = is_conversational({"prompt": prompts[0]})
    completions: list[Any] = []
    ids_out: list[list[int]] = []
    truncated: list[bool] = []
    device = next(model.parameters()).device
    for prompt in prompts:  # one prompt at a time: no padding to think about, and little memory
        text = maybe_apply_chat_template({"prompt": prompt}, tokenizer)["prompt"]
        batch = tokenizer(text, return_tensors="pt", add_special_tokens=False).to(device)
        with torch.inference_mode():
            out = model.generate(**batch, generation_config=config)
        for row in out[:, batch["input_ids"].shape[1] :].tolist():
            ids = _until_eos(row, tokenizer.eos_token_id)
            truncated.append(len(ids) == len(row) and len(row) >= spec.max_completion_length)
            ids_out.append(ids)
            text_out = tokenizer.decode(ids, skip_special_tokens=True)
            completions.append([{"role": "assistant", "content": text_out}] if chat else text_out)
    return completions, ids_out, truncated


def _until_eos(row: list[int], eos: int | list[int] | None) -> list[int]:
    ends = set(eos if isinstance(eos, list) else [eos]) - {None}
    for i, token in enumerate(row):
        if token in ends:
            return row[:i]
    return row


def try_rewards(spec: JobSpec, prompts: int = DEFAULT_PROMPTS, store: Any = None, seed: int = 0) -> dict[str, Any]:
    """Sample, score and summarise the first `prompts` training prompts (see the module docstring).

    `store`: where a `reward_model_run` or a judge reward's `run:N` is found (the CLI's or the worker's store)."""
    import torch
    from transformers import set_seed

    from jobs.config.trainers import reward_weights
    from jobs.data.loading import load_datasets
    from jobs.devices.facts import CPU
    from jobs.train.judges import reward_judges
    from jobs.train.trainers import reward_sources
    from jobs.train.training import compute_dtype, load_model, reward_model_of

    set_seed(seed)
    train, _ = load_datasets(spec)
    rows = [train[i] for i in range(min(prompts, len(train)))]
    device = CPU
    model, tokenizer = load_model(spec, device)
    model.eval()
    if torch.cuda.is_available():
        model.to("cuda")
    judges = reward_judges(store, lambda: next(model.parameters()).device, compute_dtype(spec, device))
    funcs, classes = reward_sources(spec, reward_model_of(spec, device, store), judges)
    chosen = [r["prompt"] for r in rows]
    completions, ids, truncated = sample(model, tokenizer, spec, chosen)
    g = spec.num_generations
    repeated = [p for p in chosen for _ in range(g)]
    columns = {k: [r[k] for r in rows for _ in range(g)] for k in rows[0] if k not in ("prompt", "completion")}
    columns["trainer_state"] = None  # type: ignore[assignment]  # trl passes its TrainerState; none before training
    scores = score(funcs, classes, repeated, completions, ids, columns)
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    shown = [p[-1]["content"] if isinstance(p, list) else p for p in chosen]
    return summarise(shown, texts, scores, reward_weights(spec), g, spec.scale_rewards.value, truncated)


def trial_table(result: dict[str, Any]) -> str:
    """The trial as text: each prompt, its completions with their scores and advantages, the group's mean and
    spread, and the share of prompts that can teach."""
    names = result["rewards"]
    lines = []
    for n, group in enumerate(result["groups"], 1):
        flag = "" if group["teaches"] else "   <- no learning signal (every completion scores the same)"
        lines.append(f"prompt {n}: {_short(group['prompt'], 100)}")
        lines.append(f"  mean {_num(group['mean'])}  spread {_num(group['spread'])}{flag}")
        lines.append("  " + " | ".join([*(f"{x[:18]:>18}" for x in names), "    reward", " advantage", "completion"]))
        for c in group["completions"]:
            cells = [f"{_num(c['scores'][x]):>18}" for x in names]
            cut = " [cut]" if c.get("truncated") else ""
            text = _short(c["text"], 60) + cut
            lines.append("  " + " | ".join([*cells, f"{_num(c['reward']):>10}", f"{c['advantage']:>10.3f}", text]))
        lines.append("")
    share = result["share_teaching"]
    lines.append(
        f"{result['teaching']} of {len(result['groups'])} prompts can teach ({share:.0%}); "
        f"num_generations {result['num_generations']}, scale_rewards {result['scale_rewards']}"
    )
    if not result["teaching"]:
        lines.append(
            "no group has any spread: GRPO would learn nothing from these prompts. Raise temperature or "
            "num_generations, or use a reward that tells these completions apart (partial credit)."
        )
    return "\n".join(lines)


def _num(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


def _short(text: str, n: int) -> str:
    flat = " ".join(str(text).split())
    return flat if len(flat) <= n else flat[: n - 1] + "…"
