"""tunedeck's MCP server (`app.mcp_tools`), spoken to by the MCP SDK's own client.

In process (fast): the tools an agent sees, a plan equal to submit's prediction, and a call a dashboard user may
not make refused exactly as the API refuses it, with nothing queued. Then the real thing (integration): `tunedeck
mcp` over stdio on the session's finished runs, and `/mcp` on a served dashboard with a login and a worker: no
credentials, no tools; with them, an agent plans a spec, submits it, reads the run to its end, its metrics and log,
and talks to the result.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from browser_helpers import REPO, free_port, start_server, stop_server, wait_for_route
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from app.api import Endpoints
from jobs.checks.access import AccessPolicy

TOOLS = {"runs", "run", "plan", "submit", "cancel", "resume", "metrics", "log", "chat", "export", "tasks"}
USER, PASSWORD = "agent", "mcp-test-password"


def tiny_yaml(model: Path, steps: int = 2, **extra: Any) -> str:
    lines = [
        f"model: {model}",
        "dataset: sample:chat-format",
        "method: lora",
        f"max_steps: {steps}",
        "per_device_train_batch_size: 2",
        "max_length: 64",
        "max_train_samples: 8",
        "logging_steps: 1",
        "lora_r: 4",
        "lora_alpha: 8",
        *(f"{k}: {v}" for k, v in extra.items()),
    ]
    return "\n".join(lines) + "\n"


def call(server: Any, name: str, arguments: dict[str, Any]) -> Any:
    """One tool call through the SDK's client connected in process; the CallToolResult."""

    async def go() -> Any:
        async with Client(server) as client:
            return await client.call_tool(name, arguments)

    return asyncio.run(go())


@pytest.fixture
def restricted(store: Any, tmp_path: Path) -> tuple[Any, Any, AccessPolicy]:
    """(store, MCP server, policy) under a dashboard-with-login's policy: data folders only, no code."""
    from app.mcp_tools import build

    policy = AccessPolicy(
        restricted=True, data_dirs=(tmp_path.resolve(),), allow_remote_code=False, allow_reward_function=False
    )
    return store, build(store, policy), policy


def test_the_tools_an_agent_sees_and_a_plan_equal_to_submits_prediction(store: Any, tiny_model: Path) -> None:
    from app.mcp_tools import build
    from jobs.checks.pipeline import check
    from jobs.spec.job import JobSpec

    server = build(store, AccessPolicy.dashboard())

    async def listed() -> set[str]:
        async with Client(server) as client:
            return {t.name for t in (await client.list_tools()).tools}

    assert asyncio.run(listed()) == TOOLS
    spec_yaml = tiny_yaml(tiny_model)
    planned = call(server, "plan", {"spec_yaml": spec_yaml})
    assert not planned.is_error, planned.content
    expected = check(JobSpec.from_yaml(spec_yaml), store=store).prediction
    assert expected is not None and planned.structured_content["total_bytes"] == expected.total_bytes
    assert planned.structured_content["problems"] == []
    assert store.list_runs(None) == []  # a plan queues nothing


def test_a_call_a_dashboard_user_may_not_make_is_refused_the_same_way(
    restricted: tuple[Any, Any, AccessPolicy],
) -> None:
    store, server, policy = restricted
    outside = "model: tiny-llama\ndataset: /etc/passwd\n"
    answered = call(server, "submit", {"spec_yaml": outside})
    assert answered.structured_content["run_id"] is None
    problems = answered.structured_content["problems"]
    assert [p["field"] for p in problems] == ["dataset"] and "data folders" in problems[0]["problem"]
    assert problems == Endpoints(store, policy).submit(outside)["problems"]  # the API's refusal, word for word
    code = "model: tiny-llama\ntrainer: grpo\ndataset: sample:math-prompts\nreward_function: /tmp/reward.py:score\n"
    refused = call(server, "submit", {"spec_yaml": code})
    fields = {p["field"] for p in refused.structured_content["problems"]}
    assert "reward_function" in fields, refused.structured_content
    planned = call(server, "plan", {"spec_yaml": outside})
    assert any(p["field"] == "dataset" for p in planned.structured_content["problems"])
    assert store.list_runs(None) == []  # nothing queued by any of them


def test_bad_arguments_are_tool_errors_naming_the_field(restricted: tuple[Any, Any, AccessPolicy]) -> None:
    _, server, _ = restricted
    missing = call(server, "run", {"run_id": 99})
    assert missing.is_error and "run_id: run 99 does not exist" in missing.content[0].text
    lines = call(server, "log", {"run_id": 1, "lines": 0})
    assert lines.is_error and "lines:" in lines.content[0].text
    tokens = call(server, "chat", {"run_id": 1, "prompt": "hi", "max_tokens": 100000})
    assert tokens.is_error and "max_tokens:" in tokens.content[0].text
    typed = call(server, "cancel", {"run_id": "one"})
    assert typed.is_error  # the SDK's own argument validation, before any tunedeck code


# ---------------------------------------------------------------------- the real transports
@pytest.mark.integration
def test_tunedeck_mcp_over_stdio_reads_the_finished_runs(tag_home: tuple[Path, dict[str, int]]) -> None:
    folder, ids = tag_home
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNEDECK_")}
    env.update(TUNEDECK_HOME=str(folder), HF_HUB_OFFLINE="1", GRADIO_ANALYTICS_ENABLED="False", PYTHONPATH=str(REPO))
    params = StdioServerParameters(command=sys.executable, args=["-m", "app.cli.main", "mcp"], env=env, cwd=str(REPO))

    async def session() -> tuple[set[str], Any, Any, Any]:
        async with Client(params, read_timeout_seconds=300) as client:
            tools = {t.name for t in (await client.list_tools()).tools}
            runs = await client.call_tool("runs", {"status": "succeeded"})
            shown = await client.call_tool("run", {"run_id": ids["lora"]})
            spec = await client.read_resource(f"tunedeck://runs/{ids['lora']}/spec")
            return tools, runs, shown, spec

    tools, runs, shown, spec = asyncio.run(session())
    assert tools == TOOLS
    listed = {r["id"] for r in runs.structured_content["result"]}
    assert set(ids.values()) <= listed
    assert shown.structured_content["status"] == "succeeded" and shown.structured_content["spec"]["method"] == "lora"
    assert "method: lora" in spec.contents[0].text


@pytest.fixture(scope="module")
def served(tag_home: tuple[Path, dict[str, int]], tiny_model: Path, tmp_path_factory: pytest.TempPathFactory):
    """(port, tag_home ids, tiny model): `tunedeck serve` with a login and its worker on the session's runs;
    its users may read the tiny model's folder and the data folder only."""
    folder, ids = tag_home
    port = free_port()
    log = tmp_path_factory.mktemp("mcp-server") / "server.log"
    dirs = os.pathsep.join([str(tiny_model.parent.resolve()), str(folder)])
    env = {"TUNEDECK_AUTH": f"{USER}:{PASSWORD}", "TUNEDECK_DATA_DIRS": dirs}
    proc = start_server(folder, port, log, extra_env=env)
    try:
        wait_for_route(port, "/mcp", proc, post=True)
        yield port, ids, tiny_model
    finally:
        stop_server(proc)


def _http_client(port: int, credentials: str | None) -> Any:
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    headers = {"Authorization": f"Bearer {credentials}"} if credentials else {}
    http = httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(600.0))
    return streamable_http_client(f"http://127.0.0.1:{port}/mcp", http_client=http)


@pytest.mark.integration
def test_without_credentials_mcp_on_the_dashboard_is_refused(served: tuple[int, Any, Path]) -> None:
    port = served[0]
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    answer = httpx.post(f"http://127.0.0.1:{port}/mcp", json=body, timeout=60)
    assert answer.status_code == 401 and "login" in answer.json()["error"]["message"]
    wrong = httpx.post(
        f"http://127.0.0.1:{port}/mcp", json=body, headers={"Authorization": f"Bearer {USER}:nope"}, timeout=60
    )
    assert wrong.status_code == 401


@pytest.mark.integration
def test_an_agent_plans_submits_follows_a_run_to_its_end_and_talks_to_it(served: tuple[int, Any, Path]) -> None:
    port, _, tiny_model = served
    spec_yaml = tiny_yaml(tiny_model)

    async def session() -> dict[str, Any]:
        seen: dict[str, Any] = {}
        async with Client(_http_client(port, f"{USER}:{PASSWORD}"), read_timeout_seconds=600) as client:
            seen["plan"] = await client.call_tool("plan", {"spec_yaml": spec_yaml})
            submitted = await client.call_tool("submit", {"spec_yaml": spec_yaml})
            run_id = submitted.structured_content["run_id"]
            assert run_id is not None, submitted.structured_content
            deadline = time.monotonic() + 900
            while True:
                shown = await client.call_tool("run", {"run_id": run_id})
                if shown.structured_content["status"] in ("succeeded", "failed", "cancelled", "interrupted"):
                    break
                assert time.monotonic() < deadline, shown.structured_content
                await asyncio.sleep(1.0)
            seen["run"] = shown
            seen["metrics"] = await client.call_tool("metrics", {"run_id": run_id, "names": ["loss"]})
            seen["log"] = await client.call_tool("log", {"run_id": run_id, "lines": 50})
            seen["chat"] = await client.call_tool("chat", {"run_id": run_id, "prompt": "Hello", "max_tokens": 8})
            seen["outside"] = await client.call_tool(
                "submit", {"spec_yaml": "model: tiny-llama\ndataset: /etc/hosts\n"}
            )
        return seen

    seen = asyncio.run(session())
    assert not seen["plan"].is_error and seen["plan"].structured_content["total_bytes"] > 0
    assert seen["run"].structured_content["status"] == "succeeded", seen["run"].structured_content
    losses = seen["metrics"].structured_content["loss"]
    assert [row["step"] for row in losses] == [1, 2] and all(row["value"] > 0 for row in losses)
    assert not seen["log"].is_error and seen["log"].content[0].text.strip()
    assert not seen["chat"].is_error, seen["chat"].content
    assert isinstance(seen["chat"].structured_content["result"], str)
    outside = seen["outside"].structured_content
    assert outside["run_id"] is None and outside["problems"][0]["field"] == "dataset"
