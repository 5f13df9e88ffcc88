"""The agent process under real storage faults: a full disk, fd exhaustion, a damaged outbox, and the
order of fsync and delivery seen in the syscalls themselves.

The agent runs as installed (``python -m bridge agent``) against the emulator; the state directory is a
1 MiB tmpfs that the test fills; fd exhaustion is a lowered RLIMIT_NOFILE on the running process;
the syscall order is read from ``strace``. Assertions are on what the file sink received.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import stat
from pathlib import Path

import orjson
import pytest
import requests
from faults import fill, no_new_fds, tmpfs
from procs import Agent, Emulator, wait_until
from test_agent_e2e import assert_consistent

from bridge.pipeline import frames
from bridge.schemas import validate_record

pytestmark = pytest.mark.slow


def sink_lines(agent: Agent) -> list[bytes]:
    return agent.sink_path.read_bytes().splitlines() if agent.sink_path.exists() else []


def assert_every_line_is_a_valid_record(agent: Agent) -> list[dict]:
    """The sink never got half a record: each line parses and passes the schema."""
    records = []
    for line in sink_lines(agent):
        record = orjson.loads(line)  # raises on a cut record
        assert validate_record(record) == [], record
        records.append(record)
    return records


def test_a_full_disk_holds_the_change_back_and_records_it_when_space_returns(
    emulator: Emulator, make_agent, tmp_path: Path
) -> None:
    """Issue 8: on a full 1 MiB tmpfs a record with a long description was cut at 8192 bytes and
    delivered as invalid JSON. Now the change waits, whole, until the disk has room."""
    with tmpfs(tmp_path / "state") as state:
        agent = make_agent(emulator.url)
        agent.state_dir = state
        agent.start()
        filler = fill(state)
        event_id = emulator.add_event(eventType="Reboot", description="maintenance " + "x" * 3000)
        wait_until(lambda: agent.metric("se_bridge_outbox_write_errors_total", op="append") >= 2, 20)
        emulator.control("POST", f"events/{event_id}/start")  # a second change while the disk is full
        wait_until(lambda: agent.metric("se_bridge_outbox_write_errors_total", op="append") >= 4, 20)
        assert len(assert_every_line_is_a_valid_record(agent)) == 1  # nothing half-written went out
        assert any(e.get("errorKind") == "outbox_io" for e in agent.logs())
        assert agent.get("/healthz").status_code == 200  # a full disk is waited out, not a failure
        filler.unlink()
        record = agent.wait_for_change(event_id, "startedWithoutNotice", timeout=20)
        (event,) = record["events"]
        assert event["eventStatus"] == "Started" and len(event["description"]) == 3012
        records = assert_every_line_is_a_valid_record(agent)
        assert_consistent(records)
        agent.stop()


def committed_cursors(directory: Path) -> list[int]:
    """The cursor values the outbox has committed (written by rename; temporaries are skipped)."""
    return [int(p.read_text()) for p in directory.iterdir() if p.suffix != ".tmp"]


def test_cursors_that_cannot_be_written_do_not_stop_delivery(
    emulator: Emulator, make_agent, tmp_path: Path
) -> None:
    """A full disk while a sink catches up: every cursor write fails; delivery goes on, and a restart
    afterwards re-sends at most what was confirmed while the cursor could not be written."""
    blocker = tmp_path / "sink"
    blocker.write_text("a file where the sink's directory should be")
    with tmpfs(tmp_path / "state") as state:
        agent = make_agent(emulator.url, sink=f"file://{blocker}/records.jsonl")
        agent.sink_path, agent.state_dir = blocker / "records.jsonl", state
        agent.start(first_record=False)
        wait_until(lambda: agent.metric("se_bridge_records_total") == 1, what="first observation held")
        ids = [emulator.add_event(eventType="Freeze")]
        wait_until(lambda: agent.metric("se_bridge_records_total") == 2, what="two records held")
        filler = fill(state)
        blocker.unlink()  # the sink comes back while the disk is full
        blocker.mkdir()  # its directory is back (a file sink never creates one: issue 33)
        wait_until(lambda: len(sink_lines(agent)) == 2, what="backlog delivered on a full disk")
        assert agent.metric("se_bridge_outbox_write_errors_total", op="cursor") >= 1
        health = agent.get("/healthz")
        assert health.status_code == 200 and health.json()["status"] == "ok"
        filler.unlink()
        ids.append(emulator.add_event(eventType="Reboot"))
        agent.wait_for_change(ids[-1], "scheduled")
        cursors = state / "outbox" / "cursors"
        # Written again once there was room (the cursor follows the sink's confirmation: wait for it).
        # Only committed cursors: a ``.tmp`` listed here may be renamed before it is read.
        wait_until(lambda: committed_cursors(cursors) == [3], what="the cursor at 3")
        agent.kill()
        agent.start(first_record=False)
        ids.append(emulator.add_event(eventType="Redeploy"))
        agent.wait_for_change(ids[-1], "scheduled")
        records = assert_every_line_is_a_valid_record(agent)
        assert [c["eventId"] for r in records for c in r["changes"] if c["change"] == "scheduled"] == ids
        agent.stop()


def test_fd_exhaustion_does_not_kill_delivery(emulator: Emulator, make_agent) -> None:
    """Issue 8: an EMFILE while writing a cursor killed the delivery thread for good."""
    agent = make_agent(emulator.url).start()
    scrape = requests.Session()  # one kept-alive connection: the listener cannot accept a new one
    scrape.trust_env = False

    def metric(name: str, **labels: str) -> float:
        text = scrape.get(f"{agent.api}/metrics", timeout=5).text
        pattern = re.compile(rf"^{name}\{{([^}}]*)\}} (\S+)$", re.M)
        return sum(
            float(v)
            for lab, v in pattern.findall(text)
            if all(f'{k}="{x}"' in lab for k, x in labels.items())
        )

    assert metric("se_bridge_sink_sent_total") == 1
    assert agent.proc is not None
    records = 1
    with no_new_fds(agent.proc.pid) as tighten:
        # A transient fd closed after the limit was set leaves a hole the cursor's write may take:
        # tighten again and send another change, a few times at most.
        for _ in range(5):
            tighten()
            event_id = emulator.add_event(eventType="Freeze")
            agent.wait_for_change(event_id, "scheduled")  # delivered through the fds already open
            records += 1
            with contextlib.suppress(AssertionError):
                wait_until(lambda: metric("se_bridge_outbox_write_errors_total", op="cursor") >= 1, 3)
                break
        assert metric("se_bridge_outbox_write_errors_total", op="cursor") >= 1, "no EMFILE seen"
        assert scrape.get(f"{agent.api}/healthz", timeout=5).status_code == 200
    second = emulator.add_event(eventType="Reboot")
    agent.wait_for_change(second, "scheduled")  # the worker is alive
    cursors = agent.state_dir / "outbox" / "cursors"
    wait_until(lambda: committed_cursors(cursors) == [records + 1], what="cursor written once fds were free")
    assert_consistent(assert_every_line_is_a_valid_record(agent))


def test_a_damaged_middle_frame_costs_only_itself_across_a_restart(
    emulator: Emulator, make_agent, tmp_path: Path
) -> None:
    """Issue 8: with frame 3 of 8 damaged, records after it were silently never sent."""
    blocker = tmp_path / "sink"
    blocker.write_text("x")
    agent = make_agent(emulator.url, sink=f"file://{blocker}/records.jsonl")
    agent.sink_path = blocker / "records.jsonl"
    agent.start(first_record=False)
    wait_until(lambda: agent.metric("se_bridge_records_total") == 1, what="first observation held")
    for n in range(2, 9):
        emulator.add_event(eventType="Freeze")
        wait_until(lambda n=n: agent.metric("se_bridge_records_total") == n, what=f"record {n} held")
    agent.kill()
    (segment,) = (agent.state_dir / "outbox").glob("seg-*.log")
    found, _ = frames.scan(segment.read_bytes())
    ids = [frames.decode(segment.read_bytes(), f).record_id for f in found]
    assert [f.seq for f in found] == list(range(1, 9))
    data = bytearray(segment.read_bytes())
    data[found[2].end - 20] ^= 0x01  # one bit inside the payload of frame 3
    segment.write_bytes(bytes(data))
    blocker.unlink()
    blocker.mkdir()  # its directory is back (a file sink never creates one: issue 33)
    agent.start(first_record=False)
    wait_until(lambda: len(sink_lines(agent)) == 7, what="every intact record")
    records = assert_every_line_is_a_valid_record(agent)
    assert [r["recordId"] for r in records] == ids[:2] + ids[3:]
    damaged = [e for e in agent.logs() if e.get("msg", "").startswith("outbox frames damaged")]
    assert len(damaged) == 1 and damaged[0]["seqs"] == "3" and damaged[0]["level"] == "error"
    assert agent.metric("se_bridge_outbox_corrupt_frames_total") == 1
    wait_until(lambda: agent.metric("se_bridge_outbox_records") == 0, what="outbox drained")


def test_the_segment_is_fsynced_before_any_sink_sees_the_record(emulator: Emulator, tmp_path: Path) -> None:
    """Crash consistency, read from the syscalls: ``fdatasync`` of the outbox segment completes before
    the first write of that record to the sink. (A SIGKILL test cannot see a missing fsync: the page
    cache survives the process.)"""
    strace = shutil.which("strace")
    if strace is None:
        pytest.fail("strace is missing: make test installs it (Debian package strace)")
    trace = tmp_path / "trace.txt"
    prefix = (strace, "-f", "-qq", "-y", "-s", "400", "-e", "trace=write,fdatasync,fsync", "-o", str(trace))
    agent = Agent(emulator.url, tmp_path, prefix=prefix)
    traced: list[int] = []
    try:
        agent.start()
        assert agent.proc is not None  # strace: SIGTERM goes to the agent it runs; strace then exits
        tracer = agent.proc.pid
        traced = [int(p) for p in Path(f"/proc/{tracer}/task/{tracer}/children").read_text().split()]
        event_id = emulator.add_event(eventType="Freeze")
        record = agent.wait_for_change(event_id, "scheduled")
        (child,) = traced
        os.kill(child, signal.SIGTERM)
        assert agent.proc.wait(20) == 0
    finally:
        agent.stop()
        for pid in traced:  # killing strace does not kill what it traces
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    lines = trace.read_text(errors="replace").splitlines()
    order = syscall_order(lines, record["recordId"], str(agent.sink_path))
    assert order["segment write"] < order["segment fdatasync done"] < order["sink write"], order


def syscall_order(lines: list[str], record_id: str, sink_path: str) -> dict[str, int]:
    """Line numbers of: the frame's write to a segment, the completion of the fdatasync of that segment
    that follows it, and the first write of the record to the sink file."""
    found: dict[str, int] = {}
    sync_pid: str | None = None
    for number, line in enumerate(lines):
        pid, _, call = line.partition(" ")
        call = call.lstrip()  # strace pads the pid column: "601   write(" as well as "18506 write("
        if "segment write" not in found:
            if call.startswith("write(") and "/outbox/seg-" in call and record_id in call:
                found["segment write"] = number
            continue
        if "segment fdatasync done" not in found:
            if call.startswith("fdatasync(") and "/outbox/seg-" in call:
                if "<unfinished ...>" not in call:
                    found["segment fdatasync done"] = number
                else:
                    sync_pid = pid
            elif sync_pid == pid and call.startswith("<... fdatasync resumed>"):
                found["segment fdatasync done"] = number
        if call.startswith("write(") and sink_path in call and record_id in call:
            found["sink write"] = number
            break
    missing = {"segment write", "segment fdatasync done", "sink write"} - set(found)
    assert not missing, f"not in the trace: {missing}"
    return found


def test_state_files_and_directories_are_private(emulator: Emulator, make_agent) -> None:
    previous = os.umask(0o022)  # what a careless service manager would give
    try:
        agent = make_agent(emulator.url).start()
    finally:
        os.umask(previous)
    eid = emulator.add_event(eventType="Freeze")
    agent.wait_for_change(eid, "scheduled")
    agent.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
    agent.proc.wait(20)  # type: ignore[union-attr]
    for path in [agent.state_dir, *agent.state_dir.rglob("*")]:
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode == (0o700 if path.is_dir() else 0o600), (path, oct(mode))


def test_a_preparation_record_waits_for_a_full_disk_and_is_published_once_there_is_room(
    emulator: Emulator, make_agent, tmp_path: Path
) -> None:
    """Issue 12: a coordinated agent's `prepared` record is what its coordinator waits for. The
    prepare hook ends while the state directory's tmpfs is full: the record is not lost (the hook
    thread waits for room, logging why) and goes out, valid, once the disk has room."""
    go = tmp_path / "go"
    hook = tmp_path / "hook.sh"
    hook.write_text(f"#!/bin/sh\nwhile [ ! -e {go} ]; do sleep 0.1; done\n")
    hook.chmod(0o755)
    with tmpfs(tmp_path / "state") as state:
        agent = make_agent(emulator.url, "--coordinate", "fleet", "--prepare-hook", str(hook))
        agent.state_dir = state
        agent.start()
        event_id = emulator.add_event(eventType="Reboot")
        agent.wait_for_change(event_id, "scheduled")  # durable: the hook runs now
        filler = fill(state)
        go.touch()  # the hook ends while the disk is full
        wait_until(lambda: any(e.get("msg") == "record waits for the outbox" for e in agent.logs()), 20,
                   what="the preparation record waiting for room")  # fmt: skip
        assert not [r for r in agent.records("preparation") if r["eventId"] == event_id]
        filler.unlink()
        (record,) = wait_until(
            lambda: [r for r in agent.records("preparation") if r["eventId"] == event_id],
            30,
            what="the preparation record once there is room",
        )
        assert record["result"] == "prepared" and record["hook"]["result"] == "ok"
        assert validate_record(record) == []
        agent.stop()
