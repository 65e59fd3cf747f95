"""A tiny offline Llama model for tests and demos, plus the atomic folder builder it uses.

`build_tiny_model(dest)` writes a normal Hugging Face model folder (safetensors weights,
`tokenizer.json`, a ChatML-like chat template with `{% generation %}` markers so trl's
`assistant_only_loss` works) in a few seconds, with no network:

    python -c "from pathlib import Path; from jobs.models.tiny import build_tiny_model; \
print(build_tiny_model(Path('data/models/tiny-llama')))"

The weights are random (seeded) and the byte-level BPE tokenizer is trained on a small built-in
English corpus, so the model is useless for text but exercises every code path of training.
`build_folder_atomically` (build in a temp folder under a file lock, then rename) is shared
with `jobs.models.embedded` for the SmolLM2 conversion.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

SEED = 1234
BUILDER_VERSION = "tiny-1"  # bump when the built folder changes: older builds are then rebuilt
VOCAB_SIZE = 512
BOS_TOKEN = "<|im_start|>"
EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|pad|>"
SPECIAL_TOKENS = [PAD_TOKEN, BOS_TOKEN, EOS_TOKEN]

# Written into every folder we build (holding the builder version), just before the atomic rename.
COMPLETE_MARKER = ".tunedeck-complete"

# ChatML-like template. The `generation` block marks assistant tokens for trl's
# assistant_only_loss (it returns an assistant mask from apply_chat_template).
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['role'] == 'assistant' %}"
    "{% generation %}{{- message['content'] + '<|im_end|>' }}{% endgeneration %}"
    "{{- '\\n' }}"
    "{%- else %}"
    "{{- message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

_CORPUS = """\
You are a helpful assistant. Answer briefly and clearly.
What is the capital of France? The capital of France is Paris.
Tell me about volcanoes. A volcano is an opening in the crust where hot rock comes out.
How do I make a cup of tea? Boil water, pour it over the tea leaves and wait three minutes.
Translate hello into Spanish. Hello in Spanish is hola.
What is two plus two? Two plus two is four.
Summarise the text in one sentence. The text says the weather will be sunny tomorrow.
Write a short poem about the sea. The sea is blue, the waves are slow, the wind is cold.
Why is the sky blue? Sunlight is scattered by the air, and blue light is scattered the most.
Give me three tips for better sleep. Go to bed at the same time, avoid screens, keep it dark.
Which answer is better? The first answer is correct and polite; the second one is rude.
Please explain what a neural network is. It is a function with many weights learned from data.
The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with a step.
Thank you! You are welcome. Is there anything else I can help you with today?
[tag] This is worth a closer look. Over.
system user assistant question answer reply chosen rejected prompt messages content role
Monday Tuesday Wednesday Thursday Friday Saturday Sunday one two three four five six seven
the of and to in is was it for on with as his they be at one have this from or had by
0 1 2 3 4 5 6 7 8 9 10 100 1000 , . ! ? : ; ' " ( ) [ ] - + = / * # @ & % $
"""


def corpus() -> list[str]:
    """The built-in training text for the tiny tokenizer, one line per item."""
    return [line for line in _CORPUS.splitlines() if line.strip()]


def is_complete_model(path: Path) -> bool:
    """True when `path` holds a finished model folder (config, safetensors weights, tokenizer)."""
    return (
        (path / "config.json").is_file()
        and (any(path.glob("*.safetensors")) or (path / "model.safetensors.index.json").is_file())
        and (path / "tokenizer_config.json").is_file()
    )


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive advisory lock on `path` (created if missing) for the block."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _make_readable(folder: Path) -> None:
    """Give a built folder normal permissions (mkdtemp and some writers use 0700/0600)."""
    folder.chmod(0o755)
    for path in folder.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)


def built_version(path: Path) -> str | None:
    """The builder version recorded in a folder we built, or None when we did not build it."""
    marker = path / COMPLETE_MARKER
    return marker.read_text().strip() if marker.is_file() else None


def build_folder_atomically(dest: Path, build: Callable[[Path], None], version: str = "1") -> Path:
    """Run `build(tmp)` in a temp folder next to `dest` under a lock, then rename it to `dest`.

    A folder we built with another `version` is replaced; a folder we did not build is never touched.
    """
    dest = Path(dest).expanduser().resolve()
    if built_version(dest) == version and is_complete_model(dest):
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(dest.parent / f".{dest.name}.lock"):
        if built_version(dest) == version and is_complete_model(dest):  # built while we waited
            return dest
        if dest.exists():
            if built_version(dest) is not None:  # ours, from an older builder: move aside, delete
                stale = Path(tempfile.mkdtemp(prefix=f".{dest.name}.stale-", dir=dest.parent))
                os.rename(dest, stale / "old")
                shutil.rmtree(stale, ignore_errors=True)
            elif dest.is_dir() and not any(dest.iterdir()):
                dest.rmdir()
            else:
                raise FileExistsError(f"{dest} exists and is not a model folder built by tunedeck")
        tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
        try:
            build(tmp)
            (tmp / COMPLETE_MARKER).write_text(f"{version}\n")
            _make_readable(tmp)
            os.rename(tmp, dest)
        except BaseException:  # any failure, Ctrl-C included: drop the half-built folder, then re-raise it
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return dest


def train_tokenizer(vocab_size: int = VOCAB_SIZE):  # -> PreTrainedTokenizerFast
    """Train a byte-level BPE tokenizer on the built-in corpus and wrap it for transformers."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        model_max_length=1024,
        padding_side="right",
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def tiny_llama_config(tokenizer: Any) -> Any:
    """The tiny Llama's shape (64 wide, 2 layers) over `tokenizer`'s vocabulary and special tokens; the
    vision-language test models use it as their language model."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def write_seeded_model(
    out: Path, model_class: Any, config: Any, tokenizer: Any, builder: str, saver: Any = None
) -> None:
    """Build `model_class(config)` with the fixed seed and write it into `out` with `saver` (the tokenizer or
    a processor: what loads beside the model) and the `tunedeck.json` naming its builder module."""
    import torch
    from transformers import GenerationConfig

    # fork_rng keeps the caller's global RNG untouched while the seed makes weights reproducible.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        model = model_class(config)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model.save_pretrained(out, safe_serialization=True)
    (saver or tokenizer).save_pretrained(out)
    (out / "tunedeck.json").write_text(json.dumps({"builder": builder, "seed": SEED}) + "\n")


def _write_tiny_model(out: Path) -> None:
    """Write the tiny model and tokenizer into `out`."""
    from transformers import LlamaForCausalLM

    tokenizer = train_tokenizer()
    write_seeded_model(out, LlamaForCausalLM, tiny_llama_config(tokenizer), tokenizer, "jobs.models.tiny")


def build_tiny_model(dest: Path) -> Path:
    """Build the tiny Llama model folder at `dest` (returns at once if it is already there)."""
    return build_folder_atomically(Path(dest), _write_tiny_model, version=BUILDER_VERSION)
