"""The approver's Prometheus series: the pipeline's (same names as the agent's, so one dashboard
serves both) and the approver's own, with bounded labels."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bridge.pipeline.metrics import PipelineMetrics, counter, gauge
from bridge.streams import DecisionSource


class OwnershipCollector:
    """``se_bridge_approver_partitions_owned`` and ``se_bridge_approver_partition_lag{partition}``,
    read from the decisions source when scraped (labels: partition ids, bounded by the topic's or
    hub's partition count)."""

    def __init__(self) -> None:
        self.source: DecisionSource | None = None

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Any:
        from prometheus_client.core import GaugeMetricFamily

        owned = self.source.ownership() if self.source is not None else {}
        count = GaugeMetricFamily(
            "se_bridge_approver_partitions_owned", "Partitions of the decisions source this instance reads."
        )
        count.add_metric([], len(owned))
        lag = GaugeMetricFamily(
            "se_bridge_approver_partition_lag",
            "Messages of an owned partition not read yet (Kafka; absent when unknown).",
            labels=["partition"],
        )
        for partition, behind in sorted(owned.items()):
            if behind is not None:
                lag.add_metric([partition], behind)
        yield count
        yield lag


class FleetCollector:
    """``se_bridge_approver_fleet_vms`` and ``se_bridge_approver_fleet_events``: what the fleet view
    holds (bridge.approver.fleet), read when scraped."""

    def __init__(self) -> None:
        self.counts: Any = None  # () -> (VMs, events)
        self.lag: Callable[[], float] | None = None  # messages of the events stream known not read yet
        self.read: Callable[[], int] | None = None  # records taken from the events stream since start

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Any:
        from prometheus_client.core import GaugeMetricFamily

        if self.counts is None:
            return
        vms, events = self.counts()
        yield GaugeMetricFamily("se_bridge_approver_fleet_vms", "VMs the fleet view knows.", value=vms)
        yield GaugeMetricFamily(
            "se_bridge_approver_fleet_events", "Open events the fleet view knows.", value=events
        )
        if self.read is not None:
            from prometheus_client.core import CounterMetricFamily

            yield CounterMetricFamily(
                "se_bridge_approver_fleet_records_read",
                "Records taken from the events stream since start (a restart reads it again).",
                value=self.read(),
            )
        if self.lag is not None:
            yield GaugeMetricFamily(
                "se_bridge_events_reader_lag",
                "Records of the events stream known not read yet (/readyz waits for it to reach 0).",
                value=self.lag(),
            )


class ApproverMetrics(PipelineMetrics):
    """The pipeline's sink/outbox series (same names as the agent's, so dashboards work for both)
    plus the approver's own, declared below. ``reason`` is a closed set (the decision schema's refusal
    reasons and the relay's), ``kind`` an :class:`~bridge.errors.BridgeError` kind."""

    decisions = counter(
        "se_bridge_approver_decisions", "Decisions by outcome and reason.", "outcome", "reason"
    )
    source_errors = counter(
        "se_bridge_approver_source_errors",
        "Failed attempts to open or read the decisions source, by kind (retried with backoff).",
        "kind",
    )
    skipped = counter(
        "se_bridge_approver_decisions_skipped",
        "Valid decisions a local approver left to another VM's approver (no relay, no audit record).",
        "reason",
    )
    source_ready = gauge(
        "se_bridge_approver_source_ready", "1 while the decisions source is open and reads succeed."
    )
    fleet_claims_refused = counter(
        "se_bridge_approver_fleet_claims_refused",
        "Records of the events stream whose claims the fleet view refused, by reason (changedClaim, "
        "malformed, tooManyEvents, tooManyResources, fleetFull, unproven: an Azure channel record not signed "
        "by a --azure-key).",
        "reason",
    )
    parked = gauge(
        "se_bridge_approver_parked",
        "Decisions waiting, uncommitted, for an agent of their event to answer (retried until expiry).",
    )
    standby_acted = counter(
        "se_bridge_approver_standby_acted",
        "Decisions another instance owned and had not finished within --standby-after, acted on here.",
    )
    coordinated = counter(
        "se_bridge_approver_coordinated",
        "Coordinated verdicts acted on, by action (approve, leave) and why (allPrepared, deadline).",
        "action",
        "why",
    )

    def __init__(self) -> None:
        super().__init__()
        self.ownership = OwnershipCollector()
        self.registry.register(self.ownership)
        self.fleet = FleetCollector()
        self.registry.register(self.fleet)
