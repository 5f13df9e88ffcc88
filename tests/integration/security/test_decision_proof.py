"""Issue 31, finding 1: nobody but a decision's signer approves, whatever a VM's root holds.

The attacker is root on *another* fleet VM: it holds that VM's relay key file (the same relay key
as every agent, as fleets were deployed before issue 31) and the public decision key every agent
holds. It talks to this VM's real agent over a real socket, signing each request with the relay
key, and the test asserts what IMDS (the emulator) received. Before issue 31 a made-up
``decisionId`` for a Redeploy three days away was answered ``200 approved`` and posted.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import orjson
import pytest
from procs import (
    DECISION_KEY,
    RELAY_KEY,
    Agent,
    Emulator,
    decision_public_file,
    ed25519_key,
    proven_body,
    relay_post,
    wait_until,
)

from bridge.decisions import new_decision, sign

pytestmark = pytest.mark.slow


@pytest.fixture
def redeploy(emulator: Emulator, make_agent) -> tuple[Emulator, Agent, str]:
    agent = make_agent(emulator.url).start()
    event_id = emulator.add_event(eventType="Redeploy", eventSource="User", noticeSeconds=3 * 86400)
    agent.wait_for_change(event_id, "scheduled")
    return emulator, agent, event_id


def test_the_relay_key_alone_approves_nothing(redeploy) -> None:
    """A request signed with the relay key and naming a made-up decision is refused ``unproven``,
    posts nothing, audits nothing, and burns nothing: the real decision with that id approves."""
    emulator, agent, event_id = redeploy
    made_up = f"d-{uuid.uuid4()}"
    status, answer = relay_post(
        agent.api or "", {"decisionId": made_up, "eventIds": [event_id], "target": "vm-bridge-0"}
    )
    assert (status, answer["outcome"], answer["reason"]) == (200, "refused", "unproven")
    assert answer["results"][0]["result"] == "unproven"
    assert emulator.state()["startRequests"] == {}
    assert agent.records("approval") == []  # nothing an attacker says is audited as a decision
    assert agent.metric("se_bridge_relay_requests_total", outcome="refused", reason="unproven") == 1
    # The real decision that carries the same id is not a replay: nothing was kept of the forgery.
    status, answer = relay_post(agent.api or "", proven_body(event_id, made_up))
    assert (status, answer["outcome"]) == (200, "approved")
    assert emulator.state()["startRequests"] == {event_id: 1}


def test_no_key_a_vm_holds_signs_a_decision_this_agent_believes(redeploy, tmp_path: Path) -> None:
    """What root on a VM can make: a decision signed with the relay key (HMAC, under the decision
    key's id), with a key of its own (Ed25519, same id), unsigned, or a real decision's signature on
    changed fields. Each is refused ``unproven`` by the agent itself."""
    emulator, agent, event_id = redeploy
    draft = new_decision(event_id, "vm-bridge-0", "mallory", 600)
    tampered = sign(new_decision(event_id, "vm-other", "ops", 600), "ops", DECISION_KEY)
    tampered["target"] = "vm-bridge-0"
    forgeries = {
        "HMAC with the relay key": sign(draft, "ops", RELAY_KEY),
        "its own Ed25519 key": sign(draft, "ops", ed25519_key("root on another VM")),
        "unsigned": draft,
        "a signature over other fields": tampered,
    }
    for what, decision in forgeries.items():
        body = {"decisionId": decision["decisionId"], "eventIds": [event_id], "decision": decision}
        status, answer = relay_post(agent.api or "", body)
        assert (status, answer["reason"]) == (200, "unproven"), what
    assert emulator.state()["startRequests"] == {}


def test_a_real_decision_approves_only_what_it_names(redeploy, emulator: Emulator) -> None:
    """A valid decision cannot be steered by the request around it: another event named beside it,
    another VM's event, an expired one. The agent takes the event and target from the signature."""
    emulator, agent, event_id = redeploy
    other_vm = emulator.add_event(eventType="Reboot", resources=["vm-other"])
    agent.wait_for_change(other_vm, "scheduled")
    real = proven_body(event_id)
    swapped = {**real, "eventIds": [other_vm]}  # the signed decision names event_id
    assert relay_post(agent.api or "", swapped)[1]["reason"] == "unproven"
    another = proven_body(other_vm, target="vm-other")  # signed, but for an event not naming this VM
    assert relay_post(agent.api or "", another)[1]["results"][0]["result"] == "notThisVm"
    expired = proven_body(event_id, ttl=1)
    time.sleep(1.2)
    assert relay_post(agent.api or "", expired)[1]["reason"] == "unproven"
    assert emulator.state()["startRequests"] == {}
    assert relay_post(agent.api or "", real)[1]["outcome"] == "approved"
    again = relay_post(agent.api or "", real)[1]  # once: a repeat is answered from the ledger
    assert again.get("repeat") is True and emulator.state()["startRequests"] == {event_id: 1}


def _rfc3339(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def test_migration_shared_keys_side_by_side_then_refused(emulator: Emulator, make_agent) -> None:
    """The rollout of docs/security.md: within ``relay_legacy_until`` a request without a signed
    decision (an approver not yet upgraded) is acted on, counted ``legacy``-logged; a proven one is
    acted on too; once the window is over the same old request is refused and the new one works."""
    until = time.time() + 8
    agent = make_agent(emulator.url, "--relay-legacy-until", _rfc3339(until)).start()
    first, second, third = (emulator.add_event(eventType="Freeze") for _ in range(3))
    agent.wait_for_change(third, "scheduled")
    old = {"decisionId": f"d-{uuid.uuid4()}", "eventIds": [first], "target": "vm-bridge-0"}
    assert relay_post(agent.api or "", old)[1]["outcome"] == "approved"
    assert relay_post(agent.api or "", proven_body(second))[1]["outcome"] == "approved"
    assert any("migration window" in line.get("msg", "") for line in agent.logs())
    wait_until(lambda: time.time() > until + 0.5, 15, what="the window's end")
    old = {"decisionId": f"d-{uuid.uuid4()}", "eventIds": [third], "target": "vm-bridge-0"}
    assert relay_post(agent.api or "", old)[1]["reason"] == "unproven"
    assert set(emulator.state()["startRequests"]) == {first, second}
    assert relay_post(agent.api or "", proven_body(third))[1]["outcome"] == "approved"


def _agent_start_error(tmp_path: Path, *args: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "bridge", "agent", "--sink", "stdout:", "--state-dir", str(tmp_path / "s"),
         "--imds-url", "http://127.0.0.1:9", *args],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stdout + proc.stderr
    return proc.stderr


def test_an_agent_refuses_keys_that_could_sign(tmp_path: Path) -> None:
    """An HMAC or a private key on a VM could sign for every VM that trusts it: refused at start,
    and so is a migration window that is no window."""
    hmac_key = tmp_path / "shared.key"
    hmac_key.write_bytes(b"s" * 40)
    assert "not an Ed25519 public key" in _agent_start_error(tmp_path, "--decision-key", f"ops={hmac_key}")
    subprocess.run(
        [sys.executable, "-m", "bridge", "keygen", str(tmp_path / "pair")], check=True, capture_output=True
    )
    private = tmp_path / "pair.key"
    assert oct(private.stat().st_mode & 0o777) == "0o600"
    assert "not an Ed25519 public key" in _agent_start_error(tmp_path, "--decision-key", f"ops={private}")
    far = _rfc3339(time.time() + 90 * 86400)
    pub = decision_public_file(tmp_path)
    error = _agent_start_error(tmp_path, "--decision-key", f"ops={pub}", "--relay-legacy-until", far)
    assert "at most 31 days" in error


def test_keygen_pair_signs_what_the_agent_proves(tmp_path: Path) -> None:
    """``se-bridge keygen`` then ``decide`` with the private key: the public key proves it."""
    from bridge.decisions import DecisionKeys, load_signing_key, verify_for_agent

    subprocess.run(
        [sys.executable, "-m", "bridge", "keygen", str(tmp_path / "ops")], check=True, capture_output=True
    )
    keys = DecisionKeys.from_specs([f"ops={tmp_path / 'ops.pub'}"], public_only=True)
    decision = sign(
        new_decision(str(uuid.uuid4()), "vm1", "me", 60), "ops", load_signing_key(tmp_path / "ops.key")
    )
    assert verify_for_agent(orjson.loads(orjson.dumps(decision)), keys, time.time()).target == "vm1"
    with pytest.raises(ValueError, match="public key, which cannot sign"):
        load_signing_key(tmp_path / "ops.pub")
