"""A faithful emulator of the Azure IMDS Scheduled Events API (plus the instance endpoint).

It is the project's independent oracle for the agent's IMDS client and parser: it implements the wire
behaviour from Microsoft's documentation and real captures (request rules, exact error answers, every
api-version's document shape, the event state machine, rate limiting) and deliberately shares no code with
the rest of ``bridge``. Tests, the benchmark and the demo drive it through :class:`EmulatorServer` and the
JSON control API under ``/_emulator/`` (see ``docs/emulator.md``).
"""

from .profile import VmProfile
from .protocol import INSTANCE_VERSIONS, NEWEST_VERSIONS, SCHEDULED_EVENTS_VERSIONS
from .scenarios import SCENARIOS, EventSpec, Scenario, Step
from .server import EmulatorServer
from .state import FAULT_KINDS, EmulatorState

__all__ = [
    "FAULT_KINDS",
    "INSTANCE_VERSIONS",
    "NEWEST_VERSIONS",
    "SCENARIOS",
    "SCHEDULED_EVENTS_VERSIONS",
    "EmulatorServer",
    "EmulatorState",
    "EventSpec",
    "Scenario",
    "Step",
    "VmProfile",
]
