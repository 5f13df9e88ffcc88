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
from pathlib import Path
from typing import Any

import orjson

from bridge.agent.service import Agent
from bridge.approver.build import build_approver
from bridge.config import AgentConfig, ApproverConfig
from bridge.fsutil import ensure_private_dir, write_atomic
from bridge.imds.emulator import EmulatorServer
from bridge.observability import setup_logging
from bridge.schemas import validate_record

MAX_SECONDS = 120.0


def run_demo(output: Path, *, speed: float = 60.0, scenario: str = "tour") -> int:
    output = output.resolve()
    if output.exists():
        shutil.rmtree(output)  # a demo starts from scratch: no baseline, no outbox
    output.mkdir(parents=True)
    records_path = output / "records.jsonl"
    log_file = open(output / "agent.log", "w", encoding="utf-8")  # noqa: SIM115 - closed in finally
    setup_logging("info", stream=log_file)

    emulator = EmulatorServer(port=0, scenario="idle", speed=speed).start()
    keys = _make_keys(output / "keys")
    config = AgentConfig(
        imds_url=emulator.url,
        sink=(f"file://{records_path}",),
        state_dir=output / "state",
        poll_interval=0.25,  # the tour's Spot eviction has 0.5 s of notice at 60x
        listen="127.0.0.1:0",
        shutdown_timeout=5.0,
        relay_key=(f"relay={keys['relay']}",),
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
        forwarding_act(emulator, records_path, scenario, speed, started)
        approved = approval_act(output, emulator, agent, keys, started)
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
    return code if approved else 1


def forwarding_act(
    emulator: EmulatorServer, records_path: Path, scenario: str, speed: float, started: float
) -> None:
    """Act 1: the tour's scenarios, each change printed as the agent records it."""
    printed = 0
    seen: dict[str, dict[str, Any]] = {}
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
        done = snap["pendingSteps"] == 0 and not snap["events"] and records and not records[-1]["events"]
        quiet_since = (quiet_since or time.monotonic()) if done else None
        if quiet_since and time.monotonic() - quiet_since > 1.0:
            return
        time.sleep(0.1)


def _make_keys(directory: Path) -> dict[str, Path]:
    """The decision signing key (``ops``) and the relay key the approver and the agent share."""
    ensure_private_dir(directory)
    out = {}
    for name in ("ops", "relay"):
        out[name] = directory / f"{name}.key"
        write_atomic(out[name], secrets.token_hex(32).encode())
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
            key=(f"ops={keys['ops']}",),
            relay_key=(f"relay={keys['relay']}",),
            listen="127.0.0.1:0",
        )
    )
    runner = threading.Thread(target=approver.run, kwargs={"install_signals": False}, daemon=True)
    runner.start()
    timeline = _Timeline(started)
    try:
        _say("\n-- act 2: the approval loop (decision -> approver -> relay -> IMDS StartRequest) --")
        event_id = emulator.state.add_event(
            event_type="Reboot", event_source="User", duration=20, started_seconds=60
        )
        timeline.wait("agent", "scheduled", lambda: _change(output / "records.jsonl", event_id, "scheduled"))
        published = _decide(decisions, keys["ops"], event_id, agent.identity.current.name or "")
        timeline.say("ops", f"se-bridge decide: decision {published['decisionId'][:8]} signed and published")
        timeline.wait("approver", "approved", lambda: _audit(audit, published["decisionId"]))
        timeline.wait("emulator", "StartRequest received", lambda: emulator.state.snapshot()["startRequests"])
        timeline.wait("agent", "started", lambda: _change(output / "records.jsonl", event_id, "started"))
        timeline.wait("agent", "audit: StartRequest posted", lambda: _agent_audit(output, published))
        ok = timeline.wait(
            "agent", "completed", lambda: _change(output / "records.jsonl", event_id, "completed")
        )
        return ok and not timeline.missed
    finally:
        approver.stop_event.set()
        runner.join(20)


class _Timeline:
    def __init__(self, started: float) -> None:
        self.started = started
        self.missed: list[str] = []

    def say(self, actor: str, what: str) -> None:
        _say(f"{time.monotonic() - self.started:6.1f}s  {actor:<9} {what}")

    def wait(self, actor: str, what: str, found: Any, timeout: float = 30.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if found():
                self.say(actor, what)
                return True
            time.sleep(0.05)
        self.say(actor, f"{what}: NOT SEEN within {timeout:g} s")
        self.missed.append(what)
        return False


def _decide(decisions: Path, key: Path, event_id: str, target: str) -> dict[str, Any]:
    command = [sys.executable, "-m", "bridge", "decide", "--sink", f"file://{decisions}",
               "--event-id", event_id, "--target", target, "--key-id", "ops", "--key-file", str(key),
               "--reason", "demo: approved by the on-call engineer"]  # fmt: skip
    proc = subprocess.run(command, capture_output=True, text=True, timeout=60, check=True)
    result: dict[str, Any] = orjson.loads(proc.stdout)
    return result


def _change(path: Path, event_id: str, change: str) -> bool:
    return any(
        c["eventId"] == event_id and c["change"] == change
        for r in _read(path)
        if r.get("recordType") == "scheduledEvents"
        for c in r["changes"]
    )


def _audit(path: Path, decision_id: str) -> bool:
    return any(a.get("decisionId") == decision_id and a["outcome"] == "approved" for a in _read(path))


def _agent_audit(output: Path, published: dict[str, Any]) -> bool:
    return any(
        r.get("recordType") == "approval" and r.get("decisionId") == published["decisionId"]
        for r in _read(output / "records.jsonl")
    )


def _read(path: Path) -> list[dict[str, Any]]:
    try:
        return [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]
    except FileNotFoundError:
        return []


def _print_record(record: dict[str, Any], elapsed: float, seen: dict[str, dict[str, Any]]) -> None:
    """One line per transition; ``seen`` remembers events so a gone one still shows its source."""
    events = {e["eventId"]: e for e in record["events"]}
    seen.update(events)
    if not record["changes"]:
        note = "first observation" if record["previousIncarnation"] is None else "document changed"
        _say(f"{elapsed:6.1f}s  {record['documentIncarnation']:>4}  {'(no event changes)':<21} {note}")
    for change in record["changes"]:
        event = events.get(change["eventId"]) or seen.get(change["eventId"], {})
        when = events.get(change["eventId"], {}).get("notBefore")
        note = f"not before {when[11:19]}Z" if when else ""
        if len(event.get("resources", [])) > 1:
            note += f"  resources: {', '.join(event['resources'])}"
        if event and not event.get("affectsThisVm"):
            note += "  (another VM)"
        source = event.get("eventSource") or "-"
        head = f"{elapsed:6.1f}s  {record['documentIncarnation']:>4}  {change['change']:<21}"
        _say(f"{head} {change['eventType']:<9} {source:<8} {change['eventId'][:8]:<10} {note}")


def _summary(records: list[dict[str, Any]], path: Path, elapsed: float) -> int:
    invalid = sum(1 for r in records if validate_record(r))
    changes = Counter(c["change"] for r in records for c in r.get("changes", ()))
    approvals = Counter(r["outcome"] for r in records if r.get("recordType") == "approval")
    _say(f"\n{len(records)} records in {elapsed:.0f} s, {invalid} schema violations -> {path}")
    _say("transitions: " + ", ".join(f"{k} {v}" for k, v in sorted(changes.items())))
    _say("approval audit records: " + (", ".join(f"{k} {v}" for k, v in sorted(approvals.items())) or "none"))
    _say(f"validate again with: se-bridge validate {path}")
    return 0 if records and invalid == 0 else 1


def _say(text: str) -> None:
    print(text, flush=True)
