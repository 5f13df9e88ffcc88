"""The agent's Prometheus series: the pipeline's (outbox, delivery, component liveness) and its own.

Labels are bounded (see ``docs/operations.md``): error kinds and transition names are closed sets,
event types and statuses are the documented IMDS values or ``other``; event ids, record ids and URLs
never appear in a label.

The agent's own series are declared as class attributes (:func:`~bridge.pipeline.metrics.counter`,
``gauge``, ``histogram``): one line of name, help and labels each, read like a table, and each is
created on the instance's private registry by ``AgentMetrics()``. ``metrics.polls`` is then the live
:class:`~prometheus_client.Counter`, typed as such.
"""

from __future__ import annotations

from bridge.pipeline.metrics import PipelineMetrics, counter, gauge, histogram

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class AgentMetrics(PipelineMetrics):
    """Every Prometheus series the agent exports, on a private registry (no global state in tests):
    the pipeline's (outbox, delivery, component liveness) and the agent's own, declared below."""

    # -- polling IMDS
    polls = counter("se_bridge_imds_polls", "Scheduled Events GET requests answered 200.")
    poll_errors = counter(
        "se_bridge_imds_poll_errors",
        "Failed Scheduled Events polls by kind (timeout, connection, http_410, http_429, http_5xx, ...).",
        "kind",
    )
    document_errors = counter(
        "se_bridge_document_errors",
        "IMDS answers that could not be parsed as a Scheduled Events document, by reason.",
        "reason",
    )
    imds_requests = counter("se_bridge_imds_requests", "Every HTTP request sent to IMDS, by operation.", "op")
    imds_latency = histogram(
        "se_bridge_imds_request_seconds",
        "IMDS request duration (request sent to body read).",
        "op",
        buckets=_LATENCY_BUCKETS,
    )
    # -- the document and its changes
    document_incarnation = gauge(
        "se_bridge_document_incarnation", "DocumentIncarnation of the last accepted document."
    )
    events_current = gauge(
        "se_bridge_events", "Events in the current document by type and status.", "type", "status"
    )
    changes = counter("se_bridge_changes", "Event transitions detected, by transition.", "change", "type")
    records = counter("se_bridge_records", "Records written to the outbox.")
    record_latency = histogram(
        "se_bridge_record_durable_seconds",
        "From the IMDS answer received to the record durable in the outbox.",
        buckets=_LATENCY_BUCKETS,
    )
    outbox_full = counter(
        "se_bridge_outbox_full",
        "Polls whose change could not be admitted because the outbox was at its limit "
        "(the change is coalesced into the next record, see docs/operations.md).",
    )
    # -- the agent's health
    internal_errors = counter(
        "se_bridge_internal_errors", "Unexpected errors caught by the poll loop (a bug: please report)."
    )
    identity_known = gauge(
        "se_bridge_vm_identity_known", "1 when the VM identity came from /metadata/instance."
    )
    ready = gauge("se_bridge_ready", "1 when /readyz answers 200.")
    # -- the listener, the relay and local policies
    relay_requests = counter(
        "se_bridge_relay_requests",
        "Relay (approval) requests by outcome and reason (a closed set of codes).",
        "outcome",
        "reason",
    )
    peer_asks = counter(
        "se_bridge_coordination_peer_asks",
        "Questions to a peer agent for its preparation reports (coordinate = peers), by result: answered, "
        "unanswered (unreachable, refused, not JSON) or unproven (its signature did not verify).",
        "result",
    )
    hook_runs = counter("se_bridge_hook_runs", "Local hook runs by hook and result.", "hook", "result")
