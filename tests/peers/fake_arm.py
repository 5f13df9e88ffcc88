"""A local HTTPS fake of Azure Resource Manager and an Entra ID test credential, for the ARM path
(tests/integration/test_arm.py) and Resource Graph (tests/integration/test_azure_graph.py).

Mocked, and why: Azure Resource Manager and Entra ID cannot run here. The fake checks what the real one
would refuse (the bearer token's audience) over real TLS with its own CA, records every request, and
answers from a script of (status, headers, body), then a default answer. The credential has
azure-identity's ``get_token`` contract and issues an unsigned JWT naming the scope it was asked for.
"""

from __future__ import annotations

import base64
import json
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

from brokers import https_server


class FakeCredential:
    """azure-identity's credential contract (``get_token(*scopes) -> AccessToken``); counts its calls."""

    def __init__(self) -> None:
        self.scopes: list[tuple[str, ...]] = []

    def get_token(self, *scopes: str, **kwargs: Any) -> Any:
        from azure.core.credentials import AccessToken

        self.scopes.append(scopes)
        audience = scopes[0].removesuffix("/.default")
        claims = base64.urlsafe_b64encode(json.dumps({"aud": audience}).encode()).decode().rstrip("=")
        return AccessToken(f"eyJhbGciOiJub25lIn0.{claims}.", int(time.time()) + 3600)


class FakeArm:
    """HTTPS on 127.0.0.1; ``script`` is the list of (status, headers, body) to answer, in order."""

    def __init__(self, workdir: Path, audience: str) -> None:
        self.requests: list[dict[str, Any]] = []
        self.script: list[tuple[int, dict[str, str], Any]] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                token = (self.headers.get("Authorization") or "").removeprefix("Bearer ")
                payload = token.split(".")[1] if token.count(".") == 2 else ""
                claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)) or b"{}")
                fake.requests.append({"path": self.path, "aud": claims.get("aud"), "body": body})
                if claims.get("aud") != audience:
                    status, headers, answer = 401, {}, {"error": {"code": "InvalidAuthenticationToken"}}
                elif fake.script:
                    status, headers, answer = fake.script.pop(0)
                else:
                    status, headers, answer = 200, {}, {"value": "Successfully Approved"}
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("x-ms-correlation-request-id", f"corr-{len(fake.requests)}")
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server, self.url, self.ca_file = https_server(workdir, Handler)
