"""The scripting API through gradio_client against a live `tunedeck serve` (login on, worker on).

Every endpoint is called as a script would: submit (a good spec, a wrong one, bad YAML), runs,
run, metrics, memory, cancel, resume, bundle, tag and delete; a wrong password and no login are
refused; only the named endpoints are on the API; the example script of docs/api.md runs as written.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import httpx
import pytest
from browser_helpers import REPO, free_port, start_server, stop_server
from gradio_client import Client
from gradio_client.exceptions import AppError
from training_helpers import wait_for

USER, PASSWORD = "alice", "pw-alice-12345"
ENDPOINTS = {
    "/submit",
    "/runs",
    "/run",
    "/metrics",
    "/memory",
    "/cancel",
    "/resume",
    "/bundle",
    "/tag",
    "/delete",
    "/tokens",
    "/audit",
    "/search",
    "/search_show",
    "/search_best",
    "/try_rewards",
    "/task",
}
QUICK = (
    "model: tiny-llama\ndataset: sample:chat-format\nmethod: lora\nlora_r: 4\nmax_length: 48\n"
    "per_device_train_batch_size: 4\nmax_train_samples: 16\nlearning_rate: 5.0e-3\nlogging_steps: 1\n"
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("api")
    home = root / "home"
    home.mkdir()
    port = free_port()
    proc = start_server(home, port, root / "server.log", timeout=120, extra_env={"TUNEDECK_AUTH": f"{USER}:{PASSWORD}"})
    try:
        yield {"url": f"http://127.0.0.1:{port}/", "home": home, "log": root / "server.log"}
    finally:
        stop_server(proc)


@pytest.fixture(scope="module")
def client(server: dict, tmp_path_factory: pytest.TempPathFactory) -> Client:
    return Client(
        server["url"],
        auth=(USER, PASSWORD),
        analytics_enabled=False,
        verbose=False,
        download_files=str(tmp_path_factory.mktemp("downloads")),
    )


def test_the_dashboard_s_api_is_the_named_endpoints_only(store) -> None:
    from app.ui.dashboard import build_ui

    info = build_ui(store).get_api_info()
    assert set(info["named_endpoints"]) == ENDPOINTS and info["unnamed_endpoints"] == {}
    assert [p["parameter_name"] for p in info["named_endpoints"]["/runs"]["parameters"]] == [
        "status",
        "limit",
        "search",
        "tag",
    ]


def _finished(client: Client, run_id: int, timeout: float = 300) -> dict:
    return wait_for(
        lambda: (r := client.predict(run_id=run_id, api_name="/run"))["status"] not in ("queued", "running") and r,
        timeout=timeout,
        interval=0.5,
        what=f"run {run_id} finishes",
    )


@pytest.mark.integration
@pytest.mark.slow
def test_only_the_named_endpoints_are_public_and_documented(server: dict, client: Client) -> None:
    info = client.view_api(print_info=False, return_format="dict")
    assert set(info["named_endpoints"]) == ENDPOINTS and info["unnamed_endpoints"] == {}
    submit = info["named_endpoints"]["/submit"]
    assert [p["parameter_name"] for p in submit["parameters"]] == ["spec_yaml"]
    metrics = info["named_endpoints"]["/metrics"]
    assert [p["parameter_name"] for p in metrics["parameters"]] == ["run_id", "names", "since_step"]
    for name, endpoint in info["named_endpoints"].items():
        assert endpoint["description"], name
        for param in endpoint["parameters"]:
            assert param["python_type"]["description"], (name, param["parameter_name"])
    # The page's own events (the form's 41-field launch, the budget, the timers) are private.
    with httpx.Client(base_url=server["url"], timeout=10) as web:
        assert web.post("/login", data={"username": USER, "password": PASSWORD}).status_code == 200
        deps = web.get("/config").json()["dependencies"]
    public = {d["api_name"] for d in deps if d.get("api_visibility") == "public"}
    assert public == {e.strip("/") for e in ENDPOINTS}
    assert any(d["api_name"] == "launch" and d["api_visibility"] == "private" for d in deps)


@pytest.mark.integration
@pytest.mark.slow
def test_tokens_and_audit_of_a_spec_s_data_behind_the_login(server: dict, client: Client, tiny_model: Path) -> None:
    """A row's tokens and the audit, through the login, of data and a model in the server's data folders; a file
    outside them is refused by field before it is read."""
    import json
    import shutil

    shared = server["home"] / "datasets"
    shutil.copytree(tiny_model, shared / "tiny-model", dirs_exist_ok=True)
    rows = [{"prompt": f"Question {i}?", "completion": f" Answer {i}."} for i in range(3)]
    (shared / "qa.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [*rows, rows[0]]))
    spec = f"model: {shared / 'tiny-model'}\ndataset: {shared / 'qa.jsonl'}\nmax_length: 32\n"
    out = client.predict(spec_yaml=spec, row=2, api_name="/tokens")
    (row,) = out["rows"]
    assert row["row"] == 2 and row["trained"] == sum(t["trained"] for t in row["sequences"][0]["tokens"]) > 0
    audit = client.predict(spec_yaml=spec, api_name="/audit")
    assert [f["rows"] for f in audit["findings"] if f["code"] == "duplicate-rows"] == [
        [{"field": "dataset", "source": str(shared / "qa.jsonl"), "row": 4}]
    ]
    with pytest.raises(AppError, match=r"dataset: this shared server reads data files only from its data folders"):
        client.predict(spec_yaml=spec.replace(str(shared / "qa.jsonl"), "/etc/passwd.jsonl"), api_name="/audit")


@pytest.mark.integration
@pytest.mark.slow
def test_a_wrong_password_or_no_login_is_refused(server: dict) -> None:
    with pytest.raises(ValueError, match="Could not login"):
        Client(server["url"], auth=(USER, "not-the-password"), analytics_enabled=False, verbose=False)
    with pytest.raises(Exception, match="credentials were not provided"):
        Client(server["url"], analytics_enabled=False, verbose=False)
    with httpx.Client(base_url=server["url"], timeout=10) as anon:
        for path in ("/gradio_api/info", "/gradio_api/call/submit", "/gradio_api/queue/join"):
            r = anon.post(path, json={"data": ["model: tiny-llama\n"]}) if "info" not in path else anon.get(path)
            assert r.status_code in (401, 403), (path, r.status_code)


@pytest.mark.integration
@pytest.mark.slow
def test_a_wrong_spec_comes_back_as_the_form_s_problems(server: dict, client: Client) -> None:
    import yaml

    from jobs.checks.access import AccessPolicy
    from jobs.checks.pipeline import check

    text = "learning_rat: 1.0e-4\nlora_r: 0\nmodel: tiny-llama\ndataset: /no/such/file.jsonl\n"
    before = client.predict(limit=1000, api_name="/runs")
    out = client.predict(spec_yaml=text, api_name="/submit")
    assert out["run_id"] is None
    got = {(p["field"], p["problem"], p["fix"]) for p in out["problems"]}
    # The form holds every field; this server has a login, so its shared-server limits apply too
    # (a path outside its data folders is refused before it is read).
    policy = AccessPolicy(
        restricted=True, data_dirs=(server["home"] / "datasets", server["home"] / "uploads"), allow_remote_code=False
    )
    form = check(yaml.safe_load(text), policy=policy).problems  # the form's values go through the same check
    assert got == {(p.field, p.problem, p.fix) for p in form}
    assert any("data folders" in problem for field, problem, _ in got if field == "dataset")
    assert {"learning_rat", "lora_r", "dataset"} <= {field for field, _, _ in got}
    out = client.predict(spec_yaml="model: [unclosed", api_name="/submit")
    assert out["run_id"] is None and out["problems"][0]["field"] == "spec" and "YAML" in out["problems"][0]["problem"]
    assert client.predict(limit=1000, api_name="/runs") == before  # nothing queued


@pytest.mark.integration
@pytest.mark.slow
def test_bad_arguments_name_the_parameter_and_the_fix(client: Client) -> None:
    with pytest.raises(AppError, match=r"status: `bogus` is not a run status\. Fix: use all or one of"):
        client.predict(status="bogus", api_name="/runs")
    with pytest.raises(AppError, match=r"limit: `0` is not a whole number from 1 to 1000"):
        client.predict(limit=0, api_name="/runs")
    for endpoint in ("/run", "/metrics", "/memory", "/cancel", "/resume", "/bundle", "/delete"):
        with pytest.raises(AppError, match=r"run_id: run 99999 does not exist\. Fix: list runs"):
            client.predict(run_id=99999, api_name=endpoint)
    with pytest.raises(AppError, match=r"run_id: `abc` is not a run id"):
        client.predict(run_id="abc", api_name="/run")


@pytest.mark.integration
@pytest.mark.slow
def test_submit_follow_download_tag_and_delete(server: dict, client: Client) -> None:
    out = client.predict(spec_yaml=QUICK + "max_steps: 6\nrun_name: api-quick\n", api_name="/submit")
    assert out["problems"] == [] and isinstance(out["run_id"], int)
    run_id = out["run_id"]
    run = _finished(client, run_id)
    assert run["status"] == "succeeded", run["error_summary"]
    assert run["current_step"] == 6 and run["has_bundle"] and "loss" in run["metric_names"]
    assert run["spec"]["max_steps"] == 6 and run["disk_bytes"] > 0

    loss = client.predict(run_id=run_id, names=["loss"], since_step=-1, api_name="/metrics")
    assert list(loss) == ["loss"] and [p["step"] for p in loss["loss"]] == [1, 2, 3, 4, 5, 6]
    later = client.predict(run_id=run_id, names=["loss"], since_step=4, api_name="/metrics")
    assert [p["step"] for p in later["loss"]] == [5, 6]
    assert {"loss", "learning_rate"} <= set(client.predict(run_id=run_id, api_name="/metrics"))
    samples = client.predict(run_id=run_id, api_name="/memory")
    assert samples and all(s["source"] for s in samples)
    # The worker samples until the training process has exited, which can be a moment after it marked the run
    # succeeded: compare `since` with every sample read after it, not with the first read.
    since = samples[len(samples) // 2]["time"]
    later = client.predict(run_id=run_id, since=since, api_name="/memory")
    every = client.predict(run_id=run_id, api_name="/memory")
    assert later and later == [s for s in every if s["time"] >= since][: len(later)]
    assert len(later) < len(every)

    path = Path(client.predict(run_id=run_id, api_name="/bundle"))
    with zipfile.ZipFile(path) as zf:
        assert {"adapter_model.safetensors", "adapter_config.json", "spec.yaml"} <= set(zf.namelist())

    tagged = client.predict(run_id=run_id, add=["api", "keep"], note="from a script", api_name="/tag")
    assert tagged["tags"] == ["api", "keep"] and tagged["note"] == "from a script"
    with pytest.raises(AppError, match=r"tags: `way!` is not a valid tag\. Fix: use 1-64 letters"):
        client.predict(run_id=run_id, add=["way!"], api_name="/tag")
    assert [r["id"] for r in client.predict(tag="keep", api_name="/runs")] == [run_id]
    assert [r["id"] for r in client.predict(search="API-QUICK", api_name="/runs")] == [run_id]
    assert run_id in [r["id"] for r in client.predict(status="succeeded", api_name="/runs")]

    (folder,) = server["home"].glob(f"runs/*/{run_id:06d}")  # runs/<database id>/<run id>
    assert folder.is_dir()
    gone = client.predict(run_id=run_id, api_name="/delete")
    assert gone["status"] == "deleted" and f"deleted run {run_id}" in gone["message"]
    assert not folder.exists() and run_id not in [r["id"] for r in client.predict(limit=1000, api_name="/runs")]


@pytest.mark.integration
@pytest.mark.slow
def test_cancel_resume_and_a_running_run_cannot_be_deleted(client: Client) -> None:
    out = client.predict(spec_yaml=QUICK + "max_steps: 5000\nsave_steps: 2\n", api_name="/submit")
    run_id = out["run_id"]
    run = wait_for(
        lambda: (
            (r := client.predict(run_id=run_id, api_name="/run"))["current_step"] >= 3
            or r["status"] not in ("queued", "running")
            and r
        ),
        timeout=300,
        interval=0.5,
        what="training reaches step 3",
    )
    assert run is True or run["status"] == "running", run
    with pytest.raises(AppError, match=rf"run_id: run {run_id} is running.*Fix: cancel it first"):
        client.predict(run_id=run_id, api_name="/delete")
    asked = client.predict(run_id=run_id, api_name="/cancel")
    assert asked["message"] == f"run {run_id}: cancel requested"
    assert _finished(client, run_id)["status"] == "cancelled"
    assert (
        client.predict(run_id=run_id, api_name="/cancel")["message"]
        == f"run {run_id} already cancelled; nothing to cancel"
    )
    resumed = client.predict(run_id=run_id, api_name="/resume")
    assert resumed["status"] == "queued" and "resumes from its checkpoint at step" in resumed["message"]
    assert client.predict(run_id=run_id, api_name="/cancel")["status"] in ("cancelled", "running")
    assert _finished(client, run_id)["status"] == "cancelled"
    with pytest.raises(AppError, match=r"has no bundle"):
        client.predict(run_id=run_id, api_name="/bundle")
    assert client.predict(run_id=run_id, api_name="/delete")["status"] == "deleted"


@pytest.mark.integration
@pytest.mark.slow
def test_the_api_doc_script_runs_as_written(server: dict, tmp_path: Path) -> None:
    page = (REPO / "docs" / "api.md").read_text()
    code = re.search(r"<!-- api-example:start -->\n```python\n(.*?)```\n<!-- api-example:end -->", page, re.S).group(1)
    assert len(code.splitlines()) <= 16
    local = 'Client("http://127.0.0.1:7860/", '
    assert local in code
    code = code.replace(local, f'Client("{server["url"]}", auth=("{USER}", "{PASSWORD}"), verbose=False, ')
    script = tmp_path / "follow.py"
    script.write_text(code)
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", "HF_HUB_OFFLINE": "1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    steps = [int(s) for s in re.findall(r"^step (\d+): loss \d", done.stdout, re.M)]
    assert steps == list(range(1, 21)), done.stdout  # examples/tiny-llama-quick.yaml: 20 steps, each once
    bundle = re.search(r"succeeded; bundle: (.+\.zip)$", done.stdout, re.M)
    assert bundle and zipfile.is_zipfile(bundle.group(1).strip())
