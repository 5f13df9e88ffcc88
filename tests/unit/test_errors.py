"""The error map at the top of bridge/errors.py is complete and BridgeError's kinds are labels."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bridge import errors
from bridge.errors import BridgeError

BRIDGE = Path(__file__).resolve().parents[2] / "bridge"


def test_every_exception_class_is_on_the_map() -> None:
    declared = set()
    for path in BRIDGE.rglob("*.py"):
        if "emulator" in path.parts:
            continue
        for match in re.finditer(r"^class (\w+)\((\w*(?:Exception|Error|Refused))\)", path.read_text(), re.M):
            declared.add(match.group(1))
    assert declared, "no exception class found: the pattern is wrong"
    doc = errors.__doc__ or ""
    assert sorted(name for name in declared if not re.search(rf"\b{name}\b", doc)) == []


@pytest.mark.parametrize("kind", ["", "Timeout", "connection refused", "x" * 40, "http 500"])
def test_a_kind_is_a_label_not_a_message(kind: str) -> None:
    with pytest.raises(ValueError):
        BridgeError("boom", kind=kind)


def test_a_kind_that_is_a_label_is_kept() -> None:
    assert BridgeError("boom", kind="http_429").kind == "http_429"
