"""Fixtures of the attack tests: a non-loopback address of this machine for remote callers."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest
from faults import refused


def _global_ipv4() -> str | None:
    out = subprocess.run(
        ["ip", "-4", "-o", "addr", "show", "scope", "global"], capture_output=True, text=True, check=False
    ).stdout
    for line in out.splitlines():
        fields = line.split()
        if "inet" in fields:
            return fields[fields.index("inet") + 1].split("/")[0]
    return None


@pytest.fixture(scope="session")
def public_address() -> Iterator[str]:
    """An address that is not loopback, as a fleet approver on another VM would reach the agent: the
    machine's own global IPv4 address, or one on a dummy interface the fixture adds (root)."""
    address = _global_ipv4()
    if address is not None:
        yield address
        return
    dummy, address = "sebridge-test0", "198.51.100.7"
    added = subprocess.run(["ip", "link", "add", dummy, "type", "dummy"], capture_output=True, text=True)
    if added.returncode != 0:
        refused(f"no non-loopback address and cannot add a dummy interface: {added.stderr.strip()}")
    try:
        subprocess.run(["ip", "addr", "add", f"{address}/32", "dev", dummy], check=True)
        subprocess.run(["ip", "link", "set", dummy, "up"], check=True)
        yield address
    finally:
        subprocess.run(["ip", "link", "del", dummy], capture_output=True, check=False)
