"""``se-bridge demo``: the whole product on this machine, no cloud account, in about a minute.

Act 1, forwarding: it starts the IMDS emulator (every scenario of the ``tour``, at 60x speed) and a
real agent with a file sink, in this process, and prints each change as the agent records it.

Act 2, the approval loop the product exists for: a user-initiated Reboot appears; a decision is
signed and published with ``se-bridge decide`` (a subprocess, the ops tool itself) to a decisions
file; the approver (in this process, embedded defaults: file decisions, file audit sink, signed relay
requests) validates it and relays it to the agent; the agent posts the StartRequest; the emulator
starts and completes the event; both audit records arrive. Printed as one timeline.

What it leaves behind in the output directory is what an operator would find on a VM:
``records.jsonl`` (the agent's records, schema-valid), ``decisions.jsonl``, ``audit.jsonl`` (the
approver's audit records), ``agent.log`` (both services' JSON logs), ``keys/`` and the state
directories.
"""

from __future__ import annotations

import logging
import secrets
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from bridge.agent.config import AgentConfig
from bridge.agent.service import Agent
from bridge.approver.build import build_approver
from bridge.approver.config import ApproverConfig
from bridge.imds.emulator import EmulatorServer
from bridge.records.approval import Approval
from bridge.records.fields import Refused
from bridge.records.impact import Impact
from bridge.records.reader import Reader, Record
from bridge.records.scheduled_events import EventView, ScheduledEvents
from bridge.support.fsutil import ensure_private_dir, write_atomic
from bridge.support.observability import setup_logging
from bridge.support.timeutil import epoch_of

MAX_SECONDS = 120.0


def run_demo(output: Path, *, speed: float = 60.0, scenario: str = "tour") -> int:
    output = output.resolve()
    if output.exists():
        shutil.rmtree(output)  # a demo starts from scratch: no baseline, no outbox
    output.mkdir(parents=True)
    records_path = output / "records.jsonl"
    log_file = open(output / "agent.log", "w", encoding="utf-8")  # noqa: SIM115 - closed in finally
    setup_logging("info", stream=log_file)

    # Held transitions: every state of the accelerated timeline is seen by the agent's polls, however
    # slow or busy the machine (a 60x Started state lasts a second, 120x half of one).
    emulator = EmulatorServer(port=0, scenario="idle", speed=speed, hold_until_served=True).start()
    keys = _make_keys(output / "keys")
    config = AgentConfig(
        imds_url=emulator.url,
        sink=(f"file://{records_path}",),
        state_dir=output / "state",
        poll_interval=0.25,  # the tour's Spot eviction has 0.5 s of notice at 60x
        listen="127.0.0.1:0",
        shutdown_timeout=5.0,
        relay_key=(f"relay={keys['relay']}",),
        decision_key=(f"ops={keys['ops.pub']}",),
    )
    agent = Agent(config)
    poller = threading.Thread(target=agent.poller.run, args=(agent.stop_event,), name="poller", daemon=True)
    started = time.monotonic()
    try:
        agent.start()
        poller.start()
        api = agent.api.address if agent.api else None
        _say(f"IMDS emulator  {emulator.url}  (scenario {scenario!r} at {speed:g}x)")
        if api:
            _say(f"agent API      http://{api[0]}:{api[1]}/metrics  /readyz  /v1/document")
        _say(f"records        {records_path}\n")
        _say(f"{'time':>7}  {'inc':>4}  {'change':<21} {'type':<9} {'source':<8} {'event':<10} note")
        forwarded = forwarding_act(emulator, records_path, scenario, speed, started)
        approved = approval_act(output, emulator, agent, keys, started) and forwarded
    except KeyboardInterrupt:
        _say("\ninterrupted")
        approved = False
    finally:
        agent.stop_event.set()
        poller.join(5)
        agent.shutdown()
        emulator.stop()
        logging.getLogger().handlers.clear()
        log_file.close()
    code = _summary(_read(records_path), records_path, time.monotonic() - started)
    if code != 0:
        _say("DEMO FAILED: records missing or not valid")
    return code if approved else 1


def forwarding_act(
    emulator: EmulatorServer, records_path: Path, scenario: str, speed: float, started: float
) -> bool:
    """Act 1: the tour's scenarios, each change printed as the agent records it. False when the
    scenario did not play to its end within the demo's time."""
    printed = 0
    seen: dict[str, EventView] = {}
    while not _read(records_path):  # the first observation: the empty document
        time.sleep(0.05)
    emulator.state.start_scenario(scenario, speed)
    quiet_since: float | None = None
    while time.monotonic() - started < MAX_SECONDS:
        records = _read(records_path)
        for record in records[printed:]:
            _print_record(record, time.monotonic() - started, seen)
        printed = len(records)
        snap = emulator.state.snapshot()
        documents = [r for r in records if isinstance(r, ScheduledEvents)]
        done = snap["pendingSteps"] == 0 and not snap["events"] and documents and not documents[-1].events
        quiet_since = (quiet_since or time.monotonic()) if done else None
        if quiet_since and time.monotonic() - quiet_since > 1.0:
            return True
        time.sleep(0.1)
    _say(f"DEMO FAILED: the {scenario!r} scenario did not end within {MAX_SECONDS:g} s")
    return False


def _make_keys(directory: Path) -> dict[str, Path]:
    """The decision key pair (``ops``: the private key signs, the public one proves, at the approver
    and again at the agent) and the relay key the approver and the agent share."""
    from bridge.decisions import generate_key_pair

    ensure_private_dir(directory)
    private, public = generate_key_pair()
    out = {"ops": directory / "ops.key", "ops.pub": directory / "ops.pub", "relay": directory / "relay.key"}
    write_atomic(out["ops"], private)
    write_atomic(out["ops.pub"], public)
    write_atomic(out["relay"], secrets.token_hex(32).encode())
    return out


def approval_act(
    output: Path, emulator: EmulatorServer, agent: Agent, keys: dict[str, Path], started: float
) -> bool:
    """Act 2 (see the module docstring). Returns whether the loop closed: approved, started,
    completed, and both audit records written."""
    decisions, audit = output / "decisions.jsonl", output / "audit.jsonl"
    decisions.touch()
    assert agent.api is not None
    host, port = agent.api.address
    approver = build_approver(
        ApproverConfig(
            source=f"file://{decisions}",
            sink=(f"file://{audit}",),
            relay=f"http://{host}:{port}",
            state_dir=output / "approver-state",
            key=(f"ops={keys['ops.pub']}",),
            relay_key=(f"relay={keys['relay']}",),
            listen="127.0.0.1:0",
        )
    )
    runner = threading.Thread(target=approver.run, kwargs={"install_signals": False}, daemon=True)
    runner.start()
    timeline = Timeline(started)
    records = output / "records.jsonl"
    try:
        _say("\n-- act 2: the approval loop (decision -> approver -> relay -> IMDS StartRequest) --")
        event_id = emulator.state.add_event(
            event_type="Reboot", event_source="User", duration=20, started_seconds=60
        )
        timeline.event = event_id
        if not timeline.wait("agent", "scheduled", lambda: _change(records, event_id, "scheduled")):
            return timeline.close()
        published = _decide(decisions, keys["ops"], event_id, agent.identity.current.name or "")
        decision_id = published["decisionId"]
        # The decision's own time: with the approver woken by the write, the StartRequest can come
        # before ``decide`` has even exited, so the time the demo got its answer is too late.
        signed = epoch_of(published["issuedAt"]) or time.time()
        timeline.note(signed, "ops", f"se-bridge decide: decision {decision_id[:8]} signed, published")
        timeline.wait("emulator", "StartRequest received", lambda: _start_request(emulator, event_id))
        timeline.wait("agent", "relay: StartRequest posted", lambda: _audit(records, decision_id, "agent"))
        timeline.wait("approver", "approved", lambda: _audit(audit, decision_id, "approver"))
        timeline.wait("agent", "started", lambda: _change(records, event_id, "started"))
        timeline.wait("agent", "completed", lambda: _change(records, event_id, "completed"))
        return timeline.close()
    finally:
        approver.stop_event.set()
        runner.join(20)


class Timeline:
    """Act 2's steps, each stamped with the time its own record gives (not when the demo noticed it),
    printed in that order once every step was seen or waited for."""

    def __init__(self, started: float) -> None:
        self.started_wall = time.time() - (time.monotonic() - started)
        self.event = ""
        self.steps: list[tuple[float, str, str]] = []
        self.missed: list[str] = []

    def note(self, at: float, actor: str, what: str) -> None:
        self.steps.append((at, actor, what))

    def wait(self, actor: str, what: str, found: Callable[[], float | None], timeout: float = 30.0) -> bool:
        """Wait for a step; ``found`` returns the step's own Unix time once it happened."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            at = found()
            if at is not None:
                self.note(at, actor, what)
                return True
            time.sleep(0.05)
        self.missed.append(what)
        self.note(time.time(), actor, f"{what}: NOT SEEN within {timeout:g} s")
        return False

    def close(self) -> bool:
        """Print the steps in the order they happened; True when none was missed."""
        for at, actor, what in sorted(self.steps):
            _say(f"{at - self.started_wall:6.1f}s  {actor:<9} {self.event[:8]}  {what}")
        if self.missed:
            _say(f"DEMO FAILED: not seen: {', '.join(self.missed)}")
        return not self.missed


def _decide(decisions: Path, key: Path, event_id: str, target: str) -> dict[str, Any]:
    command = [sys.executable, "-m", "bridge", "decide", "--sink", f"file://{decisions}",
               "--event-id", event_id, "--target", target, "--key-id", "ops", "--key-file", str(key),
               "--reason", "demo: approved by the on-call engineer"]  # fmt: skip
    proc = subprocess.run(command, capture_output=True, text=True, timeout=60, check=True)
    result: dict[str, Any] = orjson.loads(proc.stdout)
    return result


def _change(path: Path, event_id: str, change: str) -> float | None:
    """When the agent observed ``change`` of the event (its record's ``observedAt``), or None."""
    for r in _read(path):
        if isinstance(r, ScheduledEvents) and any(
            c.event_id == event_id and c.change == change for c in r.changes
        ):
            return r.observed_at
    return None


def _audit(path: Path, decision_id: str, component: str) -> float | None:
    """When ``component`` (the agent's relay or the approver) audited the decision approved, or None."""
    for a in _read(path):
        if isinstance(a, Approval) and (a.decision_id, a.component, a.outcome) == (
            decision_id,
            component,
            "approved",
        ):
            return a.observed_at
    return None


def _start_request(emulator: EmulatorServer, event_id: str) -> float | None:
    log = emulator.state.snapshot()["startRequestLog"]
    return next((float(p["at"]) for p in log if event_id in p["eventIds"]), None)


def _read(path: Path) -> list[Record | Refused]:
    """The agent's records file, each line read as any consumer reads a record (typed, its schema
    checked: a violation is a Refused, which the summary counts)."""
    reader = Reader()
    try:
        lines = path.read_bytes().splitlines()
    except FileNotFoundError:
        return []
    return [r for r in (reader.read_bytes(line) for line in lines if line.strip()) if r is not None]


def _print_record(record: Record | Refused, elapsed: float, seen: dict[str, EventView]) -> None:
    """One line per transition; ``seen`` remembers events so a gone one still shows its source."""
    if isinstance(record, Impact):
        _print_impact(record, elapsed)
        return
    if not isinstance(record, ScheduledEvents):
        return
    events = {e.event_id: e for e in record.events}
    seen.update(events)
    if not record.changes:
        note = "first observation" if record.previous_incarnation is None else "document changed"
        _say(f"{elapsed:6.1f}s  {record.incarnation:>4}  {'(no event changes)':<21} {note}")
    for change in record.changes:
        event = events.get(change.event_id) or seen.get(change.event_id)
        current = events.get(change.event_id)
        when = current.not_before if current is not None else None
        note = f"not before {when[11:19]}Z" if when else ""
        if event is not None and len(event.resources) > 1:
            note += f"  resources: {', '.join(event.resources)}"
        if event is not None and not event.affects_this_vm:
            note += "  (another VM)"
        source = (event.source if event is not None else None) or "-"
        head = f"{elapsed:6.1f}s  {record.incarnation:>4}  {change.change:<21}"
        _say(f"{head} {change.event_type:<9} {source:<8} {change.event_id[:8]:<10} {note}")


def _print_impact(record: Impact, elapsed: float) -> None:
    """What the event did to the VM, as the agent measured it (bridge.agent.impact)."""
    what = (
        f"paused {record.pause_seconds:.1f} s" if record.pause_seconds is not None else "never seen Started"
    )
    if record.rebooted:
        what += f", rebooted (down {record.down_seconds} s)"
    advertised = record.advertised_duration
    note = f"{what}; IMDS advertised {advertised} s" if advertised is not None else what
    head = f"{elapsed:6.1f}s  {'':>4}  {'impact':<21} {record.event_type:<9} {'':<8}"
    _say(f"{head} {record.event_id[:8]:<10} {note}")


def _summary(records: list[Record | Refused], path: Path, elapsed: float) -> int:
    invalid = sum(1 for r in records if isinstance(r, Refused))
    changes = Counter(c.change for r in records if isinstance(r, ScheduledEvents) for c in r.changes)
    approvals = Counter(r.outcome for r in records if isinstance(r, Approval))
    _say(f"\n{len(records)} records in {elapsed:.0f} s, {invalid} schema violations -> {path}")
    _say("transitions: " + ", ".join(f"{k} {v}" for k, v in sorted(changes.items())))
    _say("approval audit records: " + (", ".join(f"{k} {v}" for k, v in sorted(approvals.items())) or "none"))
    _say(f"validate again with: se-bridge validate {path}")
    _say("see it in the ops console, on a fleet left running for you to approve: se-bridge demo --console")
    return 0 if records and invalid == 0 else 1


def _say(text: str) -> None:
    print(text, flush=True)
