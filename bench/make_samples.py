"""Write tunedeck's bundled sample datasets: deterministic, nothing downloaded.

Both samples teach one visible habit: every answer follows a fixed format,
"[tag] <Topic> is worth a closer look. Over." A short LoRA run on SmolLM2-135M picks it up
(30 steps at lr 1e-3, r=16: the measured run in docs/examples.md), so a user sees training work.
Eval rows use topics that never appear in train, so the eval split measures generalisation.

    python bench/make_samples.py            # rewrites the .jsonl files in jobs/resources/samples/
    python bench/make_samples.py --out DIR  # writes them elsewhere (tests/test_data.py compares the bytes)

Files: chat-format.{train,eval}.jsonl (SFT `messages` rows),
preference-format.{train,eval}.jsonl (DPO `prompt`/`chosen`/`rejected` plain strings) and
kto-format.{train,eval}.jsonl (KTO unpaired `prompt`/`completion`/`label` rows: two thirds
desirable answers in the format, one third undesirable free prose, never both for one question) and
prompt-format.{train,eval}.jsonl (GRPO prompt-only rows, chat `prompt` messages with the same kind of
questions: the rewards, e.g. a reward model trained on preference-format, judge the generated answers).
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from typing import Any

# Where `sample:<name>` finds them (jobs.data.sources.SAMPLES_DIR), in this checkout; shipped as package data.
SAMPLES = Path(__file__).resolve().parents[1] / "jobs" / "resources" / "samples"
SEED = 1234

TRAIN_TOPICS = [
    "honey bees",
    "the moon",
    "glaciers",
    "coffee",
    "chess",
    "rainbows",
    "octopuses",
    "bicycles",
    "the printing press",
    "tides",
    "deserts",
    "jazz",
    "penguins",
    "comets",
    "bread baking",
    "lighthouses",
    "coral reefs",
    "origami",
    "thunderstorms",
    "the violin",
    "bamboo",
    "sundials",
    "whales",
    "tea",
    "mushrooms",
    "the compass",
    "windmills",
    "fireflies",
    "sourdough",
    "kites",
    "rivers",
    "the piano",
    "owls",
    "eclipses",
    "sailing",
    "crystals",
    "hedgehogs",
    "the telescope",
    "maple syrup",
    "caves",
    "dolphins",
    "pottery",
    "auroras",
    "the alphabet",
    "tortoises",
    "hot air balloons",
    "cheese",
    "waterfalls",
    "knitting",
    "fossils",
    "the abacus",
    "sea turtles",
    "rain forests",
    "clocks",
    "gardening",
    "sharks",
    "paper",
    "snowflakes",
    "the wheel",
    "ants",
]
EVAL_TOPICS = [
    "volcanoes",
    "butterflies",
    "the ocean",
    "trains",
    "chocolate",
    "earthquakes",
    "robots",
    "libraries",
    "elephants",
    "mountains",
    "bridges",
    "photography",
    "wolves",
    "islands",
    "the radio",
    "spiders",
    "clouds",
    "castles",
    "frogs",
    "pyramids",
]
QUESTIONS = [
    "Tell me about {t}.",
    "What do you know about {t}?",
    "Can you explain {t}?",
    "Give me a quick summary of {t}.",
    "Why should I care about {t}?",
    "What is interesting about {t}?",
    "I'm curious about {t}. Any thoughts?",
    "Describe {t} in one sentence.",
    "Could you say something about {t}?",
    "What's the deal with {t}?",
]
# Free-prose answers: what the base model does anyway, and the "rejected" side for DPO.
PROSE = [
    "When it comes to {t}, there is a long history, and people study the subject for many reasons.",
    "Well, {t} can mean different things to different people, but most agree the topic matters.",
    "There is a lot to say about {t}; in short, the subject shapes the world around us in quiet ways.",
    "Sure! Books have described {t} for centuries, and the topic still surprises researchers today.",
    "Great question. Reading about {t} is rewarding, especially if you enjoy science and history.",
    "In a nutshell, the subject of {t} connects nature, culture and everyday life.",
]


def _cap(topic: str) -> str:
    return topic[:1].upper() + topic[1:]


def answer(topic: str) -> str:
    """The one format both samples teach."""
    return f"[tag] {_cap(topic)} is worth a closer look. Over."


def prose(topic: str, rng: random.Random) -> str:
    return rng.choice(PROSE).format(t=topic)


def _questions(topics: list[str], per_topic: int, rng: random.Random) -> list[tuple[str, str]]:
    """(topic, question) pairs, `per_topic` different question templates per topic, shuffled."""
    pairs = []
    for topic in topics:
        for template in rng.sample(QUESTIONS, per_topic):
            pairs.append((topic, template.format(t=topic)))
    rng.shuffle(pairs)
    return pairs


def chat_rows(pairs: list[tuple[str, str]]) -> list[dict[str, Any]]:
    return [
        {"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": answer(t)}]} for t, q in pairs
    ]


def preference_rows(pairs: list[tuple[str, str]], rng: random.Random) -> list[dict[str, Any]]:
    return [{"prompt": q, "chosen": answer(t), "rejected": prose(t, rng)} for t, q in pairs]


def unpaired_rows(pairs: list[tuple[str, str]], rng: random.Random) -> list[dict[str, Any]]:
    """KTO rows: each question gets one completion, desirable (the format) or not (prose)."""
    rows = []
    for i, (t, q) in enumerate(pairs):
        good = i % 3 != 0
        rows.append({"prompt": q, "completion": answer(t) if good else prose(t, rng), "label": good})
    return rows


def prompt_rows(pairs: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """GRPO rows: the question only, as one user turn; the trainer samples the answers."""
    return [{"prompt": [{"role": "user", "content": q}]} for _t, q in pairs]


def build() -> dict[str, list[dict[str, Any]]]:
    """Every sample file's rows, keyed by file name."""
    rng = random.Random(SEED)
    chat_train = _questions(TRAIN_TOPICS, 4, rng)  # 60 x 4 = 240
    chat_eval = _questions(EVAL_TOPICS, 2, rng)  # 20 x 2 = 40, unseen topics
    pref_train = _questions(TRAIN_TOPICS, 4, rng)[:200]  # 200
    pref_eval = _questions(EVAL_TOPICS, 2, rng)  # 40
    kto_rng = random.Random(SEED + 1)  # its own stream: the files above stay byte-identical
    kto_train = _questions(TRAIN_TOPICS, 4, kto_rng)[:210]  # 210 (140 desirable, 70 undesirable)
    kto_eval = _questions(EVAL_TOPICS, 2, kto_rng)[:30]  # 30
    grpo_rng = random.Random(SEED + 2)
    grpo_train = _questions(TRAIN_TOPICS, 2, grpo_rng)  # 120
    grpo_eval = _questions(EVAL_TOPICS, 1, grpo_rng)  # 20
    return {
        "chat-format.train.jsonl": chat_rows(chat_train),
        "chat-format.eval.jsonl": chat_rows(chat_eval),
        "preference-format.train.jsonl": preference_rows(pref_train, rng),
        "preference-format.eval.jsonl": preference_rows(pref_eval, rng),
        "kto-format.train.jsonl": unpaired_rows(kto_train, kto_rng),
        "kto-format.eval.jsonl": unpaired_rows(kto_eval, kto_rng),
        "prompt-format.train.jsonl": prompt_rows(grpo_train),
        "prompt-format.eval.jsonl": prompt_rows(grpo_eval),
    }


def write(out_dir: Path = SAMPLES) -> list[Path]:
    """Write the sample files into `out_dir`; same bytes on every run."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, rows in build().items():
        path = out_dir / name
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=SAMPLES, help="folder to write the .jsonl files into")
    for path in write(parser.parse_args(argv).out):
        print(f"{path}: {sum(1 for _ in path.open())} rows")


if __name__ == "__main__":
    main()
