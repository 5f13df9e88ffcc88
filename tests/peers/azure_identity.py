"""What the local fakes of Azure services share (tests/integration/test_keyvault.py,
tests/peers/logs_ingestion.py): a quiet JSON handler, a server on 127.0.0.1 (TLS with a given
certificate), and a managed-identity endpoint speaking azure-identity's App Service protocol
(``IDENTITY_ENDPOINT`` / ``IDENTITY_HEADER``; on a VM the same credential asks IMDS). Azure and
Entra ID cannot be reached from here; the clients talking to these are the real ones.
"""

from __future__ import annotations

import json
import ssl
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit


class QuietHandler(BaseHTTPRequestHandler):
    def log_message(self, *_: Any) -> None:
        pass

    def answer(self, status: int, body: Any = None, headers: dict[str, str] | None = None) -> None:
        data = b"" if body is None else json.dumps(body).encode()
        self.send_response(status)
        if data:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)


def serve(handler: type[BaseHTTPRequestHandler], tls: tuple[Path, Path] | None = None) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    if tls is not None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(*tls)
        server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


class IdentityEndpoint:
    """Issues ``token_for(resource)`` to a caller with the right identity header; ``seen`` records
    every request (its query and header)."""

    def __init__(self, header: str, token_for: Callable[[str], str]) -> None:
        self.header = header
        self.seen: list[dict[str, Any]] = []
        endpoint = self

        class Identity(QuietHandler):
            def do_GET(self) -> None:
                query = {k: v[0] for k, v in parse_qs(urlsplit(self.path).query).items()}
                endpoint.seen.append(
                    {"at": "identity", **query, "header": self.headers.get("X-IDENTITY-HEADER")}
                )
                if self.headers.get("X-IDENTITY-HEADER") != endpoint.header:
                    return self.answer(401, {"error": "bad identity header"})
                resource = query.get("resource", "")
                body = {"access_token": token_for(resource), "expires_on": str(int(time.time()) + 3600),
                        "resource": resource, "token_type": "Bearer"}  # fmt: skip
                self.answer(200, body)

        self.server = serve(Identity)

    def env(self) -> dict[str, str]:
        return {
            "IDENTITY_ENDPOINT": f"http://127.0.0.1:{self.server.server_address[1]}/token",
            "IDENTITY_HEADER": self.header,
        }

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
