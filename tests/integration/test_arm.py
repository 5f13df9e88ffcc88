"""The approver's ARM path (issue 12): ``ScheduledEvents_Acknowledge`` against a local HTTPS fake of
Azure Resource Manager, through the real azure-core pipeline (bearer-token policy, requests
transport, TLS verified against the fake's own CA).

Mocked, and why: Azure Resource Manager and Entra ID cannot run here. The fake ARM checks what the
real one would refuse: the bearer token's audience, the path (a VM, or the scale set of a scale-set
instance), the api-version, an empty body; it answers 200, 404, 409, 429 with ``Retry-After``, 500
as told. The credential is a test credential object with azure-identity's ``get_token`` contract
that issues an unsigned JWT naming the scope it was asked for.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import records
from peers.fake_arm import FakeArm, FakeCredential
from procs import wait_until

from bridge.approver.arm import ARM_API_VERSION, ArmAcknowledger, event_scope
from bridge.signing import sign_record

SUB = "0d2d7c4e-6a1b-4f3e-8a52-9c3b1e7f4a21"
VM_ID = f"/subscriptions/{SUB}/resourceGroups/rg1/providers/Microsoft.Compute/virtualMachines/vm1"
VMSS_VM_ID = VM_ID.replace("virtualMachines/vm1", "virtualMachineScaleSets/ss1/virtualMachines/3")
EVENT = "C7061BAC-AFDC-4513-B24B-AA5F13A16123"
AZURE_KEY = b"a" * 40


@pytest.fixture
def arm(tmp_path: Path) -> Iterator[FakeArm]:
    fake = FakeArm(tmp_path, "https://management.azure.com")
    yield fake
    fake.server.shutdown()


def acknowledger(arm: FakeArm, credential: FakeCredential, **kwargs: Any) -> ArmAcknowledger:
    return ArmAcknowledger(
        credential, arm.url, audience="https://management.azure.com", ca_file=arm.ca_file, **kwargs
    )


def test_an_acknowledgement_is_the_documented_request_with_the_right_token(arm: FakeArm) -> None:
    credential = FakeCredential()
    answer = acknowledger(arm, credential).acknowledge(VM_ID, EVENT)
    assert (answer.outcome, answer.reason, answer.status) == ("approved", None, 200)
    assert answer.detail == "Successfully Approved" and answer.correlation_id == "corr-1"
    (request,) = arm.requests
    assert request["path"] == (
        f"/subscriptions/{SUB}/resourcegroups/rg1/providers/Microsoft.Compute/virtualMachines/vm1"
        f"/providers/Microsoft.Maintenance/scheduledevents/{EVENT}/acknowledge?api-version={ARM_API_VERSION}"
    )
    assert request["aud"] == "https://management.azure.com" and request["body"] == b""
    assert credential.scopes == [("https://management.azure.com/.default",)]


def test_a_scale_set_instance_is_acknowledged_on_its_scale_set(arm: FakeArm) -> None:
    assert acknowledger(arm, FakeCredential()).acknowledge(VMSS_VM_ID, EVENT).outcome == "approved"
    assert "/virtualMachineScaleSets/ss1/providers/Microsoft.Maintenance/" in arm.requests[0]["path"]
    with pytest.raises(ValueError):
        event_scope(f"/subscriptions/{SUB}/resourceGroups/rg1/providers/Microsoft.Storage/storageAccounts/x")


@pytest.mark.parametrize(
    "resource_id",
    [
        f"/subscriptions/{SUB}/resourceGroups/rg1/providers/Microsoft.Compute/virtualMachines/../../x",
        f"/subscriptions/{SUB}/resourceGroups/rg1/providers/Microsoft.Compute/virtualMachines/vm1?x=1",
        f"/subscriptions/{SUB}/resourceGroups/rg1/providers/Microsoft.Compute/virtualMachines/vm1#x",
        f"/subscriptions/{SUB}/resourceGroups/rg%2F1/providers/Microsoft.Compute/virtualMachines/vm1",
        f"/subscriptions/{SUB}/resourceGroups/rg1./providers/Microsoft.Compute/virtualMachines/vm1",
        "/subscriptions/not-a-guid/resourceGroups/rg1/providers/Microsoft.Compute/virtualMachines/vm1",
        VM_ID.replace(SUB, "00000000-0000-0000-0000-000000000000"),  # another subscription
        VM_ID.replace("rg1", "rg2"),  # another group of the allowed subscription's scope rg1
    ],
)
def test_a_scope_outside_the_grammar_or_the_allowed_scopes_is_never_called(
    arm: FakeArm, resource_id: str
) -> None:
    """Issue 23: a resource id from an unsigned record reaches ARM only if it is a VM's id by Azure's
    naming rules and inside ``--arm-scope``; ``..``, ``?``, ``#``, ``%2F`` never reach a URL."""
    allowed = (f"/subscriptions/{SUB}/resourceGroups/rg1",)
    answer = acknowledger(arm, FakeCredential(), allowed_scopes=allowed).acknowledge(resource_id, EVENT)
    assert answer.outcome == "refused" and answer.reason == "armScopeRefused", answer
    assert arm.requests == []
    assert acknowledger(arm, FakeCredential(), allowed_scopes=allowed).acknowledge(VM_ID, EVENT).outcome == (
        "approved"
    )


@pytest.mark.parametrize(
    ("status", "outcome", "reason"),
    [(404, "refused", "armNotFound"), (409, "refused", "armConflict"), (403, "refused", "armForbidden")],
)
def test_refusals_are_final_and_named(arm: FakeArm, status: int, outcome: str, reason: str) -> None:
    arm.script = [(status, {}, {"error": {"code": "Code", "message": "what ARM said"}})]
    answer = acknowledger(arm, FakeCredential()).acknowledge(VM_ID, EVENT)
    assert (answer.outcome, answer.reason, answer.status) == (outcome, reason, status)
    assert answer.detail == "Code: what ARM said" and len(arm.requests) == 1


def test_throttling_and_server_errors_are_retried(arm: FakeArm) -> None:
    arm.script = [(429, {"Retry-After": "0"}, {"error": {"code": "TooManyRequests"}}), (500, {}, {})]
    answer = acknowledger(arm, FakeCredential()).acknowledge(VM_ID, EVENT)
    assert answer.outcome == "approved" and len(arm.requests) == 3


def test_a_retry_after_beyond_the_deadline_ends_failed_without_another_request(arm: FakeArm) -> None:
    """The Retry-After is honoured (capped at 30 s): waiting it would pass the 2 s deadline, so the
    acknowledgement fails at once instead of asking ARM again early."""
    arm.script = [(429, {"Retry-After": "3600"}, {"error": {"code": "TooManyRequests"}})]
    answer = acknowledger(arm, FakeCredential(), deadline=2.0).acknowledge(VM_ID, EVENT)
    assert (answer.outcome, answer.reason) == ("failed", "armUnavailable") and len(arm.requests) == 1


def test_an_endless_outage_ends_failed_within_the_deadline(arm: FakeArm) -> None:
    """The retry schedule on the acknowledger's own clock (a fake one here, which the waits move on:
    a loaded machine cannot change how many requests fit in the deadline)."""
    now = [0.0]
    waits: list[float] = []

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        now[0] += seconds

    arm.script = [(503, {}, {})] * 50
    answer = acknowledger(arm, FakeCredential(), deadline=2.0, clock=lambda: now[0], sleep=sleep).acknowledge(
        VM_ID, EVENT
    )
    assert (answer.outcome, answer.reason) == ("failed", "armUnavailable")
    assert waits == [0.5, 1.0] and len(arm.requests) == 3  # backoff 0.5 s, 1 s; the next (2 s) is past it


def test_a_token_for_another_audience_is_refused_and_tls_is_verified(arm: FakeArm) -> None:
    wrong = ArmAcknowledger(FakeCredential(), arm.url, audience="https://management.usgovcloudapi.net",
                            ca_file=arm.ca_file)  # fmt: skip
    assert wrong.acknowledge(VM_ID, EVENT).reason == "armForbidden"
    unverified = ArmAcknowledger(FakeCredential(), arm.url, deadline=1.0)  # system CAs: the fake is unknown
    assert unverified.acknowledge(VM_ID, EVENT).reason == "armUnavailable"
    assert len(arm.requests) == 1  # the unverified connection never sent a request


def run_fleet_approver(
    arm: FakeArm,
    tmp_path: Path,
    agent_port: int,
    *,
    target: str = "vm1",
    ttl: float = 600,
    azure: list[dict[str, Any]] = (),  # type: ignore[assignment]
    decided: str = EVENT,
) -> dict[str, Any]:
    """The fleet approver of an installed configuration (``arm = "fallback"``), in process, with one
    decision for ``EVENT`` on ``vm1``, whose agent is at ``127.0.0.1:agent_port``; its audit record.
    The credential is swapped for the test one (a managed identity exists only on Azure); everything
    else is what ``build_approver`` built from the TOML file."""
    import argparse

    from bridge.approver.build import build_approver
    from bridge.approver.config import load_approver_config
    from bridge.decisions import Decision, new_decision, sign
    from bridge.schemas import validate_record

    tmp_path.mkdir(exist_ok=True)
    key = tmp_path / "ops.key"
    key.write_bytes(b"k" * 40)
    (tmp_path / "azure.key").write_bytes(AZURE_KEY)  # azure-channel's --sign-key (bridge.signing)
    relay_key = tmp_path / "relay.key"
    relay_key.write_bytes(b"r" * 40)
    events, decisions, audit = (
        tmp_path / "events.jsonl",
        tmp_path / "decisions.jsonl",
        tmp_path / "audit.jsonl",
    )
    vm = records.vm_block("vm1", vm_id="5f0c2d4a-93f1-4c59-b7a8-2e61d0c4f9ab", resource_id=VM_ID,
                          private_ip="127.0.0.1")  # fmt: skip
    record = records.scheduled_events(vm, [records.event(EVENT, "vm1", "vm2")])
    events.write_bytes(b"".join(json.dumps(r).encode() + b"\n" for r in [record, *azure]))
    decisions.touch()
    config = tmp_path / "config.toml"
    config.write_text(
        "[approver]\n"
        f'source = "file://{decisions}"\nmode = "fleet"\nevents_source = ["file://{events}"]\n'
        f'relay_url_template = "http://{{privateIp}}:{agent_port}"\nkey = ["ops={key}"]\nsink = ["file://{audit}"]\n'
        f'state_dir = "{tmp_path / "state"}"\nlisten = "off"\nrelay_timeout = 1\n'
        f'relay_key = ["relay={relay_key}"]\nazure_key = ["azure={tmp_path / "azure.key"}"]\n'
        f'arm = "fallback"\narm_endpoint = "{arm.url}"\narm_audience = "https://management.azure.com"\n'
        f'arm_ca_file = "{arm.ca_file}"\narm_scope = ["/subscriptions/{SUB}/resourceGroups/rg1"]\n'
    )
    approver = build_approver(load_approver_config(argparse.Namespace(config=str(config)), environ={}))
    assert approver.relayer.arm is not None and approver.relayer.arm_mode == "fallback"
    approver.relayer.arm = ArmAcknowledger(  # the configured one, with the test's credential
        FakeCredential(), arm.url, audience="https://management.azure.com", ca_file=arm.ca_file,
        allowed_scopes=approver.relayer.arm.allowed_scopes,
    )  # fmt: skip
    runner = threading.Thread(target=approver.run, kwargs={"install_signals": False}, daemon=True)
    runner.start()
    try:
        decision = sign(new_decision(decided, target, "tests", ttl), "ops", b"k" * 40)
        wait_until(
            lambda: approver.router.resource_id(Decision.of(decision)) is not None,
            30,
            what="the scope learned",
        )
        decisions.write_bytes(json.dumps(decision).encode() + b"\n")
        wait_until(lambda: audit.exists() and audit.read_bytes().strip(), 60, what="the audit record")
        (line,) = audit.read_bytes().splitlines()
        written = json.loads(line)
        validate_record(written)
        return written
    finally:
        approver.stop_event.set()
        runner.join(30)


def test_a_fleet_approver_falls_back_to_arm_when_no_agent_of_the_event_answers(
    arm: FakeArm, tmp_path: Path
) -> None:
    """The event's only agent refuses connections (its VM is isolated): after the relay attempts the
    decision is acknowledged through ARM, on the VM's resource id learned from the events stream, and
    audited with ``path: arm`` and ARM's correlation id."""
    import socket

    with socket.socket() as s:  # a port nothing listens on: connection refused, never sent
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    written = run_fleet_approver(arm, tmp_path, dead)
    assert (written["outcome"], written["path"], written["requester"]) == ("approved", "arm", "arm")
    assert written["armCorrelationId"] == "corr-1" and written["results"][0]["result"] == "approved"
    assert [r["path"].split("?")[0].rsplit("/", 2)[-2] for r in arm.requests] == [EVENT]


def test_the_arm_path_refuses_what_every_agent_refuses(arm: FakeArm, tmp_path: Path) -> None:
    """Issue 19: the target rule (and the rest of bridge.eligibility) before ARM is called. A decision
    for a VM the event does not name is refused ``targetMismatch``, as an agent's relay refuses it
    (tests/integration/security/test_relay_attacks.py), and ARM is never asked; a decision for the
    event's other VM (vm2, no agent known) is acknowledged on vm1's scope."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    written = run_fleet_approver(arm, tmp_path / "a", dead, target="vm-elsewhere")
    assert (written["outcome"], written["reason"], written["path"]) == ("refused", "targetMismatch", "arm")
    assert written["results"][0]["result"] == "targetMismatch" and arm.requests == []
    written = run_fleet_approver(arm, tmp_path / "b", dead, target="vm2")
    assert (written["outcome"], written["path"]) == ("approved", "arm") and len(arm.requests) == 1


def test_the_arm_path_acknowledges_on_the_parent_azures_channel_names(arm: FakeArm, tmp_path: Path) -> None:
    """Issue 25: a Flexible scale set's VM has its own VM id, but its events live under the scale set;
    when Azure's channel (bridge.azure, an azureScheduledEvent record on the events stream) named the
    event's parent, the acknowledgement goes there. A parent outside Azure's grammar is ignored (the
    VM's own scope is used), and one outside --arm-scope is refused like any scope."""
    import socket

    from azure_events import grid_event

    from bridge.azure.events import from_event_grid
    from bridge.azure.records import azure_event_record
    from bridge.azure.tracker import News

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]

    def azure(parent: str, sub: str = SUB, key: bytes | None = AZURE_KEY) -> dict[str, Any]:
        event = grid_event(EVENT, "Scheduled", ["vm1", "vm2"], parent=parent, kind="virtualMachineScaleSets",
                           sub=sub, rg="rg1")  # fmt: skip
        record = azure_event_record(from_event_grid(event), News("Scheduled", False), time.time())
        return record if key is None else sign_record("azure", key, record)

    # What any agent could write to the events stream: unsigned, or signed with a key the approver
    # does not hold. Neither chooses the scope: the VM's own is used.
    for name, record in (
        ("unsigned", azure("flex1", key=None)),
        ("other key", azure("flex1", key=b"x" * 40)),
    ):
        written = run_fleet_approver(arm, tmp_path / name, dead, azure=[record])
        assert "/virtualMachines/vm1/" in arm.requests.pop()["path"], name
    written = run_fleet_approver(arm, tmp_path / "a", dead, azure=[azure("flex1")])
    assert (written["outcome"], written["path"]) == ("approved", "arm")
    (request,) = arm.requests
    assert request["path"].split("?")[0] == (
        f"/subscriptions/{SUB}/resourcegroups/rg1/providers/Microsoft.Compute/virtualMachineScaleSets/flex1"
        f"/providers/Microsoft.Maintenance/scheduledevents/{EVENT}/acknowledge"
    )
    forged = azure("flex1", key=None)  # signed, yet outside the grammar: refused all the same
    forged["event"]["parentId"] += "/../../other"
    forged = sign_record("azure", AZURE_KEY, forged)
    written = run_fleet_approver(arm, tmp_path / "b", dead, azure=[forged])
    assert "/virtualMachines/vm1/" in arm.requests[-1]["path"]  # the grammar refused it: the VM's own
    outside = azure("flex1", sub="11111111-2222-3333-4444-555555555555")
    written = run_fleet_approver(arm, tmp_path / "c", dead, azure=[outside])
    assert (written["outcome"], written["reason"]) == ("refused", "armScopeRefused") and len(
        arm.requests
    ) == 2


def test_a_vm_nobody_watches_is_approved_through_arm_at_once_from_azures_channel(
    arm: FakeArm, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 25: a VM without an agent (vm9, in a Flexible scale set) whose event Azure's channel
    published, and which the reconciliation found unwatched: the fleet approver knows the event, its
    parent and the VM's id from Azure's records, applies the same rule (target in Resources, event
    Scheduled), and acknowledges through ARM on the parent at once: the decision never waits in the
    parking for agents that do not exist."""
    import logging
    import socket

    from azure_events import grid_event

    from bridge.azure.events import from_event_grid
    from bridge.azure.reconcile import Reconciler
    from bridge.azure.records import azure_event_record
    from bridge.azure.tracker import News

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    agentless = "D1E2F3A4-0000-4000-8000-000000000009"
    event = from_event_grid(grid_event(agentless, "Scheduled", ["vm9"], parent="flex1",
                                       kind="virtualMachineScaleSets", sub=SUB, rg="rg1"))  # fmt: skip
    reconciler, now = Reconciler(grace=1, ended=lambda key: False), time.time()
    records = [azure_event_record(event, News("Scheduled", False), now)]
    records += reconciler.azure(event, News("Scheduled", False), now) + reconciler.due(now + 2)
    records = [sign_record("azure", AZURE_KEY, r) for r in records]  # what azure-channel --sign-key writes
    assert [r.get("finding") for r in records] == [None, "unwatched"]
    with caplog.at_level(logging.WARNING, logger="bridge.approver.service"):
        written = run_fleet_approver(arm, tmp_path, dead, target="vm9", azure=records, decided=agentless)
    assert (written["outcome"], written["path"]) == ("approved", "arm")
    (request,) = arm.requests
    assert (
        "/virtualMachineScaleSets/flex1/providers/Microsoft.Maintenance/scheduledevents/" in request["path"]
    )
    assert not [r for r in caplog.records if "waits for an agent" in r.getMessage()]


def test_no_arm_fallback_when_the_agent_may_have_posted(arm: FakeArm, tmp_path: Path) -> None:
    """An agent that accepted the connection and never answered may have posted the StartRequest
    already: approving through ARM as well could approve twice. The decision is retried instead
    until it expires, then ends ``unknown`` (reason ``expired``: a request may have
    reached the agent), and ARM is never called."""
    import socket

    with socket.socket() as hung:
        hung.bind(("127.0.0.1", 0))
        hung.listen(16)  # accepts (the kernel does), never reads or answers
        written = run_fleet_approver(arm, tmp_path, hung.getsockname()[1], ttl=4)
    assert (written["outcome"], written["reason"]) == ("unknown", "expired"), written
    assert "path" not in written and arm.requests == []
