"""Who is looking at the console, and who may approve: an approval reboots production VMs.

The console never signs anyone in itself. It runs behind Microsoft Entra ID and reads who the
front door says the person is:

* ``entra``: Azure Container Apps / App Service authentication ("Easy Auth"), which puts the signed-in
  principal in ``X-MS-CLIENT-PRINCIPAL`` (base64 JSON: ``claims`` of ``typ``/``val``) after it
  validated the token, and strips any such header a client sent. App roles (``roles``) and group
  object ids (``groups``) are read from it.
* ``oauth2-proxy``: ``X-Forwarded-Email`` (or ``X-Forwarded-User``) and ``X-Forwarded-Groups``
  (comma separated), set by oauth2-proxy in front of the console.
* ``lab``: no front door (a laptop, the demo, the tests). A random token is printed at start; the
  browser presents it once (``/?token=...``) and gets a session cookie. Anyone with the token may
  approve.

Headers are only proof when the console cannot be reached *except* through that front door
(Container Apps ingress with authentication on; oauth2-proxy as the only way in): docs/console.md.
A signed-in person may look; only one holding a configured app role (``--approver-role``) or group
(``--approver-group``) may approve.

Every state change also needs (:meth:`Access.check_change`): the request's ``Origin`` to be this
console's (a cross-site form or script is refused), ``Content-Type: application/json`` (a form
cannot send it cross-site without a preflight, which the console never answers) and the CSRF token
of the session in ``X-CSRF-Token`` (an HMAC of the person's name under a key made at start).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

AUTH_MODES = ("entra", "oauth2-proxy", "lab")
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
    ) -> None:
        if mode not in AUTH_MODES:
            raise ValueError(f"auth must be one of {', '.join(AUTH_MODES)}")
        if mode != "lab" and not (approver_roles or approver_groups):
            raise ValueError(
                "name who may approve: --approver-role or --approver-group (everyone else only looks)"
            )
        self.mode = mode
        self.roles = frozenset(approver_roles)
        self.groups = frozenset(g.lower() for g in approver_groups)
        self.lab_token = lab_token or (secrets.token_urlsafe(24) if mode == "lab" else None)
        self._key = secrets.token_bytes(32)  # sessions and CSRF tokens live as long as this process

    # -- who --------------------------------------------------------------------------------------

    def person(self, headers: Mapping[str, str], cookies: Mapping[str, str]) -> Person | None:
        """The signed-in person, or None (the page answers 401)."""
        if self.mode == "entra":
            return self._entra(headers.get("x-ms-client-principal"))
        if self.mode == "oauth2-proxy":
            name = headers.get("x-forwarded-email") or headers.get("x-forwarded-user")
            if not name:
                return None
            groups = {
                g.strip().lower() for g in (headers.get("x-forwarded-groups") or "").split(",") if g.strip()
            }
            return Person(name[:256], bool(groups & self.groups), self.mode)
        session = cookies.get(SESSION_COOKIE)
        if session and hmac.compare_digest(session, self.session_cookie()):
            return Person("lab user", True, self.mode)
        return None

    def _entra(self, principal: str | None) -> Person | None:
        if not principal:
            return None
        try:
            data: Any = orjson.loads(base64.b64decode(principal, validate=True))
        except (binascii.Error, ValueError):
            return None
        claims = data.get("claims") if isinstance(data, dict) else None
        if not isinstance(claims, list):
            return None
        values: dict[str, list[str]] = {}
        for claim in claims:
            if (
                isinstance(claim, dict)
                and isinstance(claim.get("typ"), str)
                and isinstance(claim.get("val"), str)
            ):
                values.setdefault(claim["typ"], []).append(claim["val"])
        role_type = data.get("role_typ") if isinstance(data.get("role_typ"), str) else "roles"
        roles = set(values.get(role_type, [])) | set(values.get("roles", []))
        groups = {g.lower() for g in values.get("groups", [])}
        name = next(
            (values[k][0] for k in ("preferred_username", "name", "email", "upn") if values.get(k)), None
        )
        if name is None:
            return None
        return Person(name[:256], bool(roles & self.roles or groups & self.groups), self.mode)

    def lab_login(self, token: str | None) -> bool:
        return bool(self.lab_token and token and hmac.compare_digest(token, self.lab_token))

    def session_cookie(self) -> str:
        return hmac.new(self._key, b"lab-session", hashlib.sha256).hexdigest()

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
