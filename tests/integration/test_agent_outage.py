"""Decisions held, not dropped, while the agent is down (issue 23 item 1).

A local approver used to try the relay three times (0.5 s, 1 s), then end the decision
``failed/relayUnavailable`` and commit it: one agent crash during a burst lost most of it for good
(publishing it again is a replay). Now a decision no agent answered waits, uncommitted, and is
relayed again with backoff until the agent answers or the decision expires. Real processes: the
emulator, the agent (SIGKILL, then restarted on its state as systemd's ``RestartSec=5`` would), the
approver reading a decisions file. Figures for 5 s and 30 s outages during a burst of 150 come from
``bench/outage_bench.py``; this test holds what must never change: every decision approved, every
event one StartRequest, no decision given up.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import orjson
from brokers import free_port
from procs import DECISION_KEY, Emulator, approver_api, scrape, start_approver, wait_until

from bridge.decisions import new_decision, sign

KEY = DECISION_KEY  # Ed25519 (the agents prove each decision with its public half)


def test_a_burst_survives_the_agent_being_killed_for_five_seconds(make_agent, tmp_path: Path) -> None:
    emulator = Emulator()  # IMDS's own 5 requests per second
    decisions, audit = tmp_path / "decisions.jsonl", tmp_path / "audit.jsonl"
    decisions.touch()
    approver = None
    try:
        # A fixed port, as installed agents have (8710): the restarted agent is where it was.
        agent = make_agent(emulator.url, "--listen", f"127.0.0.1:{free_port()}").start()
        events = [emulator.add_event(eventType="Freeze") for _ in range(40)]
        agent.wait_for_change(events[-1], "scheduled")
        approver = start_approver(tmp_path, f"file://{decisions}", f"file://{audit}", agent.api or "", KEY)
        api = approver_api(tmp_path)
        signed = [sign(new_decision(e, "vm-bridge-0", "tests", 600), "ops", KEY) for e in events]
        with decisions.open("ab") as out:
            for decision in signed[:20]:
                out.write(orjson.dumps(decision) + b"\n")
        wait_until(lambda: len(emulator.state()["startRequests"]) >= 5, 30, what="the first approvals")
        agent.kill()
        with decisions.open("ab") as out:  # the rest of the burst arrives while the agent is down
            for decision in signed[20:]:
                out.write(orjson.dumps(decision) + b"\n")
        wait_until(lambda: scrape(api, "se_bridge_approver_parked") > 0, 30, what="decisions parked")
        time.sleep(5)  # the outage (systemd's RestartSec=5), not a timing assertion
        assert _outcomes(audit).get("failed", 0) == 0  # nothing given up while the agent was away
        agent.start(first_record=False)
        everything = dict.fromkeys(events, 1)
        wait_until(lambda: emulator.state()["startRequests"] == everything, 90, what="every StartRequest")
        wait_until(lambda: _outcomes(audit) == {"approved": 40}, 60, what="40 approved audits")
        assert scrape(api, "se_bridge_approver_parked") == 0
    finally:
        if approver is not None and approver.poll() is None:
            approver.terminate()
            approver.wait(20)
        emulator.stop()


def _outcomes(audit: Path) -> dict[str, int]:
    counts: dict[str, int] = {}
    seen: set[str] = set()
    for record in _records(audit):
        if record["recordId"] not in seen:  # one record per decision (a consumer deduplicates)
            seen.add(record["recordId"])
            counts[record["outcome"]] = counts.get(record["outcome"], 0) + 1
    return counts


def _records(path: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()] if path.exists() else []
