"""The README stays honest: its job-spec field table is generated from `jobs.spec.field_info.field_infos()`.

    .venv/bin/python -m pytest tests/test_docs.py -q     # check
    .venv/bin/python tests/test_docs.py --write          # regenerate the table in README.md

The table sits between `<!-- fields:start -->` and `<!-- fields:end -->`; every JobSpec field
appears there with its group, type, default and help text, written once next to the field.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
START, END = "<!-- fields:start -->", "<!-- fields:end -->"

if str(ROOT) not in sys.path:  # when run as a script
    sys.path.insert(0, str(ROOT))


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _num(x: float) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


def _type(info) -> str:
    if info.kind == "enum":
        text = "one of " + ", ".join(f"`{c}`" for c in info.choices)
    else:
        bounds = []
        if info.ge is not None:
            bounds.append(f">= {_num(info.ge)}")
        if info.gt is not None:
            bounds.append(f"> {_num(info.gt)}")
        if info.le is not None:
            bounds.append(f"<= {_num(info.le)}")
        text = info.kind + (f" ({', '.join(bounds)})" if bounds else "")
    return text + (", or empty" if info.optional else "")


def _default(value) -> str:
    if value is None:
        return "empty"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, float):
        return f"`{_num(value)}`"
    return f"`{value}`"


def fields_table() -> str:
    """The README's field table, generated from the spec's own metadata."""
    from jobs.spec.field_info import field_infos

    lines = ["| name | group | type | default | help |", "|---|---|---|---|---|"]
    for info in field_infos():
        help_text = info.help + (f" (method: {', '.join(info.methods)})" if info.methods else "")
        lines.append(
            f"| `{info.name}` | {info.group.value} | {_cell(_type(info))} | {_cell(_default(info.default))} | {_cell(help_text)} |"
        )
    return "\n".join(lines)


def _split(text: str) -> tuple[str, str, str]:
    head, sep, rest = text.partition(START)
    assert sep, f"README.md lacks the {START} marker"
    body, sep, tail = rest.partition(END)
    assert sep, f"README.md lacks the {END} marker"
    return head, body, tail


def write_readme() -> bool:
    """Rewrite the table between the markers; True when README.md changed."""
    text = README.read_text()
    head, _, tail = _split(text)
    new = f"{head}{START}\n{fields_table()}\n{END}{tail}"
    if new != text:
        README.write_text(new)
    return new != text


# ---------------------------------------------------------------------- tests
def test_readme_field_table_is_generated_from_the_spec():
    _, body, _ = _split(README.read_text())
    assert body.strip() == fields_table(), "README field table is stale: run `python tests/test_docs.py --write`"


def test_every_spec_field_is_in_the_readme():
    from jobs.spec.field_info import field_infos

    _, body, _ = _split(README.read_text())
    missing = [i.name for i in field_infos() if f"| `{i.name}` |" not in body]
    assert not missing, f"fields missing from README.md: {missing}"


def test_readme_leads_with_the_two_commands():
    head = README.read_text()[:1500]
    assert head.index("./dev.sh serve") < head.index("./dev.sh test")
    assert "http://127.0.0.1:7860" in head


def test_readme_names_every_cli_command_and_example():
    text = README.read_text()
    from app.cli.main import build_parser

    sub = next(a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction")
    assert {"serve", "worker", "submit", "run", "runs", "show", "cancel", "setup"} <= set(sub.choices)
    for command in sub.choices:  # every command the CLI has, so a new one cannot go undocumented
        assert re.search(rf"tunedeck {command}\b", text), f"README does not show `tunedeck {command}`"
    for example in sorted((ROOT / "examples").glob("*.yaml")):
        assert f"examples/{example.name}" in text, f"README does not mention examples/{example.name}"
    for var in ("TUNEDECK_HOME", "TUNEDECK_DATABASE_URL", "TUNEDECK_TORCH", "TUNEDECK_TORCH_INDEX", "TUNEDECK_VENV"):
        assert var in text, f"README does not document {var}"


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    assert ci.startswith("#!/usr/bin/env bash")
    assert "set -euo pipefail" in ci
    assert "./dev.sh test" in ci and "./dev.sh test" in README.read_text()


def test_shell_scripts_parse():
    for script in (ROOT / "dev.sh", ROOT / ".ci" / "run"):
        out = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert out.returncode == 0, f"{script.name}: {out.stderr}"
        assert script.stat().st_mode & 0o111, f"{script.name} is not executable"


def test_dev_sh_usage_names_its_commands():
    out = subprocess.run(["bash", str(ROOT / "dev.sh"), "help"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 2
    assert "./dev.sh serve" in out.stderr and "./dev.sh test" in out.stderr


# Paths that live outside this repository: a checkout must explain itself with its own files. The
# patterns are built from pieces so that this file does not match itself.
_OUTSIDE = re.compile(
    "|".join(
        [
            r"\.\./" + "shared",
            r"(?<![\w.-])/" + r"(?:work|farm|old_root)/",
            r"/home/" + r"[\w.-]+/",
            r"(?<![\w.-])/" + r"root/(?!\.cache/tunedeck)",
        ]
    )
)
_TEXT_SUFFIXES = {".py", ".md", ".yml", ".yaml", ".toml", ".sh", ".txt", ".cfg", ".ini", ".json", ""}


def _tracked_text_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:  # not a git checkout (an sdist): every file below the root
        names = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file() and ".venv" not in p.parts]
    else:
        names = [n for n in out.stdout.split("\0") if n]
    files = [ROOT / n for n in names]
    return [
        f
        for f in files
        if f.is_file()
        and (f.suffix in _TEXT_SUFFIXES or f.name in {"Dockerfile", "run"})
        and f.stat().st_size < 2_000_000
    ]


def test_nothing_points_outside_the_repository():
    """Code, docs and comments cite files in the repository, never a folder beside it or a machine's path."""
    hits = []
    for path in _tracked_text_files():
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if _OUTSIDE.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:120]}")
    assert not hits, "references to paths outside the repository:\n" + "\n".join(hits)


def test_outside_reference_check_catches_what_it_should():
    for line in (
        "see ../" + "shared/MEMORY.md",
        "in /" + "work/shared/ENV.md",
        "open /" + "home/alice/x",
        "/" + "root/notes",
    ):
        assert _OUTSIDE.search(line), line
    for line in ("/usr/bin/chromium", "~/.cache/tunedeck/test-models", "docs/memory.md", "shared memory"):
        assert not _OUTSIDE.search(line), line


def test_markdown_links_point_at_files_that_exist():
    missing = []
    for md in [f for f in _tracked_text_files() if f.suffix == ".md"]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", md.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (md.parent / target).exists():
                missing.append(f"{md.relative_to(ROOT)} -> {target}")
    assert not missing, "links to files that do not exist: " + ", ".join(missing)


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        print("README.md updated" if write_readme() else "README.md already up to date")
    else:
        print(fields_table())
