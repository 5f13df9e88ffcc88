"""The pipeline's Prometheus series: the outbox, delivery per sink, and component liveness.

The services (agent, approver) own a registry and add their own series; the pipeline registers these
on it, so both services export them under the same names and one dashboard reads either. Labels are
bounded: ``sink`` is a sink id from configuration, ``kind``/``op`` are closed sets, ``component`` is
one of a service's fixed components (``poller``, ``delivery/<sink id>``, ...).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar, overload

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily

M = TypeVar("M", Counter, Gauge, Histogram)


class Series(Generic[M]):
    """One series, declared on a metrics class; :meth:`create` makes it on a registry.

    A non-data descriptor: once ``PipelineMetrics.__init__`` has set the created series on the
    instance, the instance attribute is what ``metrics.<name>`` returns."""

    def __init__(self, kind: type[M], name: str, help: str, labels: tuple[str, ...], **options: Any) -> None:
        self.kind: type[M] = kind
        self.name, self.help, self.labels, self.options = name, help, labels, options
        self.attr = ""

    def __set_name__(self, owner: type, attr: str) -> None:
        self.attr = attr

    @overload
    def __get__(self, instance: None, owner: type) -> Series[M]: ...
    @overload
    def __get__(self, instance: object, owner: type) -> M: ...
    def __get__(self, instance: object | None, owner: type) -> Series[M] | M:
        if instance is None:
            return self
        raise AttributeError(f"{owner.__name__}.{self.attr} is created by {owner.__name__}.__init__")

    def create(self, registry: CollectorRegistry) -> M:
        return self.kind(self.name, self.help, self.labels, registry=registry, **self.options)


def counter(name: str, help: str, *labels: str) -> Series[Counter]:
    return Series(Counter, name, help, labels)


def gauge(name: str, help: str, *labels: str) -> Series[Gauge]:
    return Series(Gauge, name, help, labels)


def histogram(name: str, help: str, *labels: str, buckets: tuple[float, ...]) -> Series[Histogram]:
    return Series(Histogram, name, help, labels, buckets=buckets)


class SinkLagCollector:
    """``se_bridge_sink_queue_depth`` and ``se_bridge_sink_oldest_unsent_age_seconds`` per sink,
    computed when scraped from the outbox itself: an idle service never wakes up to refresh a gauge."""

    def __init__(self) -> None:
        self._providers: list[Callable[[], tuple[str, int, float]]] = []

    def add(self, provider: Callable[[], tuple[str, int, float]]) -> None:
        """``provider()`` returns (sink id, records not confirmed, age in seconds of the oldest)."""
        self._providers.append(provider)

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[GaugeMetricFamily]:
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


class PipelineMetrics:
    """Outbox, delivery, liveness and API-refusal series, registered on ``self.registry``; a service's
    subclass declares its own with :func:`counter`, :func:`gauge` and :func:`histogram`."""

    http_refused = counter(
        "se_bridge_http_refused",
        "API requests refused before their route, by reason (origin, host, content_type, auth, busy, "
        "timeout, length, chunked).",
        "reason",
    )

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry or CollectorRegistry(auto_describe=True)
        self.outbox_records = Gauge("se_bridge_outbox_records", "Records held in the outbox.", registry=r)
        self.outbox_bytes = Gauge("se_bridge_outbox_bytes", "Bytes held in the outbox.", registry=r)
        self.outbox_corrupt = Counter(
            "se_bridge_outbox_corrupt_frames",
            "Damaged outbox regions skipped (at recovery or when read back) or torn tails cut off.",
            registry=r,
        )
        self.outbox_write_errors = Counter(
            "se_bridge_outbox_write_errors",
            "Failed outbox writes by operation (append: the record was not admitted and is retried; "
            "cursor: a sink's position is kept in memory and written again later).",
            ["op"],
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
        self.sink_lag = SinkLagCollector()
        r.register(self.sink_lag)
        self.sink_last_success = Gauge(
            "se_bridge_sink_last_success_timestamp_seconds",
            "Unix time of the sink's last confirmation.",
            ["sink"],
            registry=r,
        )
        self.component_up = Gauge(
            "se_bridge_component_up",
            "1 while a long-running component works, 0 once it failed for good (the process then exits "
            "non-zero so its service manager restarts it).",
            ["component"],
            registry=r,
        )
        self.component_errors = Counter(
            "se_bridge_component_errors",
            "Internal errors a component caught and retried, by component and kind.",
            ["component", "kind"],
            registry=r,
        )
        self._create_declared_series()

    def _create_declared_series(self) -> None:
        """Create every :class:`Series` declared on this class and its subclasses, in declaration
        order (a service declares its own series as class attributes)."""
        for cls in reversed(type(self).__mro__):
            for attr, declared in vars(cls).items():
                if isinstance(declared, Series):
                    setattr(self, attr, declared.create(self.registry))
