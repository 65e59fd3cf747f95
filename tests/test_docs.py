"""The README and docs/ stay honest: what they state is checked against the code.

    .venv/bin/python -m pytest tests/test_docs.py -q     # check
    .venv/bin/python tests/test_docs.py --write          # regenerate the field table in docs/spec.md

The job-spec field table in docs/spec.md is generated from `jobs.spec.field_info.field_infos()`; it sits
between `<!-- fields:start -->` and `<!-- fields:end -->`, and every JobSpec field appears there with
its group, type, default and help text, written once next to the field. The README is the front
door: at most 150 lines, leading with the two commands. Every CLI command, example and setting is
documented in the page that owns it, and every relative link in README.md and docs/*.md resolves.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
SPEC_DOC = DOCS / "spec.md"  # the field table
CLI_DOC = DOCS / "cli.md"  # every command
EXAMPLES_DOC = DOCS / "examples.md"  # every example spec
DEPLOYMENT_DOC = DOCS / "deployment.md"  # the settings
README_MAX_LINES = 150
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
    """docs/spec.md's field table, generated from the spec's own metadata."""
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
    assert sep, f"{SPEC_DOC.name} lacks the {START} marker"
    body, sep, tail = rest.partition(END)
    assert sep, f"{SPEC_DOC.name} lacks the {END} marker"
    return head, body, tail


def write_table() -> bool:
    """Rewrite the table between the markers; True when docs/spec.md changed."""
    text = SPEC_DOC.read_text()
    head, _, tail = _split(text)
    new = f"{head}{START}\n{fields_table()}\n{END}{tail}"
    if new != text:
        SPEC_DOC.write_text(new)
    return new != text


# ---------------------------------------------------------------------- tests
def test_field_table_is_generated_from_the_spec():
    _, body, _ = _split(SPEC_DOC.read_text())
    assert body.strip() == fields_table(), "docs/spec.md field table is stale: run `python tests/test_docs.py --write`"


def test_every_spec_field_is_in_the_spec_doc():
    from jobs.spec.field_info import field_infos

    _, body, _ = _split(SPEC_DOC.read_text())
    missing = [i.name for i in field_infos() if f"| `{i.name}` |" not in body]
    assert not missing, f"fields missing from docs/spec.md: {missing}"


def test_readme_leads_with_the_two_commands():
    head = README.read_text()[:1500]
    assert head.index("./dev.sh serve") < head.index("./dev.sh test")
    assert "http://127.0.0.1:7860" in head


def test_readme_is_a_front_door():
    lines = README.read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines; keep it <= {README_MAX_LINES}, move detail to docs/"
    )


def test_readme_links_every_doc_page():
    text = README.read_text()
    for page in sorted(DOCS.glob("*.md")):
        assert f"](docs/{page.name})" in text, f"README.md does not link docs/{page.name}"


def test_docs_name_every_cli_command_and_example():
    from app.cli.main import build_parser

    cli = CLI_DOC.read_text()
    sub = next(a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction")
    assert {"serve", "worker", "submit", "run", "runs", "show", "cancel", "setup"} <= set(sub.choices)
    for command in sub.choices:  # every command the CLI has, so a new one cannot go undocumented
        assert re.search(rf"^tunedeck {command}\b", cli, re.M), f"docs/cli.md does not show `tunedeck {command}`"
    examples = EXAMPLES_DOC.read_text()
    for example in sorted((ROOT / "examples").glob("*.yaml")):
        assert f"examples/{example.name}" in examples, f"docs/examples.md does not mention examples/{example.name}"
    deployment = DEPLOYMENT_DOC.read_text()
    for var in ("TUNEDECK_HOME", "TUNEDECK_DATABASE_URL", "TUNEDECK_TORCH", "TUNEDECK_TORCH_INDEX", "TUNEDECK_VENV"):
        assert var in deployment, f"docs/deployment.md does not document {var}"


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


# Links: every relative link in README.md, docs/*.md and the other tracked Markdown files names a file
# that exists and, when it names a heading (`page.md#heading`), a heading that exists there, so a
# section that moves cannot leave a dead link behind.
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^\s*(```|~~~)")
_CODE_SPAN = re.compile(r"`[^`]*`")


def _prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks (a `# comment` in a bash block is not a heading)."""
    lines, fenced = [], False
    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return lines


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def heading_anchors(page: Path) -> set[str]:
    anchors: set[str] = set()
    seen: dict[str, int] = {}
    for line in _prose_lines(page.read_text()):
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if match:
            slug = _slug(match.group(1))
            anchors.add(f"{slug}-{seen[slug]}" if slug in seen else slug)  # GitHub numbers repeats
            seen[slug] = seen.get(slug, 0) + 1
    return anchors


def broken_links(page: Path) -> list[str]:
    """`page -> target` for every relative link of `page` whose file or heading does not exist."""
    broken = []
    for line in _prose_lines(page.read_text()):
        for target in _LINK.findall(_CODE_SPAN.sub("", line)):
            if "://" in target or target.startswith("mailto:"):
                continue
            name, _, fragment = target.partition("#")
            dest = page.parent / name if name else page
            if not dest.exists():
                broken.append(f"{page.name} -> {target} (no such file)")
            elif fragment and dest.suffix == ".md" and fragment not in heading_anchors(dest):
                broken.append(f"{page.name} -> {target} (no such heading)")
    return broken


def _markdown_pages() -> list[Path]:
    tracked = {f for f in _tracked_text_files() if f.suffix == ".md"}
    return sorted(tracked | {README, *DOCS.glob("*.md")})  # docs/ pages count before they are committed


def test_markdown_links_point_at_files_that_exist():
    pages = _markdown_pages()
    assert README in pages and SPEC_DOC in pages
    missing = [b for page in pages for b in broken_links(page)]
    assert not missing, "links to files or headings that do not exist:\n" + "\n".join(missing)


def test_link_check_catches_what_it_should(tmp_path: Path):
    (tmp_path / "other.md").write_text("# Other page\n\n## Set-up: what `./dev.sh` does\n\n## Notes\n\n## Notes\n")
    (tmp_path / "img.png").write_bytes(b"")
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n\n"
        "[ok](other.md) [ok](other.md#set-up-what-devsh-does) [ok](other.md#notes-1) [ok](#page)\n"
        "![ok](img.png) [web](https://example.org/x) `[code](nowhere.md)`\n"
        "[gone](nowhere.md) [bad heading](other.md#setup) [bad here](#nothing)\n"
        "```\n[in a code block](nowhere.md)\n```\n"
    )
    assert broken_links(page) == [
        "page.md -> nowhere.md (no such file)",
        "page.md -> other.md#setup (no such heading)",
        "page.md -> #nothing (no such heading)",
    ]


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        print("docs/spec.md updated" if write_table() else "docs/spec.md already up to date")
    else:
        print(fields_table())
