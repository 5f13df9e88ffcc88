"""Who a person is, proven: the ID token the front door passes, verified against the issuer's keys.

Before issue 31 the console believed headers: ``X-Forwarded-Email`` and ``X-Forwarded-Groups``
(oauth2-proxy) or ``X-MS-CLIENT-PRINCIPAL`` (Easy Auth). Any client that reached the console some
other way than through the front door (another pod of the environment, a VM of the VNet, a
misrouted ingress) could name itself ``mallory@evil`` with the approvers' group and get its decision
signed by the console. A header is no proof; a signature is. So the console now reads the person
from the **ID token** Microsoft Entra ID issued and the front door passes along:

* ``oauth2-proxy``: ``Authorization: Bearer <id token>`` (oauth2-proxy's
  ``--pass-authorization-header``);
* ``entra`` (Container Apps / App Service authentication with its token store):
  ``X-MS-TOKEN-AAD-ID-TOKEN``, or ``Authorization: Bearer``.

The token must be a JWT signed (RS256) by a key of the issuer's JSON Web Key Set, for this console's
client id (``aud``), from the configured issuer (``iss``), unexpired (60 s of clock skew). The name
is its ``preferred_username`` (or ``email``, ``upn``, ``name``), the roles its ``roles`` claim, the
groups its ``groups`` claim (object ids). The key set is read over TLS (verification on) from
``jwks_uri`` of the issuer's OpenID configuration or a configured URL, kept, and read again when a
token names a key id it does not hold (at most once a minute: a flood of made-up key ids costs one
request a minute, not one each). PyJWT does the JWT work (a well-kept library; the console is a
central service, not on every VM).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

#: Seconds between two reads of the key set when tokens name key ids it does not hold.
REFRESH_AT_MOST_EVERY = 60.0
#: Clock skew accepted on ``exp``, ``nbf`` and ``iat``.
LEEWAY = 60
ALGORITHMS = ("RS256",)
#: A token longer than this is no ID token (Entra's are 1-3 KB; group overage keeps them small).
MAX_TOKEN_BYTES = 16 * 1024


class IdentityUnproven(Exception):
    """The request carries no token this console can prove (answered 401, never a reason shown)."""


@dataclass(frozen=True, slots=True)
class ProvenIdentity:
    name: str
    roles: frozenset[str]
    groups: frozenset[str]


@dataclass
class TokenVerifier:
    issuer: str
    audience: str
    jwks_url: str | None = None  # None: the issuer's OpenID configuration names it
    ca_file: str | None = None
    timeout: float = 10.0
    _keys: dict[str, Any] = field(default_factory=dict, repr=False)
    _read_at: float = field(default=-1e9, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        for what, url in (("oidc_issuer", self.issuer), ("oidc_jwks_url", self.jwks_url)):
            if url is not None and not url.startswith("https://"):
                raise ValueError(f"{what} must be an https:// address (TLS verification is never off)")

    def verify(self, token: str) -> ProvenIdentity:
        """The identity ``token`` proves; :class:`IdentityUnproven` otherwise."""
        import jwt

        if not token or len(token) > MAX_TOKEN_BYTES:
            raise IdentityUnproven("no token")
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            raise IdentityUnproven("not a JWT") from None
        if header.get("alg") not in ALGORITHMS:
            raise IdentityUnproven("algorithm not accepted")
        key = self._key(str(header.get("kid") or ""))
        try:
            claims = jwt.decode(
                token,
                key,
                algorithms=list(ALGORITHMS),
                audience=self.audience,
                issuer=self.issuer,
                leeway=LEEWAY,
                options={"require": ["exp", "iat", "iss", "aud"]},
            )
        except jwt.PyJWTError as exc:
            raise IdentityUnproven(type(exc).__name__) from None
        name = next(
            (str(claims[c]) for c in ("preferred_username", "email", "upn", "name") if claims.get(c)), None
        )
        if name is None:
            raise IdentityUnproven("the token names nobody")
        return ProvenIdentity(name[:256], _strings(claims.get("roles")), _strings(claims.get("groups")))

    def _key(self, kid: str) -> Any:
        with self._lock:
            if kid not in self._keys and time.monotonic() - self._read_at >= REFRESH_AT_MOST_EVERY:
                self._read_at = time.monotonic()
                try:
                    self._keys = self._read_keys()
                except Exception as exc:  # the next token tries again (after the minute)
                    log.error("cannot read the identity provider's keys", extra={"error": str(exc)[:300]})
            key = self._keys.get(kid)
        if key is None:
            raise IdentityUnproven("unknown signing key")
        return key

    def _read_keys(self) -> dict[str, Any]:
        import jwt
        import requests

        verify: str | bool = self.ca_file or True
        url = self.jwks_url
        if url is None:
            config = self.issuer.rstrip("/") + "/.well-known/openid-configuration"
            url = str(requests.get(config, timeout=self.timeout, verify=verify).json()["jwks_uri"])
            if not url.startswith("https://"):
                raise ValueError("the OpenID configuration names a jwks_uri that is not https://")
        answer = requests.get(url, timeout=self.timeout, verify=verify)
        answer.raise_for_status()
        keys = jwt.PyJWKSet.from_dict(answer.json()).keys
        return {str(k.key_id): k.key for k in keys if k.key_id}


def _strings(value: object) -> frozenset[str]:
    if not isinstance(value, list):
        return frozenset()
    return frozenset(str(v) for v in value[:500] if isinstance(v, str))
