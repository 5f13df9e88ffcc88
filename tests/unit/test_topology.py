"""Approver topologies (issue 11): what each mode reads with, and what is refused before anything is
contacted because it would lose decisions or exceed an Event Hubs limit."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bridge.streams import topology

EH = "eventhubs://ns.servicebus.windows.net/se-decisions?credential=managed"
STORE = "&checkpoint_url=https://acct.blob.core.windows.net/checkpoints"
KAFKA = "kafka://10.0.0.5:9092/decisions"


def test_local_approvers_on_kafka_read_with_their_own_group_kept_across_restarts(tmp_path: Path) -> None:
    one, two = tmp_path / "vm1", tmp_path / "vm2"
    one.mkdir(), two.mkdir()
    group_one = topology.source_group("local", KAFKA, "se-bridge-approver", one)
    assert group_one.startswith("se-bridge-approver-") and group_one != "se-bridge-approver"
    assert topology.source_group("local", KAFKA, "se-bridge-approver", one) == group_one  # restart
    assert topology.source_group("local", KAFKA, "se-bridge-approver", two) != group_one  # another VM
    assert topology.source_group("fleet", KAFKA, "se-bridge-approver", one) == "se-bridge-approver"
    assert topology.source_group("local", EH, "se-bridge-approver", one) == "se-bridge-approver"


def test_a_damaged_instance_file_is_replaced(tmp_path: Path) -> None:
    (tmp_path / topology.INSTANCE_FILE).write_text("bad id with spaces\n")
    value = topology.instance_id(tmp_path)
    assert " " not in value and (tmp_path / topology.INSTANCE_FILE).read_text().strip() == value


def test_the_fleet_events_reader_reads_everything_in_every_instance(tmp_path: Path) -> None:
    kafka_group = topology.events_group(KAFKA, "se-bridge-approver", tmp_path)
    assert kafka_group.startswith("se-bridge-approver-fleet-")
    assert topology.events_group(EH, "se-bridge-approver", tmp_path) == "se-bridge-approver-fleet"
    topology.check_events_reader(EH)
    with pytest.raises(topology.TopologyRefused, match="every partition"):
        topology.check_events_reader(EH + STORE)


@pytest.mark.parametrize(
    ("mode", "spec", "refused"),
    [
        ("local", EH, None),
        ("local", EH + STORE, "split the partitions"),
        ("local", EH + "&checkpoint_connection_string_env=CP&checkpoint_container=c", "split"),
        ("fleet", EH + STORE, None),
        ("fleet", EH, "needs a checkpoint store"),
        ("fleet", KAFKA, None),
        ("local", KAFKA, None),
    ],
)
def test_topologies_that_lose_decisions_are_refused(mode: str, spec: str, refused: str | None) -> None:
    if refused is None:
        topology.check(mode, spec)
    else:
        with pytest.raises(topology.TopologyRefused, match=refused):
            topology.check(mode, spec)


def test_the_approver_refuses_at_start_with_the_reason(tmp_path: Path) -> None:
    key = tmp_path / "ops.key"
    key.write_bytes(b"k" * 40)
    proc = subprocess.run(
        [sys.executable, "-m", "bridge", "approver", "--mode", "fleet", "--source", EH,
         "--events-source", f"file://{tmp_path}/records.jsonl", "--sink", "stdout:",
         "--key", f"ops={key}", "--relay-key", f"relay={key}", "--state-dir", str(tmp_path / "state"),
         "--listen", "off"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "needs a checkpoint store" in proc.stderr
