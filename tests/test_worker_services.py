"""The worker's services: where a request may be carried out, and a service that fails to start."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from jobs.worker.services import Place, run_host, shared_data, start_all, stop_all, weights_here


@dataclass
class FakeRun:
    worker_id: str | None


@dataclass
class Recorder:
    name: str
    events: list[str] = field(default_factory=list)

    def start(self) -> None:
        self.events.append(f"{self.name} start")

    def stop(self) -> None:
        self.events.append(f"{self.name} stop")


def place(**kw: Any) -> Place:
    return replace(Place(None, "gpu-a:12", "gpu-a", "0", False, False), **kw)  # type: ignore[arg-type]


def test_weights_are_where_the_run_trained_unless_the_data_folder_is_shared() -> None:
    here = FakeRun("gpu-a:4242")
    there = FakeRun("gpu-b:7")
    assert run_host(there) == "gpu-b"  # type: ignore[arg-type]
    assert weights_here(here, place())  # type: ignore[arg-type]
    assert not weights_here(there, place())  # type: ignore[arg-type]
    assert not weights_here(FakeRun(None), place())  # type: ignore[arg-type]  # never trained: no weights
    assert weights_here(there, place(shared_data=True))  # type: ignore[arg-type]


@pytest.mark.parametrize(("value", "shared"), [("1", True), ("yes", True), ("0", False), ("", False)])
def test_shared_data_setting(monkeypatch: pytest.MonkeyPatch, value: str, shared: bool) -> None:
    monkeypatch.setenv("TUNEDECK_SHARED_DATA", value)
    assert shared_data() is shared


def test_a_service_that_fails_to_start_is_left_out_and_the_others_run() -> None:
    events: list[str] = []

    def broken(_: Place) -> Recorder:
        raise RuntimeError("no model here")

    started = start_all(place(), [lambda p: Recorder("export", events), broken, lambda p: Recorder("chat", events)])
    assert [s.name for s in started] == ["export", "chat"]
    stop_all(started)
    assert events == ["export start", "chat start", "export stop", "chat stop"]
