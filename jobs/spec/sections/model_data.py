"""The spec's first section: the run's name, the model, and the training and evaluation data.

`run_name` opens the spec (and the form) although it belongs to the Run group, whose other
fields close it (`jobs.spec.sections.run`): the order of the fields is the order of the YAML,
the form and the README table.
"""

from __future__ import annotations

from dataclasses import dataclass

from jobs.spec.columns import parse_columns
from jobs.spec.enums import DEFAULT_MODEL, DEFAULT_SFT_DATASET, Thinking
from jobs.spec.field import Group, spec_field


@dataclass(frozen=True)
class ModelDataFields:
    """Which model learns from which rows, and is evaluated on which."""

    run_name: str | None = spec_field(
        None,
        Group.RUN,
        "A name to find the run by; defaults to model + method. Not one that reads as a run id (3, #3, run:3) or "
        "names a base model the dashboard serves (tiny-llama): the API reads those first, so they are refused.",
        label="Run name",
    )
    # --- Model
    model: str = spec_field(
        DEFAULT_MODEL,
        Group.MODEL,
        "Built-in model name (smollm2-135m-instruct), a Hugging Face hub id, or a local model folder.",
        label="Model",
    )
    trust_remote_code: bool = spec_field(
        False,
        Group.MODEL,
        "Run Python code shipped with the model. Only for models you trust; never turned on implicitly.",
        label="Trust the model's code",
        advanced=True,
    )
    # --- Data
    dataset: str = spec_field(
        DEFAULT_SFT_DATASET,
        Group.DATA,
        "A bundled sample (sample:chat-format, sample:preference-format, sample:kto-format, sample:prompt-format), a local .jsonl/.json/.csv/.parquet file (.jsonl.gz too; Alpaca and ShareGPT rows are converted), or a hub dataset name. Several data sets are mixed: `a.jsonl, b.json [max_rows=500]` (in YAML also a list), shuffled with the seed.",
        label="Training data",
    )
    eval_dataset: str | None = spec_field(
        None,
        Group.DATA,
        "Held-out data, same forms as dataset. Empty: the sample's own eval split, or none for user data.",
        label="Evaluation data",
    )
    max_train_samples: int | None = spec_field(
        None, Group.DATA, "Use only the first N training rows (empty: all).", ge=1, label="Row limit", advanced=True
    )
    dataset_columns: str | None = spec_field(
        None,
        Group.DATA,
        "Map your column names to the ones trl reads, as target=yours pairs: prompt=question, completion=answer (in YAML also a mapping). Alpaca and ShareGPT files need no mapping: they are detected and converted.",
        label="Column mapping",
        advanced=True,
    )
    eval_split: float | None = spec_field(
        None,
        Group.DATA,
        "Hold out rows of the training file for evaluation when there is no eval_dataset: a fraction (0.1 = 10%) or a row count (50). Eval loss (and perplexity for sft) is graphed.",
        gt=0.0,
        le=1e9,
        label="Held-out share",
        advanced=True,
    )
    dedupe: bool = spec_field(
        False,
        Group.DATA,
        "Drop duplicate training rows before training: exact copies and near-duplicates (MinHash, about 80% of "
        "their word pairs shared), keeping the first of each, and training rows that are also in the eval data. "
        "The log says how many were dropped; `tunedeck data audit SPEC` lists them first.",
        label="Drop duplicate rows",
        advanced=True,
    )

    thinking: Thinking | None = spec_field(
        None,
        Group.DATA,
        "What is trained of rows with reasoning (`<think>...</think>` in an answer, or a turn's `reasoning_content` "
        "/ `thinking` field, folded into its content as a `<think>` block): train (all of it), answer_only (the "
        "reasoning moves into the prompt and is masked; prompt/completion rows of text) or strip (removed). Chat "
        "templates that take `enable_thinking` (Qwen3 and its kind) get it, false for strip. Empty: the rows as "
        "they are; `tunedeck data audit` counts the rows that carry reasoning.",
        label="Reasoning (thinking)",
        advanced=True,
    )

    @property
    def column_map(self) -> dict[str, str]:
        """dataset_columns as {trl column: the data's column}; {} when unset or invalid."""
        return parse_columns(self.dataset_columns)[0] if self.dataset_columns else {}
