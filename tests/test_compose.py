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

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "docker-compose.yml"
DOCKER_COMPOSE = shutil.which("docker-compose")
needs_compose = pytest.mark.skipif(
    DOCKER_COMPOSE is None,
    reason="the docker-compose binary is not installed (./dev.sh test installs it with apt-get when root)",
)


def _compose(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    assert DOCKER_COMPOSE is not None
    return subprocess.run([DOCKER_COMPOSE, *args], cwd=cwd, capture_output=True, text=True, timeout=60)


@functools.cache
def _resolved() -> dict:
    """The compose file as docker-compose resolves it (anchors, variables), else as YAML."""
    if DOCKER_COMPOSE:
        out = _compose("config")
        assert out.returncode == 0, out.stderr
        return yaml.safe_load(out.stdout)
    return yaml.safe_load(COMPOSE.read_text())


@needs_compose
def test_compose_config_is_valid():
    out = _compose("config", "-q")
    assert out.returncode == 0, f"docker-compose config -q failed:\n{out.stderr}"


@needs_compose
def test_compose_validation_catches_a_misspelt_key(tmp_path: Path):
    # Guards the test above: a typo in the GPU reservation must fail validation.
    bad = COMPOSE.read_text().replace("capabilities:", "capabilites:")
    (tmp_path / "docker-compose.yml").write_text(bad)
    out = _compose("-f", str(tmp_path / "docker-compose.yml"), "config", "-q", cwd=tmp_path)
    assert out.returncode != 0
    assert "capabilites" in out.stderr


def test_worker_reserves_one_nvidia_gpu():
    worker = _resolved()["services"]["worker"]
    devices = worker["deploy"]["resources"]["reservations"]["devices"]
    assert len(devices) == 1
    (device,) = devices
    assert device["driver"] == "nvidia"
    assert int(device["count"]) == 1
    assert "gpu" in device["capabilities"]
    assert worker["command"][:2] == ["tunedeck", "worker"]


def test_ui_and_worker_share_one_named_volume_at_data():
    config = _resolved()
    services = config["services"]
    assert set(services) == {"ui", "worker"}
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
    assert mounts["ui"] == mounts["worker"]


def test_ui_is_published_on_loopback_only_with_a_healthcheck():
    ui = _resolved()["services"]["ui"]
    assert ui["command"][:2] == ["tunedeck", "serve"]
    assert "--no-worker" in ui["command"]
    assert "0.0.0.0" in ui["command"]
    ports = [str(p) for p in ui["ports"]]
    assert ports and all(p.startswith("127.0.0.1:7860:7860") for p in ports)
    assert ui["healthcheck"]["test"]
    assert "deploy" not in ui, "the UI needs no GPU"


def test_dockerfile_installs_cuda_torch_from_a_build_arg():
    text = (ROOT / "Dockerfile").read_text()
    assert text.startswith("#") and "FROM python:3.11-slim" in text
    assert "ARG TORCH_SPEC" in text and "ARG TORCH_INDEX_URL" in text
    compose_args = yaml.safe_load(COMPOSE.read_text())["x-tunedeck"]["build"]["args"]
    assert set(compose_args) == {"TORCH_SPEC", "TORCH_INDEX_URL"}
