"""Where training data comes from: a dataset reference resolved to a bundled sample, a local file or a hub data set.

A dataset reference is one of
- `sample:<name>` (train split) or `sample:<name>:eval` - files shipped in jobs/resources/samples/
  (package data, no code), written by bench/make_samples.py;
- a local `.jsonl`, `.json`, `.csv` or `.parquet` file, `.jsonl.gz`/`.json.gz` too (read by
  `jobs.data.files`: UTF-8 with or without BOM, CRLF, JSON arrays and `{"data": [...]}`
  wrappers; never unpickled; row numbers of a .jsonl file are its line numbers);
- a `.zip` of one such data file and its images (`jobs.data.archive`: unpacked once, the file inside read);
- a hub data set `org/name` (its `train` split; fails fast when HF_HUB_OFFLINE=1 and it is
  not cached).
The rows are checked by `jobs.data.inspection` and loaded for trl by `jobs.data.loading`.

    source = resolve("sample:chat-format", "dataset")      # Source(path=...), or DataError
    list_samples()                                          # ["sample:chat-format", ...]
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from jobs.data.embedded_images import undecoded
from jobs.data.files import file_kind
from jobs.errors import Problem, ProblemError
from storage.data_folders import readable

if TYPE_CHECKING:
    import datasets

SAMPLES_DIR = Path(__file__).resolve().parents[1] / "resources" / "samples"
_HUB_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


class DataError(ProblemError):
    """Raised with every problem found in a data set (field `dataset` or `eval_dataset`)."""

    subject = "with the data"


def list_samples() -> list[str]:
    """The bundled sample refs (train splits); append `:eval` for a sample's held-out split."""
    return sorted(f"sample:{p.name[: -len('.train.jsonl')]}" for p in SAMPLES_DIR.glob("*.train.jsonl"))


# ---------------------------------------------------------------------- resolving a ref
@dataclass(frozen=True)
class Source:
    """A resolved dataset reference: a file (samples included) or a hub data set."""

    ref: str
    path: Path | None = None  # a file (samples included)
    hub: str | None = None  # a hub data set name


def resolve(ref: str, field_name: str) -> Source:
    """What `ref` names; DataError (on `field_name`) when it names nothing usable."""
    ref = (ref or "").strip()
    if not ref:
        raise DataError(
            [Problem(field_name, "is empty", f"use one of {', '.join(list_samples())} or a path to a data file")]
        )
    if ref.startswith("sample:"):
        name, _, split = ref[len("sample:") :].partition(":")
        split = split or "train"
        path = SAMPLES_DIR / f"{name}.{split}.jsonl"
        if split not in ("train", "eval") or f"sample:{name}" not in list_samples():
            raise DataError(
                [
                    Problem(
                        field_name,
                        f"`{ref}` is not a bundled sample",
                        f"use one of {', '.join(list_samples())} (add `:eval` for the held-out split)",
                    )
                ]
            )
        if not path.is_file():
            raise DataError(
                [
                    Problem(
                        field_name,
                        f"sample file {path} is missing",
                        "reinstall tunedeck (in a checkout of its source: run `python bench/make_samples.py`)",
                    )
                ]
            )
        return Source(ref, path=path)
    path = Path(ref).expanduser()
    # A restricted user (storage.data_folders): AccessPolicy refused paths outside the data folders already, and
    # an `org/name` there is a hub name, never a file looked at (whether one exists would tell).
    look = readable(path)
    if look and path.is_dir():
        raise DataError(
            [Problem(field_name, f"`{ref}` is a folder", "point at one .jsonl, .json, .csv or .parquet file")]
        )
    if look and path.is_file() and path.name.lower().endswith(".zip"):  # a data file and its images (jobs.data.archive)
        from jobs.data.archive import ZipProblem, unpacked_data_file

        try:
            return Source(ref, path=unpacked_data_file(path, field_name, lambda p: file_kind(p) is not None))
        except ZipProblem as exc:
            raise DataError(exc.problems) from exc
    if look and path.is_file():
        if file_kind(path) is None:
            raise DataError(
                [
                    Problem(
                        field_name,
                        f"`{path.suffix or path.name}` files are not supported",
                        "convert it to .jsonl (one JSON object per line, may be gzipped), .json, .csv or .parquet",
                    )
                ]
            )
        return Source(ref, path=path)
    if _HUB_NAME.match(ref) and file_kind(path) is None:
        return Source(ref, hub=ref)
    if file_kind(path) is not None or "/" in ref or "\\" in ref:
        raise DataError(
            [
                Problem(
                    field_name, f"file `{ref}` does not exist", f"check the path (relative paths start at {Path.cwd()})"
                )
            ]
        )
    raise DataError(
        [
            Problem(
                field_name,
                f"`{ref}` is not a sample, a file or a hub data set name",
                f"use {', '.join(list_samples())}, a .jsonl/.json/.csv/.parquet path, or org/name",
            )
        ]
    )


# ---------------------------------------------------------------------- reading rows
def load_hub(name: str, field_name: str) -> datasets.Dataset:
    """The train split of hub data set `name`; DataError when it cannot be had."""
    import datasets

    try:
        found = datasets.load_dataset(name, split="train")
    except Exception as exc:  # re-raised below as the DataError that names the cause
        # The hub, the network, the cache and the data set's own loader each raise their own types; offline,
        # not found, gated or no train split all mean "cannot use it" to the user.
        offline = datasets.config.HF_HUB_OFFLINE
        problem = (
            f"hub data set `{name}` is not in the local cache and the hub is off (HF_HUB_OFFLINE=1)"
            if offline
            else f"hub data set `{name}` could not be loaded ({type(exc).__name__}: {str(exc)[:200]})"
        )
        raise DataError(
            [
                Problem(
                    field_name,
                    problem,
                    "check the name, or download the data and point at a local .jsonl/.parquet file",
                )
            ]
        ) from exc
    return undecoded(found)  # images stored in it are read as bytes, never decoded here
