"""Named, data-driven event timelines replayed by the emulator.

The seven "real flows" reproduce event sequences captured on Azure VMs (EventType, EventSource,
DurationInSeconds, Description and the Scheduled -> Started -> gone timing). The others cover cases the
captures do not: scale-set Terminate, a hardware failure that skips Scheduled, an event naming several
VMs, two overlapping events, and the demo ``tour``.

All times here are *scenario seconds*: real seconds at speed 1. The emulator divides them by its speed,
so ``--accelerated`` (speed 60) turns the 15-minute notice into 15 s. A scenario only says when each event
*appears* and how long it stays in each state; the transitions themselves (Scheduled -> Started at
NotBefore or after an approval, Started -> gone) are driven by the emulator's state machine, which is why
an agent that approves an event sees the flow end earlier, exactly as on Azure.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

# Descriptions copied verbatim from real captures.
DESC_LIVE_MIGRATION = (
    "Virtual machine is being paused because of a memory-preserving Live Migration operation."
)
DESC_USER_REBOOT = "Virtual machine is going to be restarted as requested by authorized user."
DESC_HOST_MAINTENANCE = "Host server is undergoing maintenance."
DESC_FAILURE = "Virtual machine has encountered a failure."
DESC_USER_REDEPLOY = "Virtual machine is going to be redeployed as requested by authorized user."
DESC_SPOT_EVICTION = "The Virtual Machine will be evicted."

# Minimum notice per EventType (documentation "Event scheduling"): used when an injected event gives none.
DEFAULT_NOTICE_SECONDS: dict[str, float] = {
    "Freeze": 900.0,
    "Reboot": 900.0,
    "Redeploy": 600.0,
    "Preempt": 30.0,
    "Terminate": 600.0,
}
FALLBACK_NOTICE_SECONDS = 900.0
# "EventStatus:Started to Completed (event removed from Events array): 10 minutes" (documentation).
DEFAULT_STARTED_SECONDS = 600.0


@dataclass(frozen=True, slots=True)
class EventSpec:
    """One event of a scenario.

    ``notice`` is how long the event stays Scheduled before its NotBefore (``None``: it appears directly
    as Started, like a hardware failure). ``started_for`` is how long it stays Started before it leaves
    the document. ``cancel_after`` makes the platform withdraw it while still Scheduled: such an event
    never starts, even if approved, because on Azure the cancellation is the platform's decision.
    ``siblings`` adds that many other VMs of the same availability set to ``Resources``.
    """

    event_type: str
    source: str
    description: str
    duration: int
    notice: float | None
    started_for: float
    cancel_after: float | None = None
    siblings: int = 0

    @property
    def lifetime(self) -> float:
        """Scenario seconds from appearance to removal when nobody approves it early."""
        if self.cancel_after is not None:
            return self.cancel_after
        return (self.notice or 0.0) + self.started_for


@dataclass(frozen=True, slots=True)
class Step:
    """``spec`` appears ``at`` scenario seconds after the scenario starts."""

    at: float
    spec: EventSpec


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    summary: str
    steps: tuple[Step, ...]
    scale_set: bool = False  # the natural VM profile is a scale-set instance (Terminate)

    @property
    def length(self) -> float:
        """Scenario seconds until the document is empty again when no event is approved early."""
        return max((s.at + s.spec.lifetime for s in self.steps), default=0.0)


# A short lead-in lets a client that starts together with the emulator see the empty document first, as
# in the documentation's sample sequence (incarnation 1 empty -> 2 Scheduled -> 3 Started -> 4 empty).
LEAD_IN = 5.0


def _single(name: str, summary: str, spec: EventSpec, *, scale_set: bool = False) -> Scenario:
    return Scenario(name, summary, (Step(LEAD_IN, spec),), scale_set)


_LIVE_MIGRATION = EventSpec("Freeze", "Platform", DESC_LIVE_MIGRATION, 5, notice=900, started_for=300)
_USER_REBOOT = EventSpec("Reboot", "User", DESC_USER_REBOOT, -1, notice=900, started_for=600)
_HOST_MAINTENANCE = EventSpec("Freeze", "Platform", DESC_HOST_MAINTENANCE, 9, notice=900, started_for=600)
_REDEPLOY = EventSpec("Redeploy", "Platform", DESC_FAILURE, -1, notice=900, started_for=600)
_USER_REDEPLOY = EventSpec("Redeploy", "User", DESC_USER_REDEPLOY, -1, notice=900, started_for=600)
_CANCELED = EventSpec(
    "Freeze", "Platform", DESC_HOST_MAINTENANCE, 9, notice=900, started_for=600, cancel_after=480
)
# Spot eviction: 30 s minimum notice; once Started the VM is being evicted. The emulated VM survives, so
# the event simply leaves the document a minute later.
_SPOT = EventSpec("Preempt", "Platform", DESC_SPOT_EVICTION, -1, notice=30, started_for=60)
# Terminate comes from a scale-in or delete of a scale-set instance with terminate notifications enabled
# (notice user-configurable 5-15 min, default here 10). Captures show no description for it.
_TERMINATE = EventSpec("Terminate", "User", "", -1, notice=600, started_for=60)
# "During the recovery process, an event is created for all impacted VMs with EventType = Reboot and
# EventStatus = Started" (documentation, hardware failure).
_HARDWARE = EventSpec("Reboot", "Platform", DESC_FAILURE, -1, notice=None, started_for=600)
_MULTI_VM = EventSpec("Freeze", "Platform", DESC_LIVE_MIGRATION, 5, notice=900, started_for=300, siblings=2)
_OVERLAP_FREEZE = EventSpec("Freeze", "Platform", DESC_HOST_MAINTENANCE, 9, notice=900, started_for=600)
_OVERLAP_REBOOT = EventSpec("Reboot", "User", DESC_USER_REBOOT, -1, notice=900, started_for=600)


def _tour() -> Scenario:
    """Every scenario once, staggered, with shortened timings so speed 60 finishes in about 45 s.

    Per step (scenario seconds; divide by 60 for accelerated real seconds): Scheduled notice 300 s
    (5 s) instead of 600-900; Started 120 s (2 s) instead of 600, or 60 s (1 s) for live migration,
    multi-vm, terminate and spot eviction. Canceled maintenance is withdrawn after 240 s (4 s); spot
    eviction keeps its real 30 s notice. Steps start 120-420 s apart, so neighbouring flows overlap.
    """

    def short(
        spec: EventSpec, notice: float | None, started: float, cancel: float | None = None
    ) -> EventSpec:
        return EventSpec(
            spec.event_type,
            spec.source,
            spec.description,
            spec.duration,
            notice=notice,
            started_for=started,
            cancel_after=cancel,
            siblings=spec.siblings,
        )

    steps = (
        Step(30, short(_LIVE_MIGRATION, 300, 60)),  # gone at 390
        Step(240, short(_USER_REBOOT, 300, 120)),  # gone at 660
        Step(450, short(_HOST_MAINTENANCE, 300, 120)),  # gone at 870
        Step(660, short(_REDEPLOY, 300, 120)),  # gone at 1080
        Step(870, short(_USER_REDEPLOY, 300, 120)),  # gone at 1290
        Step(1080, short(_CANCELED, 300, 120, cancel=240)),  # canceled at 1320
        Step(1290, short(_MULTI_VM, 300, 60)),  # gone at 1650
        Step(1500, short(_OVERLAP_FREEZE, 300, 120)),  # Started 1800, gone at 1920
        Step(1860, short(_OVERLAP_REBOOT, 300, 120)),  # appears while the Freeze is Started, gone at 2280
        Step(1980, short(_TERMINATE, 300, 60)),  # gone at 2340
        Step(2400, short(_SPOT, 30, 60)),  # gone at 2490
        Step(2520, short(_HARDWARE, None, 120)),  # appears Started, gone at 2640 (44 s at speed 60)
    )
    return Scenario("tour", "demo: every scenario once, staggered; about 44 s at speed 60", steps)


_ALL: tuple[Scenario, ...] = (
    Scenario("idle", "empty document, nothing happens (default)", ()),
    _single(
        "live-migration", "Freeze/Platform 5 s: Scheduled 15 min -> Started 5 min -> gone", _LIVE_MIGRATION
    ),
    _single("user-reboot", "Reboot/User: Scheduled 15 min -> Started 10 min -> gone", _USER_REBOOT),
    _single(
        "host-agent-maintenance",
        "Freeze/Platform 9 s: Scheduled 15 min -> Started 10 min -> gone",
        _HOST_MAINTENANCE,
    ),
    _single("redeploy", "Redeploy/Platform: Scheduled 15 min -> Started 10 min -> gone", _REDEPLOY),
    _single("user-redeploy", "Redeploy/User: Scheduled 15 min -> Started 10 min -> gone", _USER_REDEPLOY),
    _single("canceled-maintenance", "Freeze/Platform 9 s: Scheduled 8 min -> gone, never Started", _CANCELED),
    _single("spot-eviction", "Preempt/Platform: Scheduled 30 s -> Started 1 min -> gone", _SPOT),
    _single(
        "terminate",
        "Terminate/User on a scale-set instance: Scheduled 10 min -> Started 1 min -> gone",
        _TERMINATE,
        scale_set=True,
    ),
    _single("hardware-failure", "Reboot/Platform appears directly Started, gone after 10 min", _HARDWARE),
    _single(
        "multi-vm",
        "Freeze/Platform naming this VM and two others of its availability set, 15 min -> 5 min -> gone",
        _MULTI_VM,
    ),
    Scenario(
        "overlapping",
        "Freeze scheduled; while it is Started a Reboot is scheduled (two events in one document)",
        (Step(LEAD_IN, _OVERLAP_FREEZE), Step(LEAD_IN + 1000, _OVERLAP_REBOOT)),
    ),
    _tour(),
)

SCENARIOS: Mapping[str, Scenario] = MappingProxyType({s.name: s for s in _ALL})
