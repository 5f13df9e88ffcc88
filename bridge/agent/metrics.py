"""The agent's Prometheus series: the pipeline's (outbox, delivery, component liveness) and its own.

Labels are bounded (see ``docs/operations.md``): error kinds and transition names are closed sets,
event types and statuses are the documented IMDS values or ``other``; event ids, record ids and URLs
never appear in a label.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from bridge.pipeline.metrics import PipelineMetrics

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class AgentMetrics(PipelineMetrics):
    """Every Prometheus series the agent exports, on a private registry (no global state in tests):
    the pipeline's (outbox, delivery, component liveness) and the agent's own."""

    def __init__(self) -> None:
        super().__init__(CollectorRegistry(auto_describe=True))
        r = self.registry
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
        self.outbox_full = Counter(
            "se_bridge_outbox_full",
            "Polls whose change could not be admitted because the outbox was at its limit "
            "(the change is coalesced into the next record, see docs/operations.md).",
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
        self.http_refused = Counter(
            "se_bridge_http_refused",
            "API requests refused before their route, by reason (origin, host, content_type, auth, busy, "
            "timeout, length, chunked).",
            ["reason"],
            registry=r,
        )
        self.hook_runs = Counter(
            "se_bridge_hook_runs", "Local hook runs by hook and result.", ["hook", "result"], registry=r
        )
