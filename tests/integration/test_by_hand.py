"""The by-hand walkthrough in docs/approvals.md works as written (issue 21 item 3): the block between
its ``by-hand`` markers is run by bash, only its fixed ports and directory swapped for free ones (tests
run side by side) and ``se-bridge`` for this environment's. Real processes, as a person would start
them: the emulator, the agent, the approver, ``se-bridge decide``."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parents[2] / "docs" / "approvals.md"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _walkthrough() -> str:
    text = DOCS.read_text()
    found = re.search(r"<!-- by-hand:begin.*?-->\s*```sh\n(.*?)```\s*<!-- by-hand:end -->", text, re.S)
    assert found, "docs/approvals.md lost its by-hand block"
    return found.group(1)


def test_the_documented_by_hand_setup_approves_one_event(tmp_path: Path) -> None:
    script = _walkthrough()
    for port in ("8080", "8710", "8711"):
        assert port in script
        script = script.replace(port, str(_free_port()))
    se_bridge = str(Path(sys.executable).parent / "se-bridge")
    script = script.replace("/tmp/se-lab", str(tmp_path / "lab")).replace("se-bridge ", f"{se_bridge} ")
    output = tmp_path / "output.txt"
    with output.open("wb") as out_file:  # a file, not a pipe: the services left running keep it open
        proc = subprocess.Popen(
            ["bash", "-e", "-c", script],
            stdout=out_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # the block leaves three services in the background: one group
            env={k: v for k, v in os.environ.items() if not k.startswith("SE_BRIDGE_")},
        )
        try:
            code = proc.wait(timeout=90)
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
    out = output.read_text()
    assert code == 0, out
    assert out.count('"outcome":"approved"') == 2, out  # the approver's audit and the agent's
    assert re.search(r'"startRequests":\{"[0-9A-F-]{36}":1\}', out), out


def test_an_approver_without_a_relay_key_refuses_to_start(tmp_path: Path) -> None:
    """It would relay every decision to an agent that answers 401, spending each decision id."""
    key = tmp_path / "ops.key"
    key.write_text("k" * 40)
    base = [sys.executable, "-m", "bridge", "approver", "--source", f"file://{tmp_path}/d.jsonl",
            "--key", f"ops={key}", "--sink", "stdout:", "--state-dir", str(tmp_path / "s")]  # fmt: skip
    proc = subprocess.run(base, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "relay_key" in lines[0] and "--relay-key" in lines[0], proc.stderr
    # A fleet approver needs one too; a Unix-socket relay and --relay-unsigned (development) do not.
    fleet = [*base, "--mode", "fleet", "--events-source", f"file://{tmp_path}/e.jsonl"]
    assert subprocess.run(fleet, capture_output=True, timeout=60, check=False).returncode == 2
    for extra in (["--relay", "unix:/nonexistent.sock"], ["--relay-unsigned", "true"]):
        started = subprocess.Popen([*base, *extra, "--listen", "off"], stderr=subprocess.PIPE, text=True)
        try:
            assert started.wait(3) is None
        except subprocess.TimeoutExpired:
            pass  # still running: it started
        finally:
            started.kill()
            started.wait()
