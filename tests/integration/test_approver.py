"""The approver end to end on this machine: emulator -> agent -> decisions file -> approver -> relay -> IMDS.

Every process is real (emulator, agent, approver, ``se-bridge decide``) and talks over loopback HTTP
and files; the Kafka and Event Hubs decision sources are tested with their brokers in their own
modules. Refusals are checked for their audit record *and* for zero StartRequests at the emulator.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
import requests
from procs import (
    DECISION_KEY,
    RELAY_KEY,
    Agent,
    Emulator,
    approver_api,
    decide,
    ed25519_key,
    names_decision,
    pem_files,
    scrape,
    start_approver,
    wait_until,
)

from bridge.decisions import DecisionKeys, new_decision, sign
from bridge.schemas import validate_record

KEY = DECISION_KEY  # Ed25519: the agents prove every decision with its public half
OTHER_KEY = ed25519_key("a key nobody configured")
HMAC_KEY = b"k" * 40


class Approver:
    def __init__(self, workdir: Path, relay: str, *extra: str) -> None:
        self.workdir = workdir
        self.decisions = workdir / "decisions.jsonl"
        self.decisions.touch()  # an approver is not ready while its decisions file does not exist
        self.audit = workdir / "audit.jsonl"
        self.key_file = workdir / "ops.key"
        pem_files(workdir, "ops", KEY)  # `decide` may run before the approver starts
        self.relay = relay
        self.extra = extra
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Approver:
        source, sink = f"file://{self.decisions}", f"file://{self.audit}"
        self.proc = start_approver(self.workdir, source, sink, self.relay, KEY, *self.extra)
        return self

    def logged(self, msg: str, **fields: Any) -> bool:
        """Whether the approver logged ``msg`` with these fields (its JSON log, every run)."""
        path = self.workdir / "approver.log"
        for line in path.read_bytes().splitlines() if path.exists() else []:
            try:
                entry = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            if entry.get("msg") == msg and all(entry.get(k) == v for k, v in fields.items()):
                return True
        return False

    def audits(self) -> list[dict[str, Any]]:
        if not self.audit.exists():
            return []
        return [orjson.loads(line) for line in self.audit.read_bytes().splitlines() if line.strip()]

    def publish(self, decision: dict[str, Any]) -> None:
        with open(self.decisions, "ab") as f:
            f.write(orjson.dumps(decision) + b"\n")

    def decide(self, event_id: str) -> dict[str, Any]:
        return decide(f"file://{self.decisions}", event_id, self.key_file)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()


@pytest.fixture
def setup(emulator: Emulator, make_agent, tmp_path: Path):
    agent = make_agent(emulator.url).start()
    approver = Approver(tmp_path, agent.api)
    yield emulator, agent, approver
    approver.stop()


def get(url: str, **headers: str) -> requests.Response:
    return requests.get(url, headers=headers, timeout=5, proxies={"http": "", "https": ""})


def audit_for(approver: Approver, decision_id: str) -> dict[str, Any]:
    return wait_until(
        lambda: next((a for a in approver.audits() if names_decision(a, decision_id)), None),
        30,
        what=f"audit of {decision_id}",
    )


def test_decide_approver_agent_imds_end_to_end(setup) -> None:
    emulator, agent, approver = setup
    approver.start()
    eid = emulator.add_event(eventType="Reboot", eventSource="User")
    agent.wait_for_change(eid, "scheduled")
    published = approver.decide(eid)
    audit = audit_for(approver, published["decisionId"])
    assert audit["outcome"] == "approved" and audit["results"][0]["result"] == "approved"
    assert validate_record(audit) == []
    assert audit["decisionReason"] == "tests"  # issue 33: decide --reason reaches the audit trail
    agent.wait_for_change(eid, "started", timeout=30)  # the emulator started it after the approval
    assert emulator.state()["startRequests"] == {eid: 1}
    agent_audits = agent.records("approval")
    assert [a["outcome"] for a in agent_audits] == ["approved"] and agent_audits[0][
        "startRequestsPosted"
    ] == 1
    assert validate_record(agent_audits[0]) == []
    # The approver serves probes and metrics like the agent (issue 10), behind the same guard.
    api = approver_api(approver.workdir)
    assert get(api + "/healthz").status_code == 200
    assert get(api + "/readyz").json() == {"ready": True, "reason": "ok"}
    assert scrape(api, "se_bridge_approver_decisions_total", outcome="approved") == 1
    assert scrape(api, "se_bridge_approver_source_ready") == 1
    assert scrape(api, "se_bridge_sink_sent_total") >= 1
    assert get(api + "/metrics", Origin="https://evil.example").status_code == 403
    assert scrape(api, "se_bridge_http_refused_total", reason="origin") == 1
    # Issue 8: the approver's state directory was created 0755 and the relay ledger written 0644.
    approver.stop()
    for root in (approver.workdir / "approver-state", agent.state_dir):
        for path in [root, *root.rglob("*")]:
            mode = stat.S_IMODE(path.stat().st_mode)
            assert mode == (0o700 if path.is_dir() else 0o600), (path, oct(mode))
    assert (agent.state_dir / "relayed.json").exists()


def signed(
    event_id: str,
    target: str = "vm-bridge-0",
    ttl: float = 600,
    key: Any = KEY,
    key_id: str = "ops",
    **changes: Any,
) -> dict[str, Any]:
    decision = {**new_decision(event_id, target, "tests", ttl), **changes}
    return sign(decision, key_id, key)


def test_refusals_are_audited_and_post_nothing(setup) -> None:
    emulator, agent, approver = setup
    approver.start()
    eid = emulator.add_event(eventType="Freeze")
    started = emulator.add_event(eventType="Reboot")
    other = emulator.add_event(eventType="Freeze", resources=["some-other-vm"])
    agent.wait_for_change(other, "scheduled")
    emulator.control("POST", f"events/{started}/start")
    agent.wait_for_change(started, "started")

    tampered = signed(eid)
    tampered["target"] = "vm-bridge-1"
    unsigned = new_decision(eid, "vm-bridge-0", "tests", 600)
    expired = signed(eid, ttl=600, issuedAt="2020-01-01T00:00:00.000Z", expiresAt="2020-01-01T00:10:00.000Z")
    cases = {
        "badSignature": tampered,
        "unknownKey": signed(eid, key=OTHER_KEY, key_id="stranger"),
        "unsigned": unsigned,
        "expired": expired,
        "schema": {**signed(eid), "action": "delete"},
        "notFound": signed("00000000-0000-0000-0000-000000000000"),
        "alreadyStarted": signed(started),
        "notThisVm": signed(other),
    }
    for decision in cases.values():
        approver.publish(decision)
    approver.publish(b"not json at all".decode())  # type: ignore[arg-type]
    for reason, decision in cases.items():
        audit = audit_for(approver, decision["decisionId"])
        assert validate_record(audit) == []
        if reason == "alreadyStarted":  # not an error: the event is already on its way
            assert audit["outcome"] == "approved" and audit["results"][0]["result"] == "alreadyStarted"
        else:
            assert audit["outcome"] == "refused", (reason, audit)
            assert audit["reason"] == reason, (reason, audit)
        if reason in ("badSignature", "unknownKey", "unsigned", "schema"):
            # Never proven: what it claims is "unverified", not the record's own decisionId (issue 23).
            assert audit["decisionId"] is None and audit["eventIds"] == [], audit
            assert audit["unverified"]["decisionId"] == decision["decisionId"]
        else:
            assert audit["decisionId"] == decision["decisionId"] and "unverified" not in audit
    wait_until(
        lambda: any(a["decisionId"] is None and a["reason"] == "schema" for a in approver.audits()),
        what="audit of the non-JSON message",
    )
    assert emulator.state()["startRequests"] == {}  # nothing was posted for any of them


def test_a_local_approver_skips_decisions_for_other_vms_without_an_audit(setup) -> None:
    """Issue 11: every VM's local approver reads every decision; one for another VM is neither relayed
    (the agent would audit a refusal) nor audited here: counted, committed, and (issue 21) logged,
    rate-limited, since a target no VM has is skipped by every approver and would go unseen."""
    emulator, agent, approver = setup
    approver.start()
    eid = emulator.add_event(eventType="Freeze")
    agent.wait_for_change(eid, "scheduled")
    elsewhere = signed(eid, target="vm-bridge-7")
    mine = signed(eid)
    approver.publish(elsewhere)
    approver.publish(mine)
    assert audit_for(approver, mine["decisionId"])["outcome"] == "approved"
    api = approver_api(approver.workdir)
    assert scrape(api, "se_bridge_approver_decisions_skipped_total", reason="otherVm") == 1
    assert [a["decisionId"] for a in approver.audits()] == [mine["decisionId"]]
    assert agent.metric("se_bridge_relay_requests_total") == 1  # the skipped one never reached it
    assert emulator.state()["startRequests"] == {eid: 1}
    assert approver.logged("local approver acts for this VM")
    skipped = "decision for another VM skipped (its own approver acts on it)"
    assert approver.logged(skipped, decisionId=elsewhere["decisionId"], target="vm-bridge-7")
    for _ in range(3):  # more of them within the minute: counted, not one line each
        approver.publish(signed(eid, target="vm-bridge-7"))
    wait_until(
        lambda: scrape(api, "se_bridge_approver_decisions_skipped_total", reason="otherVm") == 4,
        what="three more skipped",
    )
    lines = (approver.workdir / "approver.log").read_text()
    assert lines.count(skipped) == 1 and lines.count("local approver acts for this VM") == 1


def test_replayed_decision_is_refused(setup) -> None:
    emulator, agent, approver = setup
    approver.start()
    eid = emulator.add_event(eventType="Freeze")
    agent.wait_for_change(eid, "scheduled")
    decision = signed(eid)
    approver.publish(decision)
    approver.publish(decision)  # the same message published again: a replay
    wait_until(
        lambda: len([a for a in approver.audits() if a["decisionId"] == decision["decisionId"]]) == 2,
        30,
        what="two audits",
    )
    first, second = [a for a in approver.audits() if a["decisionId"] == decision["decisionId"]]
    assert first["outcome"] == "approved"
    assert (second["outcome"], second["reason"]) == ("refused", "replayed")
    assert emulator.state()["startRequests"] == {eid: 1}


def test_approver_killed_before_relaying_processes_after_restart_once(
    emulator: Emulator, make_agent, tmp_path: Path
) -> None:
    agent = make_agent(emulator.url).start()
    eid = emulator.add_event(eventType="Freeze")
    agent.wait_for_change(eid, "scheduled")
    # First run: the relay URL answers nothing (closed port), so the approver consumed the decision
    # and is stuck retrying the relay when it is killed.
    dead = Approver(
        tmp_path,
        "http://127.0.0.1:9",
    )
    decision = signed(eid)
    dead.publish(decision)
    dead.start()
    store = tmp_path / "approver-state" / "decisions.jsonl"
    wait_until(lambda: store.exists() and b'"started"' in store.read_bytes(), what="decision started")
    assert dead.proc is not None
    dead.proc.kill()
    dead.proc.wait(10)
    assert emulator.state()["startRequests"] == {}
    # Second run: same state, working relay: the decision is relayed exactly once.
    again = Approver(tmp_path, agent.api)
    again.start()
    try:
        audit = audit_for(again, decision["decisionId"])
        assert audit["outcome"] == "approved"
        # Decisions are processed in order: once a later one is audited, a wrong second attempt at
        # the first would have happened already.
        marker = signed("00000000-0000-0000-0000-000000000000")
        again.publish(marker)
        assert audit_for(again, marker["decisionId"])["outcome"] == "refused"
        assert emulator.state()["startRequests"] == {eid: 1}
        approved = [a for a in again.audits() if a["decisionId"] == decision["decisionId"]]
        assert len(approved) == 1
    finally:
        again.stop()


def test_approver_killed_after_relaying_does_not_post_twice(
    emulator: Emulator, make_agent, tmp_path: Path
) -> None:
    """Relay done, offset not committed (crash): the re-read decision gets the agent's ledger answer."""
    from bridge.approver.routing import LocalRouter, RelayClient
    from bridge.approver.service import Approver as ApproverService
    from bridge.decisions import ValidationPolicy
    from bridge.signing import KeyRing
    from bridge.sinks import create_sink
    from bridge.streams import Message, Position
    from bridge.streams.file import FileSource

    agent = make_agent(emulator.url).start()
    eid = emulator.add_event(eventType="Freeze")
    agent.wait_for_change(eid, "scheduled")
    decision = signed(eid)
    message = Message(orjson.dumps(decision), Position("line", 1, partitioned=False))

    def service() -> ApproverService:
        return ApproverService(
            source=FileSource(f"file://{tmp_path}/decisions.jsonl", tmp_path),  # process() is driven directly
            router=LocalRouter(agent.api),
            relay=RelayClient(KeyRing({"relay": RELAY_KEY})),
            policy=ValidationPolicy(DecisionKeys({"ops": KEY.public_key()})),
            sinks=[create_sink(f"file://{tmp_path}/audit.jsonl")],
            state_dir=tmp_path / "approver-state",
        )

    first = service()
    assert first.process(message)["outcome"] == "approved"
    first.close()
    # The store says final for this position: a re-read is only committed, nothing is relayed.
    second = service()
    assert second.process(message).get("reread") is True
    second.close()
    # Even with the store lost (worst case), the agent's ledger answers without a second POST.
    lost = service()
    lost.store._entries.clear()
    answer = lost.process(message)
    assert answer["outcome"] == "approved"
    assert emulator.state()["startRequests"] == {eid: 1}
    # The agent's approval record reaches its sink through the outbox, a moment after the answer.
    repeats = wait_until(
        lambda: [r for r in agent.records("approval") if r["startRequestsPosted"] == 0],
        what="the agent's record of the repeat",
    )
    assert "repeat" in repeats[-1]["detail"]


def test_a_lane_batch_costs_one_audit_fsync_and_a_failed_one_writes_the_audits_again(
    emulator: Emulator, make_agent, tmp_path: Path
) -> None:
    """Issue 11: a lane's chunk of decisions appends its audit records without fsync and syncs them
    once before committing. When that fsync fails (EIO; Linux may have dropped the pages), syncing
    again proves nothing: every audit record is appended again durably (same recordId), and only
    then is anything committed. The service is driven in-process so the fsync can fail (the
    outbox's fault seam: a tmpfs never fails an fsync)."""
    import errno

    from bridge.approver.routing import LocalRouter, RelayClient
    from bridge.approver.service import Approver as ApproverService
    from bridge.decisions import ValidationPolicy
    from bridge.pipeline import Outbox
    from bridge.signing import KeyRing
    from bridge.sinks import create_sink
    from bridge.streams import Message, Position
    from bridge.streams.file import FileSource

    agent = make_agent(emulator.url).start()
    events = [emulator.add_event(eventType="Freeze") for _ in range(4)]
    agent.wait_for_change(events[-1], "scheduled")
    committed: list[str] = []
    service = ApproverService(
        source=FileSource(f"file://{tmp_path}/decisions.jsonl", tmp_path),
        router=LocalRouter(agent.api),
        relay=RelayClient(KeyRing({"relay": RELAY_KEY})),
        policy=ValidationPolicy(DecisionKeys({"ops": KEY.public_key()})),
        sinks=[create_sink(f"file://{tmp_path}/audit.jsonl")],
        state_dir=tmp_path / "approver-state",
    )
    commits = type(service.commits)(lambda ms: committed.extend(m.position for m in ms))
    service.commits = service.life.commits = commits
    real_sync, calls = service.outbox.disk.sync, []

    def sync_failing_once(fd: int) -> None:
        calls.append(fd)
        if len(calls) == 1:
            raise OSError(errno.EIO, "Input/output error")
        real_sync(fd)

    service.outbox.disk.sync = sync_failing_once
    messages = [
        Message(orjson.dumps(signed(e)), Position("line", i, partitioned=False))
        for i, e in enumerate(events, 1)
    ]
    service.life.drain_lane("vm", [service.commits.track(m) for m in messages])
    service.commits.commit_ready()
    assert committed == [m.position for m in messages]
    assert emulator.state()["startRequests"] == dict.fromkeys(events, 1)
    # One failed batch fsync, then one durable append per audit record: not one fsync per record
    # for the batch itself.
    assert len(calls) == 1 + len(events)
    service.close()
    frames = Outbox(tmp_path / "approver-state" / "outbox", ["x"]).read(0)
    ids = [orjson.loads(f.payload)["decisionId"] for f in frames]
    assert sorted(ids) == sorted([orjson.loads(m.payload)["decisionId"] for m in messages] * 2)


def test_local_policy_auto_approves_user_events_after_the_prepare_hook(
    emulator: Emulator, make_agent, tmp_path: Path
) -> None:
    marker = tmp_path / "prepared"
    hook = tmp_path / "prepare.sh"
    hook.write_text(
        f'#!/bin/sh\necho "draining for $SE_EVENT_ID ($SE_EVENT_TYPE)"\necho "$SE_EVENT_ID" >> {marker}\n'
    )
    hook.chmod(0o755)
    recovered = tmp_path / "recovered"
    recover = tmp_path / "recover.sh"
    recover.write_text(f'#!/bin/sh\necho "$SE_EVENT_ID $SE_CHANGE" >> {recovered}\n')
    recover.chmod(0o755)
    agent = make_agent(
        emulator.url,
        "--auto-approve",
        "source=User",
        "--prepare-hook",
        str(hook),
        "--recover-hook",
        str(recover),
    ).start()
    user = emulator.add_event(eventType="Reboot", eventSource="User")
    platform = emulator.add_event(eventType="Freeze", eventSource="Platform")
    agent.wait_for_change(user, "started", timeout=30)
    wait_until(lambda: marker.exists() and len(marker.read_text().split()) == 2, what="both prepared")
    assert emulator.state()["startRequests"] == {user: 1}  # the Platform event was prepared, not approved
    emulator.control("POST", f"events/{user}/complete")
    wait_until(
        lambda: recovered.exists() and f"{user} completed" in recovered.read_text(), what="recover hook"
    )
    logs = [e for e in agent.logs() if e.get("msg") == "prepare hook ok"]
    assert any("draining for" in e["stdout"] for e in logs)
    assert platform in marker.read_text()


def test_a_failing_or_hanging_hook_blocks_neither_polling_nor_approval_of_others(
    emulator: Emulator, make_agent, tmp_path: Path
) -> None:
    hook = tmp_path / "hang.sh"
    hook.write_text(
        '#!/bin/sh\nif [ "$SE_EVENT_TYPE" = "Freeze" ]; then sleep 30; fi\n'
        'if [ "$SE_EVENT_TYPE" = "Redeploy" ]; then exit 3; fi\nexit 0\n'
    )
    hook.chmod(0o755)
    agent = make_agent(
        emulator.url,
        "--auto-approve",
        "type=Freeze|Redeploy|Reboot",
        "--prepare-hook",
        str(hook),
        "--hook-timeout",
        "3",
    ).start()
    hanging = emulator.add_event(eventType="Freeze")
    failing = emulator.add_event(eventType="Redeploy")
    good = emulator.add_event(eventType="Reboot")
    agent.wait_for_change(good, "started", timeout=30)  # approved while the Freeze hook still hangs
    wait_until(
        lambda: agent.metric("se_bridge_hook_runs_total", hook="prepare", result="timeout") == 1,
        20,
        what="hook timeout counted",
    )
    assert agent.metric("se_bridge_hook_runs_total", hook="prepare", result="failed") == 1
    assert emulator.state()["startRequests"] == {good: 1}
    assert {hanging, failing}.isdisjoint(emulator.state()["startRequests"])


def test_relay_refuses_unsigned_remote_requests_and_accepts_signed_ones(tmp_path: Path) -> None:
    from bridge.signing import KeyRing, NonceStore, RequestVerifier, sign_request

    nonces = tmp_path / "relay-nonces.jsonl"
    verifier = RequestVerifier(KeyRing({"fleet": HMAC_KEY}), nonces=NonceStore(nonces))
    body = b'{"decisionId": "d-12345678", "eventIds": ["e"]}'
    post = ("POST", "/v1/start-requests")
    with pytest.raises(PermissionError, match="unsigned"):
        verifier.verify({}, *post, body)
    headers = sign_request("fleet", HMAC_KEY, *post, body)
    assert verifier.verify(headers, *post, body) == "fleet"
    with pytest.raises(PermissionError, match="replayed nonce"):
        verifier.verify(headers, *post, body)
    after_restart = RequestVerifier(KeyRing({"fleet": HMAC_KEY}), nonces=NonceStore(nonces))
    with pytest.raises(PermissionError, match="replayed nonce"):  # the nonce store survived
        after_restart.verify(headers, *post, body)
    with pytest.raises(PermissionError, match="bad signature"):
        verifier.verify(sign_request("fleet", HMAC_KEY, *post, body), *post, body + b" ")
    with pytest.raises(PermissionError, match="bad signature"):  # method and path are signed
        verifier.verify(sign_request("fleet", HMAC_KEY, "GET", "/metrics", body), *post, body)
    with pytest.raises(PermissionError, match="replay window"):
        verifier.verify(sign_request("fleet", HMAC_KEY, *post, body, now=time.time() - 3600), *post, body)
    with pytest.raises(PermissionError, match="unknown key"):
        verifier.verify(sign_request("other", HMAC_KEY, *post, body), *post, body)


def test_canonical_form_matches_an_independent_implementation() -> None:
    """What a Logic App or a script in another language must produce (docs/approvals.md)."""
    import hashlib
    import hmac
    import json

    decision = signed("EV-1", reason="Noël maintenance")
    body = {k: v for k, v in decision.items() if k != "signature"}
    canonical = json.dumps(dict(sorted(body.items())), separators=(",", ":"), ensure_ascii=False).encode()
    assert decision["signature"]["alg"] == "Ed25519"
    KEY.public_key().verify(bytes.fromhex(decision["signature"]["value"]), canonical)  # raises if not
    legacy = signed("EV-1", key=HMAC_KEY, reason="Noël maintenance")  # a migration's HMAC decision
    body = {k: v for k, v in legacy.items() if k != "signature"}
    canonical = json.dumps(dict(sorted(body.items())), separators=(",", ":"), ensure_ascii=False).encode()
    assert legacy["signature"]["value"] == hmac.new(HMAC_KEY, canonical, hashlib.sha256).hexdigest()


def test_approver_refuses_to_start_without_keys(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bridge",
            "approver",
            "--source",
            f"file://{tmp_path}/d.jsonl",
            "--sink",
            "stdout:",
            "--state-dir",
            str(tmp_path / "s"),
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        env={**os.environ},
    )
    assert proc.returncode == 2 and "at least one --key" in proc.stderr


def test_fleet_mode_learns_agents_and_fails_over_to_another_vm_of_the_event(tmp_path: Path) -> None:
    """Two VMs (each its own emulator and agent on its own loopback address) share one event. The
    approver learns both from their records; the target VM's agent is down, so the approval goes
    through the other VM: approving through any VM of the event releases it for all."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.2", 0))
        port = s.getsockname()[1]
    event_id = "5DD55B64-45AD-49D3-BBC9-F57D4EA97BD7"
    vms = {}
    cleanup: list = []
    try:
        for name, ip in (("vm-a", "127.0.0.2"), ("vm-b", "127.0.0.3")):
            emu = Emulator("--rate-limit", "0", "--vm-name", name, "--private-ip", ip)
            workdir = tmp_path / name
            workdir.mkdir()
            agent = Agent(emu.url, workdir).start("--listen", f"{ip}:{port}")
            vms[name] = (emu, agent)
        for emu, _ in vms.values():
            emu.add_event(eventType="Freeze", eventId=event_id, resources=["vm-a", "vm-b"])
        for _, agent in vms.values():
            agent.wait_for_change(event_id, "scheduled")
        approver = Approver(
            tmp_path,
            "http://unused:1",
            "--mode",
            "fleet",
            "--events-source",
            f"file://{vms['vm-a'][1].sink_path}",
            "--events-source",
            f"file://{vms['vm-b'][1].sink_path}",
            "--relay-url-template",
            f"http://{{privateIp}}:{port}",
        )
        vms["vm-a"][1].kill()  # the primary does not answer
        cleanup.append(approver.stop)
        approver.start()
        api = approver_api(approver.workdir)  # it learns the fleet from the events stream
        wait_until(lambda: scrape(api, "se_bridge_approver_fleet_vms") == 2, what="both VMs learned")
        decision = signed(event_id, target="vm-a")
        approver.publish(decision)
        audit = audit_for(approver, decision["decisionId"])
        assert audit["outcome"] == "approved", audit
        assert audit["requester"] == f"http://127.0.0.3:{port}"
        assert vms["vm-b"][0].state()["startRequests"] == {event_id: 1}
        assert vms["vm-a"][0].state()["startRequests"] == {}
    finally:
        for stop in cleanup:
            stop()
        for emu, agent in vms.values():
            agent.stop()
            emu.stop()


def test_relay_over_tls_with_a_private_ca(emulator: Emulator, make_agent, tmp_path: Path) -> None:
    """The agent's listener can serve TLS; the approver verifies it against a CA file, never skips."""
    from brokers import self_signed_certificate

    cert, key = self_signed_certificate(tmp_path)
    agent = make_agent(emulator.url, "--listen-tls-cert", str(cert), "--listen-tls-key", str(key))
    agent.start(first_record=False)
    wait_until(lambda: agent.records(), what="first record")
    https_relay = agent.api.replace("http://", "https://")
    eid = emulator.add_event(eventType="Freeze")
    agent.wait_for_change(eid, "scheduled")

    no_ca = tmp_path / "no-ca"
    no_ca.mkdir()
    untrusting = Approver(no_ca, https_relay)
    refused = signed(eid, ttl=4)  # retried (no agent reached) until it expires
    untrusting.publish(refused)
    untrusting.start()
    try:
        audit = audit_for(untrusting, refused["decisionId"])
        # Certificate not trusted: never sent, so provably nothing posted.
        assert (audit["outcome"], audit["reason"]) == ("failed", "expired"), audit
    finally:
        untrusting.stop()
    assert emulator.state()["startRequests"] == {}

    trusting = Approver(tmp_path, https_relay, "--relay-ca-file", str(cert))
    accepted = signed(eid)
    trusting.publish(accepted)
    trusting.start()
    try:
        assert audit_for(trusting, accepted["decisionId"])["outcome"] == "approved"
    finally:
        trusting.stop()
    assert emulator.state()["startRequests"] == {eid: 1}


def test_a_full_disk_holds_decisions_back_and_loses_none(
    emulator: Emulator, make_agent, tmp_path: Path
) -> None:
    """The approver's state directory (decision store, audit outbox) on a full tmpfs while a burst
    of decisions arrives: none can be recorded as started, so none is relayed, audited or committed,
    and none is given up as "unprocessable". Once there is room, every one ends approved with
    exactly one StartRequest for its event."""
    from faults import fill, tmpfs

    agent = make_agent(emulator.url).start()
    events = [emulator.add_event(eventType="Freeze") for _ in range(5)]
    agent.wait_for_change(events[-1], "scheduled")
    workdir = tmp_path / "approver"
    workdir.mkdir()
    with tmpfs(tmp_path / "approver-state", "2m") as state:
        approver = Approver(workdir, agent.api or "", "--state-dir", str(state)).start()
        try:
            approver_api(workdir)  # started: the store and the outbox are open
            filler = fill(state)
            decided = [approver.decide(e)["decisionId"] for e in events]
            log = workdir / "approver.log"
            wait_until(lambda: b'"errorKind":"store"' in log.read_bytes(), 30,
                       what="the approver waiting for its full disk")  # fmt: skip
            assert emulator.state()["startRequests"] == {}  # nothing relayed without a durable "started"
            assert not approver.logged("decision could not be processed")  # not a poison attempt
            filler.unlink()
            wait_until(lambda: {a["decisionId"] for a in approver.audits()} >= set(decided), 60,
                       what="every decision audited once there was room")  # fmt: skip
            assert {a["outcome"] for a in approver.audits()} == {"approved"}
            assert emulator.state()["startRequests"] == dict.fromkeys(events, 1)
        finally:
            approver.stop()


def test_a_state_directory_deleted_under_a_running_approver_stops_it(setup) -> None:
    """Issue 23: deleting the approver's state directory went unnoticed (it kept writing into unlinked
    files, /readyz said ok, a second approver could start on the same path, and the restart made a
    new consumer group that read the whole topic again). Now it stops (exit 70) naming the cause,
    and its instance id, derived from the host and the path, comes back the same."""
    import shutil

    emulator, agent, approver = setup
    approver.start()
    api = approver_api(approver.workdir)
    wait_until(lambda: get(api + "/readyz").status_code == 200, what="ready")
    state = approver.workdir / "approver-state"
    instance = (state / "instance-id").read_text()
    shutil.rmtree(state)
    assert approver.proc is not None
    assert approver.proc.wait(30) == 70
    assert approver.logged("component failed; the service stops and exits non-zero so that it is restarted")
    assert "was deleted" in (approver.workdir / "approver.log").read_text()
    approver.start()
    wait_until(lambda: (state / "instance-id").exists(), what="a new state directory")
    assert (state / "instance-id").read_text() == instance  # the same consumer group after a loss
    eid = emulator.add_event(eventType="Freeze")
    agent.wait_for_change(eid, "scheduled")
    assert audit_for(approver, approver.decide(eid)["decisionId"])["outcome"] == "approved"


def test_a_state_directory_deleted_under_a_running_agent_stops_it(emulator: Emulator, make_agent) -> None:
    import shutil

    agent = make_agent(emulator.url).start()
    # The running agent may create a file (a cursor's temporary) while the tree is removed: remove
    # until the directory is gone, as an operator's `rm -rf` run twice would.
    for _ in range(100):
        shutil.rmtree(agent.state_dir, ignore_errors=True)
        if not agent.state_dir.exists():
            break
    assert agent.proc is not None and agent.proc.wait(30) == 70
    assert "was deleted" in agent.log_path.read_text() or ".lock is gone" in agent.log_path.read_text()


def test_an_approver_whose_decisions_file_does_not_exist_is_not_ready(tmp_path: Path) -> None:
    """Issue 33: a typo in the decisions file's path reported ready. The file may still come (a writer
    creates it): the approver waits, not ready and saying why, and reads it once it is there."""
    missing = tmp_path / "decsions.jsonl"
    proc = start_approver(
        tmp_path, f"file://{missing}", f"file://{tmp_path}/audit.jsonl", "http://127.0.0.1:9", KEY
    )
    try:
        api = approver_api(tmp_path)
        wait_until(lambda: "does not exist" in get(api + "/readyz").json()["reason"], what="the reason")
        assert get(api + "/readyz").status_code == 503
        missing.touch()
        wait_until(lambda: get(api + "/readyz").status_code == 200, what="ready once the file exists")
    finally:
        proc.terminate()
        proc.wait(20)
