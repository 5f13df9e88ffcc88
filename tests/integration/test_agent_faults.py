"""Faults and crashes: IMDS errors, malformed answers, kill -9, restarts, a sink that is down, a full outbox.

Everything runs for real: the emulator injects the faults on its HTTP path, the agent is a process
that is SIGKILLed and started again on the same state directory.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from procs import Agent, Emulator, wait_until
from test_agent_e2e import assert_consistent

# fault kind -> (metric, label) the agent must count it under
FAULTS = {
    "429": ("se_bridge_imds_poll_errors_total", {"kind": "http_429"}),
    "500": ("se_bridge_imds_poll_errors_total", {"kind": "http_5xx"}),
    "503": ("se_bridge_imds_poll_errors_total", {"kind": "http_5xx"}),
    "410": ("se_bridge_imds_poll_errors_total", {"kind": "http_410"}),
    "drop": ("se_bridge_imds_poll_errors_total", {"kind": "connection"}),
    "garbage": ("se_bridge_document_errors_total", {"reason": "invalid_json"}),
    "truncated": ("se_bridge_document_errors_total", {"reason": "invalid_json"}),
    "wrong-types": ("se_bridge_document_errors_total", {"reason": "bad_events"}),
}


@pytest.mark.parametrize("kind", sorted(FAULTS))
def test_fault_streak_is_counted_logged_once_and_survived(kind: str, emulator: Emulator, make_agent) -> None:
    agent = make_agent(emulator.url).start()
    emulator.control("POST", "faults", {"kind": kind, "count": 6})
    eid = emulator.add_event(eventType="Freeze")  # the change happens while IMDS misbehaves
    record = agent.wait_for_change(eid, "scheduled", timeout=30)
    metric, labels = FAULTS[kind]
    # A dropped kept-alive connection is retried once at once on a fresh one (an idle keep-alive closed
    # by the server is not an IMDS failure), so the first poll consumes two of the six drops.
    assert agent.metric(metric, **labels) == (5 if kind == "drop" else 6)
    streak_logs = [
        e for e in agent.logs() if e.get("msg", "").endswith("failing") or "failing:" in e.get("msg", "")
    ]
    assert len(streak_logs) == 1, streak_logs  # once per streak, not once per poll
    assert any(
        e.get("msg") == "polling IMDS scheduled events recovered" or e.get("msg", "").endswith("recovered")
        for e in agent.logs()
    )
    assert record["previousIncarnation"] == 1  # the previous state was kept through the bad answers
    assert_consistent(agent.records())
    assert agent.proc is not None and agent.proc.poll() is None


def test_slow_answer_times_out_and_recovers(emulator: Emulator, make_agent) -> None:
    agent = make_agent(emulator.url, "--imds-timeout", "0.5").start()
    emulator.control("POST", "faults", {"kind": "slow", "count": 2, "delaySeconds": 2})
    eid = emulator.add_event(eventType="Reboot")
    agent.wait_for_change(eid, "scheduled", timeout=30)
    assert agent.metric("se_bridge_imds_poll_errors_total", kind="timeout") >= 1


def test_first_request_may_take_long(emulator: Emulator, make_agent) -> None:
    """The first call after Scheduled Events wakes up may take minutes: it gets its own timeout."""
    emulator.control("POST", "faults", {"kind": "slow", "count": 1, "delaySeconds": 2})
    agent = make_agent(emulator.url, "--imds-timeout", "0.5", "--imds-first-timeout", "10").start()
    assert agent.metric("se_bridge_imds_poll_errors_total") == 0
    assert len(agent.records()) == 1


def test_readiness_follows_imds_failures(emulator: Emulator, make_agent) -> None:
    agent = make_agent(emulator.url, "--ready-max-failure", "1").start()
    wait_until(lambda: agent.get("/readyz").status_code == 200, what="ready")
    emulator.control("POST", "faults", {"kind": "500", "durationSeconds": 4})
    wait_until(lambda: agent.get("/readyz").status_code == 503, 10, what="not ready")
    assert "IMDS failing" in agent.get("/readyz").json()["reason"]
    assert agent.get("/healthz").status_code == 200  # liveness never depends on IMDS
    wait_until(lambda: agent.get("/readyz").status_code == 200, 30, what="ready again")


def test_kill_9_then_event_completes_while_down(emulator: Emulator, make_agent) -> None:
    agent = make_agent(emulator.url).start()
    eid = emulator.add_event(eventType="Freeze")
    agent.wait_for_change(eid, "scheduled")
    emulator.control("POST", f"events/{eid}/start")
    agent.wait_for_change(eid, "started")
    agent.kill()
    emulator.control("POST", f"events/{eid}/complete")  # vanishes while the agent is down
    other = emulator.add_event(eventType="Reboot")
    agent.start(first_record=False)
    record = agent.wait_for_change(eid, "completed")
    assert {(c["eventId"], c["change"]) for c in record["changes"]} == {
        (eid, "completed"),
        (other, "scheduled"),
    }
    assert_consistent(agent.records())


def test_kill_9_then_event_canceled_while_down(emulator: Emulator, make_agent) -> None:
    agent = make_agent(emulator.url).start()
    eid = emulator.add_event(eventType="Freeze")
    agent.wait_for_change(eid, "scheduled")
    agent.kill()
    emulator.control("POST", f"events/{eid}/cancel")
    agent.start(first_record=False)
    agent.wait_for_change(eid, "canceled")
    assert_consistent(agent.records())


def test_restart_without_changes_reports_nothing_again(emulator: Emulator, make_agent) -> None:
    agent = make_agent(emulator.url).start()
    eid = emulator.add_event(eventType="Freeze")
    agent.wait_for_change(eid, "scheduled")
    assert agent.terminate() == 0
    agent.start(first_record=False)
    wait_until(lambda: agent.metric("se_bridge_imds_polls_total") >= 5, what="a few polls")
    agent.kill()
    agent.start(first_record=False)
    wait_until(lambda: agent.metric("se_bridge_imds_polls_total") >= 5, what="a few polls")
    assert len(agent.records()) == 2
    assert_consistent(agent.records())


def test_sink_down_then_kill_9_loses_nothing(emulator: Emulator, make_agent, tmp_path: Path) -> None:
    """Records pile up in the outbox while the sink cannot write, survive SIGKILL, then go out in order."""
    blocker = tmp_path / "sink"
    blocker.write_text("a file where the sink's directory should be")  # the file sink cannot open
    agent = make_agent(emulator.url, sink=f"file://{blocker}/records.jsonl")
    agent.sink_path = blocker / "records.jsonl"
    agent.start(first_record=False)
    wait_until(lambda: agent.metric("se_bridge_records_total") == 1, what="first observation in the outbox")
    ids = []
    for n in (2, 3, 4):
        ids.append(emulator.add_event(eventType="Freeze"))
        wait_until(lambda n=n: agent.metric("se_bridge_records_total") == n, what="record in outbox")
    assert agent.metric("se_bridge_outbox_records") == 4
    assert agent.metric("se_bridge_sink_failures_total") >= 1
    agent.kill()
    blocker.unlink()
    blocker.mkdir()  # its directory is back (a file sink never creates one: issue 33)
    agent.start(first_record=False)
    wait_until(lambda: len(agent.records()) == 4, what="backlog delivered")
    records = agent.records()
    assert [c["eventId"] for r in records for c in r["changes"]] == ids  # in order, none missing
    assert_consistent(records)
    wait_until(lambda: agent.metric("se_bridge_outbox_records") == 0, what="outbox drained")


def test_full_outbox_coalesces_changes_and_keeps_the_newest_state(
    emulator: Emulator, make_agent, tmp_path: Path
) -> None:
    blocker = tmp_path / "sink"
    blocker.write_text("x")
    agent = make_agent(emulator.url, "--outbox-max-records", "2", sink=f"file://{blocker}/records.jsonl")
    agent.sink_path = blocker / "records.jsonl"
    agent.start(first_record=False)
    wait_until(lambda: agent.metric("se_bridge_records_total") == 1, what="first observation in the outbox")
    first = emulator.add_event(eventType="Freeze")
    wait_until(lambda: agent.metric("se_bridge_records_total") == 2, what="two records admitted")
    second = emulator.add_event(eventType="Reboot")
    third = emulator.add_event(eventType="Redeploy")
    wait_until(lambda: agent.metric("se_bridge_outbox_full_total") >= 2, what="outbox full counted")
    assert any("outbox" in e.get("msg", "") and e.get("level") == "error" for e in agent.logs())
    blocker.unlink()  # the sink comes back
    blocker.mkdir()  # its directory is back (a file sink never creates one: issue 33)
    wait_until(lambda: len(agent.records()) == 3, what="coalesced record")
    records = agent.records()
    last = records[-1]
    assert {c["eventId"] for c in last["changes"]} == {
        second,
        third,
    }  # the net change since the last admitted
    assert {e["eventId"] for e in last["events"]} == {first, second, third}  # newest state, nothing lost
    assert_consistent(records)


def test_bad_configuration_is_refused_clearly(tmp_path: Path) -> None:
    import subprocess
    import sys

    def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "bridge", "agent", *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=30,
            check=False,
        )

    state = str(tmp_path / "s")
    bad = run("--sink", "ftp://nowhere", "--state-dir", state)
    assert bad.returncode == 2 and "unsupported sink" in bad.stderr and "Traceback" not in bad.stderr
    bad = run("--sink", "stdout:", "--state-dir", state, "--poll-interval", "fast")
    assert bad.returncode == 2 and "poll_interval" in bad.stderr and "flag --poll-interval" in bad.stderr
    none = run("--state-dir", state)
    assert none.returncode == 2 and "at least one sink" in none.stderr


def test_agent_started_from_toml_and_environment(emulator: Emulator, tmp_path: Path) -> None:
    config = tmp_path / "agent.toml"
    config.write_text(
        f'[agent]\nimds_url = "{emulator.url}"\npoll-interval = 0.2\nlisten = "127.0.0.1:0"\n'
        f'sinks = ["file://{tmp_path}/from-toml.jsonl"]\n'
    )
    env = {"SE_BRIDGE_CONFIG": str(config), "SE_BRIDGE_STATE_DIR": str(tmp_path / "st")}
    agent = Agent(emulator.url, tmp_path, env=env)
    agent.sink_path = tmp_path / "from-toml.jsonl"
    import os
    import subprocess
    import sys

    log = open(agent.log_path, "ab")  # noqa: SIM115
    agent.proc = subprocess.Popen(
        [sys.executable, "-m", "bridge", "agent"],
        stderr=log,
        stdout=subprocess.DEVNULL,
        env={**os.environ, **env},
    )
    log.close()
    try:
        wait_until(lambda: agent.records(), what="record through the TOML-configured sink")
        assert (tmp_path / "st" / "baseline.json").exists()
    finally:
        agent.stop()


def test_kill_9_then_event_starts_and_completes_unseen(emulator: Emulator, make_agent) -> None:
    """The usual reboot case: the agent saw Scheduled, was down while the event started and finished."""
    agent = make_agent(emulator.url).start()
    eid = emulator.add_event(eventType="Reboot", noticeSeconds=1)
    agent.wait_for_change(eid, "scheduled")
    agent.kill()
    wait_until(lambda: any(e["eventStatus"] == "Started" for e in emulator.state()["events"]), what="started")
    emulator.control("POST", f"events/{eid}/complete")
    agent.start(first_record=False)
    record = agent.wait_for_change(eid, "completed")
    assert record["changes"][0]["previousStatus"] == "Scheduled"  # the start itself was not observed
    assert_consistent(agent.records())


@pytest.mark.parametrize("retry_after", ["86400", "inf", "nan"])
def test_a_retry_after_from_imds_never_stops_polling_for_long(
    retry_after: str, emulator: Emulator, make_agent
) -> None:
    """Issue 8: ``Retry-After: 86400`` stopped polling for a day and ``inf`` crashed the agent. The
    bound is 10 s (a Spot eviction gives 30 s of notice); nonsense values are ignored."""
    agent = make_agent(emulator.url).start()
    emulator.control("POST", "faults", {"kind": "429", "count": 1, "retryAfter": retry_after})
    eid = emulator.add_event(eventType="Preempt", noticeSeconds=30)
    agent.wait_for_change(eid, "scheduled", timeout=20)  # seen within the bound, not a day later
    assert agent.metric("se_bridge_imds_poll_errors_total", kind="http_429") == 1
    assert agent.proc is not None and agent.proc.poll() is None


def test_a_component_that_fails_stops_the_agent_with_exit_code_70(tmp_path: Path) -> None:
    """No silent death: a delivery worker whose loop breaks ends the agent non-zero (systemd's
    Restart=always then starts it again), after /healthz and the metric named the component.

    In-process, because nothing outside the process can break a worker's loop; the emulator, the
    sink and the HTTP listener are real."""
    import threading

    import requests

    from bridge.agent.config import AgentConfig
    from bridge.agent.service import Agent as AgentService
    from bridge.imds.emulator import EmulatorServer
    from bridge.shell.statedir import EXIT_COMPONENT_FAILED

    with EmulatorServer(port=0, rate_limit=0) as emu:
        config = AgentConfig(
            imds_url=emu.url,
            sink=(f"file://{tmp_path}/records.jsonl",),
            state_dir=tmp_path / "state",
            poll_interval=0.2,
            listen="127.0.0.1:0",
            shutdown_timeout=1.0,
        )
        service = AgentService(config)
        worker = service.workers[0]
        broken = threading.Event()

        def loop() -> None:
            broken.wait()
            raise SystemError("the loop itself broke")

        worker._loop = loop  # type: ignore[method-assign]
        codes: list[int] = []
        runner = threading.Thread(target=lambda: codes.append(service.run(install_signals=False)))
        runner.start()
        assert service.api is not None
        host, port = service.api.address
        url = f"http://{host}:{port}"
        wait_until(lambda: requests.get(f"{url}/healthz", timeout=5).status_code == 200, what="healthy")
        healthz = requests.get(f"{url}/healthz", timeout=5).json()
        assert healthz == {"status": "ok"}
        broken.set()
        runner.join(20)
    assert codes == [EXIT_COMPONENT_FAILED]
    alive, body = service.health.report()
    assert not alive and body["failed"] == {worker.component: "SystemError: the loop itself broke"}
    up = service.metrics.registry.get_sample_value("se_bridge_component_up", {"component": worker.component})
    assert up == 0


def test_a_trickling_imds_answer_cannot_hang_the_poll(emulator: Emulator, make_agent) -> None:
    """Issue 9, item 7: an answer sent one byte at a time reset the per-recv socket timeout with every
    byte, so the poll never returned and /readyz kept saying ready. ``--imds-timeout`` is now a deadline
    for the whole answer: each trickled poll fails as a timeout after about a second, readiness follows,
    and the change made meanwhile is recorded once IMDS answers normally again."""
    agent = make_agent(emulator.url, "--imds-timeout", "1", "--ready-max-failure", "1").start()
    wait_until(lambda: agent.get("/readyz").status_code == 200, what="ready")
    # ~150 bytes at 0.5 s each: a minute and more per answer if only each recv were bounded.
    emulator.control("POST", "faults", {"kind": "trickle", "count": 4, "delaySeconds": 0.5})
    eid = emulator.add_event(eventType="Freeze")  # the change happens while IMDS trickles
    wait_until(lambda: agent.get("/readyz").status_code == 503, 15, what="not ready while IMDS trickles")
    assert "IMDS failing" in agent.get("/readyz").json()["reason"]
    assert agent.metric("se_bridge_imds_poll_errors_total", kind="timeout") >= 1
    assert agent.get("/healthz").status_code == 200  # liveness never depends on IMDS
    agent.wait_for_change(eid, "scheduled", timeout=30)
    wait_until(lambda: agent.get("/readyz").status_code == 200, 15, what="ready again")
    assert agent.metric("se_bridge_imds_poll_errors_total", kind="timeout") == 4  # one per trickled poll
    assert emulator.state()["requests"]["faults"] == {"trickle": 4}
    assert_consistent(agent.records())
    assert agent.proc is not None and agent.proc.poll() is None
