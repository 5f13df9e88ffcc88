"""``se-bridge demo --console`` (issue 20): the fleet and the console a person is told to open.

What a newcomer does: runs the command, opens the printed address (the lab token becomes a session
cookie), sees three VMs and a user Reboot waiting, approves it, and the approver's audit says
``approved`` and the event starts; Ctrl-C (SIGTERM here) stops every process it started. The pages
themselves are tested in a browser in tests/integration/test_console.py; this checks the demo's wiring.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
import requests
from procs import wait_until

pytestmark = pytest.mark.slow


def test_the_console_demo_runs_a_fleet_a_person_can_approve_and_stops_clean(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "bridge", "demo", "--console", "--output", str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        # The address line, whatever a loaded machine prints before it (a log line of a starting part).
        url = None
        said = []
        for _ in range(200):
            line = proc.stdout.readline().decode()
            said.append(line)
            if not line or (m := re.search(r"http://\S+\?token=\S+", line)):
                url = m.group(0) if line else None
                break
        assert url, f"the demo printed no console address: {''.join(said)!r}"
        origin = url.split("/?", 1)[0]
        http = requests.Session()
        http.trust_env = False
        assert http.get(url, timeout=10).status_code == 200  # the token -> a session cookie

        def reboot() -> dict | None:
            fleet = http.get(f"{origin}/api/fleet", timeout=10).json()
            found = [e for e in fleet["events"] if e["eventType"] == "Reboot"]
            return found[0] if fleet["counts"]["vms"] == 3 and found else None

        event = wait_until(reboot, 30, what="three VMs and the user Reboot on the console")
        me = http.get(f"{origin}/api/me", timeout=10).json()
        answer = http.post(
            f"{origin}/api/decisions",
            data=orjson.dumps({"eventId": event["eventId"], "target": event["resources"][0],
                               "action": "approve", "reason": "demo", "confirm": event["resources"]}),
            headers={"Content-Type": "application/json", "X-CSRF-Token": me["csrf"], "Origin": origin},
            timeout=10,
        )  # fmt: skip
        assert answer.status_code == 202, answer.text
        audit = tmp_path / "console" / "audit.jsonl"

        def approved() -> bool:
            records = [orjson.loads(line) for line in audit.read_bytes().splitlines() if line.strip()]
            return any(r["outcome"] == "approved" and event["eventId"] in r["eventIds"] for r in records)

        wait_until(approved, 30, what="the approver's approved audit record")
        started = lambda: http.get(f"{origin}/api/events/{event['eventId']}", timeout=10).json()  # noqa: E731
        wait_until(lambda: started()["eventStatus"] == "Started", 30, what="the event Started")
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        code = proc.wait(30)
    assert code == 0
    time.sleep(0.5)
    left = subprocess.run(["pgrep", "-s", str(proc.pid)], capture_output=True, text=True).stdout.split()
    assert left == [], f"processes of the demo left running: {left}"
