"""Logging, error streaks and secret redaction shared by every service and tool.

Why one module: every operator-facing text (a JSON log line, an error message, a metric label) must
follow one rule: no secret ever leaves the process. Everything that may carry one (sink specs, URLs,
exception texts) goes through :func:`redact` first; the shapes of secret it knows are one table in
:mod:`bridge.support.redaction` (a leaf module, re-exported here), and the log writer applies it last.
The metric series themselves are declared by their layer (:mod:`bridge.pipeline.metrics`,
:mod:`bridge.agent.metrics`); their labels are bounded sets, never event ids, record ids or URLs.
"""

from __future__ import annotations

import logging
import math
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import orjson

from bridge.support.redaction import MASK, is_secret_name, redact
from bridge.support.timeutil import rfc3339

__all__ = ["ErrorStreak", "JsonFormatter", "RateLimitedLog", "redact", "setup_logging"]

# --------------------------------------------------------------------------------------------------
# JSON logging
# --------------------------------------------------------------------------------------------------

_RESERVED = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``ts``, ``level``, ``logger``, ``msg`` and any ``extra=`` fields.

    Messages and string fields are redacted here, at the last moment, so a careless ``extra`` cannot
    leak a secret either.
    """

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": rfc3339(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _RESERVED and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        # Twice: every string (nested in a list, a dict, a traceback) and every field named like a
        # credential (`"token": 123`) before encoding, where a value is plain text; then the whole
        # line, for what only shows once encoded (an object's str()). Log lines are rare (once per
        # change or per error streak), so this costs nothing.
        return redact(orjson.dumps(_redacted(out), default=_redacted_str).decode())


def _redacted(value: Any) -> Any:
    """``value`` with every string redacted and the value of every credential-named key masked."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {
            (redact(k) if isinstance(k, str) else k): (
                MASK if isinstance(k, str) and is_secret_name(k) and _maskable(v) else _redacted(v)
            )
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [_redacted(v) for v in value]
    return value


def _maskable(value: object) -> bool:
    return value is not None and not isinstance(value, bool) and value != ""


def _redacted_str(value: object) -> str:
    return redact(str(value))


def setup_logging(level: str = "info", stream: Any = None) -> None:
    """Route all logging to ``stream`` (stderr by default) as JSON lines."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # Chatty third-party loggers stay at warning unless the operator asks for debug everywhere:
    # requests' connection pool, the Azure SDKs (their AMQP stack logs under azure.eventhub._pyamqp),
    # and the Kafka client.
    if level.lower() != "debug":
        for name in ("urllib3", "azure", "confluent_kafka"):
            logging.getLogger(name).setLevel(logging.WARNING)


# --------------------------------------------------------------------------------------------------
# Error streaks: log once per streak, not once per poll
# --------------------------------------------------------------------------------------------------


@dataclass
class ErrorStreak:
    """Tracks a run of consecutive failures of one operation so it is logged once, not every second.

    The first failure of a streak is logged at ``warning``; a change of error kind is logged again;
    while the streak lasts a reminder is logged every ``remind_every`` seconds; the first success after
    a streak logs how long it lasted and how many attempts failed.
    """

    logger: logging.Logger
    what: str
    remind_every: float = 300.0
    level: int = logging.WARNING  # of the first line of a streak
    failures: int = 0
    kind: str | None = None
    since: float = 0.0
    _last_log: float = field(default=0.0, repr=False)

    def failure(self, kind: str, detail: str, **extra: object) -> None:
        now = time.monotonic()
        self.failures += 1
        if self.failures == 1 or kind != self.kind:
            if self.failures == 1:
                self.since = now
            self.kind = kind
            self._last_log = now
            self.logger.log(
                self.level,
                "%s failing: %s",
                self.what,
                detail,
                extra={"errorKind": kind, "failures": self.failures, **extra},
            )
        elif now - self._last_log >= self.remind_every:
            self._last_log = now
            self.logger.error(
                "%s still failing: %s",
                self.what,
                detail,
                extra={
                    "errorKind": kind,
                    "failures": self.failures,
                    "forSeconds": round(now - self.since, 1),
                },
            )

    def success(self) -> None:
        if self.failures:
            self.logger.info(
                "%s recovered",
                self.what,
                extra={
                    "failures": self.failures,
                    "lastErrorKind": self.kind,
                    "forSeconds": round(time.monotonic() - self.since, 1),
                },
            )
        self.failures = 0
        self.kind = None

    def duration(self) -> float:
        """Seconds since the streak began (0 when there is no streak)."""
        return time.monotonic() - self.since if self.failures else 0.0


# --------------------------------------------------------------------------------------------------
# Rate-limited lines: one per interval, with how many were left out
# --------------------------------------------------------------------------------------------------


@dataclass
class RateLimitedLog:
    """Logs an occurrence at most once per ``every`` seconds; the next line says how many were left
    out meanwhile. For what is normal but must not go unseen (a decision for another VM skipped),
    where a line per occurrence could flood the log."""

    logger: logging.Logger
    every: float = 60.0
    level: int = logging.INFO
    _last: float = field(default=-math.inf, repr=False)
    _suppressed: int = field(default=0, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def log(self, msg: str, **extra: object) -> bool:
        """Log ``msg`` unless a line went out less than ``every`` seconds ago; True when logged."""
        now = time.monotonic()
        with self._lock:
            if now - self._last < self.every:
                self._suppressed += 1
                return False
            suppressed, self._suppressed, self._last = self._suppressed, 0, now
        self.logger.log(self.level, msg, extra={**extra, "alsoSinceLastLine": suppressed})
        return True
