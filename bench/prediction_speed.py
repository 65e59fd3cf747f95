"""What the memory prediction costs, against issues 21's and 31's targets, side by side with a baseline commit.

    .venv/bin/python bench/prediction_speed.py                      # this tree and 7357390 (meta-device path)
    .venv/bin/python bench/prediction_speed.py --rows 2000 --only form,plan    # issue 31's figures, ~3 min
    .venv/bin/python bench/prediction_speed.py --baseline c0acf70 --rows 20000 --only lengths

Three figures, each measured by the same child code in both trees (`--child`, with the tree's own
PYTHONPATH and a TUNEDECK_HOME of its own); the two trees run the lengths phase at the same time on
this machine, so both see the same load, and the form and plan phases one tree after the other
(`--together` chooses):

1. lengths: `jobs.checks.memory.measured_lengths(spec)` on two generated JSONL files of `--rows` rows
   (chat `messages` rows and plain `text` rows of 50-500 SmolLM2 tokens, words drawn from a
   20k-word Zipf vocabulary with punctuation, capitals and numbers), the first time (the tokenizer
   loaded from its files, in a process that has already imported what loading a tokenizer and
   datasets need, like the dashboard) and on a cache hit (median of 5). Then its pieces, each the
   tree's own way: loading the rows (`load_data(spec).train.to_list()`), rendering the chat
   template, tokenizing in batches of 2048, and the cache key's hashing as a new process does it.
   The sum of all lengths is compared between the trees: both must measure the same.
2. form: `app.ui.memory.memory_views` on a warm process (a first call, not timed, warms imports,
   architecture and lengths) for the form's default spec and after one field change (max_length,
   per_device_train_batch_size, method qlora, method full: each state's first call), on the form's
   own device (this machine, no worker published) and on a 2 GiB GPU (where changes do not fit and
   the planner's grid runs), with the bundled sample and with the generated chat file.
3. plan: `python -m app.cli.main plan SPEC.yaml` wall time, for a folder holding only a
   Llama-2-7B-shaped config.json and `dataset: sample:chat-format`: in a fresh home (no database,
   no caches: a config never seen), again (median of 3), and with a database in the home (median
   of 3); then Qwen2.5-7B, Mistral-7B and Gemma-2-2B config.json folders, each in a fresh home of
   its own. Both trees' bytecode is compiled first (as an installed package has it). Both trees'
   tables are compared, family by family: a faster path must print the same prediction.

Needs the built-in SmolLM2 converted (`tunedeck setup`, or TUNEDECK_MODELS_DIR pointing at a cache
that has it). The baseline is checked out into a temporary git worktree.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# Every architecture built on the meta device, transformers asked for its model types (issue 31's "current path").
BASELINE, BASELINE_IS = "7357390", "every config built on the meta device"
PHASES = ("lengths", "form", "plan")
LLAMA2_7B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "vocab_size": 32000,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-05,
    "tie_word_embeddings": False,
    "torch_dtype": "float16",
}
# The published shapes of three more common families, each planned once in a home of its own: never seen.
NEVER_SEEN = {
    "Qwen2.5-7B": {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "vocab_size": 152064,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    },
    "Mistral-7B": {
        "architectures": ["MistralForCausalLM"],
        "model_type": "mistral",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 32768,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    },
    "Gemma-2-2B": {
        "architectures": ["Gemma2ForCausalLM"],
        "model_type": "gemma2",
        "hidden_size": 2304,
        "intermediate_size": 9216,
        "num_hidden_layers": 26,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "vocab_size": 256000,
        "torch_dtype": "float32",
    },
}
FORM_CHANGES = (
    ("max_length 2048", {"max_length": 2048}),
    ("batch 32", {"per_device_train_batch_size": 32}),
    ("method qlora", {"method": "qlora"}),
    ("method full", {"method": "full"}),
)
GIB = 1024**3


# ---------------------------------------------------------------------- the data
def make_data(work: Path, rows: int, seed: int = 0) -> dict[str, Path]:
    """Chat and text JSONL files of `rows` rows each (kept in `work`; made again only for another size)."""
    files = {"chat": work / f"chat-{rows}.jsonl", "text": work / f"text-{rows}.jsonl"}
    if all(p.is_file() for p in files.values()):
        return files
    rng = random.Random(seed)
    syllables = [c + v for c in "bcdfghklmnprstvwz" for v in ("a", "e", "i", "o", "u", "ai", "ou", "en", "ar")]
    vocab = sorted({"".join(rng.choices(syllables, k=rng.choice((1, 1, 2, 2, 3)))) for _ in range(30000)})[:20000]
    rng.shuffle(vocab)
    cum, total = [], 0.0
    for i in range(len(vocab)):
        total += 1 / (i + 1) ** 1.1
        cum.append(total)

    def sentence_words(n: int) -> str:
        words = rng.choices(vocab, cum_weights=cum, k=n)
        out = []
        for i, w in enumerate(words):
            r = rng.random()
            w = w.capitalize() if i == 0 or r < 0.03 else w
            w = w + "," if 0.03 <= r < 0.09 else str(rng.randint(1, 2030)) if 0.09 <= r < 0.1 else w
            out.append(w)
        return " ".join(out) + rng.choice(".....?!")

    def text(tokens: int) -> str:
        words = max(4, tokens // 3)  # ~3 SmolLM2 tokens per word of this vocabulary
        parts, left = [], words
        while left > 0:
            n = min(left, rng.randint(6, 20))
            parts.append(sentence_words(n))
            left -= n
        return (" " if rng.random() < 0.8 else "\n").join(parts)

    def length() -> int:
        return int(math.exp(rng.uniform(math.log(50), math.log(500))))

    with files["chat"].open("w") as f:
        for _ in range(rows):
            n = length()
            q = max(8, int(n * rng.uniform(0.1, 0.5)))
            f.write(
                json.dumps(
                    {"messages": [{"role": "user", "content": text(q)}, {"role": "assistant", "content": text(n - q)}]}
                )
                + "\n"
            )
    with files["text"].open("w") as f:
        for _ in range(rows):
            f.write(json.dumps({"text": text(length())}) + "\n")
    return files


# ---------------------------------------------------------------------- the child: one tree, one phase
def _timed(fn: Any, *args: Any) -> tuple[float, Any]:
    start = time.perf_counter()
    out = fn(*args)
    return time.perf_counter() - start, out


def child_lengths(work: Path, files: dict[str, str]) -> dict[str, Any]:
    from datasets import Dataset  # noqa: F401 - imported before timing, as the dashboard has them

    from jobs.checks.memory import measured_lengths
    from jobs.models.tokenizer import local_tokenizer
    from jobs.spec.job import JobSpec

    local_tokenizer(JobSpec().model)  # the modules a tokenizer load imports (transformers imports on first use)
    out: dict[str, Any] = {}
    for name, path in files.items():
        spec = JobSpec.from_dict({"dataset": path})
        out[f"{name}_first"], lengths = _timed(measured_lengths, spec)
        out[f"{name}_hit"] = statistics.median(_timed(measured_lengths, spec)[0] for _ in range(5))
        out[f"{name}_rows"] = lengths.rows if lengths is not None else 0
        out[f"{name}_sum"] = int(lengths.lengths.sum()) if lengths is not None else -1
        out.update({f"{name}_{k}": v for k, v in pieces(spec).items()})
    return out


def pieces(spec: Any) -> dict[str, float]:
    """Loading, rendering, tokenizing and the cache key's hashing, each the tree's own way."""
    from jobs.data.loading import load_data
    from jobs.models.tokenizer import local_tokenizer, tokenizer_folder

    try:
        from jobs.data.tokens import measurement as row_tokens
        from jobs.data.tokens import shortcuts as shortcut_module
    except ImportError:  # a baseline from before jobs.data.tokens: one module held both
        from jobs.data import row_tokens

        shortcut_module = row_tokens
    out: dict[str, float] = {}
    tok = local_tokenizer(spec.model)
    out["load"], rows = _timed(lambda: load_data(spec).train.to_list())
    seqs = [s for r in rows for s in row_tokens.sequences(r, spec.trainer)]
    shortcuts = getattr(shortcut_module, "Shortcuts", None)  # this tree's shortcuts, when it has them
    fast = shortcuts.of(tok) if shortcuts is not None else None
    render = fast.render if fast is not None and fast.render is not None else None
    eos = tok.eos_token or ""

    def rendered(seq: Any) -> str:
        if isinstance(seq, list):
            return render(seq) if render is not None else row_tokens._render(seq, tok)
        return seq if seq.endswith(eos) else seq + eos

    out["render"], texts = _timed(lambda: [rendered(s) for s in seqs])
    flag = not isinstance(seqs[0], list) or not tok.chat_template
    counter = fast.counter if fast is not None else None

    def count() -> int:
        total = 0
        for i in range(0, len(texts), 2048):
            batch = texts[i : i + 2048]
            if counter is not None:
                total += sum(counter.counts(batch, flag))
            else:
                ids = tok(batch, add_special_tokens=flag, return_attention_mask=False)["input_ids"]
                total += sum(len(x) for x in ids)
        return total

    out["tokenize"], _ = _timed(count)
    try:
        from jobs.data import digests

        digests._MEMO.clear()  # as a new process finds it: only the digest notes on disk
    except ImportError:  # the baseline hashes every file each time
        pass
    out["hash"], _ = _timed(row_tokens.cache_key, spec, tokenizer_folder(spec.model))
    return out


def child_form(work: Path, files: dict[str, str]) -> dict[str, Any]:
    from app.ui import form as ui_form
    from app.ui import memory as ui_memory
    from jobs.devices.facts import DeviceFacts
    from jobs.spec.job import JobSpec
    from storage.store import Store

    store = Store()
    gpu = DeviceFacts(kind="cuda", name="2 GiB GPU", total_bytes=2 * GIB, bf16=True, fp16=True)
    devices = {"this machine": ui_memory.worker_device(store), "2 GiB GPU": lambda: gpu}

    def views(spec: JobSpec, device: Any) -> float:
        values = dict(zip(ui_form.NAMES, ui_form.form_values(spec)))
        args = [values[n] for n in ui_form.NAMES]
        return _timed(lambda: ui_memory.memory_views(ui_form.spec_from_form, ui_form.NAMES, *args, device=device))[0]

    out: dict[str, Any] = {}
    for data_name, dataset in (("sample", "sample:chat-format"), ("chat", files["chat"])):
        for device_name, device in devices.items():
            base = JobSpec.from_dict({"dataset": dataset})
            views(base, device)  # warm: imports, the architecture, the tokenizer, the lengths
            key = f"{data_name}|{device_name}"
            out[f"{key}|default"] = views(base, device)
            for change, fields in FORM_CHANGES:
                out[f"{key}|{change}"] = views(JobSpec.from_dict({"dataset": dataset, **fields}), device)
    store.dispose()
    return out


def _plan_spec(work: Path, name: str, config: dict[str, Any]) -> Path:
    model = work / f"{name}-config"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps(config, indent=2))
    spec = work / f"plan-{name}.yaml"
    spec.write_text(f"model: {model}\ndataset: sample:chat-format\n")
    return spec


def _plan(root: Path, home: str, spec: Path) -> tuple[float, str]:
    """One `tunedeck plan` in a new process: its wall time and the table it printed."""
    env = {**os.environ, "TUNEDECK_HOME": home, "PYTHONPATH": str(root)}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # an installed package has its bytecode (compiled before timing)
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "app.cli.main", "plan", str(spec)], env=env, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise RuntimeError(f"plan failed in {root}:\n{done.stderr[-2000:]}")
    return time.perf_counter() - start, done.stdout


def child_plan(work: Path, root: Path) -> dict[str, Any]:
    import compileall

    for package in ("app", "jobs", "storage"):  # as installed: bytecode kept, so no plan compiles the sources
        compileall.compile_dir(str(root / package), quiet=2)
    spec = _plan_spec(work, "llama-2-7b", LLAMA2_7B)
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as home:
        out["cold"], table = _plan(root, home, spec)
        out["warm"] = statistics.median(_plan(root, home, spec)[0] for _ in range(3))
        env = {**os.environ, "TUNEDECK_HOME": home, "PYTHONPATH": str(root)}
        subprocess.run([sys.executable, "-m", "app.cli.main", "runs"], env=env, capture_output=True, check=True)
        out["with_db"] = statistics.median(_plan(root, home, spec)[0] for _ in range(3))
        out["table"] = table
    for name, config in NEVER_SEEN.items():  # each in a fresh home: no architecture, no model types kept
        with tempfile.TemporaryDirectory() as home:
            out[f"cold {name}"], out[f"table {name}"] = _plan(root, home, _plan_spec(work, name, config))
    return out


def child(phase: str, root: Path, work: Path, files: dict[str, str], out: Path) -> None:
    import jobs

    assert Path(jobs.__file__).resolve().is_relative_to(root), f"jobs imported from {jobs.__file__}, not {root}"
    logging_quiet()
    if phase == "lengths":
        result = child_lengths(work, files)
    elif phase == "form":
        result = child_form(work, files)
    else:
        result = child_plan(work, root)
    out.write_text(json.dumps(result))


def logging_quiet() -> None:
    import logging
    import warnings

    logging.basicConfig(level=logging.ERROR)
    warnings.filterwarnings("ignore")


# ---------------------------------------------------------------------- the parent: both trees, each phase at once
def run_phase(
    phase: str, trees: dict[str, Path], homes: dict[str, Path], work: Path, files: dict[str, Path], together: bool
) -> dict:
    """Each tree's child for `phase`: both at once (`together`), or one after the other."""
    if not together:
        results: dict[str, Any] = {}
        for name in trees:
            results.update(run_phase(phase, {name: trees[name]}, homes, work, files, True))
        return results
    procs = {}
    for name, root in trees.items():
        out = work / f"{phase}-{name.split()[0]}.json"
        env = {
            **os.environ,
            "PYTHONPATH": str(root),
            "TUNEDECK_HOME": str(homes[name]),
            "HF_HUB_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "true",
        }
        env.pop("TUNEDECK_DATABASE_URL", None)
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child", phase, "--root", str(root)]
        cmd += ["--work", str(work), "--out", str(out), "--files", json.dumps({k: str(v) for k, v in files.items()})]
        procs[name] = (subprocess.Popen(cmd, env=env, cwd=homes[name], stderr=subprocess.PIPE, text=True), out)
    results = {}
    for name, (proc, out) in procs.items():
        _, err = proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"{phase} failed for {name}:\n{err[-3000:]}")
        results[name] = json.loads(out.read_text())
    return results


def seconds(x: float) -> str:
    return f"{x * 1000:.0f} ms" if x < 1 else f"{x:.2f} s"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--baseline", default=BASELINE, help=f"the commit to measure side by side (default {BASELINE}: {BASELINE_IS})"
    )
    parser.add_argument("--rows", type=int, default=100_000, help="rows per generated data file (default 100000)")
    parser.add_argument("--only", default=",".join(PHASES), help="phases to run: lengths,form,plan")
    parser.add_argument(
        "--together",
        default="lengths",
        help="phases whose two trees run at the same time (default lengths: minutes each, so both see the same "
        "load); the others run one tree after the other, since a baseline's seconds-long torch import would "
        "otherwise land on this tree's millisecond figures",
    )
    parser.add_argument("--workdir", default=None, help="keep the generated data here (reused by a later run)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--child", choices=PHASES, help=argparse.SUPPRESS)
    parser.add_argument("--root", help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--files", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, Path(args.root).resolve(), Path(args.work), json.loads(args.files), Path(args.out))
        return 0
    phases = [p for p in args.only.split(",") if p]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.workdir).resolve() if args.workdir else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        files = make_data(work, args.rows)
        print(
            f"data: {args.rows:,} rows each, {', '.join(f'{k} {p.stat().st_size / 1e6:.0f} MB' for k, p in files.items())}"
            f" ({time.perf_counter() - started:.0f} s to make)",
            file=sys.stderr,
        )
        tree = Path(tmp) / "baseline"
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(tree), args.baseline], check=True
        )
        try:
            trees = {f"baseline {args.baseline}": tree, "this tree": ROOT}
            homes = {name: Path(tmp) / f"home-{i}" for i, name in enumerate(trees)}
            for home in homes.values():
                home.mkdir()
            load = os.getloadavg()
            results: dict[str, dict] = {}
            for phase in phases:
                print(f"{phase}: both trees {'at once' if phase in args.together else 'in turn'}...", file=sys.stderr)
                together = phase in args.together.split(",")
                results[phase] = run_phase(phase, trees, homes, work, files, together)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=False)
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    report(results, list(trees), args, load)
    return 0


def report(results: dict[str, dict], names: list[str], args: argparse.Namespace, load: tuple[float, ...]) -> None:
    base, now = names
    rows: list[tuple[str, str, float, float]] = []
    if "lengths" in results:
        r = results["lengths"]
        for kind in ("chat", "text"):
            label = f"{args.rows // 1000}k {kind} rows"
            rows.append((f"lengths, {label}: first time", "<= 10 s", r[base][f"{kind}_first"], r[now][f"{kind}_first"]))
            rows.append((f"lengths, {label}: cache hit", "<= 0.2 s", r[base][f"{kind}_hit"], r[now][f"{kind}_hit"]))
            for piece in ("load", "render", "tokenize", "hash"):
                if kind == "text" and piece == "render":
                    continue
                rows.append((f"  piece: {piece}", "", r[base][f"{kind}_{piece}"], r[now][f"{kind}_{piece}"]))
    if "form" in results:
        r = results["form"]
        groups = sorted({k.rsplit("|", 1)[0] for k in r[now]})
        for group in groups:
            data, device = group.split("|")
            label = f"form, {'bundled sample' if data == 'sample' else f'{args.rows // 1000}k chat rows'}, {device}"
            rows.append((f"{label}: default", "<= 0.3 s", r[base][f"{group}|default"], r[now][f"{group}|default"]))
            worst = {n: max(r[n][f"{group}|{c}"] for c, _ in FORM_CHANGES) for n in names}
            rows.append((f"{label}: slowest field change", "<= 0.3 s", worst[base], worst[now]))
    if "plan" in results:
        r = results["plan"]
        rows.append(("plan 7B config.json: fresh home", "<= 2 s", r[base]["cold"], r[now]["cold"]))
        rows.append(("plan 7B config.json: again", "<= 2 s", r[base]["warm"], r[now]["warm"]))
        rows.append(("plan 7B config.json: with a database", "<= 2 s", r[base]["with_db"], r[now]["with_db"]))
        for name in NEVER_SEEN:
            key = f"cold {name}"
            if key in r[base] and key in r[now]:
                rows.append((f"plan {name} config.json: fresh home", "<= 2 s", r[base][key], r[now][key]))
    width = max(len(r[0]) for r in rows) + 2
    print(f"{'':{width}}{'target':>10}{base:>22}{now:>14}{'baseline/now':>14}")
    for label, target, b, n in rows:
        print(f"{label:{width}}{target:>10}{seconds(b):>22}{seconds(n):>14}{b / n if n else float('inf'):>13.1f}x")
    notes = [
        f"machine: {os.cpu_count()} CPUs, load average {load[0]:.1f} at the start; trees ran at once for: "
        f"{args.together or 'no phase'}"
    ]
    if "lengths" in results:
        r = results["lengths"]
        same = all(r[base][f"{k}_sum"] == r[now][f"{k}_sum"] for k in ("chat", "text"))
        notes.append(f"lengths: both trees measured the same token counts: {'yes' if same else 'NO'}")
    if "form" in results:
        r = results["form"]
        for group in sorted({k.rsplit("|", 1)[0] for k in r[now]}):
            cells = "; ".join(
                f"{change} {seconds(r[base][f'{group}|{change}'])} -> {seconds(r[now][f'{group}|{change}'])}"
                for change, _ in FORM_CHANGES
            )
            notes.append(f"form, {group.replace('|', ', ')}: {cells}")
    if "plan" in results:
        r = results["plan"]
        tables = ["table"] + [f"table {name}" for name in NEVER_SEEN if f"table {name}" in r[base]]
        same = [k.removeprefix("table").strip() or "Llama-2-7B" for k in tables if r[base][k] == r[now].get(k)]
        differ = [k.removeprefix("table").strip() or "Llama-2-7B" for k in tables if r[base][k] != r[now].get(k)]
        notes.append(
            f"plan: both trees printed the same table for {', '.join(same) or 'none'}"
            + (f"; DIFFERENT for {', '.join(differ)}" if differ else "")
        )
    print("\n" + "\n".join(notes))


if __name__ == "__main__":
    raise SystemExit(main())
