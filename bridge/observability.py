"""Logging, metrics and secret redaction shared by the agent and the tools.

Why one module: every operator-facing signal (a JSON log line, a Prometheus series) must follow the
same two rules, so they live together.

* No secret ever leaves the process through a log line, an error message or a metric. Everything that
  may carry one (sink specs, URLs, exception texts) goes through :func:`redact` first.
* No unbounded label values. Metric labels are sink names (from configuration), error kinds and
  transition names (closed enums); never event ids, record ids or URLs.
"""

from __future__ import annotations

import logging
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily

from bridge.timeutil import rfc3339

# --------------------------------------------------------------------------------------------------
# Redaction
# --------------------------------------------------------------------------------------------------

# Query parameters and connection-string keys that carry credentials: Logic Apps `sig=`, SAS tokens
# (`sig`, `se`, `skn` are harmless but `sig` is the secret), Event Hubs `SharedAccessKey=`, passwords.
_SECRET_QUERY = re.compile(
    r"(?i)([?&;](?:sig|signature|sas|token|access_token|code|key|password|passwd|secret|apikey|api-key)=)"
    r"[^&;#\s\"']+"
)
_SECRET_KV = re.compile(
    r"(?i)((?:SharedAccessKey|SharedAccessSignature|AccountKey|password|passwd|secret|sasl\.password|"
    r"client_secret)\s*[=:]\s*)[^;&\s\"',}]+"
)
_URL_USERINFO = re.compile(r"(?i)(\b[a-z][a-z0-9+.-]*://)([^/@\s:]+):([^/@\s]+)@")


def redact(text: object) -> str:
    """Return ``text`` as a string with every credential-looking value replaced by ``***``.

    It is deliberately greedy: a log line with one ``***`` too many costs nothing, a leaked SAS key
    costs a key rotation across a fleet.
    """
    s = str(text)
    s = _URL_USERINFO.sub(r"\1\2:***@", s)
    s = _SECRET_QUERY.sub(r"\1***", s)
    s = _SECRET_KV.sub(r"\1***", s)
    return s


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
        # Redact the whole line, not field by field: a secret nested in a list, a dict or a traceback
        # is masked too. Log lines are rare (once per change or per error streak), so this costs nothing.
        return redact(orjson.dumps(out, default=str).decode())


def setup_logging(level: str = "info", stream: Any = None) -> None:
    """Route all logging to ``stream`` (stderr by default) as JSON lines."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # Chatty third-party loggers stay at warning unless the operator asks for debug everywhere.
    if level.lower() != "debug":
        for name in ("urllib3", "azure", "uamqp", "confluent_kafka"):
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

    def failure(self, kind: str, detail: str, **extra: Any) -> None:
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
# Metrics
# --------------------------------------------------------------------------------------------------

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class SinkLagCollector:
    """``se_bridge_sink_queue_depth`` and ``se_bridge_sink_oldest_unsent_age_seconds`` per sink."""

    def __init__(self) -> None:
        self._providers: list[Callable[[], tuple[str, int, float]]] = []

    def add(self, provider: Callable[[], tuple[str, int, float]]) -> None:
        """``provider()`` returns (sink id, records not confirmed, age in seconds of the oldest)."""
        self._providers.append(provider)

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Any:
        depth = GaugeMetricFamily(
            "se_bridge_sink_queue_depth", "Records not yet confirmed by a sink.", labels=["sink"]
        )
        age = GaugeMetricFamily(
            "se_bridge_sink_oldest_unsent_age_seconds",
            "Age of the oldest record a sink has not confirmed.",
            labels=["sink"],
        )
        for provider in self._providers:
            sink, records, oldest = provider()
            depth.add_metric([sink], records)
            age.add_metric([sink], oldest)
        yield depth
        yield age


class AgentMetrics:
    """Every Prometheus series the agent exports, on a private registry (no global state in tests)."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.polls = Counter(
            "se_bridge_imds_polls", "Scheduled Events GET requests answered 200.", registry=r
        )
        self.poll_errors = Counter(
            "se_bridge_imds_poll_errors",
            "Failed Scheduled Events polls by kind (timeout, connection, http_410, http_429, http_5xx, ...).",
            ["kind"],
            registry=r,
        )
        self.document_errors = Counter(
            "se_bridge_document_errors",
            "IMDS answers that could not be parsed as a Scheduled Events document, by reason.",
            ["reason"],
            registry=r,
        )
        self.imds_requests = Counter(
            "se_bridge_imds_requests", "Every HTTP request sent to IMDS, by operation.", ["op"], registry=r
        )
        self.imds_latency = Histogram(
            "se_bridge_imds_request_seconds",
            "IMDS request duration (request sent to body read).",
            ["op"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.document_incarnation = Gauge(
            "se_bridge_document_incarnation", "DocumentIncarnation of the last accepted document.", registry=r
        )
        self.events_current = Gauge(
            "se_bridge_events",
            "Events in the current document by type and status.",
            ["type", "status"],
            registry=r,
        )
        self.changes = Counter(
            "se_bridge_changes", "Event transitions detected, by transition.", ["change", "type"], registry=r
        )
        self.records = Counter("se_bridge_records", "Records written to the outbox.", registry=r)
        self.record_latency = Histogram(
            "se_bridge_record_durable_seconds",
            "From the IMDS answer received to the record durable in the outbox.",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.outbox_records = Gauge("se_bridge_outbox_records", "Records held in the outbox.", registry=r)
        self.outbox_bytes = Gauge("se_bridge_outbox_bytes", "Bytes held in the outbox.", registry=r)
        self.outbox_full = Counter(
            "se_bridge_outbox_full",
            "Polls whose change could not be admitted because the outbox was at its limit "
            "(the change is coalesced into the next record, see docs/operations.md).",
            registry=r,
        )
        self.outbox_corrupt = Counter(
            "se_bridge_outbox_corrupt_frames",
            "Outbox frames skipped on recovery (torn or corrupt).",
            registry=r,
        )
        self.sink_info = Gauge(
            "se_bridge_sink_info",
            "Configured sinks: id (the label of every sink series) and redacted spec.",
            ["sink", "name"],
            registry=r,
        )
        self.sink_sent = Counter("se_bridge_sink_sent", "Records confirmed by a sink.", ["sink"], registry=r)
        self.sink_failures = Counter(
            "se_bridge_sink_failures", "Failed deliveries by sink and kind.", ["sink", "kind"], registry=r
        )
        self.sink_retries = Counter(
            "se_bridge_sink_retries", "Delivery retries by sink.", ["sink"], registry=r
        )
        self.sink_dead_letters = Counter(
            "se_bridge_sink_dead_letters",
            "Records moved to the dead-letter file by sink.",
            ["sink"],
            registry=r,
        )
        # Queue depth and the age of the oldest unsent record are computed when scraped, from the
        # outbox itself: an idle agent then never wakes up just to refresh a gauge.
        self.sink_lag = SinkLagCollector()
        r.register(self.sink_lag)
        self.sink_last_success = Gauge(
            "se_bridge_sink_last_success_timestamp_seconds",
            "Unix time of the sink's last confirmation.",
            ["sink"],
            registry=r,
        )
        self.config_errors = Counter(
            "se_bridge_config_errors", "Configuration values refused at start-up.", registry=r
        )
        self.internal_errors = Counter(
            "se_bridge_internal_errors",
            "Unexpected errors caught by the poll loop (a bug: please report).",
            registry=r,
        )
        self.identity_known = Gauge(
            "se_bridge_vm_identity_known", "1 when the VM identity came from /metadata/instance.", registry=r
        )
        self.ready = Gauge("se_bridge_ready", "1 when /readyz answers 200.", registry=r)
        self.relay_requests = Counter(
            "se_bridge_relay_requests",
            "Relay (approval) requests by outcome and reason (a closed set of codes).",
            ["outcome", "reason"],
            registry=r,
        )
        self.relay_auth_failures = Counter(
            "se_bridge_relay_auth_failures",
            "Relay requests refused before any check (authentication).",
            registry=r,
        )
        self.hook_runs = Counter(
            "se_bridge_hook_runs", "Local hook runs by hook and result.", ["hook", "result"], registry=r
        )
