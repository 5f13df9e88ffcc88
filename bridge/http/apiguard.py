"""The checks every service API applies before a route: no browsers, and remote reads authenticated.

Loopback is not proof (see docs/security.md): a web page in a browser on the VM can reach
127.0.0.1, cross-site or after DNS rebinding. So, for every service that serves an API (the agent,
the approver):

* a request carrying ``Origin`` is refused: browsers send it on cross-site requests, nothing of
  ours does;
* on a loopback listener, a ``Host`` that is not the listener's own address or ``localhost`` is
  refused: a DNS-rebinding page sends its own host name;
* ``/healthz`` and ``/readyz`` stay open (probes); the service's *read paths* (``/metrics``, which
  names the VM and its sinks) are open to local callers and need the read token
  (``Authorization: Bearer``, what Prometheus sends from ``credentials_file``) from anyone else.

Refusals are counted by reason and logged once per streak. A service adds its own rules by
subclassing (:class:`bridge.agent.access.AccessPolicy`: the signed relay).
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Callable

from bridge.http.listener import Listener, Request, Response, Route, json_response
from bridge.http.netaddr import host_name, is_loopback
from bridge.signing import load_key_from
from bridge.support.observability import ErrorStreak

log = logging.getLogger(__name__)

OPEN_PATHS = frozenset({"/healthz", "/readyz"})
_LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "::1", "[::1]"})

Refusal = tuple[int, str, str]  # status, reason (metric label), message


class ApiGuard:
    def __init__(
        self,
        listen: str,
        read_paths: frozenset[str],
        *,
        read_token_file: str | None = None,
        on_refused: Callable[[str], None] | None = None,
    ) -> None:
        self.read_paths = read_paths
        self.read_token = load_key_from(read_token_file) if read_token_file else None
        self.unix = listen.startswith("unix:")
        self.loopback_listener = False
        self._own_hosts: set[str] = set(_LOCAL_HOSTS)
        if not self.unix:
            host = listen.rpartition(":")[0].strip("[]")
            self.loopback_listener = is_loopback(host)
            self._own_hosts.add(host.lower())
        self._on_refused = on_refused
        self._streak = ErrorStreak(log, "refusing API requests", remind_every=300.0)

    def __call__(self, request: Request) -> Response | None:
        refusal = self.check(request)
        if refusal is None:
            return None
        status, reason, message = refusal
        if self._on_refused is not None:
            self._on_refused(reason)
        self._streak.failure(reason, message, client=request.client, path=request.path)
        return json_response(status, {"error": message})

    def check(self, request: Request) -> Refusal | None:
        """The refusal for ``request``, or None. Subclasses extend it for their own paths."""
        headers = request.headers
        if headers.get("Origin") is not None:
            return 403, "origin", "cross-origin requests are refused"
        if self.loopback_listener and not self._own_host(headers.get("Host")):
            return 403, "host", "unexpected Host for a loopback listener (DNS rebinding?)"
        if request.path in self.read_paths and not request.local:
            return self.check_reader(request)
        return None

    def check_reader(self, request: Request) -> Refusal | None:
        auth = request.headers.get("Authorization") or ""
        if self.read_token is not None and auth.startswith("Bearer "):
            token = auth[len("Bearer ") :].strip().encode("utf-8", "replace")
            if hmac.compare_digest(token, self.read_token):
                request.requester = f"reader@{request.client}"
                return None
            return 401, "auth", "unauthorized: bad read token"
        return 401, "auth", "unauthorized: remote reads need the read token"

    def _own_host(self, host: str | None) -> bool:
        if host is None:  # no browser omits Host, so a request without one is no rebinding attack
            return True
        name = host_name(host)
        return name in self._own_hosts or name.strip("[]") in self._own_hosts


def guarded_listener(
    listen: str,
    routes: dict[tuple[str, str], Route],
    read_paths: frozenset[str],
    *,
    read_token_file: str | None,
    on_refused: Callable[[str], None],
) -> Listener:
    """A service API behind the guard (no browsers, remote reads with the read token): what the
    approver and Azure's channel serve; refusals counted by reason."""
    guard = ApiGuard(listen, read_paths, read_token_file=read_token_file, on_refused=on_refused)
    return Listener(listen, routes, guard=guard, on_refused=on_refused)
