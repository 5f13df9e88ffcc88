"""Which approver topologies cannot lose a decision, and the consumer identity each one reads with.

* **local** mode: one approver per VM, each acting only for its own VM (see
  :mod:`bridge.approver.routing`), so each must read *every* decision. On Kafka a shared consumer
  group would split the partitions between VMs: a decision read by the wrong VM's approver would be
  skipped and committed, and the intended VM would never see it. So a local approver reads with its own
  group, ``<group>-<instance>``, where the instance id (host name and a random suffix) is created
  once in the state directory and kept across restarts and upgrades, so its offsets are too.
  On Event Hubs every local approver is a reader of every partition in one consumer group; Event Hubs
  admits at most 5 readers per partition and consumer group (and 20 consumer groups per hub on
  Standard; Event Hubs quotas), so local mode there is for at most 5 VMs. The service refuses a sixth
  reader (``QuotaExceeded``); the source reports it as a ``quota`` error that names fleet mode
  (counted in ``se_bridge_approver_source_errors_total{kind="quota"}``, the approver not ready).
* **fleet** mode: a few central instances share the decisions' partitions. On Kafka that is the
  consumer group as configured. On Event Hubs only a Blob checkpoint store gives partition ownership
  (load balancing) and shared positions: without one every instance would read every partition from
  its own positions, so fleet mode on Event Hubs without a checkpoint store is refused at start.
* the fleet approver's **events reader** (``--events-source``, how it learns agents and events) is
  the opposite: every instance must read *every* partition, or it would know only part of the fleet.
  On Kafka it reads with its own group (``<group>-fleet-<instance>``); on Event Hubs, in the
  ``<group>-fleet`` consumer group, it must have no checkpoint store (which would split the
  partitions between instances) and is refused with one.
"""

from __future__ import annotations

import hashlib
import re
import socket
import urllib.parse
from pathlib import Path

from bridge.support.fsutil import write_atomic

INSTANCE_FILE = "instance-id"
#: What Event Hubs admits per partition and consumer group (non-epoch receivers).
EVENTHUBS_READERS_PER_GROUP = 5


_STORE_OPTIONS = frozenset(
    {"checkpoint_url", "checkpoint_connection_string_env", "checkpoint_connection_string_file"}
)


class TopologyRefused(ValueError):
    """A configuration that would lose decisions or exceed a documented service limit."""


def source_group(mode: str, source_spec: str, group: str, state_dir: Path) -> str:
    """The consumer group the decisions source reads with (see the module docstring)."""
    if mode == "local" and _scheme(source_spec) == "kafka":
        return f"{group}-{instance_id(state_dir)}"
    return group


def events_group(spec: str, group: str, state_dir: Path) -> str:
    """The consumer group of the fleet approver's events reader (every instance reads everything):
    its own on Kafka; on Event Hubs ``<group>-fleet``, which must exist on the events hub
    (infra/main.bicep creates ``se-bridge-approver-fleet``) and holds the instances as readers."""
    if _scheme(spec) == "kafka":
        return f"{group}-fleet-{instance_id(state_dir)}"
    return f"{group}-fleet"


def check_events_reader(spec: str) -> None:
    if _scheme(spec) == "eventhubs" and _has_checkpoint_store(spec):
        raise TopologyRefused(
            "events_source: the fleet approver's events reader must read every partition in every "
            "instance; a checkpoint store would split them between instances: remove checkpoint_*"
        )


def check(mode: str, spec: str) -> None:
    """Refuse what would lose decisions: local approvers on Event Hubs with a checkpoint store (they
    would split the partitions between VMs), fleet mode on Event Hubs without one. Checked on the spec,
    before anything is contacted."""
    if _scheme(spec) != "eventhubs":
        return
    store = _has_checkpoint_store(spec)
    if mode == "local" and store:
        raise TopologyRefused(
            "local mode on Event Hubs with a checkpoint store: the local approvers of several VMs "
            "would split the partitions, and a decision read on the wrong VM is skipped there and "
            "never reaches its own; remove checkpoint_* (each VM keeps its positions in its state "
            "directory) or run a fleet approver"
        )
    if mode == "fleet" and not store:
        raise TopologyRefused(
            "fleet mode on Event Hubs needs a checkpoint store (checkpoint_url=..., "
            "checkpoint_container=...): without one every instance reads every partition from its own "
            "positions, and the instances cannot share the partitions"
        )


def instance_id(state_dir: Path) -> str:
    """This approver's id, kept in the state directory. A new one is derived from the host name and
    the state directory's path, not drawn at random: a state directory lost (deleted, a new disk)
    gives the same id back, so a local approver's consumer group (``<group>-<id>``) is the same and
    resumes at its committed offsets instead of reading the whole topic again (issue 23)."""
    path = state_dir / INSTANCE_FILE
    try:
        value = path.read_text().strip()
    except FileNotFoundError:
        value = ""
    if not re.fullmatch(r"[A-Za-z0-9._-]{1,80}", value):
        host = re.sub(r"[^A-Za-z0-9.-]", "-", socket.gethostname())[:48] or "host"
        where = hashlib.sha256(f"{socket.gethostname()}|{state_dir.resolve()}".encode()).hexdigest()[:8]
        value = f"{host}-{where}"
        write_atomic(path, value.encode() + b"\n")
    return value


def _has_checkpoint_store(spec: str) -> bool:
    """Whether an ``eventhubs://`` spec names a checkpoint store (the options the source reads it from)."""
    query = urllib.parse.urlsplit(spec).query
    keys = {k.lower() for k, _ in urllib.parse.parse_qsl(query, keep_blank_values=True)}
    return bool(keys & _STORE_OPTIONS)


def _scheme(spec: str) -> str:
    return spec.split(":", 1)[0].lower()
