"""What every transport helper needs to speak for its caller, and the spec option helpers they share.

A transport helper (a spec parser, a secret reader, a credential factory) is called by a sink *and*
by a source. Its messages must read as the caller's ("kafka sink: ..." for the agent, "kafka source:
..." for the approver) and its errors must be the caller's type (a permanent ``SinkError`` stops the
agent's start, a ``SourceError`` the approver's), so the caller passes an :class:`Owner` instead of
catching and rewording what the helper raised.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl


@dataclass(frozen=True, slots=True)
class Owner:
    """The sink or source a transport helper works for.

    ``label`` starts every message (``"kafka sink"``, ``"eventhubs source"``); ``error`` builds the
    owner's error for a configuration that can never work (permanent: the process refuses to start).
    """

    label: str
    error: Callable[[str], Exception]  # a BridgeError (sinks, sources) or a ConfigError (services)

    def refuse(self, message: str) -> Exception:
        """A permanent configuration error: ``"<label>: <message>"``."""
        return self.error(f"{self.label}: {message}")


def numeric_option(owner: Owner, name: str, value: str, low: float, high: float, cast: type = float) -> Any:
    """A numeric spec option within [low, high]; a refusal naming it otherwise."""
    try:
        number = cast(value)
    except ValueError:
        kind = "an integer" if cast is int else "a number"
        raise owner.refuse(f"{name} must be {kind}, got {value!r}") from None
    if not low <= number <= high:
        raise owner.refuse(f"{name} must be between {low:g} and {high:g}, got {number:g}")
    return number


def query_options(
    query: str,
    owner: Owner,
    known: Mapping[str, str],
    secret_hint: Callable[[str], str | None],
) -> dict[str, str]:
    """The ``name=value`` options of a spec's query, names lower-cased, values stripped.

    ``known`` is every option the caller accepts (with what it does: the refusal of an unknown option
    lists them). ``secret_hint(name)`` says how to give the secret a refused name would carry
    (``"sasl_password_env=VARIABLE or sasl_password_file=/path"``), or None for a harmless name: a
    secret in the spec is refused without its value ever being shown, since the spec is logged.
    """
    values: dict[str, str] = {}
    for key, value in parse_qsl(query, keep_blank_values=True):
        name = key.strip().lower()
        if name not in known:
            hint = secret_hint(name)
            if hint is not None:
                raise owner.refuse(
                    f"{key} is refused: never put a secret in the {owner.label} spec; use {hint}"
                )
            raise owner.refuse(f"unknown option {key!r} (known: {', '.join(known)})")
        if name in values:
            raise owner.refuse(f"option {name} given twice")
        values[name] = value.strip()
    return values
