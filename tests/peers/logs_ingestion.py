"""A local Azure Monitor Logs Ingestion endpoint and a managed-identity endpoint, for the real
``azure-monitor-ingestion`` and ``azure-identity`` clients (Azure cannot be reached from here).

The ingestion endpoint (HTTPS, its own CA) behaves as Microsoft documents it ("Logs Ingestion API in
Azure Monitor"): ``POST /dataCollectionRules/{immutableId}/streams/{stream}?api-version=2023-01-01``
with a bearer token for ``https://monitor.azure.com`` (401 otherwise), a JSON array body, gzip accepted
(``Content-Encoding: gzip``), 413 above 1 MB, 404 for a DCR it does not know, 400 for a stream the DCR
does not declare, 204 when taken; ``faults`` queues answers (a 429 with ``Retry-After``, a 500) for the
next requests. The identity endpoint speaks azure-identity's App Service managed-identity protocol
(``IDENTITY_ENDPOINT`` / ``IDENTITY_HEADER``) and issues a token naming the resource it was asked for.
"""

from __future__ import annotations

import gzip
import json
import threading
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from brokers import self_signed_certificate

from peers.azure_identity import IdentityEndpoint, QuietHandler, serve

IDENTITY_HEADER = "identity-header-of-the-logs-test"
AUDIENCE = "https://monitor.azure.com"
MAX_BODY = 1024 * 1024


class LogsIngestion:
    def __init__(self, workdir: Path, rule_id: str, streams: tuple[str, ...]) -> None:
        self.rule_id = rule_id
        self.streams = streams
        self.rows: dict[str, list[dict[str, Any]]] = {s: [] for s in streams}
        self.requests: list[dict[str, Any]] = []
        self.faults: list[tuple[int, dict[str, str]]] = []
        self.lock = threading.Lock()
        cert, key = self_signed_certificate(workdir)
        self.ca_file = str(cert)
        self.server = serve(self._handler(), (cert, key))
        self.identity = IdentityEndpoint(IDENTITY_HEADER, lambda resource: f"token-for:{resource}")
        self.host = f"127.0.0.1:{self.server.server_address[1]}"

    def env(self) -> dict[str, str]:
        return self.identity.env()

    def all_rows(self) -> list[dict[str, Any]]:
        with self.lock:
            return [row for rows in self.rows.values() for row in rows]

    def stop(self) -> None:
        self.server.shutdown()
        self.identity.stop()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Ingestion(QuietHandler):
            def do_POST(self) -> None:
                parts = urlsplit(self.path)
                query = parse_qs(parts.query)
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                auth = self.headers.get("Authorization", "")
                with fake.lock:
                    fake.requests.append({"path": parts.path, "auth": auth, "bytes": len(body)})
                    fault = fake.faults.pop(0) if fake.faults else None
                if auth != f"Bearer token-for:{AUDIENCE}":
                    return self.answer(401, {"error": {"code": "InvalidToken", "message": "audience"}})
                if fault is not None:
                    return self.answer(fault[0], {"error": {"code": "Fault"}}, fault[1])
                if query.get("api-version") != ["2023-01-01"]:
                    return self.answer(400, {"error": {"code": "InvalidApiVersion"}})
                segments = parts.path.strip("/").split("/")
                if len(segments) != 4 or segments[0] != "dataCollectionRules" or segments[2] != "streams":
                    return self.answer(404, {"error": {"code": "NotFound"}})
                if segments[1] != fake.rule_id:
                    return self.answer(404, {"error": {"code": "DataCollectionRuleNotFound"}})
                if segments[3] not in fake.streams:
                    return self.answer(400, {"error": {"code": "InvalidStream"}})
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if len(body) > MAX_BODY:
                    return self.answer(413, {"error": {"code": "ContentLengthLimitExceeded"}})
                rows = json.loads(body)
                with fake.lock:
                    fake.rows[segments[3]].extend(rows)
                self.answer(204)

        return Ingestion
