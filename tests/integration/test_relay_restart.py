"""An agent that dies around its own StartRequest (issue 21 item 2, issue 23 item 5).

A Reboot the VM approved reboots the VM: the agent is killed right after its StartRequest, often
before IMDS answered, and comes back to a document where the event is gone. Real processes: the
emulator (its POST faults hold or drop the StartRequest), the agent killed with SIGKILL, restarted on
the same state directory.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

from procs import Emulator, proven_body, relay_post, wait_until


def _records_of(agent: Any, event_id: str) -> list[tuple[str, str | None]]:
    return [
        (c["change"], c["previousStatus"])
        for r in agent.records()
        for c in r["changes"]
        if c["eventId"] == event_id
    ]


def _audits(agent: Any, decision_id: str) -> list[dict[str, Any]]:
    return [a for a in agent.records("approval") if a["decisionId"] == decision_id]


def test_an_event_approved_here_and_gone_while_the_agent_was_down_is_completed(make_agent) -> None:
    """The relay answered, the agent was killed before it saw the event Started, the event ran and
    ended meanwhile, NotBefore is still 15 minutes ahead: completed (started unseen), not canceled."""
    emulator = Emulator("--rate-limit", "0", "--approval-delay", "30")
    try:
        agent = make_agent(emulator.url).start()
        event_id = emulator.add_event(eventType="Reboot", eventSource="User")
        agent.wait_for_change(event_id, "scheduled")
        status, answer = relay_post(agent.api, proven_body(event_id))
        assert (status, answer["outcome"]) == (200, "approved")
        agent.kill()
        emulator.control("POST", f"events/{event_id}/complete")  # the reboot ran while the agent was down
        agent.start()
        agent.wait_for_change(event_id, "completed")
        assert _records_of(agent, event_id) == [("scheduled", None), ("completed", "Scheduled")]
    finally:
        emulator.stop()


def test_a_post_imds_took_before_the_agent_died_is_resolved_approved_on_restart(make_agent) -> None:
    """IMDS took the StartRequest but its answer never reached the agent (killed while waiting):
    after the restart the event is gone, so the POST is audited approved, the event completed, and
    the approver's retry of the same decision is answered from the ledger without a second POST."""
    emulator = Emulator("--rate-limit", "0")
    try:
        agent = make_agent(emulator.url).start()
        event_id = emulator.add_event(eventType="Reboot", eventSource="User")
        agent.wait_for_change(event_id, "scheduled")
        emulator.control("POST", "faults", {"kind": "slow", "on": "post", "delaySeconds": 60})
        decision = proven_body(event_id, issued_by="ops")
        threading.Thread(target=lambda: _quietly(relay_post, agent.api, decision), daemon=True).start()
        wait_until(lambda: emulator.state()["startRequests"].get(event_id), 15, what="IMDS took the POST")
        agent.kill()
        emulator.control("POST", f"events/{event_id}/complete")
        agent.start()
        agent.wait_for_change(event_id, "completed")
        (audit,) = wait_until(lambda: _audits(agent, decision["decisionId"]), 15, what="the resolution audit")
        assert (audit["outcome"], audit["results"][0]["result"]) == ("approved", "approved")
        assert "before the agent stopped" in audit["detail"] and audit["issuedBy"] == "ops"
        posts = emulator.state()["requests"]["post"]
        status, again = relay_post(agent.api, decision)
        assert (status, again["outcome"], again.get("repeat")) == (200, "approved", True)
        assert emulator.state()["requests"]["post"] == posts and emulator.state()["startRequests"] == {
            event_id: 1
        }
    finally:
        emulator.stop()


def test_a_post_that_never_reached_imds_is_unknown_and_the_retry_approves_once(make_agent) -> None:
    """Every POST dropped, the agent killed while it retries: after the restart the event is still
    Scheduled, so nobody can tell whether IMDS took it: audited ``unknown`` (never a flat failure), not
    kept in the ledger, and the approver's retry of that decision posts once and approves."""
    emulator = Emulator("--rate-limit", "0", "--approval-delay", "30")
    try:
        agent = make_agent(emulator.url).start()
        event_id = emulator.add_event(eventType="Freeze")
        agent.wait_for_change(event_id, "scheduled")
        emulator.control("POST", "faults", {"kind": "drop", "on": "post", "durationSeconds": 60})
        decision = proven_body(event_id)
        threading.Thread(target=lambda: _quietly(relay_post, agent.api, decision), daemon=True).start()
        wait_until(lambda: emulator.state()["requests"]["faults"].get("post-drop"), 15, what="a dropped POST")
        agent.kill()
        emulator.control("DELETE", "faults")
        agent.start(first_record=False)
        (audit,) = wait_until(lambda: _audits(agent, decision["decisionId"]), 15, what="the resolution audit")
        assert (audit["outcome"], audit["reason"], audit["results"][0]["result"]) == (
            "unknown",
            "interruptedPost",
            "unknown",
        )
        status, again = relay_post(agent.api, decision)
        assert (status, again["outcome"], again.get("repeat")) == (200, "approved", None)
        assert emulator.state()["startRequests"] == {event_id: 1}
    finally:
        emulator.stop()


def _quietly(call: Any, *args: Any) -> None:
    with contextlib.suppress(Exception):  # the agent is killed under this request: no answer is the point
        call(*args)
