"""What a person meets on the command line (issue 21): doomed decisions refused before they are
published, honest counts from ``validate``, a mistyped flag answered by its own command, an emulator
that names the port it could not take."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import orjson

EVENT = "28957A56-0000-4000-8000-000000000001"


def se_bridge(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bridge", *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def _decide(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    key = tmp_path / "ops.key"
    key.write_text("k" * 40)
    sink = tmp_path / "decisions.jsonl"
    return se_bridge("decide", "--sink", f"file://{sink}", "--target", "vm-bridge-0", "--key-id", "ops",
                     "--key-file", str(key), *args)  # fmt: skip


def test_decide_refuses_what_every_approver_would_refuse(tmp_path: Path) -> None:
    published = tmp_path / "decisions.jsonl"
    for args, says in [
        (["--event-id", EVENT, "--ttl", "0"], "--ttl must be from 1"),
        (["--event-id", EVENT, "--ttl", "-5"], "--ttl must be from 1"),
        (["--event-id", EVENT, "--ttl", str(8 * 86400)], "--ttl must be from 1"),
        (["--event-id", "not-a-guid"], "--event-id: 'not-a-guid' is not a GUID"),
        (["--event-id", EVENT, "--issued-by", "x" * 300], "--issued-by"),
    ]:
        proc = _decide(tmp_path, *args)
        assert proc.returncode == 2 and says in proc.stderr and "not published" in proc.stderr, (args, proc)
        assert not published.exists() or published.read_text() == ""
    ok = _decide(tmp_path, "--event-id", EVENT.lower())
    assert ok.returncode == 0, ok.stderr
    assert orjson.loads(published.read_text())["eventId"] == EVENT.lower()


def test_validate_counts_unreadable_files_honestly(tmp_path: Path) -> None:
    proc = se_bridge("validate", str(tmp_path / "nonexistent.jsonl"))
    assert proc.returncode == 1
    assert proc.stdout.strip() == "0 valid, 0 invalid, 0 records, 1 file(s) unreadable"
    assert "cannot read" in proc.stderr


def test_a_mistyped_flag_is_answered_by_its_command(tmp_path: Path) -> None:
    proc = se_bridge("agent", "--sinks", "stdout:")
    assert proc.returncode == 2
    assert "usage: se-bridge agent" in proc.stderr and "unrecognized arguments: --sinks" in proc.stderr
    proc = se_bridge("approver", "--sourc", "x", "--bogus")
    assert "usage: se-bridge approver" in proc.stderr and "--bogus" in proc.stderr


def test_the_emulator_names_the_port_it_could_not_take() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = se_bridge("simulate", "--port", str(port))
    assert proc.returncode == 2
    assert f"127.0.0.1:{port}" in proc.stderr and "in use" in proc.stderr, proc.stderr


def test_typos_fail_with_a_message_not_a_success_or_a_traceback(tmp_path: Path) -> None:
    """Issue 33: ``decide --sink file:///nonexistent/d.jsonl`` said published and created the
    directory; a mistyped ``[agnet]`` table was reported as "at least one sink is required";
    ``demo --scenario nope`` ended in a traceback."""
    key = tmp_path / "ops.key"
    key.write_text("k" * 40)
    nowhere = tmp_path / "nonexistent" / "d.jsonl"
    proc = se_bridge("decide", "--sink", f"file://{nowhere}", "--target", "vm1", "--key-id", "ops",
                     "--key-file", str(key), "--event-id", EVENT)  # fmt: skip
    assert proc.returncode != 0 and "does not exist" in proc.stderr and "published" not in proc.stdout
    assert not nowhere.parent.exists()
    config = tmp_path / "config.toml"
    config.write_text('[agnet]\nsink = ["stdout:"]\n')
    proc = se_bridge("agent", "--config", str(config))
    assert proc.returncode == 2 and "agnet" in proc.stderr, proc.stderr
    proc = se_bridge("demo", "--scenario", "nope", "--output", str(tmp_path / "demo"))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "nope" in proc.stderr, proc.stderr
