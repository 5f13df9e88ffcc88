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


# The tests mirror the code by directory (issue 24): tests/unit holds the unit and property tests (no
# service process, broker or peer; in-process servers at most), tests/integration everything that
# starts real processes and peers. `make test-fast` runs tests/unit (`-m "not slow"`, about half a
# minute); every test under tests/integration is marked `slow` here, by where it lives.
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "integration" in item.path.parts:
            item.add_marker(pytest.mark.slow)
