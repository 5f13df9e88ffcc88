"""Issue 12, part 2: coordinated approval across the VMs an event names (bridge.coordination).

Three agents of one availability set on the fleet emulator: one event is on all three documents, an
approval through any of them releases it for all, and the emulator's fleet ledger counts the
StartRequests per event and through which VM the first came. Each agent's prepare hook waits for a
file named after its VM, so the test decides when each VM is prepared. Every agent listens on its
VM's own loopback address (the emulator's private IPs), as on a VNet.
"""

from __future__ import annotations

import random
import signal
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import orjson
import pytest
import records
from procs import DECISION_KEY, Agent, Emulator, approver_api, pem_files, scrape, start_approver, wait_until

from bridge.coordination import CoordinationPolicy, assess
from bridge.schemas import validate_record

pytestmark = pytest.mark.slow

HOOK = """#!/bin/sh
# Prepared when the test creates $GO_DIR/<vm name>; "fail" in it makes the hook fail.
while [ ! -e "$GO_DIR/$SE_VM_NAME" ]; do sleep 0.1; done
grep -q fail "$GO_DIR/$SE_VM_NAME" && exit 1
exit 0
"""
VMS = ["fleet-vm-000", "fleet-vm-001", "fleet-vm-002"]
KEY = b"k" * 40  # the approver's decision key (no decision is signed here: the coordinator decides)


# -- the rule (pure) ------------------------------------------------------------------------------


def test_the_rule_waits_for_every_vm_that_runs_the_agent_and_applies_the_deadline_policy() -> None:
    names = ["VM-B", "vm-a", "vm-c", "vm-without-agent"]
    nb = "2026-11-23T10:00:00+00:00"
    at_nb = 1795428000.0  # that NotBefore as epoch seconds
    approve, platform = CoordinationPolicy(60, "approve"), CoordinationPolicy(60, "platform")
    reports: dict[str, str | None] = {"vm-a": "prepared", "vm-b": "prepared", "vm-c": None}
    early = assess(names, reports, nb, at_nb - 120, approve)
    assert (early.action, early.pending, early.without_agent) == ("wait", ("vm-c",), ("vm-without-agent",))
    assert assess(names, {**reports, "vm-c": "prepareFailed"}, nb, at_nb - 120, approve).action == "wait"
    ready = assess(names, {**reports, "vm-c": "prepared"}, nb, at_nb - 120, platform)
    assert (ready.action, ready.why, ready.waited_for) == ("approve", "allPrepared", ("vm-a", "vm-b", "vm-c"))
    late = assess(names, reports, nb, at_nb - 59, approve)
    assert (late.action, late.why, late.pending) == ("approve", "deadline", ("vm-c",))
    assert assess(names, reports, nb, at_nb - 59, platform).action == "leave"
    # Nobody known to run the agent: nothing to wait for, but nothing proven ready either.
    assert assess(names, {}, nb, at_nb - 120, approve).action == "wait"
    assert assess(names, reports, None, at_nb, approve).action == "wait"  # no NotBefore, no deadline
    with pytest.raises(ValueError):
        CoordinationPolicy(60, "sometimes")  # type: ignore[arg-type]


def test_the_relay_takes_a_coordination_account_only_in_the_shape_audit_records_admit() -> None:
    """A caller's account is copied into the agent's audit record: a malformed one is a 400, so no
    caller can make the agent write a record its own schema refuses."""
    from bridge.records import approval_record
    from bridge.relay_api import RelayDecision, RelayRequestError

    verdict = assess(
        ["vm-a", "vm-b"], {"vm-a": "prepared", "vm-b": "prepared"}, None, 0, CoordinationPolicy()
    )
    body = {
        "decisionId": "coordinated-E1",
        "eventIds": ["E1"],
        "target": "vm-a",
        "issuedBy": "coordinator:vm-a",
    }
    good = verdict.to_json("vm-a", "platform")
    parsed = RelayDecision.from_json({**body, "coordination": good})
    assert parsed.to_json() == {**body, "coordination": good}  # what the approver sends, unchanged
    record = approval_record(
        "coordinator", decision_id="coordinated-E1", event_ids=["E1"], outcome="approved", reason=None,
        results=[], coordination=parsed.coordination,
    )  # fmt: skip
    assert validate_record(record) == []
    missing = {k: v for k, v in good.items() if k != "pending"}
    bad_ones = [{**good, "extra": 1}, {**good, "why": "because"}, {**good, "prepared": [1]}, missing, "text"]
    for bad in [*bad_ones, {**good, "withoutAgent": ["x" * 100] * 200}]:  # the last: too large
        with pytest.raises(RelayRequestError):
            RelayDecision.from_json({**body, "coordination": bad})


def test_a_peer_is_asked_with_a_bounded_answer_and_only_until_the_coordinator_answers() -> None:
    """A hostile or broken peer cannot make an agent buffer an unbounded answer (10 MB here: not an
    answer, so not live); a VM asks the VMs before it only until one answers, and only the coordinator
    asks everyone. Each peer is a real HTTP server of its own."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from bridge.agent.coordinator import MAX_ANSWER, PeerCoordinator
    from bridge.agent.peerkeys import PeerPins
    from bridge.signing import KeyRing, _sign_object, sign_peer_answer

    KEY = b"r" * 40
    own = {}  # each peer's own answer key (bridge.agent.peerkeys)

    asked: list[str] = []
    servers = []

    def peer_server(name: str) -> str:
        class Peer(BaseHTTPRequestHandler):
            def log_message(self, *_: Any) -> None:
                pass

            def do_GET(self) -> None:
                asked.append(name)
                answer = {"vm": name, "preparations": {"E1": {"result": "prepared"}}}
                nonce = self.headers.get("X-SE-Bridge-Nonce") or ""
                key = own.setdefault(name, Ed25519PrivateKey.generate())
                if name == "vm-huge":
                    body = b'{"preparations": {}, "pad": "' + b"x" * (10 << 20) + b'"}'
                elif name == "vm-forged":  # unsigned: anyone on the network could say it
                    body = orjson.dumps(answer)
                elif name == "vm-replayed":  # signed, but for another request
                    body = orjson.dumps(sign_peer_answer(key, "n" * 32, answer))
                elif name == "vm-relaykey":  # issue 31: the relay key every agent holds signs nothing
                    signed = {**answer, "answeredAt": int(time.time()), "nonce": nonce}
                    body = orjson.dumps(_sign_object("relay", KEY, b"answer", signed))
                elif name == "vm-impostor":  # another VM's own key, in vm-a's name
                    body = orjson.dumps(sign_peer_answer(key, nonce, {**answer, "vm": "vm-a"}))
                else:
                    body = orjson.dumps(sign_peer_answer(key, nonce, answer))
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        server = ThreadingHTTPServer(("127.0.0.1", 0), Peer)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}"

    try:
        names = ["vm-a", "vm-huge", "vm-m", "vm-z"]
        peers = {
            n: peer_server(n) for n in [*names, "vm-forged", "vm-replayed", "vm-relaykey", "vm-impostor"]
        }

        def coordinator(me: str) -> PeerCoordinator:
            return PeerCoordinator(
                CoordinationPolicy(), this_vm=lambda: me, event=lambda _: None, own_report=lambda _: None,
                approve=lambda *_: None, leave=lambda *_: None, keys=KeyRing({"relay": KEY}),
                peers=peers, template="http://{name}:1", stop=threading.Event(), takeover=10,
                pins=pins,
            )  # fmt: skip

        pins = PeerPins(None)

        assert MAX_ANSWER < 10 << 20
        reports: dict[str, str | None] = {}
        seen: dict[str, float] = {}
        middle = coordinator("vm-m")
        middle._ask("vm-huge", "E1", seen, reports)
        assert "vm-huge" not in seen and "vm-huge" not in reports  # oversized: not an answer
        # Issues 23 and 31: only an answer signed with the peer's own key, for this request, is one.
        for forged in ("vm-forged", "vm-replayed", "vm-relaykey", "vm-impostor"):
            middle._ask(forged, "E1", seen, reports)
            assert forged not in seen and forged not in reports, forged
        asked.clear()
        started = time.monotonic()
        assert middle._round(names, "vm-m", "E1", seen, reports, started) == "vm-a"
        assert asked == ["vm-a"] and reports["vm-a"] == "prepared"  # stopped at the first live VM
        own["vm-a"] = Ed25519PrivateKey.generate()  # another key in vm-a's name after its pin
        again: dict[str, str | None] = {}
        middle._ask("vm-a", "E1", {}, again)
        assert "vm-a" not in again
        asked.clear()
        assert coordinator("vm-a")._round(names, "vm-a", "E1", {}, {}, started) == "vm-a"
        assert asked == ["vm-huge", "vm-m", "vm-z"]  # the coordinator asks everyone after it
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()


# -- three agents of one availability set ------------------------------------------------------------


class AvailabilitySet:
    """The fleet emulator with three VMs, an agent per VM, and the prepare hooks' go files."""

    def __init__(self, tmp_path: Path) -> None:
        # A loopback range of its own: tests running in parallel must not share the agents' port.
        first_ip = f"127.{random.randint(20, 250)}.{random.randint(0, 250)}.1"
        self.emulator = Emulator("--fleet", "3", "--fleet-first-ip", first_ip, "--approval-delay", "0.5")
        self.vms = {vm["name"]: vm for vm in self.emulator.info["fleet"]}
        self.tmp_path = tmp_path
        self.go = tmp_path / "go"
        self.go.mkdir()
        self.hook = tmp_path / "prepare.sh"
        self.hook.write_text(HOOK)
        self.hook.chmod(0o755)
        self.agents: dict[str, Agent] = {}

    def api(self, name: str) -> str:
        return f"http://{self.vms[name]['privateIp']}:8710"

    def start_agents(self, *extra: str) -> None:
        peers = [arg for name in VMS for arg in ("--peer", f"{name}={self.api(name)}")]
        for name in VMS:
            agent = Agent(
                self.vms[name]["url"], self.tmp_path / name, "--prepare-hook", str(self.hook),
                "--hook-margin", "1", *peers, *extra, env={"GO_DIR": str(self.go)},
            )  # fmt: skip
            (self.tmp_path / name).mkdir()
            self.agents[name] = agent.start("--listen", f"{self.vms[name]['privateIp']}:8710")

    def add_event(self, notice: float = 900) -> str:
        body = {"eventType": "Reboot", "resources": VMS, "noticeSeconds": notice}
        return self.emulator.control("POST", "fleet/events", body)["eventId"]

    def prepare(self, name: str, outcome: str = "ok") -> None:
        (self.go / name).write_text(outcome)

    def ledger(self, event_id: str) -> dict[str, Any]:
        (event,) = [e for e in self.emulator.control("GET", "fleet")["events"] if e["eventId"] == event_id]
        return event

    def preparations(self, name: str, event_id: str) -> list[dict[str, Any]]:
        return [r for r in self.agents[name].records("preparation") if r["eventId"] == event_id]

    def coordinated(self, name: str, event_id: str) -> list[dict[str, Any]]:
        return [
            r for r in self.agents[name].records("approval")
            if r["component"] == "coordinator" and r["eventIds"] == [event_id]
        ]  # fmt: skip

    def stop(self) -> None:
        for agent in self.agents.values():
            agent.stop()
        self.emulator.stop()


@pytest.fixture
def aset(tmp_path: Path) -> Iterator[AvailabilitySet]:
    s = AvailabilitySet(tmp_path)
    try:
        yield s
    finally:
        s.stop()


def assert_valid(records: list[dict[str, Any]]) -> None:
    for record in records:
        assert validate_record(record) == [], record


def test_peers_approve_once_only_when_every_vm_is_prepared(aset: AvailabilitySet) -> None:
    aset.start_agents("--coordinate", "peers", "--approve-after-prepare", "true")
    event_id = aset.add_event()
    aset.prepare("fleet-vm-001")
    aset.prepare("fleet-vm-002")
    for name in ("fleet-vm-001", "fleet-vm-002"):
        wait_until(lambda n=name: aset.preparations(n, event_id), 20, what=f"{name} prepared")
    # Two of three prepared, the coordinator (fleet-vm-000, first by name) still preparing: several
    # coordination rounds (2 s each) go by without an approval.
    time.sleep(5)
    assert aset.ledger(event_id)["startRequests"] == 0
    assert all(aset.coordinated(name, event_id) == [] for name in VMS)
    aset.prepare("fleet-vm-000")
    wait_until(lambda: aset.ledger(event_id)["startRequests"] >= 1, 20, what="the coordinated approval")
    time.sleep(3)  # a second coordinator, if any, would have posted by now
    ledger = aset.ledger(event_id)
    assert (ledger["startRequests"], ledger["firstStartRequestVia"]) == (1, "fleet-vm-000")
    (audit,) = aset.coordinated("fleet-vm-000", event_id)
    assert audit["outcome"] == "approved" and audit["startRequestsPosted"] == 1
    assert audit["decisionId"] == f"coordinated-{event_id}"
    account = audit["coordination"]
    assert (account["coordinator"], account["why"]) == ("fleet-vm-000", "allPrepared")
    assert account["waitedFor"] == account["prepared"] == VMS and account["pending"] == []
    assert aset.coordinated("fleet-vm-001", event_id) == aset.coordinated("fleet-vm-002", event_id) == []
    preparations = [r for n in VMS for r in aset.preparations(n, event_id)]
    assert {(r["vm"]["name"], r["result"], r["hook"]["result"]) for r in preparations} == {
        (n, "prepared", "ok") for n in VMS
    }
    assert_valid([audit, *preparations])
    # What a peer coordinator asks; remote callers need a signature or the read token.
    answer = aset.agents["fleet-vm-001"].get("/v1/preparations").json()
    assert answer["vm"] == "fleet-vm-001"


def test_a_silent_peer_is_waited_for_until_the_deadline_not_dropped(aset: AvailabilitySet) -> None:
    """Issue 23: a VM whose agent is down when the event appears used to count as running no agent
    (withoutAgent), and the set was approved without it 2.6 s later: the VM that is restarting or
    partitioned is exactly the one that gets rebooted unprepared. Now every VM of the event is
    waited for until the deadline; the default policy then approves nothing, and the audit names
    the silent VM."""
    aset.start_agents(
        "--coordinate", "peers", "--approve-after-prepare", "true", "--coordinate-deadline", "30",
    )  # fmt: skip
    aset.agents["fleet-vm-002"].kill()  # its VM is restarting: it cannot answer
    event_id = aset.add_event(notice=40)
    aset.prepare("fleet-vm-000")
    aset.prepare("fleet-vm-001")
    wait_until(lambda: aset.coordinated("fleet-vm-000", event_id), 40, what="the deadline's verdict")
    (audit,) = aset.coordinated("fleet-vm-000", event_id)
    account = audit["coordination"]
    assert (audit["outcome"], audit["reason"], account["why"]) == ("refused", "leftToPlatform", "deadline")
    assert account["silent"] == account["pending"] == ["fleet-vm-002"] and account["withoutAgent"] == []
    assert aset.ledger(event_id)["startRequests"] == 0  # nothing approved without the silent VM
    assert_valid([audit])


def test_at_the_deadline_the_coordinator_approves_anyway_by_policy(aset: AvailabilitySet) -> None:
    """NotBefore 40 s away, deadline 30 s before it: fleet-vm-002's hook fails, so the wait ends at
    the deadline, about 10 s after the event appeared, with one StartRequest that says why."""
    aset.start_agents(
        "--coordinate", "peers", "--approve-after-prepare", "true",
        "--coordinate-deadline", "30", "--coordinate-on-deadline", "approve",
    )  # fmt: skip
    event_id = aset.add_event(notice=40)
    aset.prepare("fleet-vm-000")
    aset.prepare("fleet-vm-001")
    aset.prepare("fleet-vm-002", "fail")
    wait_until(lambda: aset.preparations("fleet-vm-002", event_id), 20, what="fleet-vm-002's report")
    assert aset.preparations("fleet-vm-002", event_id)[0]["result"] == "prepareFailed"
    wait_until(lambda: aset.coordinated("fleet-vm-000", event_id), 30, what="the deadline approval")
    (audit,) = aset.coordinated("fleet-vm-000", event_id)
    # Not before the deadline: the approval's own stamp against the NotBefore the VMs were told.
    not_before = aset.preparations("fleet-vm-002", event_id)[0]["notBefore"]
    deadline = datetime.fromisoformat(not_before).timestamp() - 30
    assert datetime.fromisoformat(audit["observedAt"].replace("Z", "+00:00")).timestamp() >= deadline
    account = audit["coordination"]
    assert (audit["outcome"], account["why"], account["onDeadline"]) == ("approved", "deadline", "approve")
    assert account["pending"] == account["prepareFailed"] == ["fleet-vm-002"]
    wait_until(lambda: aset.ledger(event_id)["startRequests"] == 1, 10, what="one StartRequest")
    assert_valid([audit])


def test_a_coordinator_killed_mid_wait_is_replaced_and_the_event_approved_once(
    aset: AvailabilitySet,
) -> None:
    aset.start_agents(
        "--coordinate", "peers", "--approve-after-prepare", "true", "--coordinate-takeover", "3"
    )
    event_id = aset.add_event()
    aset.prepare("fleet-vm-000")
    aset.prepare("fleet-vm-001")
    for name in ("fleet-vm-000", "fleet-vm-001"):
        wait_until(lambda n=name: aset.preparations(n, event_id), 20, what=f"{name} prepared")
    # fleet-vm-001 learned fleet-vm-000's report: two answers counted after the report was visible
    # (the first may have been asked before it existed; the second was asked after). Order, not time.
    asks = aset.agents["fleet-vm-001"].metric("se_bridge_coordination_peer_asks_total", result="answered")
    wait_until(
        lambda: (
            aset.agents["fleet-vm-001"].metric("se_bridge_coordination_peer_asks_total", result="answered")
            >= asks + 2
        ),
        20,
        what="fleet-vm-001 asked fleet-vm-000 after its report",
    )
    aset.agents["fleet-vm-000"].kill()  # the coordinator, mid-wait (fleet-vm-002 still preparing)
    aset.prepare("fleet-vm-002")
    wait_until(lambda: aset.ledger(event_id)["startRequests"] >= 1, 30, what="the next VM's approval")
    time.sleep(3)
    ledger = aset.ledger(event_id)
    assert (ledger["startRequests"], ledger["firstStartRequestVia"]) == (1, "fleet-vm-001")
    (audit,) = aset.coordinated("fleet-vm-001", event_id)
    account = audit["coordination"]
    assert (account["coordinator"], account["why"]) == ("fleet-vm-001", "allPrepared")
    assert account["prepared"] == VMS  # the dead coordinator's last report still counts
    assert aset.coordinated("fleet-vm-002", event_id) == []


def test_the_fleet_approver_coordinates_and_leaves_late_events_to_the_platform(
    aset: AvailabilitySet, tmp_path: Path
) -> None:
    """Agents run with coordinate=fleet (they report, never approve); a fleet approver run with
    --coordinate reads their records and approves once all three are prepared. A second event whose
    deadline comes first with a VM still preparing is, by policy, left to the platform: no
    StartRequest, one audit record saying who was not prepared."""
    aset.start_agents("--coordinate", "fleet", "--approve-after-prepare", "true")
    workdir = tmp_path / "approver"
    workdir.mkdir()
    (workdir / "decisions.jsonl").touch()
    events = [f"--events-source=file://{aset.agents[n].sink_path}" for n in VMS]
    proc = start_approver(
        workdir, f"file://{workdir}/decisions.jsonl", f"file://{workdir}/audit.jsonl", "http://127.0.0.1:9",
        KEY, "--mode", "fleet", *events, "--relay-url-template", "http://{privateIp}:8710",
        "--coordinate", "true", "--coordinate-deadline", "30", "--coordinate-on-deadline", "platform",
        # the coordinator signs its approvals; the agents prove them with the public half (issue 31)
        "--coordinate-key", f"coordinator={pem_files(workdir, 'coordinator', DECISION_KEY)[0]}",
    )  # fmt: skip
    try:
        api = approver_api(workdir)
        ready, late = aset.add_event(), aset.add_event(notice=40)
        aset.prepare("fleet-vm-000")
        aset.prepare("fleet-vm-001")
        time.sleep(4)
        assert aset.ledger(ready)["startRequests"] == 0  # fleet-vm-002 still preparing
        assert all(aset.coordinated(n, ready) == [] for n in VMS)  # agents never approve themselves

        def audits() -> list[dict[str, Any]]:
            import orjson

            path = workdir / "audit.jsonl"
            return [orjson.loads(line) for line in path.read_bytes().splitlines()] if path.exists() else []

        left = wait_until(
            lambda: [a for a in audits() if a["eventIds"] == [late]], 30, what="late event left"
        )
        (audit,) = left
        assert (audit["outcome"], audit["reason"], audit["component"]) == (
            "refused",
            "leftToPlatform",
            "coordinator",
        )
        assert audit["coordination"]["pending"] == ["fleet-vm-002"]
        assert aset.ledger(late)["startRequests"] == 0
        aset.prepare("fleet-vm-002")
        wait_until(lambda: aset.ledger(ready)["startRequests"] >= 1, 20, what="the coordinated approval")
        approved = wait_until(lambda: [a for a in audits() if a["eventIds"] == [ready]], 10, what="its audit")
        assert approved[0]["outcome"] == "approved" and approved[0]["coordination"]["why"] == "allPrepared"
        assert approved[0]["coordination"]["coordinator"].startswith("fleet-approver:")
        time.sleep(2)
        assert aset.ledger(ready)["startRequests"] == 1
        assert scrape(api, "se_bridge_approver_coordinated_total", action="approve", why="allPrepared") == 1
        assert scrape(api, "se_bridge_approver_coordinated_total", action="leave", why="deadline") == 1
        assert_valid(audits())
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(20)


def test_a_coordinated_approval_that_reached_no_agent_is_tried_again(
    emulator: Emulator, make_agent, tmp_path: Path
) -> None:
    """A coordinated approval whose relay reached no agent of the event (a partition, every VM of
    the set restarting) is not spent: no final entry, no audit record, and the coordinator assesses
    the event again after ``retry_after`` (not before); once an agent answers it is approved once.
    A Started event ends the retries. The approver runs in-process against a real agent: the fleet
    router knows no agent at first, then learns this one as the events stream would show it."""
    from procs import RELAY_KEY

    from bridge.approver.coordinator import FleetCoordinator
    from bridge.approver.routing import FleetRouter, RelayClient
    from bridge.approver.service import Approver
    from bridge.decisions import ValidationPolicy
    from bridge.signing import KeyRing
    from bridge.sinks import create_sink
    from bridge.streams.file import FileSource

    # The coordinator's own bookkeeping, with an act that fails once.
    acts: list[float] = []
    coordinator = FleetCoordinator(
        CoordinationPolicy(deadline=60.0), runs_agent=lambda _: True, leader=lambda: True,
        act=lambda *_: bool(acts.append(time.time()) or len(acts) > 1), retry_after=5.0,
    )  # fmt: skip
    document = records.scheduled_events(records.vm_block("vm-a"), [records.event("E1", "vm-a")])
    prepared = records.typed(records.preparation(records.vm_block("vm-a"), "E1", resources=("vm-a",)))
    coordinator.observe(records.typed(document))
    coordinator.observe(prepared)
    coordinator.tick(1000.0)
    coordinator.tick(1004.0)  # too early: not assessed again
    assert len(acts) == 1
    coordinator.tick(1005.5)
    assert len(acts) == 2
    coordinator.tick(1020.0)  # done: once
    assert len(acts) == 2
    acts.clear()
    coordinator = FleetCoordinator(
        CoordinationPolicy(), runs_agent=lambda _: True, leader=lambda: True,
        act=lambda *_: bool(acts.append(0.0)), retry_after=5.0,
    )  # fmt: skip
    coordinator.observe(records.typed(document))
    coordinator.observe(prepared)
    coordinator.tick(1000.0)
    started = records.event("E1", "vm-a", status="Started")
    coordinator.observe(records.typed(records.scheduled_events(records.vm_block("vm-a"), [started])))
    coordinator.tick(1010.0)  # Started meanwhile: no more tries
    assert len(acts) == 1

    # The approver's side, with a real agent.
    agent = make_agent(emulator.url).start()
    event_id = emulator.add_event(eventType="Freeze")
    agent.wait_for_change(event_id, "scheduled")
    vm_name = agent.records()[-1]["vm"]["name"]
    router = FleetRouter([], template=str(agent.api))
    service = Approver(
        source=FileSource(f"file://{tmp_path}/decisions.jsonl", tmp_path),
        router=router,
        relay=RelayClient(KeyRing({"relay": RELAY_KEY})),
        policy=ValidationPolicy(KeyRing({"ops": b"k" * 40})),
        sinks=[create_sink(f"file://{tmp_path}/audit.jsonl")],
        state_dir=tmp_path / "approver-state",
        relay_attempts=1,
        coordination_policy=CoordinationPolicy(),
        coordinator_key=("coordinator", DECISION_KEY),
    )
    verdict = assess([vm_name], {vm_name.lower(): "prepared"}, None, time.time(), CoordinationPolicy())
    assert verdict.action == "approve"
    try:
        assert service.coordinated(event_id, [vm_name.lower()], verdict) is False  # no agent known
        assert service.outbox.last_seq == 0  # nothing audited
        assert service.store.get(f"coordinated-{event_id}").state == "started"  # type: ignore[union-attr]
        assert emulator.state()["startRequests"] == {}
        router.learn(
            records.typed(records.scheduled_events(records.vm_block(vm_name, private_ip="127.0.0.1")))
        )
        assert service.coordinated(event_id, [vm_name.lower()], verdict) is True
        assert emulator.state()["startRequests"] == {event_id: 1}
        assert service.store.get(f"coordinated-{event_id}").outcome == "approved"  # type: ignore[union-attr]
        assert service.outbox.last_seq == 1
        assert service.coordinated(event_id, [vm_name.lower()], verdict) is True  # final: nothing again
        assert emulator.state()["startRequests"] == {event_id: 1}
    finally:
        service.close()
