"""The Hugging Face hub, asked briefly: a hub model's config.json from the HF cache, or its summary from the hub.

Offline (HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE) and not cached fails at once; an unreachable hub
fails within `HUB_TIMEOUT_S` seconds instead of hanging on retries.

    config = hub_config("HuggingFaceTB/SmolLM2-135M-Instruct")   # dict, or ModelError
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from jobs.models.registry import BUILTIN_MODELS, model_error

HUB_TIMEOUT_S = 8.0


def hub_offline() -> bool:
    """True when the user asked for no hub access (HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE)."""
    from huggingface_hub import constants

    env = any(
        os.environ.get(k, "").strip().upper() in {"1", "ON", "YES", "TRUE"}
        for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )
    return env or bool(constants.HF_HUB_OFFLINE)


_T = TypeVar("_T")


def _with_deadline(fn: Callable[[], _T], seconds: float) -> _T:
    """Run `fn` in a daemon thread; raise TimeoutError if it is not done within `seconds`."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - not handled here: re-raised in the caller's thread below
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True, name="tunedeck-hub-probe")
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise TimeoutError(f"no answer from the Hugging Face hub within {seconds:.0f} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


def hub_config(repo_id: str) -> dict[str, Any]:
    """config.json of a hub model from the HF cache, or its summary from the hub (short timeout)."""
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(repo_id, "config.json")
    if isinstance(cached, str):
        return read_config(Path(cached))
    others = f"use a built-in model ({', '.join(BUILTIN_MODELS)}) or a local model folder"
    if hub_offline():
        raise model_error(
            f"{repo_id!r} is not in the local Hugging Face cache and the hub is offline (HF_HUB_OFFLINE=1)",
            f"download it once where the hub is reachable (`hf download {repo_id}`), or {others}",
        )
    import httpx2  # huggingface_hub's HTTP client (one of its requirements): its transport errors
    from huggingface_hub import model_info
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    try:
        info = _with_deadline(lambda: model_info(repo_id, timeout=HUB_TIMEOUT_S / 2), HUB_TIMEOUT_S)
    except GatedRepoError:
        raise model_error(
            f"{repo_id!r} is gated on the hub", "accept its licence on huggingface.co and log in (`hf auth login`)"
        ) from None
    except RepositoryNotFoundError:
        raise model_error(
            f"{repo_id!r} was not found on the hub (or is private)",
            f"check the spelling, log in for private models (`hf auth login`), or {others}",
        ) from None
    except (OSError, httpx2.HTTPError, ValueError) as exc:
        # All mean "unreachable" to the user: DNS, TLS and connection failures (httpx2.TransportError), other
        # HTTP statuses (HfHubHTTPError is an OSError), our deadline (TimeoutError), a non-JSON answer (ValueError).
        raise model_error(
            f"{repo_id!r} is not cached and the Hugging Face hub is unreachable ({exc})",
            f"check the network (or set HF_HUB_OFFLINE=1 and use cached models), or {others}",
        ) from None
    config = dict(info.config or {})
    files = [s.rfilename for s in (info.siblings or [])]
    config["_tunedeck_hub_files"] = files
    return config


def read_config(path: Path) -> dict[str, Any]:
    """Parse a config.json; ModelError when it is not a JSON object."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise model_error(
            f"{path} cannot be read as JSON ({exc})", "point model at a valid Hugging Face model folder"
        ) from None
    if not isinstance(data, dict):
        raise model_error(f"{path} is not a JSON object", "point model at a valid Hugging Face model folder")
    return data
