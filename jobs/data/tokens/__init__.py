"""The training rows' token lengths: measured with the model's tokenizer, cached, and read as figures.

Three modules, lowest first (each imports only the ones above it):

- `shortcuts`: faster ways to the tokenizer's own counts (`Shortcuts.of`: `PieceCounter` sums the
  counts of a text's space-separated pieces, `template_renderer` calls the compiled chat template),
  each used only where it gives the library's answer. Only `measurement` uses them.
- `lengths`: plain values the memory predictor and the checks read, no tokenizer involved:
  `RowLengths` (per row, the untruncated length of each sequence its trainer builds, and of its
  prompt) with `.stats(max_length)`, `.worst_batch(spec)` and `.answers_cut(max_length)`;
  `worst_case_batch(spec)`, the bound without data; `TokenBatch`, `LengthStats`, `AnswersCut`.
- `measurement`: rows -> `RowLengths` (`measure(rows, tokenizer, trainer)`, with `sequences` and
  `prompt_sequence`, what the trainer tokenizes of one row), the on-disk cache
  (`cached_lengths`/`save_lengths`, keyed by `cache_key`), and `length_warnings`, the cheap
  "rows over max_length" warning before training.

Beside them, what the tokens teach (not lengths): `view` builds each row's tokens with trl's own dataset
preparation and collator, each marked trained or masked (`token_views(spec, rows, tokenizer)`; the marks'
types in `marks`, sft's image rows in `image_view`, by trl's vision collator and the model's processor, orpo's,
cpo's and the reward trainer's pairs in `pair_views`), and
`viewed_rows` picks the training rows to show, named by their files' row numbers (`training_views`).
Callers: `app.cli.data_show` (`tunedeck data show`) and `jobs.checks.masks` (the stop-token and
all-masked findings).

Callers: `jobs.checks.memory.measured_lengths` (cache, else measure and save) feeds the memory
prediction (`jobs.memory.predict`, `jobs.memory.planner`) and the answers check
(`jobs.checks.answers`); `jobs.checks.datasets.length_warnings_for` gives the form's preview its
`length_warnings`; `jobs.cluster.gpu_types` reads the cache.

    from jobs.data.tokens.measurement import cached_lengths, measure, save_lengths
    from jobs.data.tokens.lengths import RowLengths, worst_case_batch
"""
