"""MoRA vs LoRA on the MoRA paper's memorisation task: random UUID pairs, a tiny model, the CPU.

The paper (Jiang et al. 2024, section 3) asks a model to memorise pairs of random UUIDs (key ->
value, loss on the value only): new knowledge that a low-rank update struggles to store. Here a
tiny Llama (random, frozen weights) gets adapters on q/k/v/o with the same trainable parameter
count for both methods (256 x 256 layers, r = 8: LoRA 8 x 512 = 4,096 per layer, MoRA a 64 x 64
matrix), the same data, optimizer, learning rate and steps. Both runs start from the same seed.
The adapters come from tunedeck's own mapping (`jobs.config.mapping.peft_config`).

    python bench/mora.py                        # ~2-4 min on 2 CPU cores
    python bench/mora.py --pairs 128 --steps 400 --lr 2e-3

Prints each method's loss at a few checkpoints and at the end, side by side, and the ratio
MoRA / LoRA of the final loss (below 1: MoRA memorised more, the paper's finding).
"""

from __future__ import annotations

import argparse
import random
import time
from typing import Any

import torch

HEX = "0123456789abcdef"
VOCAB = ["<pad>", "<bos>", ":", *HEX]
TARGETS = "q_proj,k_proj,v_proj,o_proj"


def uuid_pairs(n: int, length: int, seed: int) -> list[tuple[str, str]]:
    """n random (key, value) hex strings of `length` characters: nothing a model could already know."""
    rng = random.Random(seed)
    return [
        ("".join(rng.choice(HEX) for _ in range(length)), "".join(rng.choice(HEX) for _ in range(length)))
        for _ in range(n)
    ]


def encode(pairs: list[tuple[str, str]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids `<bos> key : value` and labels that score the value only."""
    index = {t: i for i, t in enumerate(VOCAB)}
    ids, labels = [], []
    for key, value in pairs:
        row = [index["<bos>"], *(index[c] for c in key), index[":"], *(index[c] for c in value)]
        ids.append(row)
        labels.append([-100] * (len(key) + 2) + row[len(key) + 2 :])
    return torch.tensor(ids), torch.tensor(labels)


def base_model(hidden: int, layers: int, seed: int) -> Any:
    from transformers import AutoModelForCausalLM, LlamaConfig

    torch.manual_seed(seed)
    config = LlamaConfig(
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        vocab_size=len(VOCAB),
        max_position_embeddings=128,
        tie_word_embeddings=False,
    )
    return AutoModelForCausalLM.from_config(config)


def train(method: str, args: argparse.Namespace, ids: torch.Tensor, labels: torch.Tensor) -> dict[str, Any]:
    """Train one adapter on the pairs; return its loss curve and parameter count."""
    from peft import get_peft_model

    from jobs.config.mapping import peft_config
    from jobs.spec.job import JobSpec

    extra = {"mora_type": method.split("-")[1]} if method.startswith("mora") else {}
    spec = JobSpec.from_dict(
        {
            "method": method.split("-")[0],
            "lora_r": args.r,
            "lora_alpha": 2 * args.r,
            "lora_dropout": 0.0,
            "lora_target_modules": TARGETS,
            **extra,
        }
    )
    model = get_peft_model(base_model(args.hidden, args.layers, args.seed), peft_config(spec))
    trainable = model.get_nb_trainable_parameters()[0]
    torch.manual_seed(args.seed)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.lr, weight_decay=0.0)
    curve, start = [], time.perf_counter()
    model.train()
    for _step in range(args.steps):
        order = torch.randperm(len(ids))
        total = 0.0
        for batch in order.split(args.batch):
            loss = model(input_ids=ids[batch], labels=labels[batch]).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            total += loss.item() * len(batch)
        curve.append(total / len(ids))
    model.eval()
    with torch.no_grad():  # exact-match memorisation: every value token predicted right (teacher forcing)
        logits = model(input_ids=ids).logits[:, :-1]
        target, mask = labels[:, 1:], labels[:, 1:] != -100
        right = ((logits.argmax(-1) == target) | ~mask).all(dim=1).float().mean().item()
    return {"trainable": trainable, "curve": curve, "exact": right, "seconds": time.perf_counter() - start}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=64, help="key/value pairs to memorise")
    parser.add_argument("--length", type=int, default=8, help="hex characters per key and per value")
    parser.add_argument("--hidden", type=int, default=256, help="model width (256: equal budgets at r=8)")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--r", type=int, default=8, help="LoRA rank; MoRA gets the same parameter budget")
    parser.add_argument("--steps", type=int, default=200, help="epochs over the pairs")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--methods", default="lora,mora-rope,mora-sharing")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)  # one thread: a busy shared machine makes more threads spin, not work
    ids, labels = encode(uuid_pairs(args.pairs, args.length, args.seed))
    methods = args.methods.split(",")
    results = {m: train(m, args, ids, labels) for m in methods}
    marks = sorted({0, args.steps // 4, args.steps // 2, 3 * args.steps // 4, args.steps - 1})
    print(
        f"memorise {args.pairs} random pairs ({args.length} hex chars each), tiny Llama h{args.hidden} x "
        f"{args.layers} layers (frozen, random), adapters on {TARGETS}, r={args.r}, lr {args.lr:g}, "
        f"batch {args.batch}, {args.steps} epochs"
    )
    print(f"{'':>22}" + "".join(f"{m:>15}" for m in methods))
    print(f"{'trainable parameters':>22}" + "".join(f"{results[m]['trainable']:>15,}" for m in methods))
    for step in marks:
        print(
            f"{'loss after epoch ' + str(step + 1):>22}"
            + "".join(f"{results[m]['curve'][step]:>15.4f}" for m in methods)
        )
    print(f"{'exact-match pairs':>22}" + "".join(f"{results[m]['exact']:>15.1%}" for m in methods))
    print(f"{'seconds':>22}" + "".join(f"{results[m]['seconds']:>15.1f}" for m in methods))
    if "lora" in results:
        lora_end = results["lora"]["curve"][-1]
        for m in methods:
            if m != "lora":
                print(f"final loss {m} / lora: {results[m]['curve'][-1] / lora_end:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
