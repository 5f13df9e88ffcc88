"""The agent's HTTP API: the probes and ``/metrics``, ``GET /v1/document`` (what a fleet approver
and a person read of this VM), ``GET /v1/preparations`` (what peer coordinators ask, answered with
this VM's own signature) and ``POST /v1/start-requests`` (the relay). Who may call which path is the
access policy's (:mod:`bridge.agent.access`: signed requests, the read token, no browsers)."""

from __future__ import annotations

import ssl
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from bridge import records
from bridge.agent.access import AccessPolicy
from bridge.agent.config import AgentConfig
from bridge.agent.metrics import AgentMetrics
from bridge.agent.peerkeys import answer_key
from bridge.agent.policy import LocalPolicy
from bridge.agent.poller import Poller
from bridge.agent.relay import Relay
from bridge.http.listener import Limits, Listener, Request, Response, Route, json_response, probe_routes
from bridge.imds.instance import VmIdentity
from bridge.pipeline import Health
from bridge.relay_api import DOCUMENT_PATH, PREPARATIONS_PATH, START_REQUESTS_PATH
from bridge.settings import ConfigError
from bridge.signing import H_NONCE, RequestVerifier, sign_peer_answer


class AgentApi:
    def __init__(
        self,
        config: AgentConfig,
        metrics: AgentMetrics,
        verifier: RequestVerifier,
        relay: Relay,
        poller: Poller,
        identity: Callable[[], VmIdentity],
        policy: Callable[[], LocalPolicy | None],
        health: Health,
        ready: Callable[[], tuple[bool, str]],
    ) -> None:
        self.config, self.metrics, self.verifier = config, metrics, verifier
        self.relay, self.poller, self.identity, self.policy = relay, poller, identity, policy
        self.health, self.ready = health, ready
        self._answer_key_value: Any = None
        self._answer_key_lock = threading.Lock()
        self.access, self.listener = self._build()

    def _build(self) -> tuple[AccessPolicy, Listener]:
        config = self.config
        tls = None
        if config.listen_tls_cert or config.listen_tls_key:
            if not (config.listen_tls_cert and config.listen_tls_key):
                raise ConfigError("listen_tls_cert and listen_tls_key go together")
            tls = (config.listen_tls_cert, config.listen_tls_key)
        refused = self.metrics.http_refused
        try:
            access = AccessPolicy(
                self.verifier,
                config.listen,
                allow_unsigned_loopback=config.relay_allow_unsigned_loopback,
                read_token_file=config.read_token_file,
                on_refused=lambda reason: refused.labels(reason).inc(),
            )
            listener = Listener(
                config.listen,
                self._routes(),
                guard=access,
                tls=tls,
                limits=Limits(
                    max_connections=config.listen_max_connections,
                    request_seconds=config.listen_request_timeout,
                ),
                on_refused=lambda reason: refused.labels(reason).inc(),
            )
            return access, listener
        except ValueError as exc:
            raise ConfigError(f"listen: {exc}") from None
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"listen: cannot serve on {config.listen}: {exc}") from None

    def _routes(self) -> dict[tuple[str, str], Route]:
        def document(_: Request) -> Response:
            obs = self.poller.current
            if obs is None:
                return json_response(503, {"error": "no document observed yet"})
            return json_response(200, records.document_view(self.identity(), obs.document, obs.observed_at))

        return {
            **probe_routes(self.health.report, self.ready, self.metrics.registry),
            ("GET", DOCUMENT_PATH): document,
            ("GET", PREPARATIONS_PATH): self._preparations,
            ("POST", START_REQUESTS_PATH): self._start_requests,
        }

    def _preparations(self, request: Request) -> Response:
        """``GET /v1/preparations``: this VM's reports per event (what peer coordinators ask). A
        signed request gets an answer signed with this VM's own key (bridge.agent.peerkeys), bound to
        its nonce: a peer believes no answer it cannot prove came from this VM's agent."""
        policy = self.policy()
        reports = policy.preparations() if policy is not None else {}
        answer: dict[str, Any] = {"vm": self.identity().name, "preparations": reports}
        nonce = request.headers.get(H_NONCE)
        if nonce:  # this VM's own key: no other VM can sign for it
            answer = sign_peer_answer(self._answer_key(), nonce, answer)
        return json_response(200, answer)

    def _answer_key(self) -> Any:
        """This VM's own Ed25519 answer key, read (or made) at the first peer question: an agent no
        peer asks never imports the crypto library for it."""
        with self._answer_key_lock:
            if self._answer_key_value is None:
                self._answer_key_value = answer_key(Path(self.config.state_dir))
            return self._answer_key_value

    def _start_requests(self, request: Request) -> Response:
        """``POST /v1/start-requests``; the access policy authenticated the caller already."""
        try:
            parsed = orjson.loads(request.body)
        except orjson.JSONDecodeError:
            parsed = None
        status, answer = self.relay.handle(parsed, request.requester)
        return json_response(status, answer)
