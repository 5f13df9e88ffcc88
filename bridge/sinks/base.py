"""Helpers every sink module shares for reading its spec (the sink contract itself is
:mod:`bridge.pipeline.sink`): the config error that stops a start, the :class:`Owner` a sink hands to
the transport helpers it shares with the decision sources (:mod:`bridge.transports`), the scheme.
"""

from __future__ import annotations

import re

from bridge.pipeline.sink import SinkError
from bridge.transports.base import Owner


def config_error(message: str) -> SinkError:
    """A spec that can never work: permanent, so the agent refuses to start with this message."""
    return SinkError(message, kind="config", retryable=False)


def owner(label: str) -> Owner:
    """A sink as the transport helpers speak for it: messages start with ``label`` ("kafka sink"),
    refusals are :func:`config_error` s."""
    return Owner(label, config_error)


_SCHEME = re.compile(r"^([a-z][a-z0-9+.-]*):", re.IGNORECASE)


def scheme_of(spec: str) -> str:
    m = _SCHEME.match(spec.strip())
    return m.group(1).lower() if m else ""
