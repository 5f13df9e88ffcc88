"""The Azure channel service's Prometheus series: the pipeline's (same names as the agent's and the
approver's, so one dashboard serves all) and its own, with closed label sets."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from bridge.pipeline.metrics import PipelineMetrics, counter

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric


class CountsCollector:
    """A counter family read from a service's own map of counts when scraped (a closed label set)."""

    def __init__(
        self, name: str, documentation: str, label: str, counts: Callable[[], dict[str, int]]
    ) -> None:
        self.name, self.documentation, self.label, self.counts = name, documentation, label, counts

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import CounterMetricFamily

        family = CounterMetricFamily(self.name, self.documentation, labels=[self.label])
        for value, count in self.counts().items():
            family.add_metric([value], count)
        yield family


class ReconcilerCollector:
    """``se_bridge_azure_events_known`` and ``se_bridge_azure_unwatched_vms``, read when scraped."""

    def __init__(
        self, counts: Callable[[], tuple[int, int, int]], refused: Callable[[], dict[str, int]] | None = None
    ) -> None:
        self.counts = counts
        self.refused = refused

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Any:
        from prometheus_client.core import GaugeMetricFamily

        events, unwatched, in_grace = self.counts()
        yield GaugeMetricFamily(
            "se_bridge_azure_events_known", "Events the reconciliation holds.", value=events
        )
        yield GaugeMetricFamily(
            "se_bridge_azure_unwatched_vms",
            "VMs with an open event Azure published and no agent reported in the grace (GET /v1/unwatched).",
            value=unwatched,
        )
        yield GaugeMetricFamily(
            "se_bridge_azure_events_in_grace",
            "Events with findings still due; past MAX_IN_GRACE the Azure sources wait for them to settle.",
            value=in_grace,
        )
        if self.refused is not None:
            yield from CountsCollector(
                "se_bridge_azure_agent_claims_refused",
                "Agent records that may not speak for their VM, by reason (noResourceId, changedClaim).",
                "reason",
                self.refused,
            ).collect()


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

    def state_errors(self, errors: Callable[[], dict[str, int]]) -> None:
        self.registry.register(
            CountsCollector(
                "se_bridge_azure_state_errors",
                "Problems with the events' state file, by kind (corrupt: moved aside at start, write: a "
                "commit the disk refused, read: a lookup answered as unknown).",
                "kind",
                errors,
            )
        )

    def reconciler_counts(
        self, counts: Callable[[], tuple[int, int, int]], refused: Callable[[], dict[str, int]] | None = None
    ) -> None:
        self.registry.register(ReconcilerCollector(counts, refused))
