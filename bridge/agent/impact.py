"""What an event really did to this VM, measured here (issue 25): one ``impact`` record per event
(``schemas/impact.v1.schema.json``) when it ends, next to the duration IMDS advertised.

* **times**: when this agent first saw the event, when it first knew this VM's relay had approved it
  (its ledger, checked at each poll: within one poll interval), when it saw it ``Started``, when gone;
* **a pause** (Freeze, and whatever else freezes the guest): while an event is ``Started`` until it is
  gone, a sentinel thread wakes every 50 ms and keeps the largest gap beyond that, on three clocks (the
  poll loop's own rhythm would blur the pause by up to a poll interval: a pause that begins just
  after a poll hides that interval inside it).
  Which clock sees a paused guest depends on the hypervisor's clock source. Azure's Linux guests read
  time from Hyper-V's reference TSC page (``hyperv_clocksource_tsc_page``), and Hyper-V's Top-Level
  Functional Specification (Timers) says the partition's reference counter "continues to count up as
  long as at least one virtual processor is not explicitly suspended", and that the reference time
  "will appear to stop during the time that a guest partition is saved until the subsequent restore":
  across a freeze ``CLOCK_MONOTONIC`` and ``CLOCK_BOOTTIME`` stand still (KVM's kvmclock does the same,
  by design), and the pause shows on ``CLOCK_REALTIME`` once Hyper-V's time synchronization (the
  TimeSync integration service, hv_utils) steps the wall clock after the restore. So all three are
  recorded and ``pauseSeconds`` is the largest gap with the clock it came from (``pauseClock``: on Azure,
  ``realtime``; a pause of this process alone, or a host that keeps the counter running, shows on
  ``monotonic``). ``realtime`` also moves when NTP steps the clock for other reasons, which is why the
  clock is named;
* **a reboot** (Reboot, Redeploy, and a Preempt or Terminate the VM survived): the kernel's boot id
  (``/proc/sys/kernel/random/boot_id``) differs from the one this agent last ran under, and
  ``downSeconds`` is the time from the last moment the agent saw the VM alive (persisted every 30 s
  while an event is open, at each change and at a clean stop) to its first poll after the boot: an
  upper bound of the outage that includes the guest's own boot.

Cost: nothing while no event is open; while one is, a ledger lookup per poll and a small state file
written on each change and every 30 s (the boot id and the open events must survive the reboot they
measure); while one is Started (seconds for a Freeze), 20 wake-ups a second of three clock reads.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson

from bridge.agent.diff import Change
from bridge.imds.document import EventsDocument
from bridge.imds.instance import VmIdentity
from bridge.pipeline import Outbox, RecordMeta
from bridge.records import encode, impact_record
from bridge.support.fsutil import write_atomic
from bridge.support.timeutil import rfc3339

log = logging.getLogger(__name__)

STATE_FILE = "impact.json"
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
CLOCKS = {"monotonic": time.CLOCK_MONOTONIC, "boottime": time.CLOCK_BOOTTIME, "realtime": time.CLOCK_REALTIME}
ALIVE_EVERY = 30.0
SENTINEL_EVERY = 0.05
ENDINGS = frozenset({"completed", "canceled", "removed"})
MAX_OPEN = 64  # events watched at once, at most (a document holds a handful)


@dataclass
class Watch:
    """One open event, as it is persisted (it must survive a reboot)."""

    event_id: str
    event_type: str
    advertised: int | None
    first_seen: float
    started_at: float | None = None
    approved_at: float | None = None
    gaps: dict[str, float] = field(default_factory=dict)  # clock -> largest gap beyond the interval
    rebooted: bool = False
    down_seconds: float | None = None


class ImpactMeter:
    def __init__(
        self,
        state_dir: Path,
        outbox: Outbox,
        identity: Callable[[], VmIdentity],
        *,
        approved: Callable[[str], bool] = lambda event_id: False,
        boot_id_file: Path = BOOT_ID,
    ) -> None:
        self.path = state_dir / STATE_FILE
        self.outbox = outbox
        self.identity = identity
        self.approved = approved
        self.boot_id_file = boot_id_file
        self._lock = threading.Lock()
        self._watches: dict[str, Watch] = {}
        self._sentinel: threading.Thread | None = None
        self._stop = threading.Event()
        self._saved = 0.0
        self._boot_id = self._read_boot_id()
        self._after_boot: float | None = None  # last seen alive before a reboot, until the first poll
        self._load()

    # -- the poll loop's hooks -------------------------------------------------------------------------

    def tick(self) -> None:
        """After each poll-loop iteration: the first poll after a reboot, and approvals."""
        with self._lock:
            if not self._watches:
                return
            self._first_poll(time.time())
            for watch in self._watches.values():
                if watch.approved_at is None and self.approved(watch.event_id):
                    watch.approved_at = time.time()
            if time.clock_gettime(time.CLOCK_MONOTONIC) - self._saved >= ALIVE_EVERY:
                self._save()

    def _watch_pauses(self) -> None:
        """The sentinel: while an event is Started, the largest gap beyond its own rhythm, per clock."""
        last = _clocks()
        while not self._stop.wait(SENTINEL_EVERY):
            now = _clocks()
            with self._lock:
                started = [w for w in self._watches.values() if w.started_at is not None]
                if not started:
                    self._sentinel = None
                    return
                for watch in started:
                    for name, value in now.items():
                        gap = value - last[name] - SENTINEL_EVERY
                        watch.gaps[name] = round(max(watch.gaps.get(name, 0.0), gap), 3)
            last = now

    def on_change(self, previous: EventsDocument | None, doc: EventsDocument, changes: list[Change]) -> None:
        """A change listener (bridge.agent.poller): open, advance and close watches; an ended event's
        record goes to the outbox."""
        now = time.time()
        records = []
        with self._lock:
            self._first_poll(now)
            touched = False
            for change in changes:
                watch = self._watch(change, doc, now)
                if watch is None:
                    continue
                touched = True
                if change.change in ENDINGS:
                    del self._watches[change.event_id.upper()]
                    records.append(self._record(watch, change, now))
            if touched:  # a document change that no watched event is in costs no write
                self._save()
        for record in records:
            try:
                self.outbox.append(RecordMeta.of(record), encode(record))
            except Exception as exc:  # the measure is best effort: an event's own records are not
                log.warning(
                    "impact record not stored", extra={"eventId": record["eventId"], "error": str(exc)}
                )

    def close(self) -> None:
        """A clean stop: the last moment alive is now."""
        self._stop.set()
        with self._lock:
            if self._watches:
                self._save()

    # -- internals --------------------------------------------------------------------------------------

    def _watch(self, change: Change, doc: EventsDocument, now: float) -> Watch | None:
        key = change.event_id.upper()
        watch = self._watches.get(key)
        if watch is None and change.change not in ENDINGS and len(self._watches) < MAX_OPEN:
            event = doc.by_id().get(change.event_id)
            advertised = event.duration_in_seconds if event is not None else None
            watch = self._watches[key] = Watch(change.event_id, change.event_type, advertised, now)
        if watch is None:
            return None
        if watch.approved_at is None and self.approved(watch.event_id):
            watch.approved_at = now
        if change.event_status == "Started" and watch.started_at is None:
            watch.started_at = now
        if watch.started_at is not None and self._sentinel is None and not self._stop.is_set():
            self._sentinel = threading.Thread(target=self._watch_pauses, name="impact-sentinel", daemon=True)
            self._sentinel.start()
        return watch

    def _record(self, watch: Watch, ending: Change, now: float) -> dict[str, Any]:
        vm = self.identity()
        pause = max(watch.gaps.items(), key=lambda item: item[1], default=(None, 0.0))
        measured = {
            "eventType": watch.event_type,
            "ending": ending.change,
            "advertisedDurationSeconds": watch.advertised,
            "firstSeenAt": rfc3339(watch.first_seen),
            "approvedAt": rfc3339(watch.approved_at) if watch.approved_at is not None else None,
            "startedAt": rfc3339(watch.started_at) if watch.started_at is not None else None,
            "endedAt": rfc3339(now),
            "pauseSeconds": max(0.0, pause[1]) if watch.started_at is not None else None,
            "pauseClock": pause[0] if pause[1] > 0 else None,
            "gapsSeconds": {name: max(0.0, gap) for name, gap in watch.gaps.items()},
            "rebooted": watch.rebooted,
            "downSeconds": watch.down_seconds,
        }
        return impact_record(vm, watch.event_id, measured, now)

    def _read_boot_id(self) -> str | None:
        try:
            return self.boot_id_file.read_text().strip() or None
        except OSError:
            return None  # not Linux, or hidden: reboots are not detected

    def _load(self) -> None:
        """The watches of the previous run; a boot id that changed since means the VM rebooted."""
        try:
            state = orjson.loads(self.path.read_bytes())
            self._watches = {k: Watch(**v) for k, v in state.get("watches", {}).items()}
        except FileNotFoundError:
            return
        except (orjson.JSONDecodeError, TypeError, AttributeError) as exc:
            log.warning(
                "impact state unreadable; measures of open events are lost", extra={"error": str(exc)}
            )
            return
        if self._watches and self._boot_id and state.get("bootId") not in (None, self._boot_id):
            self._after_boot = float(state.get("lastAlive") or time.time())
            for watch in self._watches.values():
                watch.rebooted, watch.gaps = True, {}  # the gaps of a previous boot mean nothing now
            log.info("this VM rebooted since the agent last ran", extra={"events": sorted(self._watches)})

    def _first_poll(self, now: float) -> None:
        """The first poll after a reboot ends the outage the open events suffered."""
        if self._after_boot is None:
            return
        for watch in self._watches.values():
            if watch.rebooted and watch.down_seconds is None:
                watch.down_seconds = round(max(0.0, now - self._after_boot), 3)
        self._after_boot = None

    def _save(self) -> None:
        self._saved = time.clock_gettime(time.CLOCK_MONOTONIC)
        state = {
            "bootId": self._boot_id,
            "lastAlive": time.time(),
            "watches": {k: asdict(w) for k, w in self._watches.items()},
        }
        try:
            write_atomic(self.path, orjson.dumps(state))
        except OSError as exc:
            log.warning("impact state not saved", extra={"error": str(exc)})


def _clocks() -> dict[str, float]:
    return {name: time.clock_gettime(clock) for name, clock in CLOCKS.items()}
