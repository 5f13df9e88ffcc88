"""`make demo` must work on a fresh machine: run it (faster than the real demo) and check its output."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

STEPS = (
    "scheduled",
    "signed, published",
    "StartRequest received",
    "relay: StartRequest posted",
    "approved",
    "started",
    "completed",
)
#: What must precede what, whatever the machine's speed.
CAUSAL = [
    ("scheduled", "signed, published"),
    ("signed, published", "StartRequest received"),
    ("StartRequest received", "relay: StartRequest posted"),
    ("relay: StartRequest posted", "approved"),
    ("StartRequest received", "started"),
    ("started", "completed"),
]


def test_demo_runs_end_to_end_and_leaves_valid_records(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    proc = subprocess.run(
        [sys.executable, "-m", "bridge", "demo", "--output", str(out), "--speed", "120"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 schema violations" in proc.stdout
    assert "scheduled" in proc.stdout and "completed" in proc.stdout and "canceled" in proc.stdout
    assert (out / "records.jsonl").stat().st_size > 0 and (out / "agent.log").stat().st_size > 0
    # Act 2 (issue 11): the approval loop, every step seen, stamped with the time its own record gives
    # and printed in that order (issue 21: the order is causal, never the order the demo noticed it).
    act = proc.stdout.split("-- act 2", 1)[1]
    lines = [line for line in act.splitlines() if line.strip().endswith(tuple(STEPS))]
    assert [next(s for s in STEPS if line.endswith(s)) for line in lines].count("completed") == 1, act
    stamps = {next(s for s in STEPS if line.endswith(s)): float(line.split("s", 1)[0]) for line in lines}
    assert set(stamps) == set(STEPS), act
    for earlier, later in CAUSAL:
        assert stamps[earlier] <= stamps[later], (earlier, later, act)
    event = lines[0].split()[2]
    assert all(line.split()[2] == event for line in lines), act  # every line names the event
    assert "NOT SEEN" not in act and "DEMO FAILED" not in proc.stdout
    assert "approval audit records: approved 1" in proc.stdout
    audits = [json.loads(line) for line in (out / "audit.jsonl").read_text().splitlines()]
    assert [(a["component"], a["outcome"]) for a in audits] == [("approver", "approved")]
    check = subprocess.run(
        [sys.executable, "-m", "bridge", "validate", str(out / "records.jsonl")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert check.returncode == 0 and " 0 invalid" in check.stdout


def test_validate_reports_bad_records(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"recordType": "scheduledEvents", "schemaVersion": 2}\nnot json\n')
    proc = subprocess.run(
        [sys.executable, "-m", "bridge", "validate", str(bad)], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 1 and "0 valid, 2 invalid" in proc.stdout
