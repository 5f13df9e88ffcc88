"""The console's state directory, as every service's (issue 32): locked before the stream readers
open their positions in it, and watched while the console runs.

The console is the real process (``se-bridge console --auth lab``) reading a file stream.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import requests
from procs import DECISION_KEY, pem_files, wait_until

pytestmark = pytest.mark.slow


def start_console(workdir: Path, state: Path, log: Path) -> tuple[subprocess.Popen[bytes], int]:
    key_file, _ = pem_files(workdir, "console", DECISION_KEY)
    (workdir / "events.jsonl").touch()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "bridge", "console", "--auth", "lab",
             "--events-source", f"file://{workdir / 'events.jsonl'}",
             "--sink", f"file://{workdir / 'd.jsonl'}",
             "--key", f"console={key_file}", "--state-dir", str(state), "--listen", f"127.0.0.1:{port}"],
            stdout=out, stderr=out,
        )  # fmt: skip
    return proc, port


def ready(port: int) -> bool:
    try:
        return requests.get(f"http://127.0.0.1:{port}/readyz", timeout=2, proxies={"http": ""}).ok
    except requests.ConnectionError:
        return False


def test_a_second_console_on_one_state_directory_refuses_to_start(tmp_path: Path) -> None:
    state = tmp_path / "state"
    first, port = start_console(tmp_path, state, tmp_path / "first.log")
    try:
        wait_until(lambda: ready(port), 30, what="the first console")
        second, _ = start_console(tmp_path, state, tmp_path / "second.log")
        assert second.wait(30) == 2
        assert "state_dir:" in (tmp_path / "second.log").read_text()
        assert ready(port)  # the first one goes on
    finally:
        first.terminate()
        assert first.wait(20) == 0


def test_a_state_directory_deleted_under_the_console_stops_it_with_exit_70(tmp_path: Path) -> None:
    """A console going on without its directory would write the readers' positions into unlinked
    files, and a second console could start beside it: it stops, and its manager starts it afresh."""
    state = tmp_path / "state"
    proc, port = start_console(tmp_path, state, tmp_path / "console.log")
    try:
        wait_until(lambda: ready(port), 30, what="the console")
        shutil.rmtree(state)
        assert proc.wait(30) == 70
        text = (tmp_path / "console.log").read_text()
        assert "console state directory lost" in text
        assert "was deleted" in text or ".lock is gone" in text
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(20)


def test_a_port_in_use_is_one_line_and_no_sign_in_address(tmp_path: Path) -> None:
    """Issue 33: the console printed a clickable token URL, then died with exit 3 in JSON logs."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        key_file, _ = pem_files(tmp_path, "console", DECISION_KEY)
        (tmp_path / "events.jsonl").touch()
        done = subprocess.run(
            [sys.executable, "-m", "bridge", "console", "--auth", "lab",
             "--events-source", f"file://{tmp_path / 'events.jsonl'}",
             "--sink", f"file://{tmp_path / 'd.jsonl'}", "--key", f"console={key_file}",
             "--state-dir", str(tmp_path / "state"), "--listen", f"127.0.0.1:{port}"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert done.returncode == 2
    assert "token=" not in done.stdout + done.stderr
    assert done.stderr.strip().splitlines() == [
        f"se-bridge: configuration refused: listen: cannot serve on 127.0.0.1:{port}: Address already in use"
    ]
