"""What a dashboard user may make the server do.

Any dashboard, with a login or without, runs no code its users bring unless the server was
started with it allowed: `trust_remote_code` (a model's own Python) needs `serve --allow-remote-code`
(or `TUNEDECK_ALLOW_REMOTE_CODE=1`), a GRPO `reward_function` (Python the training process imports)
needs `serve --allow-reward-function` (or `TUNEDECK_ALLOW_REWARD_FUNCTION=1`). A page in the same
browser could otherwise make a local dashboard run code (issue 32); the command line
(`AccessPolicy.open()`) is not restricted: whoever runs `tunedeck` is on the server already.

Without a login tunedeck serves 127.0.0.1 to the one person at that machine, who can read any
file anyway: every path stays open. With a login, several people reach one server, so data stays
with the server's administrator:
- data files (benchmark question files too) are read only from allowed folders: `TUNEDECK_DATA_DIRS` (folders separated by
  `:`), by default `$TUNEDECK_HOME/datasets` (shared data an administrator puts there) and the
  uploads folder; a path is judged after resolving `..` and symbolic links, and before anything
  is read, so a refusal says nothing about whether a file exists (`storage.data_folders`, the one rule);
- so are the images a data set's rows name (`file://` URLs, absolute and `../` paths, links): a check or
  preview made for such a user runs inside `policy.reading()`, and `jobs.data.images` refuses the others;
- a model folder (`model:` naming a path, not a built-in or a hub id) is read only from the data folders
  and the model cache (`TUNEDECK_MODELS_DIR`);
- an endpoint a spec names (the judge's `URL#MODEL`) must be one the operator trusts with the workers' keys
  (`jobs.checks.egress`, TUNEDECK_TRUSTED_ENDPOINTS); elsewhere an untrusted one is called without a key.

    policy = AccessPolicy.for_server(login=True)
    policy.problems(spec)      # [] or Problems naming the field and the fix
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from jobs.checks.egress import endpoint_problem
from jobs.errors import Problem
from jobs.spec.job import JobSpec
from jobs.spec.mixture import parse_sources
from storage.data_folders import reading_only_under, under_folders

DATA_DIRS_ENV = "TUNEDECK_DATA_DIRS"
REMOTE_CODE_ENV = "TUNEDECK_ALLOW_REMOTE_CODE"
REWARD_FUNCTION_ENV = "TUNEDECK_ALLOW_REWARD_FUNCTION"
_HUB_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_HUB_MODEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")  # as jobs.models.references
_DATA_SUFFIXES = (".jsonl", ".json", ".csv", ".parquet", ".gz", ".zip")


def default_data_dirs() -> tuple[Path, ...]:
    """`$TUNEDECK_HOME/datasets` and the uploads folder."""
    from storage.settings import data_dir, uploads_dir

    return (data_dir() / "datasets", uploads_dir())


def _truthy(raw: str | None) -> bool:
    return (raw or "").strip().lower() in {"1", "true", "yes", "on"}


@dataclass(frozen=True)
class AccessPolicy:
    """Whether the dashboard is shared, and what its users may reach on the server."""

    restricted: bool = False
    data_dirs: tuple[Path, ...] = ()
    allow_remote_code: bool = True
    allow_reward_function: bool = True  # a custom GRPO reward function: the command line only

    @classmethod
    def open(cls) -> AccessPolicy:
        """The command line: everything allowed."""
        return cls()

    @classmethod
    def dashboard(cls) -> AccessPolicy:
        """One local user at the dashboard: every path, but no code the user brings (remote code, a
        reward function) unless the server was started with it allowed (the environment)."""
        return cls(
            allow_remote_code=_truthy(os.environ.get(REMOTE_CODE_ENV)),
            allow_reward_function=_truthy(os.environ.get(REWARD_FUNCTION_ENV)),
        )

    @classmethod
    def for_server(cls, login: bool) -> AccessPolicy:
        """The policy of a dashboard with or without a login, from the environment."""
        if not login:
            return cls.dashboard()
        raw = os.environ.get(DATA_DIRS_ENV, "").strip()
        dirs = (
            tuple(Path(p).expanduser().resolve() for p in raw.split(os.pathsep) if p.strip())
            if raw
            else tuple(p.resolve() for p in default_data_dirs())
        )
        return cls(
            restricted=True,
            data_dirs=dirs,
            allow_remote_code=_truthy(os.environ.get(REMOTE_CODE_ENV)),
            allow_reward_function=_truthy(os.environ.get(REWARD_FUNCTION_ENV)),
        )

    def data_problem(self, ref: str | None, field: str) -> Problem | None:
        """A Problem when `ref` (any of the sources it lists) is a server path this policy does not let users read."""
        sources = parse_sources(ref or "")[0]
        for source in sources if len(sources) > 1 else []:
            found = self._path_problem(source.ref, field)
            if found is not None:
                return found
        return None if len(sources) > 1 else self._path_problem(sources[0].ref if sources else ref, field)

    def _path_problem(self, ref: str | None, field: str) -> Problem | None:
        ref = (ref or "").strip()
        if not self.restricted or not ref or ref.startswith("sample:"):
            return None
        path = Path(ref).expanduser()
        looks_like_path = (
            path.is_absolute()
            or ref.startswith((".", "~"))
            or ref.lower().endswith(_DATA_SUFFIXES)
            or not _HUB_NAME.match(ref)
        )  # never whether it exists: that answer would tell
        if not looks_like_path:
            return None  # a hub data set name; under `reading()` a file of that name is never read (jobs.data.sources)
        if under_folders(path, self.data_dirs):
            return None
        where = self.folders_text()
        return Problem(
            field,
            f"this shared server reads data files only from its data folders ({where}), and `{ref}` is not in one",
            "upload the file in the form, pick a bundled sample, or ask the administrator to add "
            f"its folder to {DATA_DIRS_ENV}",
        )

    def folders_text(self) -> str:
        return ", ".join(str(d) for d in self.data_dirs) or "(none)"

    @contextmanager
    def reading(self) -> Iterator[None]:
        """The span of a check or preview for this policy's users: paths named inside the data (images in
        rows) are read only from the data folders, and model files only from those and the model cache
        (`storage.data_folders.readable`); nothing changes when the policy is not restricted."""
        if not self.restricted:
            yield
            return
        from storage.settings import models_dir

        with reading_only_under((*self.data_dirs, models_dir())):
            yield

    def model_problem(self, model: str | None) -> Problem | None:
        """A Problem when `model` names a folder outside the data folders and the model cache (built-in names
        and hub ids pass); judged on the resolved path, before anything is read, so it is the same message
        whether the folder exists or not."""
        ref = (model or "").strip()
        if not self.restricted or not ref:
            return None
        from jobs.models.registry import BUILTIN_MODELS

        if ref in BUILTIN_MODELS or _HUB_MODEL.match(ref):
            return None
        from storage.settings import models_dir

        if under_folders(ref, (*self.data_dirs, models_dir())):
            return None
        return Problem(
            "model",
            f"`{ref}` names a folder outside this shared server's data folders ({self.folders_text()}) "
            "and its model cache",
            "pick a built-in model or a hub id (org/name), or ask the administrator to put the model folder "
            f"under one of the data folders ({DATA_DIRS_ENV}) or the model cache (TUNEDECK_MODELS_DIR)",
        )

    def problems(self, spec: JobSpec) -> list[Problem]:
        """Everything in `spec` that users of this server may not ask for."""
        out = [
            p
            for p in (
                self.model_problem(spec.model),
                self.data_problem(spec.dataset, "dataset"),
                self.data_problem(spec.eval_dataset, "eval_dataset"),
            )
            if p is not None
        ]
        out += self._task_problems(spec.eval_tasks)
        out += self._judge_reward_problems(spec)
        if self.restricted:
            out += [p for p in (endpoint_problem(spec.judge, "judge"),) if p is not None]
        if spec.trust_remote_code and not self.allow_remote_code:
            out.append(
                Problem(
                    "trust_remote_code",
                    "running a model's own Python code is off on this dashboard "
                    "(it would run with the server's rights, for whoever can reach the dashboard)",
                    "pick a model that transformers supports without it, run it with `tunedeck run` on the "
                    f"server, or start the server with --allow-remote-code ({REMOTE_CODE_ENV}=1)",
                )
            )
        if spec.reward_function is not None and not self.allow_reward_function:
            out.append(
                Problem(
                    "reward_function",
                    "a custom reward function runs your Python in the training process, "
                    "so the dashboard and its API accept none unless the server allows it",
                    "remove reward_function here (use built-in rewards or reward_model_run), put it in a "
                    "spec file and run `tunedeck submit SPEC.yaml` on the server, or start the server with "
                    f"--allow-reward-function ({REWARD_FUNCTION_ENV}=1)",
                )
            )
        return out

    def _judge_reward_problems(self, spec: JobSpec) -> list[Problem]:
        """A judge reward's judge: an endpoint as the eval judge's (refused on a shared dashboard unless trusted), a
        model folder as the model's (read only from the allowed folders)."""
        out: list[Problem] = []
        for i, reward in enumerate(spec.declared_rewards):
            ref, field = (reward.judge or "").strip(), f"rewards[{i}].judge"
            if not ref or ref.lower().startswith("run:"):
                continue
            if ref.lower().startswith(("http://", "https://")):
                found = endpoint_problem(ref, field) if self.restricted else None
            else:
                found = self.model_problem(ref)
            out += [Problem(field, found.problem, found.fix)] if found is not None else []
        return out

    def _task_problems(self, eval_tasks: str | None) -> list[Problem]:
        """Benchmark files are data files (read from the allowed folders); an lm-eval task YAML may import
        Python (`!function`), so it is code, allowed as a model's own code is."""
        from jobs.data.bench_tasks import TaskKind, task_refs

        refs = [r for r in task_refs(eval_tasks) if r.kind is not TaskKind.HUB]
        out = [p for p in (self._path_problem(r.ref, "eval_tasks") for r in refs) if p is not None]
        if any(r.kind is TaskKind.YAML for r in refs) and not self.allow_remote_code:
            out.append(
                Problem(
                    "eval_tasks",
                    "an lm-eval task .yaml can run Python (`!function`), which is off on this dashboard",
                    "write the questions as a .jsonl, run `tunedeck evaluate` on the server, or start the "
                    f"server with --allow-remote-code ({REMOTE_CODE_ENV}=1)",
                )
            )
        return out


def loading_problem(spec: JobSpec, run_id: int, policy: AccessPolicy | None, doing: str) -> Problem | None:
    """Loading a finished run's model (to chat with it, to export it) whose code runs on load needs the
    server's permission, as training it did; `doing` names the way out ("chat with it", "export it")."""
    if policy is None or policy.allow_remote_code or not spec.trust_remote_code:
        return None
    return Problem(
        "run",
        f"run {run_id}'s model runs its own Python code (trust_remote_code), which is off on this dashboard",
        f"{doing} from the command line, or start the server with --allow-remote-code ({REMOTE_CODE_ENV}=1)",
    )
