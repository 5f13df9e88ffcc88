"""Azure Resource Manager over HTTPS, shared by the approver's acknowledgements (bridge.approver.arm)
and Azure's channel's Resource Graph reader (bridge.azure.graph).

One way to talk to ARM: azure-core's pipeline with an Entra ID bearer token for ``{audience}/.default``
(a managed identity, workload identity or CLI credential: :mod:`bridge.transports.azure`), JSON,
our user agent, never through a proxy (``use_env_settings=False``), no azure-core retries (each
caller retries what its API allows: a POST's 429 is not retried by azure-core). TLS verification is
never off: callers pass ``connection_verify`` (a CA bundle or True). azure-core is imported on first
use: a service that never calls ARM never loads it.
"""

from __future__ import annotations

from typing import Any


def arm_pipeline(credential: Any, endpoint: str, scope: str) -> Any:
    """An azure-core ``PipelineClient`` for ``endpoint`` with a token for ``scope``."""
    from azure.core import PipelineClient
    from azure.core.pipeline.policies import (
        BearerTokenCredentialPolicy,
        HeadersPolicy,
        RetryPolicy,
        UserAgentPolicy,
    )
    from azure.core.pipeline.transport import RequestsTransport

    from bridge import __version__

    transport = RequestsTransport(use_env_settings=False)  # never through a proxy
    policies = [
        HeadersPolicy({"Accept": "application/json"}),
        UserAgentPolicy(f"se-bridge/{__version__}"),
        RetryPolicy.no_retries(),
        BearerTokenCredentialPolicy(credential, scope),
    ]
    return PipelineClient(endpoint, policies=policies, transport=transport)
