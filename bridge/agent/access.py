"""Who may use the agent's API: every request passes here before its route (the listener's guard).

Loopback is not proof: any local user, and any web page the VM's browser opens (cross-site requests,
DNS rebinding), can reach 127.0.0.1. IMDS itself demands ``Metadata: true`` for that reason. So:

* a request carrying ``Origin`` is refused: browsers send it on cross-site requests, nothing of
  ours does;
* on a loopback listener, a ``Host`` that is not the listener's own address or ``localhost`` is
  refused: a DNS-rebinding page sends its own host name;
* ``POST /v1/start-requests`` needs ``Content-Type: application/json`` (a browser cannot send that
  cross-site without a CORS preflight, which this API never answers) and an authenticated caller:
  - with relay keys configured, a valid signature (:mod:`bridge.signing`), **loopback included**;
  - over the Unix socket listener without keys, the peer's uid (the socket is 0660: file
    permissions decided who could connect);
  - unsigned from loopback only if ``relay_allow_unsigned_loopback`` is set (development; the agent
    warns at start);
* ``GET /metrics``, ``GET /v1/document`` and ``GET /v1/preparations`` name the VM and its
  subscription: from anything but loopback or the Unix socket they need a signature or the read
  token (``Authorization: Bearer``, what Prometheus sends from ``credentials_file``);
* ``/healthz`` and ``/readyz`` stay open (load balancer probes) and reveal nothing sensitive.

Refusals are counted by reason (``se_bridge_http_refused_total``) and logged once per streak.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from bridge.http.apiguard import ApiGuard, Refusal
from bridge.http.listener import Request
from bridge.relay_api import READ_PATHS, START_REQUESTS_PATH
from bridge.signing import RequestVerifier

log = logging.getLogger(__name__)


class AccessPolicy(ApiGuard):
    """The agent's guard: :class:`~bridge.http.apiguard.ApiGuard`'s checks, and the signed relay."""

    def __init__(
        self,
        verifier: RequestVerifier,
        listen: str,
        *,
        allow_unsigned_loopback: bool = False,
        read_token_file: str | None = None,
        on_refused: Callable[[str], None] | None = None,
    ) -> None:
        super().__init__(listen, READ_PATHS, read_token_file=read_token_file, on_refused=on_refused)
        self.verifier = verifier
        self.allow_unsigned_loopback = allow_unsigned_loopback

    def check(self, request: Request) -> Refusal | None:
        refusal = super().check(request)
        if refusal is None and request.method == "POST" and request.path == START_REQUESTS_PATH:
            return self._check_relay(request)
        return refusal

    def _check_relay(self, request: Request) -> Refusal | None:
        ctype = (request.headers.get("Content-Type") or "").split(";", 1)[0].strip().lower()
        if ctype != "application/json":
            return 415, "content_type", "Content-Type must be application/json"
        peer = f"uid:{request.peer_uid}" if request.peer_uid is not None else request.client
        if self.verifier.keys:
            return self._signed(request, peer)
        if self.unix:
            request.requester = peer
            return None
        if request.local and self.allow_unsigned_loopback:
            request.requester = f"unsigned@{peer}"
            return None
        return 401, "auth", "unauthorized: signed requests only (configure relay keys)"

    def check_reader(self, request: Request) -> Refusal | None:
        """The read token, or (with relay keys) a signed request."""
        refusal = super().check_reader(request)
        if refusal is not None and self.verifier.keys and "Authorization" not in request.headers:
            return self._signed(request, request.client)
        if refusal is not None and not self.verifier.keys:
            return 401, "auth", "unauthorized: remote reads need the read token or a signature"
        return refusal

    def _signed(self, request: Request, peer: str) -> tuple[int, str, str] | None:
        try:
            key_id = self.verifier.verify(request.headers, request.method, request.path, request.body)
        except PermissionError as exc:
            return 401, "auth", f"unauthorized: {exc}"
        request.requester = f"key:{key_id}@{peer}"
        return None

    # -- start-up ------------------------------------------------------------------------------------

    def describe(self) -> str:
        """One line for the start-up log: how callers are authenticated."""
        if self.verifier.keys:
            keys = ", ".join(self.verifier.keys.ids())
            return f"relay requests must be signed (keys {keys}), loopback included"
        if self.unix:
            return "relay requests are accepted from peers that can open the socket (mode 0660)"
        if self.allow_unsigned_loopback:
            return (
                "DEVELOPMENT MODE: unsigned relay requests from loopback are accepted "
                "(any local user can approve)"
            )
        return "relay requests are refused: no relay key is configured (the local policy still approves)"
