"""What the GPU machine has, for bench/gpu_check.sh: which carried wheels to install, and its facts.

    python bench/gpu_env.py --select .gpu-wheels/manifest.tsv   # the wheels to install here, one path a line
    python bench/gpu_env.py --facts --manifest .gpu-wheels/manifest.tsv --site /tmp/site
                                                                # Markdown: Python, torch, CUDA, versions, unmet needs

`--select` reads the manifest bench/gpu_wheels.sh wrote: a wheel marked `always` is installed; one
marked with a requirement (`>=5.24,<6`) only when this machine's own copy is missing or outside it
(why, on stderr). Run it BEFORE the carried folder is on sys.path, so it sees the machine's copies.

`--facts` imports torch (it creates a CUDA context: run it in its own process) and checks every
carried distribution's own requirements (Requires-Dist, extras left out) against what this
interpreter now imports, the installed folder first, as every check will see it. Needs only the
standard library and `packaging` (or pip's own copy of it).
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import platform
import sys
from dataclasses import dataclass
from pathlib import Path

# Shown in the facts table (besides the carried ones): what the checks import from the machine.
KEY_PACKAGES = (
    "torch",
    "transformers",
    "peft",
    "accelerate",
    "trl",
    "datasets",
    "bitsandbytes",
    "triton",
    "liger-kernel",
    "galore-torch",
    "apollo-torch",
    "SQLAlchemy",
    "tokenizers",
    "huggingface_hub",
    "safetensors",
    "pyarrow",
    "fsspec",
    "nvidia-ml-py",
    "psutil",
    "PyYAML",
    "pytest",
    "pytest-xdist",
    "pytest-timeout",
    "hypothesis",
)


@dataclass(frozen=True)
class Wheel:
    file: Path
    name: str
    version: str
    when: str  # "always" or a requirement specifier such as ">=5.24,<6"


def read_manifest(path: Path) -> list[Wheel]:
    """The manifest's rows (file, distribution, version, when), the file resolved next to the manifest."""
    rows = []
    for line in path.read_text().splitlines():
        if line.strip():
            file, name, version, when = line.split("\t")
            rows.append(Wheel(path.parent / file, name, version, when))
    return rows


def _packaging():
    """`packaging` (requirements, specifiers), else the copy inside pip: wherever pip runs, one of them does."""
    try:
        import packaging.requirements
        import packaging.specifiers

        return packaging
    except ImportError:
        from pip._vendor import packaging
        from pip._vendor.packaging import requirements, specifiers  # noqa: F401  (loads the submodules)

        return packaging


def installed_version(name: str) -> str | None:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


def select(wheels: list[Wheel], version_of=installed_version) -> tuple[list[Wheel], list[str]]:
    """The wheels to install, and one line of reason per wheel."""
    SpecifierSet = _packaging().specifiers.SpecifierSet

    chosen, reasons = [], []
    for w in wheels:
        have = version_of(w.name)
        if w.when == "always":
            chosen.append(w)
            reasons.append(f"{w.name} {w.version}: install (always; the machine has {have or 'none'})")
        elif have is None or not SpecifierSet(w.when).contains(have, prereleases=True):
            chosen.append(w)
            reasons.append(f"{w.name} {w.version}: install (the machine has {have or 'none'}, needed {w.when})")
        else:
            reasons.append(f"{w.name}: keep the machine's {have} (within {w.when})")
    return chosen, reasons


def unmet(names: list[str]) -> list[str]:
    """Each requirement of the named distributions that what is importable now does not meet."""
    Requirement = _packaging().requirements.Requirement

    problems = []
    for name in names:
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            problems.append(f"{name}: not installed")
            continue
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue  # an extra's need, or another platform's
            have = installed_version(req.name)
            if have is None:
                problems.append(f"{name} {dist.version} needs {req}: missing")
            elif req.specifier and not req.specifier.contains(have, prereleases=True):
                problems.append(f"{name} {dist.version} needs {req}: found {have}")
    return problems


def where(name: str, site: Path | None) -> str:
    try:
        path = Path(str(md.distribution(name).locate_file(""))).resolve()
    except md.PackageNotFoundError:
        return "-"
    if site is not None and path.is_relative_to(site.resolve()):
        return "carried"
    return "machine"


def facts(manifest: Path | None, site: Path | None) -> str:
    """The Markdown facts: interpreter, torch and its CUDA, package versions and origins, unmet needs."""
    lines = [f"- Python {platform.python_version()} ({sys.executable}), {platform.platform()}"]
    try:
        import torch

        cuda = torch.cuda.is_available()
        lines.append(
            f"- torch {torch.__version__}, built for CUDA {torch.version.cuda}, cuDNN "
            f"{torch.backends.cudnn.version() if cuda else '-'}, CUDA available: {cuda}"
        )
        if cuda:
            p = torch.cuda.get_device_properties(0)
            lines.append(
                f"- device 0: {p.name}, {p.total_memory / 2**30:.1f} GiB ({p.total_memory} bytes), compute "
                f"{p.major}.{p.minor}, {p.multi_processor_count} SMs, bf16: {torch.cuda.is_bf16_supported()}"
            )
    except ImportError as exc:  # reported, not fatal: the facts are for reading
        lines.append(f"- torch: cannot import ({exc})")
    try:
        import pynvml

        pynvml.nvmlInit()
        driver = pynvml.nvmlSystemGetDriverVersion()
        lines.append(f"- NVIDIA driver {driver.decode() if isinstance(driver, bytes) else driver}")
    except Exception as exc:  # noqa: BLE001 - NVML missing or failing is a fact to report
        lines.append(f"- NVML: {type(exc).__name__}: {exc}")
    carried = [w.name for w in read_manifest(manifest)] if manifest and manifest.is_file() else []
    names = list(dict.fromkeys([*KEY_PACKAGES, *carried]))
    lines += ["", "| package | version | from |", "|---|---|---|"]
    lines += [f"| {n} | {installed_version(n) or 'not installed'} | {where(n, site)} |" for n in names]
    problems = unmet(carried) if carried else []
    lines += ["", "Requirements of the carried packages not met here: " + ("none" if not problems else "")]
    lines += [f"- {p}" for p in problems]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--select", type=Path, metavar="MANIFEST", help="print the wheels to install here")
    parser.add_argument("--facts", action="store_true", help="print the machine's facts as Markdown")
    parser.add_argument("--manifest", type=Path, help="with --facts: the carried wheels' manifest")
    parser.add_argument("--site", type=Path, help="with --facts: the folder the carried wheels went into")
    ns = parser.parse_args(argv)
    if ns.select:
        chosen, reasons = select(read_manifest(ns.select))
        for reason in reasons:
            print(reason, file=sys.stderr)
        for w in chosen:
            print(w.file)
        return 0
    if ns.facts:
        print(facts(ns.manifest, ns.site))
        return 0
    parser.error("give --select MANIFEST or --facts")
    return 2


if __name__ == "__main__":
    sys.exit(main())
