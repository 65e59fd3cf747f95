"""One record per trainer: every fact of a trl trainer that the rest of tunedeck branches on.

The code that once asked "is this grpo?" asks the record a question about the fact instead
(`record_for(spec.trainer).generates`), so adding a trainer is its record here, its tests and its docs
(docs/contributing.md). Importing this module is cheap: the trl classes are named by module and name and
imported only when asked for (`TrainerRecord.config_type()`, `.trainer_type()`).
`tests/test_trainer_records.py` checks each record against the real trl classes, and that no
`Trainer.<NAME>` is named outside the enum, these records and the few places listed there.

    record = record_for(spec.trainer)
    record.config_class, record.module       # "GRPOConfig", "trl"
    record.kwargs                            # the config keywords only this trainer reads (jobs.config.trainers)
    record.paired, record.generates          # what its memory adds (jobs.memory.predict, jobs.data.tokens)
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from jobs.spec.enums import DPO_LOSSES, GRPO_LOSSES, KTO_LOSSES, SFT_LOSSES, LossType, Method, RowFormat, Trainer

PREFERENCE_ROWS = "prompt/chosen/rejected rows"


@dataclass(frozen=True)
class Refusal:
    """A value of a spec field the trainer fails with; `problem` and `fix` may name `{value}` and `{trainer}`."""

    field: str
    values: frozenset[str]
    problem: str
    fix: str


@dataclass(frozen=True, kw_only=True)
class TrainerRecord:
    trainer: Trainer
    # trl's classes, imported lazily: trl.experimental may change in any release, so trl is pinned
    config_class: str
    trainer_class: str
    module: str = "trl"
    # the rows it takes (jobs.data.row_formats): formats, in words, and a bundled sample of them
    row_formats: tuple[RowFormat, ...]
    rows: str
    sample: str
    # its losses (loss_type) and trl's default one when the spec says auto ("auto": no loss_type of its own)
    losses: frozenset[LossType] = frozenset()
    default_loss: str = "auto"
    # the config keywords only it reads (their values: jobs.config.trainers.KWARG_VALUES), and the common
    # TrainingArguments-level keys its config lacks (they would raise TypeError, so they are dropped)
    kwargs: tuple[str, ...] = ()
    unsupported: tuple[str, ...] = ()
    # what it logs: the "Trainer metrics" plot's {legend label: logged name}; whether it logs eval_loss at
    # evaluation; the eval metric early stopping should watch and which way is better for it
    metrics: tuple[tuple[str, str], ...] = ()
    eval_loss: bool = True
    watch: str = "eval_loss"
    better: str = "lower"
    # what its memory adds: both answers of a pair in one batch; generated completions after whole prompts;
    # a one-output score head instead of vocabulary logits; a frozen reference copy in a full fine-tune
    # ("always", "beta": when beta > 0, "none": not counted)
    paired: bool = False
    generates: bool = False
    score_head: bool = False
    reference: str = "none"
    # how jobs.train.trainers builds it: ref_model=None (the base with the adapter off), its own callbacks
    ref_model_none: bool = False
    callbacks: tuple[str, ...] = ()
    # what it does with rows: drops those over max_length (else truncated); image chat; dpo's image pairs; a row's
    # `tools` reach the chat template; trl's fused LM head needs the model's backbone
    drops_long_rows: bool = False
    image_chat: bool = False
    image_pairs: bool = False
    renders_tools: bool = True
    needs_backbone: bool = False
    # the token view that shows its rows as trl builds them (jobs.data.tokens.view: sft, dpo, kto, grpo, orpo, cpo, reward)
    token_view: str = ""
    # what it refuses: a micro-batch under min_batch, and field values it fails with
    min_batch: int = 1
    refuses: tuple[Refusal, ...] = ()

    @property
    def task_type(self) -> str:
        """peft's task_type, which decides the head peft wraps (and trains: a reward model's score head)."""
        return "SEQ_CLS" if self.score_head else "CAUSAL_LM"

    def config_type(self) -> type:
        """trl's config class (imported now)."""
        found: type = getattr(importlib.import_module(self.module), self.config_class)
        return found

    def trainer_type(self) -> type:
        """trl's trainer class (imported now)."""
        found: type = getattr(importlib.import_module(self.module), self.trainer_class)
        return found


PROMPT_VIRTUAL = frozenset({Method.PROMPT_TUNING.value, Method.P_TUNING.value})
# trl.experimental ORPO/CPO build labels without the virtual tokens: ValueError "Expected input batch_size (340)
# to match target batch_size (324)" (tiny Llama, 4 virtual tokens, batch 4).
NO_VIRTUAL_TOKENS = Refusal(
    "method",
    PROMPT_VIRTUAL,
    "{value} fails with {trainer} (its labels leave out the virtual tokens: 'Expected input batch_size ... to "
    "match target batch_size')",
    "use lora, ia3 or prefix_tuning for trainer: {trainer}",
)

RECORDS: dict[Trainer, TrainerRecord] = {
    r.trainer: r
    for r in (
        # Packing concatenates short rows into max_length blocks: no compute or memory is spent on padding,
        # often ~2x tokens/s on short-row data; attention may span row boundaries. Loss masks cost nothing in
        # memory or time; they change what the model learns from.
        TrainerRecord(
            trainer=Trainer.SFT,
            token_view="sft",
            config_class="SFTConfig",
            trainer_class="SFTTrainer",
            row_formats=(RowFormat.TEXT, RowFormat.MESSAGES, RowFormat.PROMPT_COMPLETION),
            rows="text, messages or prompt/completion rows",
            sample="sample:chat-format",
            losses=frozenset(SFT_LOSSES),
            default_loss="nll",
            kwargs=("packing", "completion_only_loss", "assistant_only_loss", "loss_type"),
            metrics=(("eval perplexity", "eval_perplexity"),),
            callbacks=("perplexity",),  # first: the store callback then records what it added
            image_chat=True,
            needs_backbone=True,
        ),
        TrainerRecord(
            trainer=Trainer.DPO,
            token_view="dpo",
            config_class="DPOConfig",
            trainer_class="DPOTrainer",
            row_formats=(RowFormat.PREFERENCE,),
            rows=PREFERENCE_ROWS,
            sample="sample:preference-format",
            losses=frozenset(DPO_LOSSES),
            default_loss="sigmoid",
            kwargs=("beta", "loss_type"),
            metrics=(("reward margin", "rewards/margins"), ("reward accuracy", "rewards/accuracies")),
            paired=True,
            reference="always",
            ref_model_none=True,
            image_pairs=True,
        ),
        # KTO scores each completion on its own (desirable or not) against a KL baseline taken from the other
        # completions of the micro-batch: the reference pass doubles the forward cost, like DPO, but no pairs
        # are needed. Without an adapter (full fine-tuning) trl copies the model as the frozen reference.
        TrainerRecord(
            trainer=Trainer.KTO,
            token_view="kto",
            config_class="KTOConfig",
            trainer_class="KTOTrainer",
            row_formats=(RowFormat.UNPAIRED, RowFormat.PREFERENCE),  # trl unpairs chosen/rejected rows itself
            rows="prompt/completion/label rows (or prompt/chosen/rejected, which trl unpairs)",
            sample="sample:kto-format",
            losses=frozenset(KTO_LOSSES),
            default_loss="kto",
            kwargs=("beta", "loss_type", "desirable_weight", "undesirable_weight"),
            unsupported=("padding_free",),
            metrics=(("reward margin", "rewards/margins"), ("KL estimate", "kl")),
            ref_model_none=True,
            # trl: "Actual (not effective) batch size must be > 1. KTO will not work properly because the KL
            # term will be equivalent to the implied reward."
            min_batch=2,
        ),
        # A reward model is the base with a one-output classification head ("score"), trained so that chosen
        # answers score above rejected ones; one forward per answer, no reference model.
        TrainerRecord(
            trainer=Trainer.REWARD,
            token_view="reward",
            config_class="RewardConfig",
            trainer_class="RewardTrainer",
            row_formats=(RowFormat.PREFERENCE,),
            rows=PREFERENCE_ROWS,
            sample="sample:preference-format",
            unsupported=("padding_free",),
            metrics=(("accuracy", "accuracy"), ("margin", "margin"), ("mean reward", "mean_reward")),
            paired=True,
            score_head=True,
            drops_long_rows=True,
            refuses=(
                # Measured on the CPU (trl 1.16, peft 0.21.2, bitsandbytes 0.50.2): RuntimeError "expected m1
                # and m2 to have the same dtype, but got: float != c10::BFloat16" in the score head's first forward.
                Refusal(
                    "method",
                    frozenset({Method.QLORA.value, Method.LORA_8BIT.value}),
                    "{value} fails for a reward model (the quantized base and the new score head disagree on "
                    "dtype: 'expected m1 and m2 to have the same dtype')",
                    "use method: lora (or dora, full) for trainer: reward",
                ),
                # peft: "Model does not support past key values which are required for prefix tuning."
                Refusal(
                    "method",
                    frozenset({Method.PREFIX_TUNING.value}),
                    "prefix_tuning needs past key values, which the sequence-classification model of a reward "
                    "model does not return",
                    "use prompt_tuning or p_tuning, or lora, for trainer: reward",
                ),
            ),
        ),
        # ORPO adds an odds-ratio penalty (weight beta) to the SFT loss on the chosen answer: one model, no
        # reference pass, so it costs about what SFT on chosen+rejected costs.
        TrainerRecord(
            trainer=Trainer.ORPO,
            token_view="orpo",
            config_class="ORPOConfig",
            trainer_class="ORPOTrainer",
            module="trl.experimental.orpo",
            row_formats=(RowFormat.PREFERENCE,),
            rows=PREFERENCE_ROWS,
            sample="sample:preference-format",
            kwargs=("beta",),
            unsupported=("padding_free",),
            metrics=(("reward margin", "rewards/margins"), ("log odds ratio", "log_odds_ratio")),
            paired=True,
            renders_tools=False,  # its dataset preparation renders rows without `tools`
            refuses=(NO_VIRTUAL_TOKENS,),
        ),
        # CPO: a DPO-style loss without the reference model plus a behaviour-cloning term on the chosen answer.
        TrainerRecord(
            trainer=Trainer.CPO,
            token_view="cpo",
            config_class="CPOConfig",
            trainer_class="CPOTrainer",
            module="trl.experimental.cpo",
            row_formats=(RowFormat.PREFERENCE,),
            rows=PREFERENCE_ROWS,
            sample="sample:preference-format",
            losses=frozenset(DPO_LOSSES),
            default_loss="sigmoid",
            kwargs=("beta", "loss_type"),
            unsupported=("padding_free",),
            metrics=(("reward margin", "rewards/margins"), ("reward accuracy", "rewards/accuracies")),
            paired=True,
            renders_tools=False,  # its dataset preparation renders rows without `tools`
            refuses=(NO_VIRTUAL_TOKENS,),
        ),
        # GRPO samples num_generations completions per prompt and scores them; each completion's advantage is
        # its reward minus the group's mean. Generation runs before every optimizer step (no KV cache kept for
        # training); beta > 0 adds a reference pass (the base with the adapter off, or a second full model).
        # GRPOConfig has no max_length: prompts are kept whole, completions end at max_completion_length.
        TrainerRecord(
            trainer=Trainer.GRPO,
            token_view="grpo",
            config_class="GRPOConfig",
            trainer_class="GRPOTrainer",
            row_formats=(RowFormat.PROMPT_ONLY,),
            rows="prompt rows (a `prompt` string, or chat `prompt` messages ending with the user's turn)",
            sample="sample:prompt-format",
            losses=frozenset(GRPO_LOSSES),
            default_loss="dapo",
            kwargs=(
                "num_generations",
                "max_completion_length",
                "beta",
                "temperature",
                "reward_weights",
                "log_completions",
                "per_device_eval_batch_size",
                "loss_type",
                "importance_sampling_level",
                "scale_rewards",
                "epsilon_high",
                "mask_truncated_completions",
                "top_entropy_quantile",
                # generation through vLLM in the training process (jobs.config.vllm)
                "use_vllm",
                "vllm_mode",
                "vllm_gpu_memory_utilization",
                "vllm_max_model_length",
            ),
            unsupported=("padding_free", "max_length"),
            metrics=(
                ("reward", "reward"),
                ("reward std", "reward_std"),
                ("completion length", "completions/mean_length"),
                ("KL", "kl"),
                ("zero-spread groups", "frac_reward_zero_std"),
                ("truncated", "completions/clipped_ratio"),
                ("clip ratio", "clip_ratio/region_mean"),
                ("entropy", "entropy"),
            ),
            eval_loss=False,  # it evaluates the rewards of generated answers
            watch="eval_reward",
            better="higher",
            generates=True,
            reference="beta",
            callbacks=("grpo_log",),
            refuses=(
                # peft's EVA reads tokenized batches from the trainer's dataloader; GRPO's hold raw prompts
                # (tokenized only after generation): TypeError "When using `prepare_model_inputs_fn_language_
                # modeling` inputs must be a dictionary" (tiny Llama, trl 1.16, peft 0.21.2).
                Refusal(
                    "lora_init",
                    frozenset({"eva"}),
                    "eva fails with grpo (it initialises from tokenized training batches, and grpo's batches "
                    "are raw prompts: 'inputs must be a dictionary')",
                    "use lora_init: default, pissa or olora for trainer: grpo",
                ),
            ),
        ),
    )
}


def record_for(trainer: Trainer | str) -> TrainerRecord:
    """The record of a trainer (its enum member or its YAML word)."""
    return RECORDS[Trainer(trainer)]


def trainers_where(**facts: object) -> tuple[Trainer, ...]:
    """The trainers whose records hold every given fact, in the enum's order (`trainers_where(paired=True)`)."""
    return tuple(t for t, r in RECORDS.items() if all(getattr(r, k) == v for k, v in facts.items()))
