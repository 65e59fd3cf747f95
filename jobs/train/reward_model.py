"""A finished reward run's model loaded as a GRPO reward, in the training process.

The run's bundle holds the sequence-classification model (a full fine-tune) or the adapter with the
trained score head (peft, MoRA included). The adapter is loaded onto the same base and merged, so trl
scores completions with one plain model in inference mode. Whether the run can serve is checked at
submit by `jobs.models.reward_model.reward_run_problems`, and again here (`reward_problems`).

    model, tokenizer = load_reward_model(store, spec.reward_model_run, torch.bfloat16)
"""

from __future__ import annotations

from typing import Any

from jobs.config.mora import load_mora
from jobs.models.references import resolve_model
from jobs.models.reward_model import bundle_folder, reward_problems
from jobs.spec.enums import Method
from jobs.spec.job import SpecError
from jobs.spec.stored import spec_of
from storage.roles import RunArtifacts


def load_reward_model(store: RunArtifacts, run_id: int, dtype: Any = None) -> tuple[Any, Any]:
    """(sequence-classification model in eval mode, its tokenizer) of a finished reward run."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    run = store.get_run(run_id)
    problems = reward_problems(store, run_id)
    if problems:
        raise SpecError(problems)
    folder = bundle_folder(store, run_id)
    assert folder is not None and run is not None
    reward_spec = spec_of(run)
    kwargs: dict[str, Any] = {
        "num_labels": 1,
        "use_safetensors": True,
        "trust_remote_code": reward_spec.trust_remote_code,
    }
    if dtype is not None:
        kwargs["dtype"] = dtype
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    if reward_spec.method is Method.FULL:
        model = AutoModelForSequenceClassification.from_pretrained(str(folder), **kwargs)
    else:
        base_path = resolve_model(reward_spec.model, trust_remote_code=reward_spec.trust_remote_code).path
        base = AutoModelForSequenceClassification.from_pretrained(base_path, **kwargs)
        if reward_spec.method is Method.MORA:
            model = load_mora(base, str(folder))
        else:
            from peft import PeftModel

            model = PeftModel.from_pretrained(base, str(folder))
        if hasattr(model, "merge_and_unload"):
            try:
                model = model.merge_and_unload()  # one plain model: the score head and the merged weights
            except (ValueError, TypeError, NotImplementedError):
                pass  # prompt-learning adapters do not merge; the PeftModel scores as well
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.config.pad_token_id = tokenizer.pad_token_id
    model.eval()
    for param in model.parameters():
        param.requires_grad_(False)
    return model, tokenizer
