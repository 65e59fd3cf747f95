"""docker-compose.yml is valid and keeps its promises: a GPU for the worker, one shared volume.

`docker-compose config -q` validates the file offline (no engine needed); `./dev.sh test`
installs Debian's docker-compose when it is missing, so CI runs these.

    .venv/bin/python -m pytest tests/test_compose.py -q
"""

from __future__ import annotations

import functools
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from engines import engine_missing

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "docker-compose.yml"
DOCKER_COMPOSE = shutil.which("docker-compose")


@pytest.fixture
def docker_compose() -> str:
    """The docker-compose binary; skips without it (fails on CI: tests/engines.py)."""
    if DOCKER_COMPOSE is None:
        engine_missing("the docker-compose binary is not installed (./dev.sh test installs it with apt-get when root)")
    return DOCKER_COMPOSE


needs_compose = pytest.mark.usefixtures("docker_compose")


PROFILES = ("--profile", "gpu1", "--profile", "postgres")  # every service, whatever its profile


def _compose(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    assert DOCKER_COMPOSE is not None
    return subprocess.run([DOCKER_COMPOSE, *args], cwd=cwd, capture_output=True, text=True, timeout=60)


@functools.cache
def _resolved() -> dict:
    """The compose file as docker-compose resolves it (anchors, variables, all profiles), else as YAML."""
    if DOCKER_COMPOSE:
        out = _compose(*PROFILES, "config")
        assert out.returncode == 0, out.stderr
        return yaml.safe_load(out.stdout)
    return yaml.safe_load(COMPOSE.read_text())


@needs_compose
def test_compose_config_is_valid():
    for profiles in ((), PROFILES):
        out = _compose(*profiles, "config", "-q")
        assert out.returncode == 0, f"docker-compose {' '.join(profiles)} config -q failed:\n{out.stderr}"


@needs_compose
def test_compose_validation_catches_a_misspelt_key(tmp_path: Path):
    # Guards the test above: a typo in the GPU reservation must fail validation.
    bad = COMPOSE.read_text().replace("capabilities:", "capabilites:")
    (tmp_path / "docker-compose.yml").write_text(bad)
    out = _compose("-f", str(tmp_path / "docker-compose.yml"), "config", "-q", cwd=tmp_path)
    assert out.returncode != 0
    assert "capabilites" in out.stderr


@pytest.mark.parametrize(("service", "gpu"), [("worker", "0"), ("worker-gpu1", "1")])
def test_each_worker_reserves_its_own_nvidia_gpu(service: str, gpu: str):
    worker = _resolved()["services"][service]
    devices = worker["deploy"]["resources"]["reservations"]["devices"]
    assert len(devices) == 1
    (device,) = devices
    assert device["driver"] == "nvidia"
    assert [str(i) for i in device["device_ids"]] == [gpu]
    assert "gpu" in device["capabilities"]
    # The container sees only its GPU, as index 0: the worker pins its children to it.
    assert worker["command"] == ["tunedeck", "worker", "--device", "0"]


def test_postgres_service_is_optional_with_a_healthcheck_and_a_named_volume():
    config = _resolved()
    pg = config["services"]["postgres"]
    assert pg["profiles"] == ["postgres"]
    assert "pg_isready" in " ".join(pg["healthcheck"]["test"])
    (volume,) = pg["volumes"]
    source = volume["source"] if isinstance(volume, dict) else str(volume).split(":")[0]
    assert source in set(config.get("volumes") or {})
    assert config["services"]["worker-gpu1"]["profiles"] == ["gpu1"]
    for name in ("ui", "worker", "worker-gpu1"):  # one setting points them all at PostgreSQL
        assert "TUNEDECK_DATABASE_URL" in config["services"][name]["environment"]


def test_ui_and_worker_share_one_named_volume_at_data():
    config = _resolved()
    services = {k: v for k, v in config["services"].items() if k != "postgres"}
    assert set(services) == {"ui", "worker", "worker-gpu1"}
    named = set(config.get("volumes") or {})
    mounts = {}
    for name, service in services.items():
        (volume,) = [v for v in service["volumes"] if str(v).split(":")[1] == "/data"]
        source = str(volume).split(":")[0]
        assert source in named, f"{name}: /data must be a named volume, got {volume}"
        mounts[name] = source
        env = service["environment"]
        assert env["TUNEDECK_HOME"] == "/data"
        assert env["HF_HOME"] == "/data/hf"
        assert service.get("restart") in {"unless-stopped", "always", "on-failure"}
    assert mounts["ui"] == mounts["worker"] == mounts["worker-gpu1"]


def test_ui_is_published_on_loopback_only_with_a_healthcheck():
    ui = _resolved()["services"]["ui"]
    assert ui["command"][:2] == ["tunedeck", "serve"]
    assert "--no-worker" in ui["command"]
    assert "0.0.0.0" in ui["command"]
    ports = [str(p) for p in ui["ports"]]
    assert ports and all(p.startswith("127.0.0.1:7860:7860") for p in ports)
    assert ui["healthcheck"]["test"]
    assert "deploy" not in ui, "the UI needs no GPU"


def test_exports_and_pushes_run_on_the_workers_which_share_the_data_and_hold_the_token():
    services = _resolved()["services"]
    for name in ("ui", "worker", "worker-gpu1"):  # any worker may export any run of the shared volume
        assert services[name]["environment"]["TUNEDECK_SHARED_DATA"] == "1"
        assert services[name]["environment"]["TUNEDECK_HOME"] == "/data"
    assert "HF_TOKEN" not in services["ui"]["environment"], "the UI never pushes: no token there"
    assert "HF_TOKEN" in services["worker"]["environment"] and "HF_TOKEN" in services["worker-gpu1"]["environment"]


def test_dockerfile_installs_cuda_torch_from_a_build_arg():
    text = (ROOT / "Dockerfile").read_text()
    assert text.startswith("#") and "FROM python:3.11-slim" in text
    assert "ARG TORCH_SPEC" in text and "ARG TORCH_INDEX_URL" in text
    compose_args = yaml.safe_load(COMPOSE.read_text())["x-tunedeck"]["build"]["args"]
    assert set(compose_args) == {"TORCH_SPEC", "TORCH_INDEX_URL"}
