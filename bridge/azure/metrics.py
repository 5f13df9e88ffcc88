"""The Azure channel service's Prometheus series: the pipeline's (same names as the agent's and the
approver's, so one dashboard serves all) and its own, with closed label sets."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from bridge.pipeline.metrics import PipelineMetrics, counter


class ReconcilerCollector:
    """``se_bridge_azure_events_known`` and ``se_bridge_azure_unwatched_vms``, read when scraped."""

    def __init__(
        self, counts: Callable[[], tuple[int, int]], refused: Callable[[], dict[str, int]] | None = None
    ) -> None:
        self.counts = counts
        self.refused = refused

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Any:
        from prometheus_client.core import GaugeMetricFamily

        events, unwatched = self.counts()
        yield GaugeMetricFamily(
            "se_bridge_azure_events_known", "Events the reconciliation holds.", value=events
        )
        yield GaugeMetricFamily(
            "se_bridge_azure_unwatched_vms",
            "VMs with an open event Azure published and no agent reported in the grace (GET /v1/unwatched).",
            value=unwatched,
        )
        if self.refused is not None:
            from prometheus_client.core import CounterMetricFamily

            family = CounterMetricFamily(
                "se_bridge_azure_agent_claims_refused",
                "Agent records that may not speak for their VM, by reason (noResourceId, changedClaim).",
                labels=["reason"],
            )
            for reason, count in self.refused().items():
                family.add_metric([reason], count)
            yield family


class AzureChannelMetrics(PipelineMetrics):
    events = counter(
        "se_bridge_azure_events",
        "Events read from Azure's channel, by channel (eventGrid, resourceGraph) and result (news, late: "
        "published without moving the event's state back, duplicate: dropped).",
        "channel",
        "result",
    )
    refused = counter(
        "se_bridge_azure_refused",
        "Deliveries that are no usable event, dead-lettered, by reason (notJson, notAnEvent, "
        "otherResourceType, malformed, tooLarge).",
        "reason",
    )
    findings = counter(
        "se_bridge_azure_findings",
        "Reconciliation findings published, by finding (unwatched, outcome, agentOnly).",
        "finding",
    )
    source_errors = counter(
        "se_bridge_azure_source_errors",
        "Failed attempts to open or read a source, by kind (retried with backoff).",
        "kind",
    )

    def reconciler_counts(
        self, counts: Callable[[], tuple[int, int]], refused: Callable[[], dict[str, int]] | None = None
    ) -> None:
        self.registry.register(ReconcilerCollector(counts, refused))
