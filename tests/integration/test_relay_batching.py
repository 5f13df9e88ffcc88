"""The relay under a burst of approvals (issue 11): the real agent, the emulator with IMDS's 5/s
limit, decisions arriving concurrently over HTTP. Every decision is answered and audited on its own,
with exactly one StartRequest per event at IMDS, in a few coalesced POSTs and without a single 429."""

from __future__ import annotations

import http.client
import threading
from pathlib import Path
from typing import Any

import orjson
from procs import DECISION_KEY, RELAY_KEY, Emulator, proven_body, start_approver, wait_until

from bridge.signing import sign_request

RELAY_PATH = "/v1/start-requests"


def post(address: tuple[str, int], body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    data = orjson.dumps(body)
    headers = {"Host": f"{address[0]}:{address[1]}", "Content-Type": "application/json"}
    headers.update(sign_request("relay", RELAY_KEY, "POST", RELAY_PATH, data))
    conn = http.client.HTTPConnection(*address, timeout=60)
    try:
        conn.request("POST", RELAY_PATH, body=data, headers=headers)
        resp = conn.getresponse()
        return resp.status, orjson.loads(resp.read())
    finally:
        conn.close()


def test_a_burst_of_decisions_is_coalesced_into_few_start_requests(make_agent, tmp_path: Path) -> None:
    emulator = Emulator()  # IMDS's limit: 5 requests per second
    try:
        agent = make_agent(emulator.url).start()
        events = [emulator.add_event(eventType="Freeze") for _ in range(40)]
        agent.wait_for_change(events[-1], "scheduled")
        host, _, port = (agent.api or "").removeprefix("http://").rpartition(":")
        address = (host, int(port))
        # Two decisions for the first event: both approved, still one StartRequest for it.
        bodies = [proven_body(e) for e in [*events, events[0]]]
        answers: list[tuple[int, dict[str, Any]]] = []
        lock = threading.Lock()

        def send(body: dict[str, Any]) -> None:
            answer = post(address, body)
            with lock:
                answers.append(answer)

        threads = [threading.Thread(target=send, args=(b,)) for b in bodies]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert len(answers) == len(bodies)
        assert all(status == 200 and a["outcome"] == "approved" for status, a in answers), answers
        state = emulator.state()
        assert state["startRequests"] == dict.fromkeys(events, 1)
        posts = state["requests"]["post"]
        assert posts <= 10, f"{posts} POSTs for {len(bodies)} decisions: not coalesced"
        assert state["requests"]["rejected"].get("429", 0) == 0
        # Every decision has its own ledger entry naming the POST that carried it, and its own audit.
        ledger = orjson.loads((agent.state_dir / "relayed.json").read_bytes())
        assert {e["decisionId"] for e in ledger} == {b["decisionId"] for b in bodies}
        assert sum(1 for e in ledger if e.get("startRequests")) >= len(events)
        assert len({e["startRequests"] for e in ledger if e.get("startRequests")}) < len(events)
        audits = wait_until(
            lambda: a if len(a := agent.records("approval")) >= len(bodies) else None, 30, what="audits"
        )
        assert sorted(a["decisionId"] for a in audits) == sorted(b["decisionId"] for b in bodies)
        assert agent.metric("se_bridge_relay_requests_total", outcome="approved") == len(bodies)
    finally:
        emulator.stop()


def test_the_approver_sends_a_burst_for_one_vm_in_few_requests(make_agent, tmp_path: Path) -> None:
    """200 signed decisions for one VM published at once, through the real approver (file source):
    each ends approved with one StartRequest for its event, in a handful of relay requests and IMDS
    POSTs, no 429 from IMDS; the source is committed past every one of them."""
    from bridge.decisions import new_decision, sign

    key = DECISION_KEY
    emulator = Emulator()
    approver = None
    try:
        agent = make_agent(emulator.url).start()
        events = [emulator.add_event(eventType="Freeze") for _ in range(200)]
        agent.wait_for_change(events[-1], "scheduled")
        decisions = tmp_path / "decisions.jsonl"
        lines = [orjson.dumps(sign(new_decision(e, "vm-bridge-0", "tests", 600), "ops", key)) for e in events]
        decisions.write_bytes(b"\n".join(lines) + b"\n")
        audit = tmp_path / "audit.jsonl"
        approver = start_approver(tmp_path, f"file://{decisions}", f"file://{audit}", agent.api or "", key)

        def approved() -> int:
            text = audit.read_bytes() if audit.exists() else b""
            return sum(1 for line in text.splitlines() if orjson.loads(line)["outcome"] == "approved")

        wait_until(lambda: approved() == len(events), 60, what="200 approvals")
        state = emulator.state()
        assert state["startRequests"] == dict.fromkeys(events, 1)
        assert state["requests"]["rejected"].get("429", 0) == 0
        assert state["requests"]["post"] <= 20, state["requests"]
        relay_requests = [e for e in agent.logs() if e.get("msg") == "StartRequests posted"]
        assert sum(e["decisions"] for e in relay_requests) >= len(events) - 1
        state_dir = tmp_path / "approver-state"

        def committed() -> list[str]:
            return [c.read_text().strip() for c in state_dir.glob("source-file-*.cursor")]

        wait_until(
            lambda: committed() == [str(len(events))],
            10,
            what="the source committed past the last decision",
        )
    finally:
        if approver is not None:
            approver.terminate()
            approver.wait(20)
        emulator.stop()


def test_a_decision_for_an_event_not_polled_yet_refreshes_the_document(make_agent) -> None:
    """Issue 11's fleet harness found it: the agents of an availability set poll at different
    moments, and a fleet approver acts on the first VM's record, so a decision can reach an agent
    before its own poll has shown the event. The relay polls once more instead of answering
    ``notFound``; the change is recorded before the approval. Polls a minute apart (the longest
    allowed) make it certain that only the refresh can have shown the event; the agent still stops
    at once on SIGTERM."""
    import signal

    emulator = Emulator()
    try:
        agent = make_agent(emulator.url, "--poll-interval", "60").start()
        event = emulator.add_event(eventType="Freeze")
        host, _, port = (agent.api or "").removeprefix("http://").rpartition(":")
        status, answer = post((host, int(port)), proven_body(event))
        assert status == 200 and answer["outcome"] == "approved", answer
        assert emulator.state()["startRequests"] == {event: 1}
        kinds = wait_until(
            lambda: k if len(k := [r["recordType"] for r in agent.records(None)]) >= 3 else None,
            15,
            what="records",
        )
        assert kinds == [
            "scheduledEvents",
            "scheduledEvents",
            "approval",
        ]  # first view, the event, then the approval
        assert agent.records("scheduledEvents")[-1]["changes"][0]["eventId"] == event
        # Still unknown after the refresh: notFound, without waiting for a poll that never comes.
        status, answer = post((host, int(port)), proven_body(GUID))
        assert status == 200 and answer["results"][0]["result"] == "notFound", answer
        assert agent.proc is not None
        agent.proc.send_signal(signal.SIGTERM)
        agent.proc.wait(20)  # well before the next poll, a minute away
    finally:
        emulator.stop()


def test_while_imds_fails_a_relay_request_does_not_cut_the_pollers_backoff(make_agent) -> None:
    """An authenticated caller naming unknown events must not turn the poll loop's backoff into one
    IMDS request per relay request: while IMDS fails, the relay answers from the document it has."""
    emulator = Emulator()
    try:
        agent = make_agent(emulator.url).start()
        emulator.control("POST", "faults", {"kind": "503", "durationSeconds": 60})
        wait_until(lambda: agent.metric("se_bridge_imds_poll_errors_total") >= 2, 30, what="IMDS failing")
        host, _, port = (agent.api or "").removeprefix("http://").rpartition(":")
        for _ in range(5):
            status, answer = post((host, int(port)), proven_body(GUID))
            assert status == 200 and answer["results"][0]["result"] == "notFound", answer
        refreshes = [e for e in agent.logs() if e.get("msg", "").startswith("relay refreshed")]
        assert len(refreshes) == 5 and not any(e["refreshed"] for e in refreshes)
    finally:
        emulator.stop()


GUID = "5DD55B64-45AD-49D3-BBC9-F57D4EA97BD7"
