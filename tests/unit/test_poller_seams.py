"""The poll loop's outcomes, in-process (issue 24): what one poll does with each kind of IMDS answer.

The poller is the real one (bridge.agent.poller) with a real outbox and baseline in a temporary
directory; only its IMDS client is a stand-in that plays back scripted answers, because the seams
tested here (an answer whose bytes differ but whose content does not, an outbox that refuses a
record, then has room again) cannot be produced on demand through the emulator. The emulator and
the real IMDS protocol are covered by tests/integration (test_agent, test_emulator).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from helpers import event

from bridge.agent.identity import IdentityResolver
from bridge.agent.metrics import AgentMetrics
from bridge.agent.poller import Poller
from bridge.agent.state import BaselineStore, IdentityCache
from bridge.imds.client import ImdsError, ImdsResponse
from bridge.pipeline import Outbox, OutboxFull


class ScriptedImds:
    """An IMDS client answering from a script: bytes (a 200 with that body) or an ImdsError."""

    def __init__(self) -> None:
        self.script: list[bytes | ImdsError] = []

    def get_scheduled_events(self) -> ImdsResponse:
        step = self.script.pop(0)
        if isinstance(step, ImdsError):
            raise step
        return ImdsResponse(200, step, time.time(), time.monotonic())

    def get_instance(self) -> Any:
        raise ImdsError("connection", "not asked in these tests")


def body(incarnation: int, *events: dict[str, Any], indent: bool = False) -> bytes:
    document = {"DocumentIncarnation": incarnation, "Events": list(events)}
    return orjson.dumps(document, option=orjson.OPT_INDENT_2 if indent else 0)


@pytest.fixture
def rig(tmp_path: Path) -> tuple[Poller, ScriptedImds, Outbox]:
    imds = ScriptedImds()
    metrics = AgentMetrics()
    outbox = Outbox(tmp_path / "outbox", ["file"], max_records=2)
    identity = IdentityResolver(imds, IdentityCache(tmp_path), metrics)  # type: ignore[arg-type]
    poller = Poller(
        imds,  # type: ignore[arg-type]
        outbox,
        BaselineStore(tmp_path),
        identity,
        metrics,
        api_version="2020-07-01",
    )
    return poller, imds, outbox


def records(outbox: Outbox) -> list[dict[str, Any]]:
    return [orjson.loads(entry.payload) for entry in outbox.read(0)]


def test_each_answer_gives_its_outcome_and_only_a_change_is_recorded(rig: Any) -> None:
    poller, imds, outbox = rig
    first, same_content = body(1, event("a")), body(1, event("a"), indent=True)
    imds.script = [
        first,  # the first document: a record
        first,  # the same bytes: not even parsed
        same_content,  # other bytes, same document: no record
        b'{"DocumentIncarnation": "x"}',  # not a Scheduled Events document: kept state
        ImdsError("http_5xx", "IMDS answered 503", status=503),
        body(2, event("a", "Started")),  # a change: a record
    ]
    outcomes = [poller.poll_once() for _ in range(6)]
    assert outcomes == ["changed", "unchanged", "unchanged", "invalid", "error", "changed"]
    assert [r["documentIncarnation"] for r in records(outbox)] == [1, 2]
    assert [c["change"] for c in records(outbox)[1]["changes"]] == ["started"]
    assert poller.baseline is not None and poller.baseline.incarnation == 2
    assert poller.metrics.document_errors.labels("bad_incarnation")._value.get() == 1
    assert poller.metrics.poll_errors.labels("http_5xx")._value.get() == 1


def test_a_change_the_outbox_refuses_is_held_and_recorded_as_the_net_change_once_there_is_room(
    rig: Any,
) -> None:
    """``full``: the baseline and the last body are kept, so the next poll (even of the same bytes)
    tries again, and what is recorded then is the change from the last admitted document."""
    poller, imds, outbox = rig
    imds.script = [
        body(1),
        body(2, event("a")),
        body(3, event("a", "Started")),
        body(3, event("a", "Started")),
    ]
    assert poller.poll_once() == "changed"
    assert poller.poll_once() == "changed"
    assert poller.poll_once() == "full"  # max_records=2: nothing delivered yet, no room
    assert poller.baseline is not None and poller.baseline.incarnation == 2
    outbox.ack("file", outbox.read(0)[-1].seq)  # the sink delivered both: room again
    assert poller.poll_once() == "changed"  # the same bytes as the refused poll: tried again
    (last,) = records(outbox)[-1:]
    assert last["previousIncarnation"] == 2 and last["documentIncarnation"] == 3
    assert [c["change"] for c in last["changes"]] == ["started"]


def test_an_outbox_that_refuses_never_loses_the_previous_state(rig: Any, monkeypatch: Any) -> None:
    poller, imds, outbox = rig
    imds.script = [body(1, event("a")), body(2)]
    assert poller.poll_once() == "changed"

    def refuse(*_: Any, **__: Any) -> Any:
        raise OutboxFull("no room")

    monkeypatch.setattr(outbox, "append", refuse)
    assert poller.poll_once() == "full"
    assert poller.baseline is not None and poller.baseline.incarnation == 1
    assert poller.current is not None and poller.current.document.incarnation == 2  # seen, not recorded


def test_a_freeze_the_monotonic_clock_did_not_see_is_measured_on_the_wall_clock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On Azure (Hyper-V's reference TSC page) a frozen guest's CLOCK_MONOTONIC stands still and the
    pause shows on CLOCK_REALTIME once time sync steps it (bridge.agent.impact). The sentinel's clocks
    are scripted here (a guest cannot be frozen on this machine): the impact record names realtime."""
    import threading

    from helpers import VM, doc

    from bridge.agent import impact
    from bridge.agent.diff import Change

    def reading(n: int) -> dict[str, float]:  # the wall clock stepped by 3 s at the fourth reading
        steady = 10.0 + 0.05 * n
        return {"monotonic": steady, "boottime": steady, "realtime": 990.0 + steady + (3.0 if n >= 3 else 0)}

    readings = iter([reading(n) for n in range(10)])
    last = reading(9)
    monkeypatch.setattr(impact, "_clocks", lambda: next(readings, last))
    records: list[Any] = []
    outbox = type("Box", (), {"append": lambda self, meta, payload: records.append(orjson.loads(payload))})()
    meter = impact.ImpactMeter(tmp_path, outbox, lambda: VM, boot_id_file=tmp_path / "none")  # type: ignore[arg-type]
    event_id = "0E000000-0000-4000-8000-00000000F00E"
    started = doc(2, event(event_id, "Started"))
    meter.on_change(None, started, [Change(event_id, "started", "Freeze", "Scheduled", "Started")])
    threading.Event().wait(0.6)  # the sentinel reads the ten scripted readings
    meter.on_change(started, doc(3), [Change(event_id, "completed", "Freeze", "Started", None)])
    meter.close()
    (record,) = records
    assert record["pauseClock"] == "realtime" and abs(record["pauseSeconds"] - 3.0) < 0.01
    assert record["gapsSeconds"]["monotonic"] == 0.0
