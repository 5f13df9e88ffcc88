"""``se-bridge demo``: the whole agent path on this machine, no cloud account, in about a minute.

It starts the IMDS emulator (every scenario of the ``tour``, at 60x speed) and a real agent with a
file sink, in this process, then prints each change as the agent records it. What it leaves behind
in the output directory is what an operator would find on a VM: ``records.jsonl`` (the records, one
per line, schema-valid), ``agent.log`` (the agent's JSON log) and ``state/`` (outbox, baseline).
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import orjson

from bridge.agent.service import Agent
from bridge.config import AgentConfig
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
    config = AgentConfig(
        imds_url=emulator.url,
        sink=(f"file://{records_path}",),
        state_dir=output / "state",
        poll_interval=0.25,  # the tour's Spot eviction has 0.5 s of notice at 60x
        listen="127.0.0.1:0",
        shutdown_timeout=5.0,
    )
    agent = Agent(config)
    poller = threading.Thread(target=agent.poller.run, args=(agent.stop_event,), name="poller", daemon=True)
    started = time.monotonic()
    printed = 0
    seen: dict[str, dict[str, Any]] = {}
    try:
        agent.start()
        poller.start()
        api = agent.api.address if agent.api else None
        _say(f"IMDS emulator  {emulator.url}  (scenario {scenario!r} at {speed:g}x)")
        if api:
            _say(f"agent API      http://{api[0]}:{api[1]}/metrics  /readyz  /v1/document")
        _say(f"records        {records_path}\n")
        _say(f"{'time':>7}  {'inc':>4}  {'change':<21} {'type':<9} {'source':<8} {'event':<10} note")
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
                break
            time.sleep(0.1)
    except KeyboardInterrupt:
        _say("\ninterrupted")
    finally:
        agent.stop_event.set()
        poller.join(5)
        agent.shutdown()
        emulator.stop()
        logging.getLogger().handlers.clear()
        log_file.close()
    return _summary(_read(records_path), records_path, time.monotonic() - started)


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
    changes = Counter(c["change"] for r in records for c in r["changes"])
    _say(f"\n{len(records)} records in {elapsed:.0f} s, {invalid} schema violations -> {path}")
    _say("transitions: " + ", ".join(f"{k} {v}" for k, v in sorted(changes.items())))
    _say(f"validate again with: se-bridge validate {path}")
    return 0 if records and invalid == 0 else 1


def _say(text: str) -> None:
    print(text, flush=True)
