"""The approver under poison and hostile messages: the real approver, agent and emulator.

Each attack is published on the decisions source (a file) between legitimate decisions; the tests
assert that the attack is refused and audited, that nothing is retried for ever (the decisions after
it still go through), and what IMDS saw: exactly one StartRequest per legitimate decision.
"""

from __future__ import annotations

import subprocess
import threading
from pathlib import Path
from typing import Any

import orjson
import pytest
from procs import (
    DECISION_KEY,
    Emulator,
    approver_api,
    approver_command,
    names_decision,
    start_approver,
    wait_until,
)

from bridge.decisions import Decision, new_decision, sign
from bridge.schemas import validate_document

pytestmark = pytest.mark.slow

KEY = DECISION_KEY  # Ed25519 (the agents prove each decision with its public half)


def signed(event_id: str, **changes: Any) -> dict[str, Any]:
    return sign({**new_decision(event_id, "vm-bridge-0", "tests", 600), **changes}, "ops", KEY)


class Setup:
    def __init__(self, emulator: Emulator, agent: Any, workdir: Path) -> None:
        self.emulator, self.agent, self.workdir = emulator, agent, workdir
        self.decisions = workdir / "decisions.jsonl"
        self.audit = workdir / "audit.jsonl"
        self.decisions.touch()
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> subprocess.Popen[bytes]:
        self.proc = start_approver(
            self.workdir, f"file://{self.decisions}", f"file://{self.audit}", self.agent.api, KEY
        )
        return self.proc

    def publish(self, message: bytes | dict[str, Any]) -> None:
        line = message if isinstance(message, bytes) else orjson.dumps(message)
        with open(self.decisions, "ab") as f:
            f.write(line + b"\n")

    def audits(self) -> list[dict[str, Any]]:
        if not self.audit.exists():
            return []
        return [orjson.loads(x) for x in self.audit.read_bytes().splitlines() if x.strip()]

    def audit_of(self, decision_id: str) -> dict[str, Any]:
        return wait_until(
            lambda: next((a for a in self.audits() if names_decision(a, decision_id)), None),
            30,
            what=f"audit of {decision_id}",
        )

    def event(self) -> str:
        event_id = self.emulator.add_event(eventType="Freeze")
        self.agent.wait_for_change(event_id, "scheduled")
        return event_id

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(20)


@pytest.fixture
def setup(emulator: Emulator, make_agent, tmp_path: Path):
    s = Setup(emulator, make_agent(emulator.url).start(), tmp_path)
    yield s
    s.stop()


def test_the_date_time_format_is_checked() -> None:
    """Issue 9: ``rfc3339-validator`` was missing, so the schema's date-time format was never checked."""
    decision = signed("E", expiresAt="2026-02-30T10:00:00Z")
    assert any('is not a "date-time"' in e for e in validate_document(decision, "decision.v1.schema.json"))


def test_an_impossible_date_is_refused_and_does_not_wedge_the_approver(setup: Setup) -> None:
    """Issue 9: ``expiresAt 2026-02-30`` raised ValueError; the message was retried for ever and
    every later decision waited behind it."""
    event_id = setup.event()
    setup.start()
    poison = signed(event_id, expiresAt="2026-02-30T10:00:00Z")
    good = signed(event_id)
    setup.publish(poison)
    setup.publish(good)
    refused = setup.audit_of(poison["decisionId"])
    assert (refused["outcome"], refused["reason"]) == ("refused", "schema")
    assert setup.audit_of(good["decisionId"])["outcome"] == "approved"
    assert setup.emulator.state()["startRequests"] == {event_id: 1}


def test_a_decision_id_cannot_be_burned_without_the_key(setup: Setup) -> None:
    """Issue 9: an unsigned message carrying the id of a real decision made it a ``replayed`` refusal."""
    event_id = setup.event()
    real = signed(event_id)
    burner = {k: v for k, v in real.items() if k != "signature"}  # same id, no signature
    setup.publish(burner)
    setup.publish({"decisionId": real["decisionId"], "junk": True})  # not even schema-valid
    setup.publish(real)
    setup.start()
    audits = wait_until(lambda: len(setup.audits()) == 3 and setup.audits(), 30, what="three audits")
    # One worker per decision id (the burners and the real one wait for each other, in any order):
    # the two without the key are refused, the real decision is approved, not "replayed".
    assert sorted((a["outcome"], a["reason"] or "") for a in audits) == [
        ("approved", ""),
        ("refused", "schema"),
        ("refused", "unsigned"),
    ]
    assert setup.emulator.state()["startRequests"] == {event_id: 1}


def test_oversized_messages_and_fields_are_refused_without_being_stored_or_echoed(setup: Setup) -> None:
    """Issue 9: a decisionId of 5 MB was stored and audited."""
    event_id = setup.event()
    setup.start()
    huge = signed(event_id, decisionId="d" * (5 * 1024 * 1024))
    long_id = signed(event_id, decisionId="d" * 200)
    good = signed(event_id)
    for message in (huge, long_id, good):
        setup.publish(message)
    setup.audit_of(good["decisionId"])
    audits = setup.audits()
    # Lanes are per target VM and a message too large to parse has none: its audit may come first or
    # second (order is kept per VM, not across lanes).
    assert sorted((a["outcome"], a["reason"], a["decisionId"]) for a in audits[:2]) == [
        ("refused", "schema", None),
        ("refused", "tooLarge", None),
    ]
    assert max(len(orjson.dumps(a)) for a in audits) < 4096
    store = (setup.workdir / "approver-state" / "decisions.jsonl").read_bytes()
    assert len(store) < 4096 and b"d" * 200 not in store
    assert setup.emulator.state()["startRequests"] == {event_id: 1}


def test_a_second_approver_on_the_same_state_directory_touches_nothing(setup: Setup) -> None:
    """Issue 9: the second approver compacted and replaced ``decisions.jsonl`` before it found the
    lock, the first kept writing to the deleted file, and after a restart a replayed decision was
    audited ``approved`` a second time."""
    first_event = setup.event()
    first = signed(first_event)
    setup.publish(first)
    setup.start()
    assert setup.audit_of(first["decisionId"])["outcome"] == "approved"
    store = setup.workdir / "approver-state" / "decisions.jsonl"
    before = (store.stat().st_ino, store.read_bytes())
    second = subprocess.run(
        approver_command(setup.workdir, f"file://{setup.decisions}", "stdout:", setup.agent.api, KEY),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert second.returncode == 2 and "in use by another process" in second.stderr
    assert (store.stat().st_ino, store.read_bytes()) == before
    setup.stop()
    setup.start()  # a restart of the first: the replayed decision is refused, not approved again
    replay = dict(first)
    setup.publish(replay)
    wait_until(lambda: len(setup.audits()) == 2, 30, what="the replay's audit")
    assert [(a["outcome"], a["reason"]) for a in setup.audits()] == [
        ("approved", None),
        ("refused", "replayed"),
    ]
    assert setup.emulator.state()["startRequests"] == {first_event: 1}


BOOM = "B0000000-0000-4000-8000-00000000B00E"  # the event whose decision breaks the approver
NEXT = "0E000000-0000-4000-8000-0000000000E0"


def test_a_message_whose_processing_fails_is_ended_not_retried_for_ever(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A decision that passes validation but breaks the approver (a router that raises: a bug) is
    tried a few times, then audited ``unprocessable`` and committed; the next one is processed.
    In-process, because nothing outside the approver can make its own code raise."""
    import bridge.approver.service as service_module
    from bridge.approver.routing import LocalRouter, RelayClient
    from bridge.decisions import DecisionKeys, ValidationPolicy
    from bridge.signing import KeyRing
    from bridge.sinks import create_sink
    from bridge.streams.file import FileSource
    from bridge.support.retry import Backoff

    class BrokenRouter(LocalRouter):
        calls: dict[str, int] = {}

        def candidates(self, decision: Decision) -> list[str]:
            BrokenRouter.calls[decision.event_id] = BrokenRouter.calls.get(decision.event_id, 0) + 1
            if decision.event_id == BOOM:
                raise RuntimeError("a bug")
            return []  # no agent: retried until the decision expires (2 s), which is an outcome

    from bridge.approver import lifecycle

    monkeypatch.setattr(lifecycle, "Backoff", lambda **_: Backoff(base=0.001, cap=0.001))
    decisions = tmp_path / "decisions.jsonl"
    soon = new_decision(NEXT, "vm-bridge-0", "tests", 2)
    decisions.write_bytes(orjson.dumps(signed(BOOM)) + b"\n" + orjson.dumps(sign(soon, "ops", KEY)) + b"\n")
    service = service_module.Approver(
        source=FileSource(f"file://{decisions}", tmp_path / "src"),
        router=BrokenRouter("http://127.0.0.1:9"),
        relay=RelayClient(KeyRing()),
        policy=ValidationPolicy(DecisionKeys({"ops": KEY.public_key()})),
        sinks=[create_sink(f"file://{tmp_path}/audit.jsonl")],
        state_dir=tmp_path / "state",
        relay_attempts=1,
    )
    # The service's own loop (lanes, commits in read order), as in production.
    runner = threading.Thread(target=service.run, kwargs={"install_signals": False})
    runner.start()
    audit_file = tmp_path / "audit.jsonl"

    def audits() -> list[dict[str, Any]]:
        lines = audit_file.read_bytes().splitlines() if audit_file.exists() else []
        return [orjson.loads(line) for line in lines]

    try:
        wait_until(lambda: len(audits()) == 2, 30, what="both decisions ended")
        cursors = tmp_path / "src"
        wait_until(
            lambda: [c.read_text().strip() for c in cursors.glob("*.cursor")] == ["2"], 10, what="committed"
        )
    finally:
        service.stop_event.set()
        runner.join(30)
    assert sorted((a["eventIds"], a["outcome"], a["reason"]) for a in audits()) == sorted(
        [
            ([BOOM], "failed", "unprocessable"),
            ([NEXT], "failed", "expired"),
        ]
    )
    # The poison broke its batch and was retried on its own until given up; NEXT reached no agent
    # and waited, retried, until it expired (never given up as failed before).
    assert BrokenRouter.calls[BOOM] in (lifecycle.POISON_ATTEMPTS, lifecycle.POISON_ATTEMPTS + 1)
    assert BrokenRouter.calls[NEXT] >= 2


def _outbox_audits(outbox: Path) -> list[dict[str, Any]]:
    from bridge.pipeline import frames

    out = []
    for segment in sorted(outbox.glob("seg-*.log")):
        buf = segment.read_bytes()
        spans, _ = frames.scan(buf)
        out += [orjson.loads(frames.decode(buf, s).payload) for s in spans]
    return out


def test_the_approver_api_is_guarded_like_the_agents(setup: Setup, public_address: str) -> None:
    """Issue 10: the approver serves /healthz, /readyz and /metrics; a remote scraper needs the read
    token, a browser is refused, a DNS-rebinding Host on a loopback listener is refused."""
    import http.client

    token = setup.workdir / "read.token"
    token.write_bytes(b"approver-read-token-" + b"r" * 32)
    setup.proc = start_approver(
        setup.workdir,
        f"file://{setup.decisions}",
        f"file://{setup.audit}",
        setup.agent.api,
        KEY,
        "--listen",
        f"{public_address}:0",
        "--read-token-file",
        str(token),
    )
    port = int(approver_api(setup.workdir).rsplit(":", 1)[1])

    def status(path: str, **headers: str) -> int:
        conn = http.client.HTTPConnection(public_address, port, timeout=10)
        try:
            conn.request("GET", path, headers={"Host": f"{public_address}:{port}", **headers})
            return conn.getresponse().status
        finally:
            conn.close()

    wait_until(lambda: status("/readyz") == 200, 30, what="the approver ready")
    assert status("/healthz") == 200
    assert status("/metrics") == 401
    assert status("/metrics", Authorization="Bearer wrong") == 401
    assert status("/metrics", Authorization="Bearer " + token.read_text()) == 200
    assert status("/metrics", Origin="https://evil.example") == 403
