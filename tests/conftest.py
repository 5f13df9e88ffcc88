import os
import sys
from pathlib import Path

# tests/helpers.py is imported as a plain module by the unit tests.
sys.path.insert(0, str(Path(__file__).parent))

from collections.abc import Callable, Iterator

import pytest
from procs import Agent, Emulator


@pytest.fixture
def emulator() -> Iterator[Emulator]:
    emu = Emulator("--rate-limit", "0")
    yield emu
    emu.stop()


@pytest.fixture
def make_agent(tmp_path: Path) -> Iterator[Callable[..., Agent]]:
    agents: list[Agent] = []

    def make(imds_url: str, *extra: str, **kwargs: object) -> Agent:
        agent = Agent(imds_url, tmp_path, *extra, **kwargs)  # type: ignore[arg-type]
        agents.append(agent)
        return agent

    yield make
    for agent in agents:
        agent.stop()


# Property tests: random exploration on developer machines (failures are kept in .hypothesis/), a
# fixed, reproducible set of examples in CI so a run never fails on an example nobody can replay.
from hypothesis import settings  # noqa: E402

settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


# `make test-fast` runs the unit and property tests (`-m "not slow"`, about half a minute): these
# modules hold no test that starts a service process or a broker. Every other test is marked `slow`
# here, so a new integration module is slow unless it is listed, never the other way round.
FAST_MODULES = frozenset(
    {
        "test_approver_seams",
        "test_config",
        "test_console_board",
        "test_delivery",
        "test_diff_record",
        "test_document",
        "test_errors",
        "test_emulator",
        "test_ledger",
        "test_decision",
        "test_fleet_view",
        "test_imds_client",
        "test_observability",
        "test_outbox",
        "test_outbox_model",
        "test_redaction",
        "test_relay_api",
        "test_retry",
        "test_topology",
        "test_state",
        "test_transports",
    }
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.module is None or item.module.__name__.rsplit(".", 1)[-1] not in FAST_MODULES:
            item.add_marker(pytest.mark.slow)
