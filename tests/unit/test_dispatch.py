"""Decisions in flight, in-process (issue 24): dispatch order and the batch path's failure seams.

Real parts: the lanes, commits and claims (bridge.approver.dispatch), the decision life
(bridge.approver.lifecycle) with its real relayer, decision store, audit writer and outbox on disk.
Stand-in: the relay client, which answers from a script, because "the relay request raised for the
whole batch" and "the store's sync failed for the batch" are seams no agent produces on demand. The
relay protocol itself is tested against real agents in tests/integration/test_approver.py.
"""

from __future__ import annotations

import errno
import threading
from pathlib import Path
from typing import Any

import orjson
import pytest

from bridge.approver import lifecycle
from bridge.approver.auditing import AuditWriter
from bridge.approver.dispatch import Claims, Lanes, OrderedCommits, Slot
from bridge.approver.lifecycle import DecisionLife
from bridge.approver.metrics import ApproverMetrics
from bridge.approver.relaying import Relayer
from bridge.approver.routing import LocalRouter, RelayUnavailable
from bridge.approver.store import DecisionStore
from bridge.decisions import ValidationPolicy, new_decision, sign
from bridge.pipeline import Outbox
from bridge.relay_api import EventResult, RelayAnswer
from bridge.signing import KeyRing
from bridge.streams import Message, Position

KEY = b"k" * 40
EVENTS = [f"00000000-0000-0000-0000-00000000000{n}" for n in range(1, 5)]


def message(partition: str, number: int) -> Message:
    return Message(b"{}", Position(partition, number))


# -- commits in read order, per partition -----------------------------------------------------------


def test_commits_follow_read_order_per_partition_and_a_stuck_one_holds_only_its_own() -> None:
    committed: list[str] = []
    commits = OrderedCommits(lambda ms: committed.extend(str(m.position) for m in ms))
    a = [commits.track(message("d/0", n)) for n in range(3)]
    b = [commits.track(message("d/1", n)) for n in range(2)]
    commits.finished(a[2])
    commits.finished(a[1])
    commits.finished(b[0])
    commits.finished(b[1])
    commits.commit_ready()
    assert committed == ["d/1@0", "d/1@1"]  # d/0@0 is still in flight: nothing of d/0 moves
    commits.finished(a[0])
    commits.commit_ready()
    assert committed[2:] == ["d/0@0", "d/0@1", "d/0@2"]
    assert commits.pending == 0


# -- lanes: FIFO per VM, bounded in flight, a failing drain does not end its lane -------------------


def test_a_lane_drains_in_arrival_order_and_survives_a_failing_batch() -> None:
    seen: list[int] = []
    done = threading.Event()

    def drain(lane: str, slots: list[Slot]) -> None:
        numbers = [s.message.position.number for s in slots]
        seen.extend(numbers)
        if 3 in numbers:
            raise RuntimeError("a bug in one batch")
        if 9 in numbers:
            done.set()

    lanes = Lanes(drain, workers=4, max_in_flight=100, batch=2, per_lane=1)
    stop = threading.Event()
    for n in range(10):
        assert lanes.add("vm1", Slot(message("d/0", n)), stop)
    assert done.wait(5)
    lanes.close()
    assert seen == list(range(10))


def test_reading_stops_while_max_in_flight_are_unfinished() -> None:
    release = threading.Event()
    lanes = Lanes(lambda lane, slots: release.wait(5), workers=2, max_in_flight=2, batch=1)
    stop = threading.Event()
    assert lanes.add("vm1", Slot(message("d/0", 0)), stop)
    assert lanes.add("vm2", Slot(message("d/0", 1)), stop)
    stop.set()  # the third waits for room; a stop ends the wait without queuing it
    assert lanes.add("vm3", Slot(message("d/0", 2)), stop) is False
    release.set()
    lanes.close()


def test_a_claimed_decision_id_waits_for_its_holder() -> None:
    claims, stop = Claims(), threading.Event()
    assert claims.claim("d1") and not claims.claim("d1")
    threading.Timer(0.05, claims.release, args=("d1",)).start()
    assert claims.wait_released("d1", stop)
    assert claims.claim("d1")


# -- the batch path's failure seams -----------------------------------------------------------------


class ScriptedRelay:
    """A relay client: each call takes the next step (an exception to raise, or "answer")."""

    def __init__(self, *steps: Any) -> None:
        self.steps = list(steps)
        self.calls: list[list[str]] = []

    def start_requests_many(self, url: str, bodies: list[dict[str, Any]]) -> list[RelayAnswer]:
        self.calls.append([b["decisionId"] for b in bodies])
        step = self.steps.pop(0) if self.steps else "answer"
        if isinstance(step, BaseException):
            raise step
        return [
            RelayAnswer(b["decisionId"], "approved", None, (EventResult(b["eventIds"][0], "approved"),))
            for b in bodies
        ]


class Rig:
    def __init__(self, tmp_path: Path, relay: ScriptedRelay) -> None:
        self.stop = threading.Event()
        self.committed: list[str] = []
        self.commits = OrderedCommits(lambda ms: self.committed.extend(str(m.position) for m in ms))
        (tmp_path / "state").mkdir()
        self.store = DecisionStore(tmp_path / "state")
        self.outbox = Outbox(tmp_path / "outbox", ["audit"])
        metrics = ApproverMetrics()
        router = LocalRouter("http://agent.invalid")
        self.relay = relay
        self.life = DecisionLife(
            policy=ValidationPolicy(KeyRing({"ops": KEY})),
            router=router,
            relayer=Relayer(router, relay, attempts=1, stop_event=self.stop),  # type: ignore[arg-type]
            store=self.store,
            audit=AuditWriter(self.outbox, self.store, metrics, self.stop),
            commits=self.commits,
            metrics=metrics,
            stop_event=self.stop,
        )

    def slots(self) -> list[Slot]:
        decisions = [sign(new_decision(e, "vm1", "tests", 600), "ops", KEY) for e in EVENTS]
        return [
            self.commits.track(Message(orjson.dumps(d), Position("d/0", n))) for n, d in enumerate(decisions)
        ]

    def outcomes(self) -> list[str]:
        return [orjson.loads(e.payload)["outcome"] for e in self.outbox.read(0)]


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    class Quick:
        def __init__(self, **_: Any) -> None: ...

        def next_delay(self, *_: Any) -> float:
            return 0.01

    monkeypatch.setattr(lifecycle, "Backoff", Quick)


def test_a_relay_that_raises_for_the_batch_sends_each_decision_its_own_way_once(tmp_path: Path) -> None:
    rig = Rig(tmp_path, ScriptedRelay(RuntimeError("a bug in the relay client")))
    slots = rig.slots()
    rig.life.drain_lane("vm1", slots)
    rig.commits.commit_ready()
    assert rig.relay.calls[0] == [orjson.loads(s.message.payload)["decisionId"] for s in slots]
    assert all(len(call) == 1 for call in rig.relay.calls[1:])  # then one at a time
    assert rig.outcomes() == ["approved"] * 4
    assert rig.committed == [f"d/0@{n}" for n in range(4)]


def test_a_store_that_cannot_sync_the_batch_is_waited_out_decision_by_decision(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rig = Rig(tmp_path, ScriptedRelay())
    real_sync, failures = rig.store.sync, [OSError(errno.EIO, "Input/output error")] * 2

    def sync() -> None:
        if failures:
            raise failures.pop()
        real_sync()

    monkeypatch.setattr(rig.store, "sync", sync)
    rig.life.drain_lane("vm1", rig.slots())
    rig.commits.commit_ready()
    assert rig.outcomes() == ["approved"] * 4  # one audit record each, none lost, none twice
    assert rig.committed == [f"d/0@{n}" for n in range(4)]
    assert not rig.relay.calls or all(len(c) <= 4 for c in rig.relay.calls)


def test_a_decision_alone_raises_what_a_batch_would_send_on(tmp_path: Path) -> None:
    rig = Rig(tmp_path, ScriptedRelay(RuntimeError("a bug in the relay client")))
    (slot,) = rig.slots()[:1]
    with pytest.raises(RuntimeError):
        rig.life.process(slot.message, slot=slot)
    assert rig.outcomes() == []  # nothing audited: the caller (handle) retries it
    assert rig.life.handle(slot) is True  # the retrying way ends it
    assert rig.outcomes() == ["approved"]


def test_a_decision_no_agent_answered_is_parked_uncommitted_with_its_decision(tmp_path: Path) -> None:
    rig = Rig(tmp_path, ScriptedRelay(RelayUnavailable("connection refused", never_sent=True)))
    (slot,) = rig.slots()[:1]
    rig.life.drain_lane("vm1", [slot])
    rig.commits.commit_ready()
    assert rig.committed == [] and rig.outcomes() == []
    assert rig.life.parking.count == 1
    assert slot.decision is not None and slot.decision.event_id == EVENTS[0]
    assert slot.unreached == 1 and not slot.maybe_sent


def test_the_standbys_copy_leaves_arm_to_the_owner_and_is_dropped_once_the_owner_finished(
    tmp_path: Path,
) -> None:
    """Issue 33: an event whose only VM's agent is dead, fleet approvers with --arm fallback: the
    owner fell back to ARM after ~1.5 s, the standby (after 1 s) did too, and every such approval was
    acknowledged twice with two audits. The standby's copy now waits STANDBY_ARM_EXTRA more rounds,
    never falls back once the owner finished, and is then dropped unaudited (retry or expiry)."""
    rig = Rig(tmp_path, ScriptedRelay())
    finished: set[str] = set()
    rig.life.owner_finished = lambda m: str(m.position) in finished
    owner_slot, standby_slot = rig.slots()[:2]
    standby_slot.standby = True
    decision = lifecycle.Decision("d-1", EVENTS[0], "vm1", "ops")
    owner = lifecycle.Prepared(0, owner_slot, decision, {})
    standby = lifecycle.Prepared(1, standby_slot, decision, {})
    owner_slot.unreached = standby_slot.unreached = lifecycle.ARM_AFTER - 1
    assert rig.life.parked.may_fall_back([owner]) is True
    assert rig.life.parked.may_fall_back([standby]) is False  # the owner's turn first
    standby_slot.unreached = lifecycle.ARM_AFTER + lifecycle.STANDBY_ARM_EXTRA - 1
    assert rig.life.parked.may_fall_back([standby]) is True  # the owner is gone, after all
    finished.add(str(standby_slot.message.position))
    assert rig.life.parked.may_fall_back([standby]) is False  # the owner did it: never a second ARM call
    assert rig.life.parked.resubmit(standby_slot) is True and standby_slot.done  # dropped, not relayed again
    rig.life.parked.expire(standby_slot)
    assert rig.outcomes() == []  # no audit of its own: the owner's is the decision's one outcome
