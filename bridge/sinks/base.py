"""Helpers every sink module shares for reading its spec (the sink contract itself is
:mod:`bridge.pipeline.sink`): the config error that stops a start, numeric options, the scheme.
"""

from __future__ import annotations

import re
from typing import Any

from bridge.pipeline.sink import SinkError


def config_error(message: str) -> SinkError:
    """A spec that can never work: permanent, so the agent refuses to start with this message."""
    return SinkError(message, kind="config", retryable=False)


def numeric_option(owner: str, name: str, value: str, low: float, high: float, cast: type = float) -> Any:
    """A numeric spec option within [low, high]; a :func:`config_error` naming it otherwise."""
    try:
        number = cast(value)
    except ValueError:
        kind = "an integer" if cast is int else "a number"
        raise config_error(f"{owner}: {name} must be {kind}, got {value!r}") from None
    if not low <= number <= high:
        raise config_error(f"{owner}: {name} must be between {low:g} and {high:g}, got {number:g}")
    return number


_SCHEME = re.compile(r"^([a-z][a-z0-9+.-]*):", re.IGNORECASE)


def scheme_of(spec: str) -> str:
    m = _SCHEME.match(spec.strip())
    return m.group(1).lower() if m else ""
