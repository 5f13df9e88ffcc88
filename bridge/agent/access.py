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
* ``GET /metrics`` and ``GET /v1/document`` name the VM and its subscription: from anything but
  loopback or the Unix socket they need a signature or the read token (``Authorization: Bearer``,
  what Prometheus sends from ``credentials_file``);
* ``/healthz`` and ``/readyz`` stay open (load balancer probes) and reveal nothing sensitive.

Refusals are counted by reason (``se_bridge_http_refused_total``) and logged once per streak.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Callable
from pathlib import Path

from bridge.listener import Request, Response, json_response
from bridge.netaddr import is_loopback
from bridge.observability import ErrorStreak
from bridge.signing import RequestVerifier, load_key

log = logging.getLogger(__name__)

RELAY_PATH = "/v1/start-requests"
OPEN_PATHS = frozenset({"/healthz", "/readyz"})
READ_PATHS = frozenset({"/metrics", "/v1/document"})
_LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "::1", "[::1]"})


class AccessPolicy:
    def __init__(
        self,
        verifier: RequestVerifier,
        listen: str,
        *,
        allow_unsigned_loopback: bool = False,
        read_token_file: str | None = None,
        on_refused: Callable[[str], None] | None = None,
    ) -> None:
        self.verifier = verifier
        self.allow_unsigned_loopback = allow_unsigned_loopback
        self.read_token = load_key(Path(read_token_file)) if read_token_file else None
        self.unix = listen.startswith("unix:")
        self.loopback_listener = False
        self._own_hosts: set[str] = set(_LOCAL_HOSTS)
        if not self.unix:
            host = listen.rpartition(":")[0].strip("[]")
            self.loopback_listener = is_loopback(host)
            self._own_hosts.add(host.lower())
        self._on_refused = on_refused
        self._streak = ErrorStreak(log, "refusing API requests", remind_every=300.0)

    # -- the guard ----------------------------------------------------------------------------------

    def __call__(self, request: Request) -> Response | None:
        refusal = self._check(request)
        if refusal is None:
            return None
        status, reason, message = refusal
        if self._on_refused is not None:
            self._on_refused(reason)
        self._streak.failure(reason, message, client=request.client, path=request.path)
        return json_response(status, {"error": message})

    def _check(self, request: Request) -> tuple[int, str, str] | None:
        headers = request.headers
        if headers.get("Origin") is not None:
            return 403, "origin", "cross-origin requests are refused"
        if self.loopback_listener and not self._own_host(headers.get("Host")):
            return 403, "host", "unexpected Host for a loopback listener (DNS rebinding?)"
        if request.path in OPEN_PATHS:
            return None
        if request.method == "POST" and request.path == RELAY_PATH:
            return self._check_relay(request)
        if request.path in READ_PATHS and not request.local:
            return self._check_reader(request)
        return None

    def _check_relay(self, request: Request) -> tuple[int, str, str] | None:
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

    def _check_reader(self, request: Request) -> tuple[int, str, str] | None:
        auth = request.headers.get("Authorization") or ""
        if self.read_token is not None and auth.startswith("Bearer "):
            token = auth[len("Bearer ") :].strip().encode("utf-8", "replace")
            if hmac.compare_digest(token, self.read_token):
                request.requester = f"reader@{request.client}"
                return None
            return 401, "auth", "unauthorized: bad read token"
        if self.verifier.keys:
            return self._signed(request, request.client)
        return 401, "auth", "unauthorized: remote reads need the read token or a signature"

    def _signed(self, request: Request, peer: str) -> tuple[int, str, str] | None:
        try:
            key_id = self.verifier.verify(request.headers, request.method, request.path, request.body)
        except PermissionError as exc:
            return 401, "auth", f"unauthorized: {exc}"
        request.requester = f"key:{key_id}@{peer}"
        return None

    def _own_host(self, host: str | None) -> bool:
        if host is None:  # no browser omits Host, so a request without one is no rebinding attack
            return True
        name = host.strip().lower()
        if name.startswith("["):
            name = name[: name.find("]") + 1] if "]" in name else name
        elif name.count(":") == 1:
            name = name.rpartition(":")[0]
        return name in self._own_hosts or name.strip("[]") in self._own_hosts

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
