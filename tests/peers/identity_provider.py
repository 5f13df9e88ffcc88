"""A stand-in for Microsoft Entra ID's token side: an OpenID configuration and a JSON Web Key Set
over TLS, and ID tokens signed RS256 by its key (what oauth2-proxy or Easy Auth passes to the
console). Entra ID itself cannot run here; the console's verification code (PyJWT, the JWKS read
over TLS) is the real one. Tokens carry Entra's claim names (``preferred_username``, ``roles``,
``groups``)."""

from __future__ import annotations

import json
import sys
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from brokers import https_server

AUDIENCE = "11111111-2222-3333-4444-555555555555"  # the console's app registration (client id)


class IdentityProvider:
    def __init__(self, workdir: Path, kid: str = "test-key-1") -> None:
        from cryptography.hazmat.primitives.asymmetric import rsa

        self.kid = kid
        self.private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.requests = 0
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                provider.requests += 1
                if self.path == "/tenant/v2.0/.well-known/openid-configuration":
                    body = {
                        "issuer": provider.issuer,
                        "jwks_uri": f"{provider.url}/tenant/discovery/v2.0/keys",
                    }
                elif self.path == "/tenant/discovery/v2.0/keys":
                    body = provider.jwks()
                else:
                    self.send_response(404)
                    self.end_headers()
                    return
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server, self.url, self.ca_file = https_server(workdir, Handler)
        self.issuer = f"{self.url}/tenant/v2.0"

    def jwks(self) -> dict[str, Any]:
        import jwt

        public = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(self.private.public_key()))
        return {"keys": [{**public, "kid": self.kid, "use": "sig", "alg": "RS256"}]}

    def token(
        self,
        name: str,
        *,
        groups: tuple[str, ...] = (),
        roles: tuple[str, ...] = (),
        audience: str = AUDIENCE,
        issuer: str | None = None,
        lifetime: float = 3600,
        key: Any = None,
        kid: str | None = None,
    ) -> str:
        import jwt

        now = int(time.time())
        claims = {"iss": issuer or self.issuer, "aud": audience, "iat": now, "nbf": now,
                  "exp": now + int(lifetime), "preferred_username": name, "groups": list(groups),
                  "roles": list(roles)}  # fmt: skip
        return jwt.encode(claims, key or self.private, algorithm="RS256", headers={"kid": kid or self.kid})

    def console_args(self) -> list[str]:
        """What a console behind this provider is started with."""
        return ["--oidc-issuer", self.issuer, "--oidc-audience", AUDIENCE, "--oidc-ca-file", self.ca_file]

    def stop(self) -> None:
        self.server.shutdown()
