"""Who is looking at the console, and who may approve: an approval reboots production VMs.

The console never signs anyone in itself. It runs behind Microsoft Entra ID and proves who the
person is from the **ID token** the front door passes (:mod:`bridge.console.identity`: verified
against the issuer's keys; issue 31 found that headers such as ``X-Forwarded-Email`` or
``X-MS-CLIENT-PRINCIPAL`` were believed from any client that reached the console another way):

* ``entra``: Azure Container Apps / App Service authentication ("Easy Auth") with its token store,
  which passes ``X-MS-TOKEN-AAD-ID-TOKEN``;
* ``oauth2-proxy``: ``Authorization: Bearer <id token>`` (``--pass-authorization-header``);
* ``lab``: no front door (a laptop, the demo, the tests). A random token is printed at start; the
  browser presents it once (``/?token=...``) and gets a session cookie of its own (random, 12 hours).
  The token is then spent (issue 33: it signed in any number of browsers, all with one cookie).
  Whoever signed in with it may approve.

A signed-in person may look; only one holding a configured app role (``--approver-role``) or group
(``--approver-group``) *in the token* may approve. Identity headers without a token are ignored.

Every request but the probes must also name this console in ``Host`` (``--public-host``; a
DNS-rebinding page sends its own name), as the agent's API requires.

Every state change also needs (:meth:`Access.check_change`): the request's ``Origin`` to be this
console's (a cross-site form or script is refused), ``Content-Type: application/json`` (a form
cannot send it cross-site without a preflight, which the console never answers) and the CSRF token
of the session in ``X-CSRF-Token`` (an HMAC of the person's name under a key made at start).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from bridge.console.identity import IdentityUnproven, TokenVerifier
from bridge.http.netaddr import host_name

AUTH_MODES = ("entra", "oauth2-proxy", "lab")
#: A lab session's life.
LAB_SESSION_SECONDS = 12 * 3600.0
SESSION_COOKIE = "se_console_session"
CSRF_HEADER = "x-csrf-token"


@dataclass(frozen=True)
class Person:
    name: str
    can_approve: bool
    via: str  # entra | oauth2-proxy | lab


class Access:
    def __init__(
        self,
        mode: str,
        *,
        approver_roles: Collection[str] = (),
        approver_groups: Collection[str] = (),
        lab_token: str | None = None,
        verifier: TokenVerifier | None = None,
        hosts: Collection[str] = (),
        read_token: bytes | None = None,
    ) -> None:
        if mode not in AUTH_MODES:
            raise ValueError(f"auth must be one of {', '.join(AUTH_MODES)}")
        if mode != "lab" and not (approver_roles or approver_groups):
            raise ValueError(
                "name who may approve: --approver-role or --approver-group (everyone else only looks)"
            )
        if mode != "lab" and verifier is None:
            raise ValueError(
                "oidc_issuer and oidc_audience are required: the console proves who a person is from "
                "the ID token the front door passes (docs/console.md)"
            )
        self.verifier = verifier
        self.read_token = read_token
        self.hosts = frozenset(h.lower() for h in hosts)
        self.mode = mode
        self.roles = frozenset(approver_roles)
        self.groups = frozenset(g.lower() for g in approver_groups)
        self.lab_token = lab_token or (secrets.token_urlsafe(24) if mode == "lab" else None)
        self._key = secrets.token_bytes(32)  # CSRF tokens live as long as this process
        self._sessions: dict[str, float] = {}  # lab session -> when it expires (monotonic); one at most

    # -- who --------------------------------------------------------------------------------------

    def person(self, headers: Mapping[str, str], cookies: Mapping[str, str]) -> Person | None:
        """The signed-in person, or None (the page answers 401)."""
        if self.verifier is not None:
            try:
                who = self.verifier.verify(self._token(headers))
            except IdentityUnproven:
                return None
            groups = {g.lower() for g in who.groups}
            return Person(who.name, bool(who.roles & self.roles or groups & self.groups), self.mode)
        session = cookies.get(SESSION_COOKIE)
        expires = self._sessions.get(session) if session else None
        if expires is not None and expires > time.monotonic():
            return Person("lab user", True, self.mode)
        return None

    def _token(self, headers: Mapping[str, str]) -> str:
        """The ID token the front door passed (Easy Auth's token store header, or a bearer token)."""
        if self.mode == "entra" and headers.get("x-ms-token-aad-id-token"):
            return headers["x-ms-token-aad-id-token"].strip()
        auth = headers.get("authorization") or ""
        return auth[len("bearer ") :].strip() if auth[:7].lower() == "bearer " else ""

    def metrics_reader(self, headers: Mapping[str, str]) -> bool:
        """Whether the request carries the read token Prometheus sends (``credentials_file``)."""
        auth = headers.get("authorization") or ""
        if self.read_token is None or auth[:7].lower() != "bearer ":
            return False
        return hmac.compare_digest(auth[7:].strip().encode("utf-8", "replace"), self.read_token)

    def host_allowed(self, host: str | None) -> bool:
        """Whether ``Host`` names this console (a name of ``--public-host``, any port)."""
        if not host:
            return False
        name = host_name(host)
        return name in self.hosts or name.strip("[]") in self.hosts

    def lab_login(self, token: str | None) -> str | None:
        """A fresh session for the one browser that presents the lab token first; None after that."""
        if not (self.lab_token and token and hmac.compare_digest(token, self.lab_token)):
            return None
        self.lab_token = None  # spent: one use (the console prints a new one only at a restart)
        session = secrets.token_urlsafe(32)
        self._sessions[session] = time.monotonic() + LAB_SESSION_SECONDS
        return session

    # -- state changes ----------------------------------------------------------------------------

    def csrf_token(self, person: Person) -> str:
        return hmac.new(self._key, b"csrf|" + person.name.encode(), hashlib.sha256).hexdigest()

    def check_change(self, person: Person, headers: Mapping[str, str], own_origin: str) -> str | None:
        """Why a state change must be refused (403), or None."""
        origin = headers.get("origin")
        if origin is None or origin.rstrip("/").lower() != own_origin.lower():
            return "cross-origin or origin-less state changes are refused"
        if headers.get("sec-fetch-site") not in (None, "same-origin"):
            return "cross-site request refused"
        if (headers.get("content-type") or "").split(";")[0].strip().lower() != "application/json":
            return "state changes are JSON"
        token = headers.get(CSRF_HEADER) or ""
        if not hmac.compare_digest(token, self.csrf_token(person)):
            return "missing or wrong CSRF token"
        if not person.can_approve:
            return "you may look, not approve (an approver role or group is needed)"
        return None
